package sched

import (
	"cmp"
	"slices"
	"sync"
	"time"
)

// Node does one node's accounting: it knows the jobs the node runs,
// charges their run time to their groups, and rolls the charges into the
// node's usage once per interval (usage × UsageCoeff + charges), which it
// reports for Store.Publish. It is safe for concurrent use; the clock is
// the caller's, so tests drive it.
type Node struct {
	params Params

	mu      sync.Mutex
	runs    map[string]*Run
	usage   map[string]float64 // this node's decayed usage per group
	charges map[string]float64 // run time charged since the last roll-up
	excess  map[string]float64 // preemptions owed per group; see Preempt
}

// Run is a job the node runs.
type Run struct {
	ID    string
	Group string
	// Continuous jobs may be preempted; one-shot jobs never are.
	Continuous bool
	Started    time.Time
	charged    time.Time // run time up to here is charged
}

// NewNode returns a node's accounting.
func NewNode(p Params) *Node {
	return &Node{params: p, runs: map[string]*Run{}, usage: map[string]float64{}, charges: map[string]float64{}, excess: map[string]float64{}}
}

// Start records a run the node starts. id names the run on the node (the
// host uses "type/id").
func (n *Node) Start(id, group string, continuous bool, now time.Time) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.runs[id] = &Run{ID: id, Group: group, Continuous: continuous, Started: now, charged: now}
}

// Stop ends a run, charging its group for the run time not charged yet,
// and says how long it ran; ok is false for a run the node does not know.
func (n *Node) Stop(id string, now time.Time) (ran time.Duration, ok bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	r := n.runs[id]
	if r == nil {
		return 0, false
	}
	delete(n.runs, id)
	n.charge(r, now)
	return now.Sub(r.Started), true
}

// charge adds a run's uncharged run time to its group's charges.
func (n *Node) charge(r *Run, now time.Time) {
	if d := now.Sub(r.charged); d > 0 {
		n.charges[r.Group] += d.Seconds()
		r.charged = now
	}
}

// Tick does the interval's accounting: it charges the running jobs, rolls
// the charges into the node's usage and returns the node's reports, to
// publish for the cluster.
func (n *Node) Tick(now time.Time) map[string]Report {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, r := range n.runs {
		n.charge(r, now)
	}
	for g, u := range n.usage {
		n.usage[g] = u * n.params.UsageCoeff
	}
	for g, c := range n.charges {
		n.usage[g] += c
	}
	clear(n.charges)
	for g, u := range n.usage {
		if u < 1e-9 {
			delete(n.usage, g)
		}
	}
	return n.report()
}

// Report returns the node's reports as they stand, without rolling usage
// up: for publishing between intervals, so that other nodes see the runs
// this node started or stopped since.
func (n *Node) Report() map[string]Report {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.report()
}

func (n *Node) report() map[string]Report {
	out := map[string]Report{}
	for g, u := range n.usage {
		out[g] = Report{Usage: u}
	}
	for _, r := range n.runs {
		rep := out[r.Group]
		rep.Running++
		out[r.Group] = rep
	}
	return out
}

// Running counts the node's runs per group.
func (n *Node) Running() map[string]int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.running()
}

func (n *Node) running() map[string]int {
	m := map[string]int{}
	for _, r := range n.runs {
		m[r.Group]++
	}
	return m
}

// Runs returns a copy of the node's runs.
func (n *Node) Runs() []Run {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]Run, 0, len(n.runs))
	for _, r := range n.runs {
		out = append(out, *r)
	}
	return out
}

// Preempt chooses up to maxChurn of the node's continuous runs to stop
// (they are resubmitted), among those that have run at least minRun,
// the longest-running first:
//
//   - while a group with waiting jobs is below its fair target
//     (Targets), runs of the groups above theirs: this node stops its
//     part of each group's excess, carrying fractions over to the next
//     interval (error diffusion), so that over time every group runs its
//     exact share and nodes acting at once do not overshoot;
//   - then, with the churn left, the longest run of each group that is at
//     its share and has jobs waiting, so that a group's jobs take turns
//     (CouchDB rotates its jobs the same way).
//
// groups is the cluster's state, with Pending filled in. One-shot runs are
// never chosen.
func (n *Node) Preempt(now time.Time, groups map[string]*Group, maxChurn int, minRun time.Duration) []string {
	targets, _ := Targets(groups)
	deficit := 0.0
	for name, g := range groups {
		if g.Pending > 0 {
			deficit += max(targets[name]-float64(g.Running), 0)
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	local := map[string][]*Run{}
	for _, r := range n.runs {
		if r.Continuous && now.Sub(r.Started) >= minRun {
			local[r.Group] = append(local[r.Group], r)
		}
	}
	for _, runs := range local {
		slices.SortFunc(runs, func(a, b *Run) int {
			if c := a.Started.Compare(b.Started); c != 0 {
				return c
			}
			return cmp.Compare(a.ID, b.ID)
		})
	}
	var out []string
	take := func(group string, k int) int {
		taken := 0
		for len(local[group]) > 0 && taken < k && len(out) < maxChurn {
			out = append(out, local[group][0].ID)
			local[group] = local[group][1:]
			taken++
		}
		return taken
	}
	if deficit <= 1e-9 {
		clear(n.excess)
	} else {
		counts := n.running()
		names := make([]string, 0, len(groups))
		for name := range groups {
			names = append(names, name)
		}
		slices.Sort(names)
		for _, name := range names {
			g, mine := groups[name], counts[name]
			if g.Running == 0 || mine == 0 {
				delete(n.excess, name)
				continue
			}
			part := (float64(g.Running) - targets[name]) * float64(mine) / float64(g.Running)
			// The carry is at most one run either way; a large excess is
			// acted on at once.
			acc := min(max(n.excess[name]+part, -1), max(part, 0)+1)
			if acc >= 1 {
				acc -= float64(take(name, int(acc)))
			}
			n.excess[name] = acc
		}
	}
	// Rotation: for each group at its share with jobs waiting, its
	// longest run, so that its jobs take turns without the whole node
	// churning at once; the queue puts the stopped job behind the others.
	var rest []*Run
	for name, runs := range local {
		g := groups[name]
		if g == nil || g.Pending == 0 || len(runs) == 0 {
			continue
		}
		// At its share: not above it, and less than a job below.
		if atShare := float64(g.Running) <= targets[name]+1e-9 && float64(g.Running) > targets[name]-1; atShare {
			rest = append(rest, runs[0])
		}
	}
	slices.SortFunc(rest, func(a, b *Run) int {
		if c := a.Started.Compare(b.Started); c != 0 {
			return c
		}
		return cmp.Compare(a.ID, b.ID)
	})
	for _, r := range rest {
		if len(out) >= maxChurn {
			break
		}
		out = append(out, r.ID)
	}
	return out
}
