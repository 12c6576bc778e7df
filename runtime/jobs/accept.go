package jobs

import (
	"cmp"
	"context"
	"crypto/rand"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"slices"
	"time"

	"github.com/couchjobs/couchjobs/runtime/kv"
	"github.com/couchjobs/couchjobs/runtime/tuple"
)

// AcceptOptions say which jobs an acceptor takes.
type AcceptOptions struct {
	// Node and Groups are this node's name and node groups: besides jobs
	// for any node, the acceptor takes jobs placed on this node or on one
	// of its groups.
	Node   string
	Groups []string
	// MaxPriority, if positive, is the largest priority taken; zero takes
	// every priority. Scheduled jobs are taken only once due, whatever
	// their priority.
	MaxPriority int64
	// Limit is the most jobs to take in one transaction; default 1.
	Limit int
	// Wait blocks until a job is eligible: until one is enqueued (a store
	// watch, not polling) or the earliest scheduled job becomes due, or ctx
	// is done. Without it, Accept returns ErrNoJobs at once.
	Wait bool
	// Rank, if set, ranks share groups (lower first), as the fair-share
	// scheduler wants them: the acceptor reads a longer head of the queue
	// (RankWindow entries per placement) and takes jobs one by one, each
	// time the best-ranked group's job first, in priority order within a
	// rank; picked is how many of the group's jobs this Accept already
	// chose, so a batch spreads over groups as they fall behind.
	Rank func(group string, picked int) int
	// RankGroups are groups the caller wants to start jobs of first (those
	// furthest below their share): their jobs are looked up in the queue by
	// group, so they are found however far back the queue holds them.
	RankGroups []string
}

// RankWindow is how many entries per placement a ranking acceptor reads.
const RankWindow = 256

func (o *AcceptOptions) placements() []string {
	ps := []string{string(AnyNode)}
	if o.Node != "" {
		ps = append(ps, string(OnNode(o.Node)))
	}
	for _, g := range o.Groups {
		ps = append(ps, string(InGroup(g)))
	}
	return ps
}

// candidate is a pending entry read from the head of a queue.
type candidate struct {
	key       []byte
	priority  int64
	id        string
	placement string
	group     string
}

// safetyRecheck bounds a blocked Accept's sleep when no scheduled job is
// due, in case a wake-up was lost (a store that lost its watches).
const safetyRecheck = 30 * time.Second

// Accept takes up to Limit pending jobs of typ, in priority order, gives
// each a fresh worker lock and marks it running. The caller must Update
// each job at least once per activity timeout of the type, and end it with
// Finish or Resubmit.
//
// Acceptors choose at random among the first AcceptSpread+Limit eligible
// jobs (read without conflicts), so that concurrent acceptors on
// FoundationDB rarely take the same job; only the chosen jobs are read with
// conflicts.
func (j *Jobs) Accept(ctx context.Context, typ string, o AcceptOptions) ([]*Job, error) {
	if err := validName("job type", typ, MaxTypeSize); err != nil {
		return nil, err
	}
	limit := max(o.Limit, 1)
	placements := o.placements()
	maxPriority := o.MaxPriority
	if maxPriority <= 0 {
		maxPriority = math.MaxInt64
	}
	for {
		type result struct {
			jobs  []*Job
			watch kv.Watch
			due   int64 // the earliest due time of a delayed job; -1 if none
		}
		v, err := j.store.Transact(ctx, func(tx kv.Tx) (any, error) {
			if err := j.checkType(tx, newBatch(), typ); err != nil {
				return nil, err
			}
			promoted := false
			if j.promoteDue(typ) {
				if err := j.promote(tx, typ); err != nil {
					return nil, err
				}
				promoted = true
			}
			jobs, found, err := j.acceptTx(tx, typ, placements, maxPriority, limit, o.Rank, o.RankGroups)
			if err == nil && !found && !promoted {
				// Nothing else to do: due jobs must not wait.
				if err := j.promote(tx, typ); err != nil {
					return nil, err
				}
				jobs, found, err = j.acceptTx(tx, typ, placements, maxPriority, limit, o.Rank, o.RankGroups)
			}
			if err != nil || len(jobs) > 0 || found || !o.Wait {
				return result{jobs: jobs}, err
			}
			due, err := j.nextDue(tx, typ)
			if err != nil {
				return nil, err
			}
			return result{watch: tx.Watch(j.watchPendingKey(typ)), due: due}, nil
		})
		if err != nil {
			return nil, fmt.Errorf("accept %s: %w", typ, err)
		}
		res := v.(result)
		if len(res.jobs) > 0 {
			return res.jobs, nil
		}
		if !o.Wait {
			return nil, ErrNoJobs
		}
		if res.watch == nil {
			continue // only orphaned entries were found and cleared
		}
		if err := j.waitQueue(ctx, res.watch, res.due); err != nil {
			return nil, err
		}
	}
}

