package jobs

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/couchjobs/couchjobs/runtime/kv"
	"github.com/couchjobs/couchjobs/runtime/tuple"
)

// monitorChecksPerTimeout is how many passes the activity monitor makes per
// activity timeout. couch_jobs makes one, so it re-enqueues a dead worker's
// job after one to two timeouts; five passes bound that to 1.2 timeouts.
const monitorChecksPerTimeout = 5

// Batch sizes of the monitor's re-enqueue transactions, adapted as
// couch_jobs does: start at 1,000, grow by 100 after a success, shrink by a
// quarter after a failure or a slow transaction.
const (
	requeueBatchStart = 1000
	requeueBatchStep  = 100
	requeueBatchMax   = 10_000
	requeueSlow       = 2 * time.Second
)

// mark is the type's activity versionstamp as one monitor pass saw it.
type mark struct {
	at time.Time
	vs tuple.Versionstamp
}

// RunMonitors runs an activity monitor for every registered job type,
// starting one for each type that appears (looking every
// Options.MonitorTypesEvery) and stopping the monitors of types that are
// cleared, until ctx is done. Every host runs it; monitors on many hosts
// are safe together, because each re-enqueue is a transaction that checks
// the job is still stale.
func (j *Jobs) RunMonitors(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	running := map[string]context.CancelFunc{}
	defer func() {
		for _, stop := range running {
			stop()
		}
	}()
	for {
		types, err := j.Types(ctx)
		if err != nil && ctx.Err() == nil {
			j.log.Warn("listing job types for the activity monitors failed", "error", err)
		}
		seen := map[string]bool{}
		for _, t := range types {
			seen[t.Name] = true
			if running[t.Name] != nil {
				continue
			}
			mctx, stop := context.WithCancel(ctx)
			running[t.Name] = stop
			wg.Go(func() {
				if err := j.Monitor(mctx, t.Name); err != nil && mctx.Err() == nil {
					j.log.Error("activity monitor stopped", "type", t.Name, "error", err)
				}
			})
		}
		for name, stop := range running {
			if !seen[name] {
				stop()
				delete(running, name)
			}
		}
		t := time.NewTimer(jitter(j.opts.MonitorTypesEvery))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		case <-j.typesChanged: // a type registered here: monitor it now
			t.Stop()
		}
	}
}

// Monitor re-enqueues the running jobs of typ whose workers stopped
// updating them, until ctx is done or the type is cleared.
//
// Every pass records the type's activity versionstamp, which every
// accept, update and finish advances. A running job whose activity entry
// is not newer than the versionstamp a pass recorded at least one timeout
// ago has not been updated for a whole timeout: it goes back to the queue.
func (j *Jobs) Monitor(ctx context.Context, typ string) error {
	var history []mark
	for {
		timeout, err := j.TypeTimeout(ctx, typ)
		switch {
		case errors.Is(err, ErrUnknownType):
			return nil
		case err != nil:
			if ctx.Err() != nil {
				return nil
			}
			j.log.Warn("activity monitor pass failed", "type", typ, "error", err)
		default:
			history, err = j.monitorPass(ctx, typ, timeout, history)
			if err != nil && ctx.Err() == nil {
				j.log.Warn("activity monitor pass failed", "type", typ, "error", err)
			}
		}
		period := max(timeout/monitorChecksPerTimeout, time.Millisecond)
		if err := kv.Sleep(ctx, jitter(period)); err != nil {
			return nil
		}
	}
}

// monitorPass records the activity versionstamp and re-enqueues the jobs
// stale against the newest mark at least a timeout old.
func (j *Jobs) monitorPass(ctx context.Context, typ string, timeout time.Duration, history []mark) ([]mark, error) {
	v, err := j.store.ReadTransact(ctx, func(tx kv.ReadTx) (any, error) {
		return tx.Snapshot().Get(j.watchActivityKey(typ))
	})
	if err != nil {
		return history, err
	}
	now := j.now()
	if b := v.([]byte); b != nil {
		t, err := tuple.Unpack(b)
		if err != nil || len(t) != 1 {
			return history, fmt.Errorf("corrupt activity versionstamp of type %s", typ)
		}
		vs, ok := t[0].(tuple.Versionstamp)
		if !ok {
			return history, fmt.Errorf("corrupt activity versionstamp of type %s", typ)
		}
		history = append(history, mark{at: now, vs: vs})
	}
	cut := -1
	for i, m := range history {
		if now.Sub(m.at) >= timeout {
			cut = i
		}
	}
	if cut < 0 {
		return history, nil
	}
	cutoff := history[cut].vs
	history = history[cut:]
	_, err = j.requeueStale(ctx, typ, cutoff)
	return history, err
}

// requeueStale re-enqueues every running job of typ whose activity entry
// is at or before cutoff, in adaptively sized batches, and returns how many
// it re-enqueued.
func (j *Jobs) requeueStale(ctx context.Context, typ string, cutoff tuple.Versionstamp) (int, error) {
	stale := kv.Range{
		Begin: j.sub.RangeOf(tuple.Tuple{keyActivity, typ}).Begin,
		End:   j.sub.RangeOf(tuple.Tuple{keyActivity, typ, cutoff}).End,
	}
	size, total, failures := requeueBatchStart, 0, 0
	for {
		type result struct {
			requeued []string
			more     bool
		}
		start := time.Now()
		v, err := j.store.Transact(ctx, func(tx kv.Tx) (any, error) {
			kvs, err := tx.GetRange(stale, kv.RangeOptions{Limit: size})
			if err != nil {
				return nil, err
			}
			var res result
			for _, e := range kvs {
				t, err := j.sub.Unpack(e.Key)
				if err != nil || len(t) != 4 {
					return nil, fmt.Errorf("malformed activity entry: %v", err)
				}
				vs, _ := t[2].(tuple.Versionstamp)
				id, _ := t[3].(string)
				tx.Clear(e.Key)
				r, err := j.load(tx, typ, id)
				if err != nil {
					return nil, err
				}
				if r == nil || r.state != Running || r.activityVS() != vs {
					continue // an entry left behind; clearing it is all
				}
				r.state, r.lock, r.due = Pending, nil, 0
				j.setPending(tx, typ, id, r)
				j.save(tx, typ, id, r, false)
				res.requeued = append(res.requeued, id)
			}
			if len(res.requeued) > 0 {
				j.bumpPending(tx, typ)
				j.touchType(tx, typ)
			}
			res.more = len(kvs) == size
			return res, nil
		})
		if err != nil {
			if ctx.Err() != nil {
				return total, ctx.Err()
			}
			failures++
			if size == 1 && failures > 3 {
				return total, fmt.Errorf("re-enqueue stale jobs of type %s: %w", typ, err)
			}
			size = max(1, size*3/4)
			j.log.Debug("re-enqueue batch failed; shrinking it", "type", typ, "batch", size, "error", err)
			continue
		}
		failures = 0
		if time.Since(start) > requeueSlow {
			size = max(1, size*3/4)
		} else {
			size = min(requeueBatchMax, size+requeueBatchStep)
		}
		res := v.(result)
		for _, id := range res.requeued {
			j.log.Info("re-enqueued a job whose worker stopped updating it", "type", typ, "id", id)
		}
		total += len(res.requeued)
		if !res.more {
			return total, nil
		}
	}
}

// jitter spreads d by up to a tenth, so that monitors on many hosts do not
// run in step.
func jitter(d time.Duration) time.Duration {
	if d < 10 {
		return d
	}
	return d + time.Duration(rand.Int64N(int64(d/10)))
}
