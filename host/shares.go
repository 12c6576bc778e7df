package host

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/couchjobs/couchjobs/runtime/jobs"
	"github.com/couchjobs/couchjobs/runtime/sched"
)

// Fair-share accounting: the node charges its runs' real run time to their
// share groups and publishes its usage once per interval (runtime/sched);
// the API and the CLI show and set shares cluster-wide.

// schedParams returns the fair-share parameters of the configuration.
func schedParams(n *Node) sched.Params {
	return sched.Params{Interval: n.cfg.Scheduler.Interval.Duration, UsageCoeff: n.cfg.Scheduler.UsageCoeff}
}

// accounting seeds the configured shares, then publishes the node's usage
// every interval until ctx is done, and once more on the way out so that
// its stopped runs stop counting at once.
func (n *Node) accounting(ctx context.Context) {
	if err := n.shares.SeedShares(ctx, n.cfg.Scheduler.Shares); err != nil && ctx.Err() == nil {
		n.log.Error("seeding scheduler.shares failed", "error", err)
	}
	interval := n.cfg.Scheduler.Interval.Duration
	// Nodes tick on the same wall-clock boundaries, so that they decide
	// from the same published state, each taking its part of the
	// cluster's correction, instead of one acting on what another has just
	// changed.
	next := func() <-chan time.Time {
		now := time.Now()
		return time.After(now.Truncate(interval).Add(interval).Sub(now))
	}
	tick := next()
	// A quarter interval after scheduling, the node publishes again, so
	// that the other nodes see the runs its decisions started and stopped.
	var refresh <-chan time.Time
	for {
		select {
		case <-refresh:
			refresh = nil
			if err := n.shares.Publish(ctx, n.cfg.Node.Name, n.acct.Report()); err != nil && ctx.Err() == nil {
				n.log.Warn("publishing fair-share usage failed", "error", err)
			}
		case <-ctx.Done():
			pctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			n.shares.Publish(pctx, n.cfg.Node.Name, n.acct.Tick(time.Now()))
			cancel()
			return
		case now := <-tick:
			tick = next()
			if err := n.shares.Publish(ctx, n.cfg.Node.Name, n.acct.Tick(now)); err != nil && ctx.Err() == nil {
				n.log.Warn("publishing fair-share usage failed", "error", err)
				continue
			}
			if err := n.schedule(ctx, now); err != nil && ctx.Err() == nil {
				n.log.Warn("scheduling failed", "error", err)
			}
			refresh = time.After(interval / 4)
		}
	}
}

// runID names a run in the node's accounting.
func runID(j *jobs.Job) string { return j.Type + "/" + j.ID }

// GroupJSON is a share group as the API shows it.
type GroupJSON struct {
	sched.Group
	// Target is the group's fair number of running jobs in the cluster.
	Target float64 `json:"target"`
	// EffectiveShare is the group's fraction of the cluster's usage.
	EffectiveShare float64 `json:"effective_share"`
}

// Groups returns every share group the cluster knows of: with shares set,
// usage recorded, or jobs waiting to run (of any type, due, counted up to
// 10,000 per group and type).
func (n *Node) Groups(ctx context.Context) ([]GroupJSON, error) {
	types, err := n.jobs.Types(ctx)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(types))
	for i, t := range types {
		names[i] = t.Name
	}
	groups, err := n.groups(ctx, names)
	if err != nil {
		return nil, err
	}
	targets, effective := sched.Targets(groups)
	out := []GroupJSON{}
	for _, g := range sched.Sorted(groups) {
		out = append(out, GroupJSON{Group: *g, Target: targets[g.Name], EffectiveShare: effective[g.Name]})
	}
	return out, nil
}

// groups reads the cluster's groups, with the jobs of types waiting.
func (n *Node) groups(ctx context.Context, types []string) (map[string]*sched.Group, error) {
	groups, err := n.shares.Groups(ctx)
	if err != nil {
		return nil, err
	}
	for _, typ := range types {
		counts, err := n.jobs.PendingGroups(ctx, typ, pendingScanPerType)
		if err != nil {
			return nil, err
		}
		for g, c := range counts {
			if groups[g] == nil {
				groups[g] = &sched.Group{Name: g, Shares: sched.DefaultShares}
			}
			groups[g].Pending += c
		}
	}
	return groups, nil
}

func (n *Node) getShares(w http.ResponseWriter, r *http.Request) {
	groups, err := n.Groups(r.Context())
	if err != nil {
		writeJobError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"groups": groups})
}

// SharesRequest sets a group's shares.
type SharesRequest struct {
	Shares int `json:"shares"`
}

