package jobs

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/couchjobs/couchjobs/runtime/kv"
	"github.com/couchjobs/couchjobs/runtime/tuple"
)

// Info is what Get and List report about a job.
type Info struct {
	Type, ID string
	State    State
	// Data is the job's JSON data.
	Data      json.RawMessage
	Priority  int64
	Placement Placement
	Group     string
	// Resubmit: a user asked the running job to run again when it ends.
	Resubmit bool
	// Canceled: the job was canceled (it is finished).
	Canceled bool
	// Created and Updated are the times the job was first added and last
	// changed.
	Created, Updated time.Time
	// Version is the versionstamp of the job's last change; it orders the
	// changes of one job.
	Version tuple.Versionstamp
	// Due is the time before which the job may not run; zero if none.
	Due time.Time
}

func (r *record) info(typ, id string) Info {
	in := Info{
		Type: typ, ID: id, State: r.state, Data: r.data, Priority: r.priority,
		Placement: Placement(r.placement), Group: r.group, Resubmit: r.resubmit, Canceled: r.canceled,
		Created: time.UnixMilli(r.created), Updated: time.UnixMilli(r.updated), Version: r.vs,
	}
	if r.due != 0 {
		in.Due = time.UnixMilli(r.due)
	}
	return in
}

// Get returns a job's state and data, or ErrNotFound.
func (j *Jobs) Get(ctx context.Context, typ, id string) (Info, error) {
	v, err := j.store.ReadTransact(ctx, func(tx kv.ReadTx) (any, error) { return j.GetTx(tx, typ, id) })
	if err != nil {
		return Info{}, err
	}
	return v.(Info), nil
}

// GetTx is Get inside the caller's transaction.
func (j *Jobs) GetTx(tx kv.ReadTx, typ, id string) (Info, error) {
	r, err := j.load(tx, typ, id)
	if err != nil {
		return Info{}, err
	}
	if r == nil {
		return Info{}, fmt.Errorf("%w: %s/%s", ErrNotFound, typ, id)
	}
	return r.info(typ, id), nil
}

// ListOptions page through a type's jobs.
type ListOptions struct {
	// After lists the jobs whose ids sort after it; "" starts at the first.
	After string
	// Limit is the most jobs returned; default 100.
	Limit int
	// State, if set, lists only jobs in that state.
	State State
}

// maxScanned bounds the records one List call reads when a state filter
// skips most of them, to keep each call's transaction short.
const maxScanned = 10_000

// List returns a page of a type's jobs in id order, and the id to pass as
// After for the next page ("" when there is none).
func (j *Jobs) List(ctx context.Context, typ string, o ListOptions) ([]Info, string, error) {
	limit := o.Limit
	if limit <= 0 {
		limit = 100
	}
	type page struct {
		infos []Info
		next  string
	}
	v, err := j.store.ReadTransact(ctx, func(tx kv.ReadTx) (any, error) {
		var p page
		r := j.sub.RangeOf(tuple.Tuple{keyData, typ})
		if o.After != "" {
			r.Begin = append(j.dataKey(typ, o.After), 0x00)
		}
		scanned, exhausted := 0, false
	scan:
		for len(p.infos) < limit && scanned < maxScanned {
			chunk := limit - len(p.infos)
			if o.State != "" {
				chunk = max(chunk, 256) // most records may not match
			}
			kvs, err := tx.GetRange(r, kv.RangeOptions{Limit: chunk})
			if err != nil {
				return nil, err
			}
			for i, e := range kvs {
				t, err := j.sub.Unpack(e.Key)
				if err != nil || len(t) != 3 {
					return nil, fmt.Errorf("malformed job key: %v", err)
				}
				id, _ := t[2].(string)
				rec, err := decodeRecord(e.Value)
				if err != nil {
					return nil, fmt.Errorf("job %s/%s: %w", typ, id, err)
				}
				if o.State == "" || rec.state == o.State {
					p.infos = append(p.infos, rec.info(typ, id))
				}
				p.next = id
				r.Begin = append(e.Key, 0x00)
				scanned++
				if len(p.infos) == limit {
					exhausted = len(kvs) < chunk && i == len(kvs)-1
					break scan
				}
			}
			if len(kvs) < chunk {
				exhausted = true
				break
			}
		}
		if exhausted {
			p.next = ""
		}
		return p, nil
	})
	if err != nil {
		return nil, "", err
	}
	p := v.(page)
	return p.infos, p.next, nil
}

