// Package shell is the shell plugin: jobs made of ordered shell steps,
// each targeted at any node, a node, a list of nodes or a node group, with
// retries, a fallback command and a policy for steps lost with their node.
// cmd/couchjobs-shell serves it; README.md documents the job document,
// the configuration and the security model.
package shell
