package sched

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/couchjobs/couchjobs/runtime/kv/sqlitekv"
)

var ctx = context.Background()

// clock is an injected clock.
type clock struct{ t time.Time }

func (c *clock) now() time.Time          { return c.t }
func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }

func newStore(t *testing.T) (*Store, *clock) {
	t.Helper()
	s, err := sqlitekv.Open(filepath.Join(t.TempDir(), "s.db"), sqlitekv.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	c := &clock{t: time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)}
	p, _ := Params{Interval: time.Minute}.WithDefaults()
	return NewStore(s, p, c.now), c
}

func near(t *testing.T, what string, got, want float64) {
	t.Helper()
	if math.Abs(got-want) > 1e-6*math.Max(1, math.Abs(want)) {
		t.Errorf("%s = %g, want %g", what, got, want)
	}
}

func TestShares(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	for _, tc := range []struct {
		set, want int
	}{{250, 250}, {0, 1}, {-5, 1}, {5000, 1000}, {1, 1}, {1000, 1000}} {
		got, err := s.SetShares(ctx, "g", tc.set)
		if err != nil || got != tc.want {
			t.Fatalf("set %d: %d, %v; want %d", tc.set, got, err, tc.want)
		}
		gs, _ := s.Groups(ctx)
		if gs["g"].Shares != tc.want {
			t.Fatalf("set %d: stored %d", tc.set, gs["g"].Shares)
		}
	}
	if _, err := s.SetShares(ctx, "", 10); err == nil {
		t.Fatal("a group without a name got shares")
	}
	// The seed fills in groups without shares and keeps the others.
	if err := s.SeedShares(ctx, map[string]int{"g": 7, "h": 300, "i": 9999}); err != nil {
		t.Fatal(err)
	}
	gs, _ := s.Groups(ctx)
	if gs["g"].Shares != 1000 || gs["h"].Shares != 300 || gs["i"].Shares != 1000 {
		t.Fatalf("after the seed: g %d, h %d, i %d", gs["g"].Shares, gs["h"].Shares, gs["i"].Shares)
	}
	if err := s.ResetShares(ctx, "h"); err != nil {
		t.Fatal(err)
	}
	if gs, _ := s.Groups(ctx); gs["h"] != nil {
		t.Fatalf("a reset group with no usage is still listed: %+v", gs["h"])
	}
}