// Fold calls fn for every job of a type, in id order, reading a page per
// transaction; it stops at fn's first error and returns it.
func (j *Jobs) Fold(ctx context.Context, typ string, o ListOptions, fn func(Info) error) error {
	for {
		infos, next, err := j.List(ctx, typ, o)
		if err != nil {
			return err
		}
		for _, in := range infos {
			if err := fn(in); err != nil {
				return err
			}
		}
		if next == "" {
			return nil
		}
		o.After = next
	}
}

// PendingCount counts a type's pending jobs that are due, with a priority
// of at most maxPriority (0: any), up to limit (0: 1,024), across every
// placement. It reads a snapshot: concurrent changes do not make the
// caller's transaction retry.
func (j *Jobs) PendingCount(ctx context.Context, typ string, maxPriority int64, limit int) (int, error) {
	v, err := j.store.ReadTransact(ctx, func(tx kv.ReadTx) (any, error) {
		return j.PendingCountTx(tx, typ, maxPriority, limit)
	})
	if err != nil {
		return 0, err
	}
	return v.(int), nil
}

// PendingCountTx is PendingCount inside the caller's transaction.
func (j *Jobs) PendingCountTx(tx kv.ReadTx, typ string, maxPriority int64, limit int) (int, error) {
	if maxPriority <= 0 {
		maxPriority = math.MaxInt64
	}
	if limit <= 0 {
		limit = 1024
	}
	snap := tx.Snapshot()
	// Delayed jobs already due count: an acceptor would promote them.
	due, err := snap.GetRange(kv.Range{
		Begin: j.sub.RangeOf(tuple.Tuple{keyDelayed, typ}).Begin,
		End:   j.sub.RangeOf(tuple.Tuple{keyDelayed, typ, j.nowMs()}).End,
	}, kv.RangeOptions{Limit: limit})
	if err != nil {
		return 0, err
	}
	count := len(due)
	all := j.sub.RangeOf(tuple.Tuple{keyPending, typ})
	begin := all.Begin
	// Visit each placement's queue: find its first entry, count its
	// eligible head, and skip to the next placement.
	for count < limit {
		first, err := snap.GetRange(kv.Range{Begin: begin, End: all.End}, kv.RangeOptions{Limit: 1})
		if err != nil {
			return 0, err
		}
		if len(first) == 0 {
			break
		}
		t, err := j.sub.Unpack(first[0].Key)
		if err != nil || len(t) != 5 {
			return 0, fmt.Errorf("malformed pending entry: %v", err)
		}
		p, _ := t[2].(string)
		queue := j.sub.RangeOf(tuple.Tuple{keyPending, typ, p})
		eligible := kv.Range{Begin: queue.Begin, End: j.sub.RangeOf(tuple.Tuple{keyPending, typ, p, maxPriority}).End}
		if maxPriority == math.MaxInt64 {
			eligible.End = queue.End
		}
		for count < limit {
			want := limit - count
			kvs, err := snap.GetRange(eligible, kv.RangeOptions{Limit: want})
			if err != nil {
				return 0, err
			}
			for _, e := range kvs {
				if _, secondary := decodePendingValue(e.Value); !secondary { // a node-list job counts once
					count++
				}
			}
			if len(kvs) < want {
				break
			}
			eligible.Begin = append(slices.Clip(kvs[len(kvs)-1].Key), 0)
		}
		begin = queue.End
	}
	return count, nil
}

// TypeInfo describes a registered job type.
type TypeInfo struct {
	Name string
	// Timeout is the type's activity timeout: a running job whose worker
	// has not updated it for this long is re-enqueued.
	Timeout time.Duration
}

// SetTypeTimeout registers a job type, or changes its activity timeout.
func (j *Jobs) SetTypeTimeout(ctx context.Context, typ string, timeout time.Duration) error {
	if err := validName("job type", typ, MaxTypeSize); err != nil {
		return err
	}
	if timeout < time.Millisecond {
		return fmt.Errorf("%w: activity timeout %v of type %s is under 1ms", ErrInvalid, timeout, typ)
	}
	_, err := j.store.Transact(ctx, func(tx kv.Tx) (any, error) {
		tx.Set(j.timeoutKey(typ), tuple.Tuple{timeout.Milliseconds()}.Pack())
		return nil, nil
	})
	if err == nil {
		select {
		case j.typesChanged <- struct{}{}:
		default:
		}
	}
	return err
}