func (n *Node) putShares(w http.ResponseWriter, r *http.Request) {
	var req SharesRequest
	if !readJSON(w, r, &req) {
		return
	}
	group := r.PathValue("group")
	if err := validGroup(group); err != nil {
		writeError(w, http.StatusBadRequest, "bad_request", err.Error())
		return
	}
	if req.Shares < sched.MinShares || req.Shares > sched.MaxShares {
		writeError(w, http.StatusBadRequest, "bad_request", fmt.Sprintf("shares %d: want %d to %d", req.Shares, sched.MinShares, sched.MaxShares))
		return
	}
	v, err := n.shares.SetShares(r.Context(), group, req.Shares)
	if err != nil {
		writeJobError(w, err)
		return
	}
	n.log.Info("shares set", "group", group, "shares", v)
	writeJSON(w, http.StatusOK, map[string]any{"ok": true, "group": group, "shares": v})
}

func (n *Node) deleteShares(w http.ResponseWriter, r *http.Request) {
	group := r.PathValue("group")
	if err := validGroup(group); err != nil {
		writeError(w, http.StatusBadRequest, "bad_request", err.Error())
		return
	}
	if err := n.shares.ResetShares(r.Context(), group); err != nil {
		writeJobError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"ok": true, "group": group, "shares": sched.DefaultShares})
}

// validGroup checks a share group name as the job layer does.
func validGroup(g string) error {
	if g == "" || len(g) > jobs.MaxTypeSize {
		return fmt.Errorf("share group %q: want 1 to %d bytes", g, jobs.MaxTypeSize)
	}
	return nil
}

// pendingScanPerType bounds the waiting jobs a node counts per group and
// type, each interval and for GET /shares.
const pendingScanPerType = 10_000

// schedule is the interval's scheduling: from the cluster's groups (their
// shares, running jobs and the jobs waiting for this node's types) it
// ranks groups for this node's acceptors, the most below its fair target
// first, and preempts continuous runs to move toward the targets and to
// let waiting jobs take turns.
func (n *Node) schedule(ctx context.Context, now time.Time) error {
	groups, err := n.groups(ctx, n.runningTypes())
	if err != nil {
		return err
	}
	targets, _ := sched.Targets(groups)
	view := &schedView{running: map[string]float64{}, targets: targets, local: n.acct.Running()}
	waiting, wanting := 0, 0
	for name, g := range groups {
		view.running[name] = float64(g.Running)
		if g.Pending > 0 {
			waiting++
		}
		if g.Pending+g.Running > 0 {
			wanting++
		}
	}
	view.contested = waiting > 0 && wanting > 1
	for name, g := range groups {
		if g.Pending > 0 && float64(g.Running) < targets[name] {
			view.under = append(view.under, name)
		}
	}
	slices.SortFunc(view.under, func(a, b string) int {
		return cmp.Compare(float64(groups[a].Running)/targets[a], float64(groups[b].Running)/targets[b])
	})
	view.under = view.under[:min(len(view.under), maxRankGroups)]
	n.view.Store(view)
	if n.cfg.Scheduler.MaxChurn < 0 {
		return nil
	}
	victims := n.acct.Preempt(now, groups, n.cfg.Scheduler.MaxChurn, n.cfg.Scheduler.MinRunTime.Duration)
	for _, id := range victims {
		n.preempt(id)
	}
	if len(victims) > 0 && n.log.IsDebug() {
		n.log.Debug("preempted", "jobs", len(victims), "targets", targets)
	}
	return nil
}

// schedView is the last interval's picture, for the acceptors: the
// cluster's running jobs per group, their fair targets, and this node's
// own runs per group then.
type schedView struct {
	running, targets map[string]float64
	local            map[string]int
	// contested: jobs wait and more than one group wants slots; otherwise
	// ranking has nothing to decide, and acceptors skip its longer reads.
	contested bool
	// under are the groups with jobs waiting below their share, the
	// furthest below first: acceptors look their jobs up by group.
	under []string
}

// maxRankGroups bounds the groups an acceptor looks up by group.
const maxRankGroups = 16

// rank is the acceptors' ranking of groups (nil until the first
// schedule): by running jobs over fair target, in percent, so the group
// furthest below its share comes first. Running counts are the last
// interval's, corrected by this node's starts and stops since, so that a
// node filling several slots within an interval does not give them all to
// the group that was furthest behind.
func (n *Node) rank() (func(string, int) int, []string) {
	v := n.view.Load()
	if v == nil || !v.contested {
		return nil, nil
	}
	now := n.acct.Running()
	return func(g string, picked int) int {
		target := v.targets[g]
		if target <= 0 {
			return 1 << 20
		}
		running := v.running[g] - float64(v.local[g]) + float64(now[g]+picked)
		return int(100 * running / target)
	}, v.under
}

// runningTypes lists the job types of this node's running plugins.
func (n *Node) runningTypes() []string {
	var out []string
	for _, p := range n.plugins {
		out = append(out, p.Status().Types...)
	}
	return out
}

// preempt stops a run so that it goes back to the queue.
func (n *Node) preempt(id string) {
	typ, jobID, _ := strings.Cut(id, "/")
	for _, p := range n.plugins {
		p.mu.Lock()
		s := p.session
		p.mu.Unlock()
		if s != nil && s.preempt(typ, jobID) {
			return
		}
	}
}
