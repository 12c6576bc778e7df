package sched

import (
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
	return &Node{params: p, runs: map[string]*Run{}, usage: map[string]float64{}, charges: map[string]float64{}}
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
	out := map[string]Report{}
	for g, u := range n.usage {
		if u < 1e-9 {
			delete(n.usage, g)
			continue
		}
		out[g] = Report{Usage: u}
	}
	for _, r := range n.runs {
		rep := out[r.Group]
		rep.Running++
		out[r.Group] = rep
	}
	return out
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