// TypeTimeout returns a type's activity timeout, or ErrUnknownType.
func (j *Jobs) TypeTimeout(ctx context.Context, typ string) (time.Duration, error) {
	v, err := j.store.ReadTransact(ctx, func(tx kv.ReadTx) (any, error) { return tx.Get(j.timeoutKey(typ)) })
	if err != nil {
		return 0, err
	}
	if v.([]byte) == nil {
		return 0, fmt.Errorf("%w %q", ErrUnknownType, typ)
	}
	return decodeTimeout(v.([]byte))
}

func decodeTimeout(b []byte) (time.Duration, error) {
	t, err := tuple.Unpack(b)
	if err != nil || len(t) != 1 {
		return 0, fmt.Errorf("corrupt activity timeout %x", b)
	}
	ms, ok := t[0].(int64)
	if !ok {
		return 0, fmt.Errorf("corrupt activity timeout %v", t)
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// ClearTypeTimeout unregisters a type: jobs can no longer be added to it.
// Its existing jobs are left alone.
func (j *Jobs) ClearTypeTimeout(ctx context.Context, typ string) error {
	_, err := j.store.Transact(ctx, func(tx kv.Tx) (any, error) {
		tx.Clear(j.timeoutKey(typ))
		return nil, nil
	})
	j.mu.Lock()
	delete(j.types, typ)
	j.mu.Unlock()
	return err
}

// Types lists the registered job types.
func (j *Jobs) Types(ctx context.Context) ([]TypeInfo, error) {
	v, err := j.store.ReadTransact(ctx, func(tx kv.ReadTx) (any, error) {
		return tx.GetRange(j.sub.RangeOf(tuple.Tuple{keyActivityTimeout}), kv.RangeOptions{})
	})
	if err != nil {
		return nil, err
	}
	var out []TypeInfo
	for _, e := range v.([]kv.KeyValue) {
		t, err := j.sub.Unpack(e.Key)
		if err != nil || len(t) != 2 {
			return nil, fmt.Errorf("malformed type key: %v", err)
		}
		name, _ := t[1].(string)
		d, err := decodeTimeout(e.Value)
		if err != nil {
			return nil, fmt.Errorf("type %s: %w", name, err)
		}
		out = append(out, TypeInfo{Name: name, Timeout: d})
	}
	return out, nil
}

// PendingGroups counts a type's due pending jobs by share group, up to
// limit per group (0: 10,000), from the queue by group: the scheduler's
// view of who waits, at a cost bounded by the number of groups waiting.
// Jobs queued before the queue by group existed are not seen.
func (j *Jobs) PendingGroups(ctx context.Context, typ string, limit int) (map[string]int, error) {
	if limit <= 0 {
		limit = 10_000
	}
	v, err := j.store.ReadTransact(ctx, func(tx kv.ReadTx) (any, error) {
		snap := tx.Snapshot()
		all := j.sub.RangeOf(tuple.Tuple{keyGroupIndex, typ})
		begin := all.Begin
		counts := map[string]int{}
		for {
			first, err := snap.GetRange(kv.Range{Begin: begin, End: all.End}, kv.RangeOptions{Limit: 1})
			if err != nil {
				return nil, err
			}
			if len(first) == 0 {
				return counts, nil
			}
			t, err := j.sub.Unpack(first[0].Key)
			if err != nil || len(t) != 6 {
				return nil, fmt.Errorf("malformed group index entry: %v", err)
			}
			g, _ := t[2].(string)
			group := j.sub.RangeOf(tuple.Tuple{keyGroupIndex, typ, g})
			kvs, err := snap.GetRange(group, kv.RangeOptions{Limit: limit})
			if err != nil {
				return nil, err
			}
			for _, e := range kvs {
				if len(e.Value) == 0 {
					counts[g]++
				}
			}
			begin = group.End
		}
	})
	if err != nil {
		return nil, fmt.Errorf("pending groups of %s: %w", typ, err)
	}
	return v.(map[string]int), nil
}
