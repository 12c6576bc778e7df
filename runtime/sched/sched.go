// Package sched is the fair-share scheduler of couchjobs: every job
// belongs to a share group, every group has shares (default 100, 1 to
// 1000, set cluster-wide at run time), and groups are charged the real
// run time of their jobs, as in Kay and Lauder's "A Fair Share Scheduler"
// and CouchDB 3.2's couch_replicator_share. Usage decays every interval:
// usage = usage × UsageCoeff + charges.
//
// Store keeps shares and usage in the store, one usage record per group
// and node, so nodes never write the same key. Targets divides the
// cluster's running jobs among the groups that want them in proportion to
// their shares. Node does one node's part: it charges its runs and, every
// interval, chooses which continuous runs to preempt so that every group
// moves to its target and a group's jobs take turns; the host's acceptors
// start the jobs of the groups furthest below their targets first
// (jobs.AcceptOptions.Rank). docs/ARCHITECTURE.md explains why this and
// not K&L's priority arithmetic.
package sched

import (
	"fmt"
	"time"
)

// Params are the fair-share parameters. Every node of a cluster should
// use the same ones.
type Params struct {
	// Interval is the accounting period: usage rolls up and nodes publish
	// it once per interval. Default 15 s (CouchDB 4.x's; 3.x used 60 s).
	Interval time.Duration
	// UsageCoeff decays a group's usage once per interval; default 0.5.
	UsageCoeff float64
}

// Defaults of Params.
const (
	DefaultInterval   = 15 * time.Second
	DefaultUsageCoeff = 0.5
)

// WithDefaults fills in zero fields and checks the others.
func (p Params) WithDefaults() (Params, error) {
	if p.Interval == 0 {
		p.Interval = DefaultInterval
	}
	if p.UsageCoeff == 0 {
		p.UsageCoeff = DefaultUsageCoeff
	}
	switch {
	case p.Interval < 10*time.Millisecond:
		return p, fmt.Errorf("scheduler interval %v is under 10ms", p.Interval)
	case p.UsageCoeff < 0 || p.UsageCoeff >= 1:
		return p, fmt.Errorf("scheduler usage_coeff %g: want a number from 0 up to 1", p.UsageCoeff)
	}
	return p, nil
}

// Shares bounds and default, as in CouchDB.
const (
	DefaultShares = 100
	MinShares     = 1
	MaxShares     = 1000
)

// ClampShares brings shares into MinShares..MaxShares.
func ClampShares(s int) int { return min(max(s, MinShares), MaxShares) }

// Group is what the cluster knows of a share group.
type Group struct {
	Name string `json:"group"`
	// Shares is the group's entitlement; DefaultShares unless set.
	Shares int `json:"shares"`
	// Usage is the group's decayed run time, in seconds, summed over
	// the nodes.
	Usage float64 `json:"usage"`
	// Running counts the group's running jobs in the cluster, as the
	// nodes last published them.
	Running int `json:"running"`
	// Pending counts the group's jobs waiting to run, where the caller
	// filled it in (Store does not).
	Pending int `json:"pending"`
}

// Targets divides the cluster's running jobs among the groups that want
// them, in proportion to their shares, a group never getting more than it
// has jobs (running and pending) for: water-filling. It returns each
// group's fair number of running jobs and its effective share, the
// fraction of the cluster's usage it had.
func Targets(groups map[string]*Group) (targets, effective map[string]float64) {
	type want struct {
		name   string
		shares float64
		demand float64
	}
	var open []want
	capacity, usage := 0.0, 0.0
	for name, g := range groups {
		if d := float64(g.Running + g.Pending); d > 0 {
			open = append(open, want{name, float64(ClampShares(g.Shares)), d})
		}
		capacity += float64(g.Running)
		usage += g.Usage
	}
	targets = map[string]float64{}
	left := capacity
	for len(open) > 0 && left > 1e-9 {
		total := 0.0
		for _, w := range open {
			total += w.shares
		}
		var next []want
		for _, w := range open {
			if fair := left * w.shares / total; w.demand <= fair {
				targets[w.name] = w.demand
			} else {
				next = append(next, w)
			}
		}
		if len(next) == len(open) {
			for _, w := range open {
				targets[w.name] = left * w.shares / total
			}
			break
		}
		for _, w := range open {
			if _, done := targets[w.name]; done {
				left -= w.demand
			}
		}
		open = next
	}
	effective = map[string]float64{}
	for name, g := range groups {
		if usage > 0 {
			effective[name] = g.Usage / usage
		}
	}
	return targets, effective
}
