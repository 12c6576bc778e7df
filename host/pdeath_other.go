//go:build !linux

package host

import "os/exec"

// setParentDeathSignal does nothing where the kernel has no parent-death
// signal; the SDK's plugins watch their parent process themselves.
func setParentDeathSignal(*exec.Cmd) {}