// WaitPending blocks until a job of typ may be eligible for an acceptor
// with options o: at once if one is due now, else until the type's pending
// queue changes or its earliest scheduled job becomes due, or ctx is done.
// An acceptor that must not hold resources (slots) while it waits calls
// Accept without Wait, then WaitPending when there was nothing to take:
// the check and the watch are one transaction, so no enqueue is missed.
func (j *Jobs) WaitPending(ctx context.Context, typ string, o AcceptOptions) error {
	placements := o.placements()
	maxPriority := o.MaxPriority
	if maxPriority <= 0 {
		maxPriority = math.MaxInt64
	}
	type result struct {
		ready bool
		watch kv.Watch
		due   int64
	}
	v, err := j.store.Transact(ctx, func(tx kv.Tx) (any, error) {
		if err := j.promote(tx, typ); err != nil {
			return nil, err
		}
		for _, p := range placements {
			r := j.sub.RangeOf(tuple.Tuple{keyPending, typ, p})
			r.End = j.sub.RangeOf(tuple.Tuple{keyPending, typ, p, maxPriority}).End
			kvs, err := tx.Snapshot().GetRange(r, kv.RangeOptions{Limit: 1})
			if err != nil {
				return nil, err
			}
			if len(kvs) > 0 {
				return result{ready: true}, nil
			}
		}
		due, err := j.nextDue(tx, typ)
		if err != nil {
			return nil, err
		}
		return result{watch: tx.Watch(j.watchPendingKey(typ)), due: due}, nil
	})
	if err != nil {
		return fmt.Errorf("wait for %s jobs: %w", typ, err)
	}
	res := v.(result)
	if res.ready {
		return nil
	}
	return j.waitQueue(ctx, res.watch, res.due)
}

// waitQueue sleeps until the pending watch w fires, the earliest scheduled
// job is due (due, in ms, if not negative), the safety recheck passes, or
// ctx is done; it cancels w.
func (j *Jobs) waitQueue(ctx context.Context, w kv.Watch, due int64) error {
	defer w.Cancel()
	wait := safetyRecheck
	if due >= 0 {
		wait = min(wait, time.Duration(due-j.nowMs())*time.Millisecond)
	}
	return j.sleep(ctx, w, max(wait, time.Millisecond))
}

// promoteBatch bounds the due jobs one accept moves to the pending queue.
const promoteBatch = 256

// promoteEvery is how often a busy acceptor looks for due jobs; an
// acceptor that finds nothing else to do always looks. Reading the delayed
// queue on every accept cost 10-20% of a job's lifecycle.
const promoteEvery = 100 * time.Millisecond

// promoteDue says whether this process's acceptors of typ should look for
// due jobs now, and if so records that they did.
func (j *Jobs) promoteDue(typ string) bool {
	now := time.Now()
	j.mu.Lock()
	defer j.mu.Unlock()
	if now.Sub(j.promoted[typ]) < promoteEvery {
		return false
	}
	j.promoted[typ] = now
	return true
}