// Usage sums the nodes' records, each decayed by its age as if the nodes
// had kept publishing it; a stopped node's running jobs stop counting, and
// its records go once they no longer matter.
func TestUsageAcrossNodes(t *testing.T) {
	t.Parallel()
	s, c := newStore(t)
	if err := s.Publish(ctx, "a", map[string]Report{"g": {Usage: 100, Running: 3}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Publish(ctx, "b", map[string]Report{"g": {Usage: 50, Running: 1}, "h": {Usage: 10}}); err != nil {
		t.Fatal(err)
	}
	gs, _ := s.Groups(ctx)
	near(t, "g's usage", gs["g"].Usage, 150)
	if gs["g"].Running != 4 || gs["g"].Shares != DefaultShares || gs["h"].Running != 0 {
		t.Fatalf("groups %+v %+v", gs["g"], gs["h"])
	}
	// A node's new report replaces its old one.
	c.advance(time.Minute)
	s.Publish(ctx, "a", map[string]Report{"g": {Usage: 60, Running: 2}})
	gs, _ = s.Groups(ctx)
	near(t, "g's usage a minute later", gs["g"].Usage, 60+50*0.5)
	// Node b stopped: after 3 intervals its jobs no longer count.
	c.advance(3 * time.Minute)
	s.Publish(ctx, "a", map[string]Report{"g": {Usage: 60, Running: 2}})
	gs, _ = s.Groups(ctx)
	if gs["g"].Running != 2 {
		t.Fatalf("running %d counts a stopped node's jobs", gs["g"].Running)
	}
	near(t, "g's usage with b's decayed", gs["g"].Usage, 60+50*math.Pow(0.5, 4))
	// Much later, b's records are negligible and cleared.
	c.advance(time.Hour)
	s.Publish(ctx, "a", nil)
	if gs, _ := s.Groups(ctx); len(gs) != 0 {
		t.Fatalf("groups left: %v", gs)
	}
}

// A node charges real run time, and its usage decays by UsageCoeff per
// interval once its jobs stop: couch_replicator_share's decay.
func TestNodeAccounting(t *testing.T) {
	t.Parallel()
	p, _ := Params{Interval: time.Minute}.WithDefaults()
	n := NewNode(p)
	t0 := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	n.Start("shell/a", "g", false, t0)
	n.Start("shell/b", "g", true, t0.Add(30*time.Second))
	n.Start("shell/c", "h", true, t0)
	rep := n.Tick(t0.Add(time.Minute))
	near(t, "g's usage after a minute", rep["g"].Usage, 90)
	if rep["g"].Running != 2 || rep["h"].Running != 1 {
		t.Fatalf("reports %+v", rep)
	}
	if ran, ok := n.Stop("shell/a", t0.Add(90*time.Second)); !ok || ran != 90*time.Second {
		t.Fatalf("stop: %v %v", ran, ok)
	}
	if _, ok := n.Stop("shell/a", t0.Add(90*time.Second)); ok {
		t.Fatal("stopped a run twice")
	}
	n.Stop("shell/b", t0.Add(2*time.Minute))
	n.Stop("shell/c", t0.Add(2*time.Minute))
	rep = n.Tick(t0.Add(2 * time.Minute))
	near(t, "g's usage after two minutes", rep["g"].Usage, 90*0.5+30+60)
	for i := 1; i <= 3; i++ {
		rep = n.Tick(t0.Add(time.Duration(2+i) * time.Minute))
		near(t, "g's usage, idle", rep["g"].Usage, 135*math.Pow(0.5, float64(i)))
	}
	if rep["g"].Running != 0 || len(n.Runs()) != 0 {
		t.Fatalf("runs left: %v", n.Runs())
	}
}

func TestTargets(t *testing.T) {
	t.Parallel()
	g := func(shares, running, pending int, usage float64) *Group {
		return &Group{Shares: shares, Running: running, Pending: pending, Usage: usage}
	}
	for _, tc := range []struct {
		name   string
		groups map[string]*Group
		want   map[string]float64
	}{
		{"unequal shares, equal jobs", map[string]*Group{"high": g(200, 10, 40, 0), "low": g(100, 20, 30, 0)},
			map[string]float64{"high": 20, "low": 10}},
		{"three groups", map[string]*Group{"a": g(200, 10, 50, 0), "b": g(100, 10, 50, 0), "c": g(50, 15, 50, 0)},
			map[string]float64{"a": 20, "b": 10, "c": 5}},
		{"a group wants less than its share", map[string]*Group{"a": g(100, 2, 0, 0), "b": g(100, 10, 50, 0), "c": g(100, 8, 50, 0)},
			map[string]float64{"a": 2, "b": 9, "c": 9}},
		{"least shares still get some", map[string]*Group{"rich": g(1000, 5, 50, 0), "poor": g(1, 0, 1, 0)},
			map[string]float64{"rich": 5 * 1000.0 / 1001, "poor": 5 * 1.0 / 1001}},
		{"nothing waits", map[string]*Group{"a": g(100, 3, 0, 0), "b": g(300, 1, 0, 0)},
			map[string]float64{"a": 3, "b": 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, _ := Targets(tc.groups)
			for name, want := range tc.want {
				near(t, name+"'s target", got[name], want)
			}
		})
	}
	_, eff := Targets(map[string]*Group{"a": g(100, 1, 0, 30), "b": g(100, 1, 0, 10), "c": g(100, 0, 0, 0)})
	near(t, "a's effective share", eff["a"], 0.75)
	near(t, "c's effective share", eff["c"], 0)
}

func TestParams(t *testing.T) {
	t.Parallel()
	p, err := Params{}.WithDefaults()
	if err != nil || p.Interval != 15*time.Second || p.UsageCoeff != 0.5 {
		t.Fatalf("defaults %+v, %v", p, err)
	}
	for _, bad := range []Params{{Interval: time.Millisecond}, {UsageCoeff: 1}, {UsageCoeff: -0.1}} {
		if _, err := bad.WithDefaults(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

func TestPreempt(t *testing.T) {
	t.Parallel()
	p, _ := Params{Interval: time.Second}.WithDefaults()
	t0 := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	later := t0.Add(time.Hour)
	g := func(shares, running, pending int) *Group {
		return &Group{Shares: shares, Running: running, Pending: pending}
	}

	// Over its share while another group waits: this node stops its
	// part of the excess, the longest-running first, never a one-shot run.
	n := NewNode(p)
	n.Start("t/small-1", "small", true, t0)
	n.Start("t/small-2", "small", true, t0.Add(time.Minute))
	n.Start("t/small-oneshot", "small", false, t0.Add(-time.Hour))
	n.Start("t/big-1", "big", true, t0)
	groups := map[string]*Group{"big": g(300, 1, 5), "small": g(100, 3, 5)}
	if got := n.Preempt(later, groups, 20, time.Minute); len(got) != 2 || got[0] != "t/small-1" || got[1] != "t/small-2" {
		t.Fatalf("preempted %v; want small's two continuous runs, longest first", got)
	}

	// The churn limit, and min_run_time.
	n = NewNode(p)
	for i := range 6 {
		n.Start(fmt.Sprint("t/s", i), "small", true, t0)
	}
	groups = map[string]*Group{"big": g(300, 0, 10), "small": g(100, 6, 10)}
	if got := n.Preempt(t0.Add(30*time.Second), groups, 20, time.Minute); len(got) != 0 {
		t.Fatalf("preempted %v before min_run_time", got)
	}
	if got := n.Preempt(later, groups, 2, time.Minute); len(got) != 2 {
		t.Fatalf("preempted %d with max_churn 2", len(got))
	}

	// A fractional excess carries over (error diffusion): with 5 slots
	// split 3.75 and 1.25, a group running 2 is 0.75 over, and gives up a
	// run in 7 of 10 intervals.
	n = NewNode(p)
	n.Start("t/b1", "b", true, t0)
	n.Start("t/b2", "b", true, t0)
	stops := 0
	for i := range 10 {
		groups = map[string]*Group{"a": g(300, 3, 3), "b": g(100, 2, 3)}
		for _, id := range n.Preempt(later.Add(time.Duration(i)*time.Second), groups, 20, 0) {
			if !strings.HasPrefix(id, "t/b") {
				t.Fatalf("preempted %s", id)
			}
			stops++
			n.Stop(id, later)
			n.Start(id, "b", true, later) // it runs again, here as elsewhere
		}
	}
	if stops != 7 {
		t.Fatalf("%d stops in 10 intervals for an excess of 0.75", stops)
	}

	// Rotation: a group at its share with waiting jobs gives up its
	// longest run once per interval.
	n = NewNode(p)
	n.Start("t/old", "solo", true, t0)
	n.Start("t/new", "solo", true, t0.Add(time.Minute))
	groups = map[string]*Group{"solo": g(100, 2, 4)}
	if got := n.Preempt(later, groups, 20, time.Minute); len(got) != 1 || got[0] != "t/old" {
		t.Fatalf("rotation preempted %v", got)
	}
	// Nothing waits: nothing is preempted.
	groups = map[string]*Group{"solo": g(100, 2, 0)}
	if got := n.Preempt(later, groups, 20, time.Minute); len(got) != 0 {
		t.Fatalf("preempted %v with nothing waiting", got)
	}
}

// Shares changed at run time move the targets, and with them which
// group's runs are preempted, from the next interval on.
func TestSharesChangedAtRunTime(t *testing.T) {
	t.Parallel()
	s, c := newStore(t)
	p, _ := Params{Interval: time.Minute}.WithDefaults()
	n := NewNode(p)
	for i := range 4 {
		n.Start(fmt.Sprint("t/x", i), "x", true, c.now())
		n.Start(fmt.Sprint("t/y", i), "y", true, c.now())
	}
	groups := func() map[string]*Group {
		s.Publish(ctx, "n", n.Report())
		gs, err := s.Groups(ctx)
		if err != nil {
			t.Fatal(err)
		}
		gs["x"].Pending, gs["y"].Pending = 10, 10
		return gs
	}
	c.advance(time.Hour)
	if got := n.Preempt(c.now(), groups(), 20, 0); len(got) != 2 {
		// Equal shares, 4 and 4 running: only rotation, one run each.
		t.Fatalf("with equal shares, preempted %v", got)
	}
	s.SetShares(ctx, "x", 300)
	got := n.Preempt(c.now(), groups(), 20, 0)
	ys := 0
	for _, id := range got {
		if strings.HasPrefix(id, "t/y") {
			ys++
		}
	}
	// Targets now 6 and 2: y gives up its 2 runs of excess.
	if ys != 2 {
		t.Fatalf("after x got 300 shares, preempted %v", got)
	}
}

// A group with 1 share among 1000-share runs still gets its turn: its
// fractional target builds up until a run is preempted for it.
func TestNoStarvation(t *testing.T) {
	t.Parallel()
	p, _ := Params{Interval: time.Minute}.WithDefaults()
	n := NewNode(p)
	t0 := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	for i := range 5 {
		n.Start(fmt.Sprint("t/rich", i), "rich", true, t0)
	}
	groups := map[string]*Group{"rich": {Shares: 1000, Running: 5, Pending: 50}, "poor": {Shares: 1, Pending: 1}}
	for i := 1; ; i++ {
		if i > 250 {
			t.Fatal("the poor group's job never got a slot in 250 intervals")
		}
		got := n.Preempt(t0.Add(time.Duration(i)*time.Minute), groups, 20, 0)
		if slices.ContainsFunc(got, func(id string) bool { return !strings.HasPrefix(id, "t/rich") }) {
			t.Fatalf("preempted %v", got)
		}
		// Rich is above its share by 5/1001 of a slot, so it does not
		// rotate; the fraction adds up to a whole run after ~200 intervals.
		if len(got) > 0 {
			if i < 150 {
				t.Fatalf("a rich run was preempted after %d intervals; the poor share is 5/1001 of a slot", i)
			}
			t.Logf("a rich run was given up for the poor group after %d intervals", i)
			break
		}
	}
}
