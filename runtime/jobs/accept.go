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
	// MaxPriority is the largest priority taken. Zero means "due now": the
	// current Unix time in milliseconds, so that scheduled jobs wait for
	// their time. math.MaxInt64 takes every job.
	MaxPriority int64
	// Limit is the most jobs to take in one transaction; default 1.
	Limit int
	// Wait blocks until a job is eligible: until one is enqueued (a store
	// watch, not polling) or the earliest scheduled job becomes due, or ctx
	// is done. Without it, Accept returns ErrNoJobs at once.
	Wait bool
}

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
	for {
		maxPriority := o.MaxPriority
		if maxPriority == 0 {
			maxPriority = j.nowPriority()
		}
		type result struct {
			jobs  []*Job
			watch kv.Watch
			due   int64 // the earliest priority above maxPriority; -1 if none
		}
		v, err := j.store.Transact(ctx, func(tx kv.Tx) (any, error) {
			if err := j.checkType(tx, newBatch(), typ); err != nil {
				return nil, err
			}
			jobs, found, err := j.acceptTx(tx, typ, placements, maxPriority, limit)
			if err != nil || len(jobs) > 0 || found || !o.Wait {
				return result{jobs: jobs}, err
			}
			due, err := j.nextDue(tx, typ, placements, maxPriority)
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
		wait := safetyRecheck
		if res.due >= 0 && o.MaxPriority == 0 {
			wait = min(wait, time.Duration(res.due-j.nowPriority())*time.Millisecond)
		}
		err = j.sleep(ctx, res.watch, max(wait, time.Millisecond))
		res.watch.Cancel()
		if err != nil {
			return nil, err
		}
	}
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
func (j *Jobs) acceptTx(tx kv.Tx, typ string, placements []string, maxPriority int64, limit int) ([]*Job, bool, error) {
	head := limit + j.opts.AcceptSpread
	var cands []candidate
	for _, p := range placements {
		r := j.sub.RangeOf(tuple.Tuple{keyPending, typ, p})
		r.End = j.sub.RangeOf(tuple.Tuple{keyPending, typ, p, maxPriority}).End
		kvs, err := tx.Snapshot().GetRange(r, kv.RangeOptions{Limit: head})
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
			cands = append(cands, candidate{key: e.Key, priority: prio, id: id, placement: p})
		}
	}
	if len(cands) == 0 {
		return nil, false, nil
	}
	if len(placements) > 1 {
		slices.SortFunc(cands, func(a, b candidate) int { return cmp.Compare(a.priority, b.priority) })
	}
	cands = cands[:min(len(cands), head)]
	// Choose limit of the head at random: a partial Fisher-Yates shuffle.
	n := min(limit, len(cands))
	for i := range n {
		k := i + mrand.IntN(len(cands)-i)
		cands[i], cands[k] = cands[k], cands[i]
	}
	chosen := cands[:n]
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
	if r == nil || r.state != Pending || r.priority != c.priority || r.placement != c.placement {
		// An entry without a matching job: nothing refers to it any more.
		j.log.Warn("cleared an orphaned pending entry", "type", typ, "id", c.id, "priority", c.priority)
		return nil, nil
	}
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

// nextDue returns the smallest priority above maxPriority among the
// placements' queues, or -1 if there is none.
func (j *Jobs) nextDue(tx kv.Tx, typ string, placements []string, maxPriority int64) (int64, error) {
	due := int64(-1)
	if maxPriority == math.MaxInt64 {
		return due, nil
	}
	for _, p := range placements {
		r := j.sub.RangeOf(tuple.Tuple{keyPending, typ, p})
		r.Begin = j.sub.Pack(tuple.Tuple{keyPending, typ, p, maxPriority + 1})
		kvs, err := tx.Snapshot().GetRange(r, kv.RangeOptions{Limit: 1})
		if err != nil || len(kvs) == 0 {
			if err != nil {
				return 0, err
			}
			continue
		}
		t, err := j.sub.Unpack(kvs[0].Key)
		if err != nil || len(t) != 5 {
			return 0, fmt.Errorf("malformed pending entry: %v", err)
		}
		if prio, ok := t[3].(int64); ok && (due < 0 || prio < due) {
			due = prio
		}
	}
	return due, nil
}