// promote moves jobs whose due time has come from the delayed queue to the
// pending queue. Acceptors do it as they look for work, so due jobs reach
// the queue as soon as any node wants one of their type. Each entry is
// checked against its job, so a stale entry is only cleared.
func (j *Jobs) promote(tx kv.Tx, typ string) error {
	r := kv.Range{
		Begin: j.sub.RangeOf(tuple.Tuple{keyDelayed, typ}).Begin,
		End:   j.sub.RangeOf(tuple.Tuple{keyDelayed, typ, j.nowMs()}).End,
	}
	kvs, err := tx.GetRange(r, kv.RangeOptions{Limit: promoteBatch})
	if err != nil {
		return err
	}
	for _, e := range kvs {
		t, err := j.sub.Unpack(e.Key)
		if err != nil || len(t) != 4 {
			return fmt.Errorf("malformed delayed entry: %v", err)
		}
		due, _ := t[2].(int64)
		id, _ := t[3].(string)
		tx.Clear(e.Key)
		rec, err := j.load(tx, typ, id)
		if err != nil {
			return err
		}
		if rec != nil && rec.state == Pending && rec.due == due {
			j.setPending(tx, typ, id, rec)
		}
	}
	return nil
}

// sleep waits for w, for d, or for ctx.
func (j *Jobs) sleep(ctx context.Context, w kv.Watch, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-w.Done():
		return nil
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// acceptTx takes up to limit jobs. found reports whether any pending entry
// was eligible, even if it turned out to be an orphan.
func (j *Jobs) acceptTx(tx kv.Tx, typ string, placements []string, maxPriority int64, limit int, rank func(string, int) int, rankGroups []string) ([]*Job, bool, error) {
	head := limit + j.opts.AcceptSpread
	read := head
	if rank != nil {
		read = max(head, RankWindow)
	}
	var cands []candidate
	for _, p := range placements {
		r := j.sub.RangeOf(tuple.Tuple{keyPending, typ, p})
		r.End = j.sub.RangeOf(tuple.Tuple{keyPending, typ, p, maxPriority}).End
		kvs, err := tx.Snapshot().GetRange(r, kv.RangeOptions{Limit: read})
		if err != nil {
			return nil, false, err
		}
		for _, e := range kvs {
			t, err := j.sub.Unpack(e.Key)
			if err != nil {
				return nil, false, fmt.Errorf("pending entry: %w", err)
			}
			prio, ok1 := t[3].(int64)
			id, ok2 := t[4].(string)
			if len(t) != 5 || !ok1 || !ok2 {
				return nil, false, fmt.Errorf("malformed pending entry %v", t)
			}
			c := candidate{key: e.Key, priority: prio, id: id, placement: p}
			if rank != nil {
				c.group, _ = decodePendingValue(e.Value)
			}
			cands = append(cands, c)
		}
	}
	if rank != nil && len(rankGroups) > 0 {
		more, err := j.groupHeads(tx, typ, placements, maxPriority, limit, rankGroups, cands)
		if err != nil {
			return nil, false, err
		}
		cands = append(cands, more...)
	}
	if len(cands) == 0 {
		return nil, false, nil
	}
	var chosen []candidate
	if rank != nil {
		chosen = rankedPick(cands, limit, rank)
	} else {
		if len(placements) > 1 {
			slices.SortFunc(cands, func(a, b candidate) int { return cmp.Compare(a.priority, b.priority) })
		}
		cands = cands[:min(len(cands), head)]
		// Choose limit of the head at random: a partial Fisher-Yates
		// shuffle, so that concurrent acceptors rarely choose the same
		// jobs.
		n := min(limit, len(cands))
		for i := range n {
			k := i + mrand.IntN(len(cands)-i)
			cands[i], cands[k] = cands[k], cands[i]
		}
		chosen = cands[:n]
	}
	slices.SortFunc(chosen, func(a, b candidate) int { return cmp.Compare(a.priority, b.priority) })
	var jobs []*Job
	for _, c := range chosen {
		job, err := j.take(tx, typ, c)
		if err != nil {
			return nil, true, err
		}
		if job != nil {
			jobs = append(jobs, job)
		}
	}
	if len(jobs) > 0 {
		j.touchType(tx, typ)
	}
	return jobs, true, nil
}

// groupHeads reads the first jobs of each group in groups, per placement,
// from the queue by group, leaving out those already among have.
func (j *Jobs) groupHeads(tx kv.Tx, typ string, placements []string, maxPriority int64, limit int, groups []string, have []candidate) ([]candidate, error) {
	seen := make(map[string]bool, len(have))
	for _, c := range have {
		seen[string(c.key)] = true
	}
	var out []candidate
	for _, g := range groups {
		for _, p := range placements {
			r := j.sub.RangeOf(tuple.Tuple{keyGroupIndex, typ, g, p})
			r.End = j.sub.RangeOf(tuple.Tuple{keyGroupIndex, typ, g, p, maxPriority}).End
			kvs, err := tx.Snapshot().GetRange(r, kv.RangeOptions{Limit: limit + j.opts.AcceptSpread})
			if err != nil {
				return nil, err
			}
			for _, e := range kvs {
				t, err := j.sub.Unpack(e.Key)
				if err != nil || len(t) != 6 {
					return nil, fmt.Errorf("malformed group index entry: %v", err)
				}
				prio, _ := t[4].(int64)
				id, _ := t[5].(string)
				key := j.pendingKey(typ, p, prio, id)
				if !seen[string(key)] {
					seen[string(key)] = true
					out = append(out, candidate{key: key, priority: prio, id: id, placement: p, group: g})
				}
			}
		}
	}
	return out, nil
}

// rankedPick chooses up to limit candidates one by one: each time the
// lowest (rank, priority), ranks recomputed for the groups already picked
// from. Candidates of a group are taken in priority order.
func rankedPick(cands []candidate, limit int, rank func(string, int) int) []candidate {
	byGroup := map[string][]candidate{}
	var groups []string
	for _, c := range cands {
		if byGroup[c.group] == nil {
			groups = append(groups, c.group)
		}
		byGroup[c.group] = append(byGroup[c.group], c)
	}
	for _, g := range groups {
		slices.SortFunc(byGroup[g], func(a, b candidate) int { return cmp.Compare(a.priority, b.priority) })
	}
	picked := map[string]int{}
	var out []candidate
	for len(out) < limit {
		best, bestRank := "", 0
		for _, g := range groups {
			if len(byGroup[g]) == picked[g] {
				continue
			}
			r := rank(g, picked[g])
			head := byGroup[g][picked[g]]
			if best == "" || r < bestRank || r == bestRank && head.priority < byGroup[best][picked[best]].priority {
				best, bestRank = g, r
			}
		}
		if best == "" {
			break
		}
		out = append(out, byGroup[best][picked[best]])
		picked[best]++
	}
	return out
}

// take moves one pending job to running under a new lock. Only now is the
// entry read with a conflict, so that two acceptors conflict only if they
// chose the same job.
func (j *Jobs) take(tx kv.Tx, typ string, c candidate) (*Job, error) {
	tx.AddReadConflictKey(c.key)
	tx.Clear(c.key)
	r, err := j.load(tx, typ, c.id)
	if err != nil {
		return nil, err
	}
	if r == nil || r.state != Pending || r.priority != c.priority || !slices.Contains(Placement(r.placement).queues(), c.placement) {
		// An entry without a matching job: nothing refers to it any more.
		// Its entry in the queue by group goes too, where the group is
		// known, so that ranked lookups do not keep finding it.
		if c.group != "" {
			tx.Clear(j.groupIndexKey(typ, c.group, c.placement, c.priority, c.id))
		}
		j.log.Warn("cleared an orphaned pending entry", "type", typ, "id", c.id, "priority", c.priority)
		return nil, nil
	}
	j.clearPending(tx, typ, c.id, r) // a node-list job's other entries
	var lock tuple.UUID
	rand.Read(lock[:])
	r.state, r.lock, r.resubmit = Running, &lock, false
	j.save(tx, typ, c.id, r, true)
	tx.SetVersionstampedKey(j.stampedActivityKey(typ, c.id), nil)
	return &Job{
		Type: typ, ID: c.id, Lock: lock, Data: r.data, Priority: r.priority,
		Placement: Placement(r.placement), Group: r.group, j: j,
	}, nil
}

// nextDue returns the earliest due time in the delayed queue, or -1.
func (j *Jobs) nextDue(tx kv.Tx, typ string) (int64, error) {
	kvs, err := tx.Snapshot().GetRange(j.sub.RangeOf(tuple.Tuple{keyDelayed, typ}), kv.RangeOptions{Limit: 1})
	if err != nil || len(kvs) == 0 {
		return -1, err
	}
	t, err := j.sub.Unpack(kvs[0].Key)
	if err != nil || len(t) != 4 {
		return 0, fmt.Errorf("malformed delayed entry: %v", err)
	}
	due, _ := t[2].(int64)
	return due, nil
}
