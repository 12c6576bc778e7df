package jobs

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/couchjobs/couchjobs/runtime/kv"
	"github.com/couchjobs/couchjobs/runtime/tuple"
)

// Placement says which nodes may run a pending job: any node, one named
// node, or the nodes of a node group.
type Placement string

// AnyNode is the placement of jobs any node may run.
const AnyNode Placement = "*"

// OnNode places a job on the node with the given name.
func OnNode(name string) Placement { return Placement("node:" + name) }

// InGroup places a job on the nodes of a node group.
func InGroup(group string) Placement { return Placement("group:" + group) }

// OnNodes places a job on any one of the named nodes: "nodes:A,B". Node
// names cannot hold commas. One name is OnNode.
func OnNodes(names ...string) Placement {
	if len(names) == 1 {
		return OnNode(names[0])
	}
	return Placement("nodes:" + strings.Join(names, ","))
}

// normalize checks a placement and gives it its canonical form: a node
// list is sorted, without duplicates, and a list of one is OnNode.
func (p Placement) normalize() (Placement, error) {
	s := string(p)
	switch {
	case p == "" || p == AnyNode:
		return AnyNode, nil
	case strings.HasPrefix(s, "nodes:"):
		names := strings.Split(s[len("nodes:"):], ",")
		slices.Sort(names)
		names = slices.Compact(names)
		if slices.Contains(names, "") {
			return "", fmt.Errorf("%w: placement %q: a node list holds an empty name", ErrInvalid, p)
		}
		if len(names) > maxPlacementNodes {
			return "", fmt.Errorf("%w: placement %q: more than %d nodes", ErrInvalid, p, maxPlacementNodes)
		}
		p = OnNodes(names...)
	case strings.HasPrefix(s, "node:") && len(s) > len("node:"),
		strings.HasPrefix(s, "group:") && len(s) > len("group:"):
	default:
		return "", fmt.Errorf("%w: placement %q: want %q, \"node:NAME\", \"nodes:A,B\" or \"group:NAME\"", ErrInvalid, p, AnyNode)
	}
	if len(p) > MaxTypeSize {
		return "", fmt.Errorf("%w: placement of %d bytes exceeds %d", ErrInvalid, len(p), MaxTypeSize)
	}
	return p, nil
}

// maxPlacementNodes bounds a node list: each node is one pending entry.
const maxPlacementNodes = 64

// queues returns the pending queues a job with this (normalized)
// placement waits in: its own, or one per node of a node list, so that an
// acceptor still reads only the queues of its own node and groups.
func (p Placement) queues() []string {
	s := string(p)
	if !strings.HasPrefix(s, "nodes:") {
		return []string{s}
	}
	names := strings.Split(s[len("nodes:"):], ",")
	qs := make([]string, len(names))
	for i, n := range names {
		qs[i] = string(OnNode(n))
	}
	return qs
}

// NewJob describes a job to add.
type NewJob struct {
	// Type and ID identify the job. The type must be registered (it has an
	// activity timeout).
	Type, ID string
	// Data is the job's data, a JSON object; nil keeps the data of an
	// existing job (an empty object for a new one).
	Data json.RawMessage
	// Priority orders the pending queue: lower runs first, 0 (the
	// default) first of all. The fair-share scheduler sets it.
	Priority int64
	// At, if set and in the future, schedules the job: it is not accepted
	// before At, and then runs in priority order.
	At time.Time
	// Placement says which nodes may run the job; default AnyNode.
	Placement Placement
	// Group is the job's share group for the fair-share scheduler; default
	// the job's type.
	Group string
	// Exclusive makes Add fail with ErrJobExists if the id exists, as the
	// RFC says. Without it, adding an existing job follows couch_jobs: a
	// pending job takes the new data and schedule, a running job is flagged
	// for resubmission (and keeps its data), a finished job is enqueued
	// again.
	Exclusive bool
}

func (n *NewJob) check() error {
	if err := validName("job type", n.Type, MaxTypeSize); err != nil {
		return err
	}
	if err := validName("job id", n.ID, MaxIDSize); err != nil {
		return fmt.Errorf("%s: %w", n.Type, err)
	}
	if n.Priority < 0 || n.Priority > MaxPriority {
		return fmt.Errorf("%w: job %s/%s: priority %d outside 0..%d", ErrInvalid, n.Type, n.ID, n.Priority, int64(MaxPriority))
	}
	var err error
	if n.Placement, err = n.Placement.normalize(); err != nil {
		return fmt.Errorf("job %s/%s: %w", n.Type, n.ID, err)
	}
	if n.Group == "" {
		n.Group = n.Type
	} else if err := validName("share group", n.Group, MaxTypeSize); err != nil {
		return fmt.Errorf("job %s/%s: %w", n.Type, n.ID, err)
	}
	if n.Data != nil {
		if n.Data, err = checkData(n.Data); err != nil {
			return fmt.Errorf("job %s/%s: %w", n.Type, n.ID, err)
		}
	}
	return nil
}

// batch remembers, within one transaction, which types were checked and
// which need their pending counter bumped and their subscribers woken, so
// a batch pays for each once.
type batch struct {
	known   map[string]bool
	pending map[string]bool
	touched map[string]bool
}

func newBatch() *batch {
	return &batch{known: map[string]bool{}, pending: map[string]bool{}, touched: map[string]bool{}}
}

// typeCacheFor is how long a type seen registered is trusted without
// reading the registry again. Types are registered once and rarely
// cleared; a job added to a type cleared within this window is harmless.
const typeCacheFor = 5 * time.Second

func (j *Jobs) checkType(tx kv.ReadTx, b *batch, typ string) error {
	if b.known[typ] {
		return nil
	}
	j.mu.Lock()
	until, ok := j.types[typ]
	j.mu.Unlock()
	if !ok || j.now().After(until) {
		v, err := tx.Snapshot().Get(j.timeoutKey(typ))
		if err != nil {
			return err
		}
		if v == nil {
			return fmt.Errorf("%w %q: set its activity timeout first", ErrUnknownType, typ)
		}
		j.mu.Lock()
		j.types[typ] = j.now().Add(typeCacheFor)
		j.mu.Unlock()
	}
	b.known[typ] = true
	return nil
}

func (j *Jobs) flush(tx kv.Tx, b *batch) {
	for typ := range b.pending {
		j.bumpPending(tx, typ)
	}
	for typ := range b.touched {
		j.touchType(tx, typ)
	}
}

// Add adds a job in a transaction of its own.
func (j *Jobs) Add(ctx context.Context, n NewJob) error {
	_, err := j.store.Transact(ctx, func(tx kv.Tx) (any, error) { return nil, j.AddTx(tx, n) })
	return err
}

// AddTx adds a job inside the caller's transaction.
func (j *Jobs) AddTx(tx kv.Tx, n NewJob) error { return j.AddManyTx(tx, []NewJob{n}) }

// AddMany adds jobs in one transaction: all or none.
func (j *Jobs) AddMany(ctx context.Context, ns []NewJob) error {
	_, err := j.store.Transact(ctx, func(tx kv.Tx) (any, error) { return nil, j.AddManyTx(tx, ns) })
	return err
}

// AddManyTx adds jobs inside the caller's transaction. Each job id may
// appear once.
func (j *Jobs) AddManyTx(tx kv.Tx, ns []NewJob) error {
	b := newBatch()
	seen := make(map[[2]string]bool, len(ns))
	for _, n := range ns {
		if err := n.check(); err != nil {
			return err
		}
		if k := [2]string{n.Type, n.ID}; seen[k] {
			return fmt.Errorf("%w: job %s/%s appears twice in one batch", ErrInvalid, n.Type, n.ID)
		} else {
			seen[k] = true
		}
		if err := j.checkType(tx, b, n.Type); err != nil {
			return err
		}
		if err := j.upsert(tx, b, n, true); err != nil {
			return err
		}
	}
	j.flush(tx, b)
	return nil
}

// upsert applies a checked NewJob: it creates the job if create is set and
// it does not exist, and otherwise follows couch_jobs' re-add rules.
func (j *Jobs) upsert(tx kv.Tx, b *batch, n NewJob, create bool) error {
	r, err := j.load(tx, n.Type, n.ID)
	if err != nil {
		return err
	}
	now := j.now().UnixMilli()
	created := r == nil && create
	switch {
	case r == nil && !create:
		return fmt.Errorf("%w: %s/%s", ErrNotFound, n.Type, n.ID)
	case r == nil:
		data := n.Data
		if data == nil {
			data = []byte("{}")
		}
		r = &record{state: Pending, priority: n.Priority, placement: string(n.Placement), group: n.Group, created: now, data: data, due: dueMs(n.At)}
		j.enqueue(tx, b, n.Type, n.ID, r)
		if j.log.IsDebug() {
			j.log.Debug("job added", "type", n.Type, "id", n.ID, "priority", r.priority, "placement", r.placement)
		}
	case n.Exclusive:
		return fmt.Errorf("%w: %s/%s", ErrJobExists, n.Type, n.ID)
	case r.state == Pending:
		j.unlink(tx, n.Type, n.ID, r)
		r.priority, r.placement, r.group, r.due = n.Priority, string(n.Placement), n.Group, dueMs(n.At)
		if n.Data != nil {
			r.data = n.Data
		}
		j.enqueue(tx, b, n.Type, n.ID, r)
	case r.state == Running:
		// The worker finishes the current run; the job then goes back to
		// the queue with the new schedule. It keeps its data, which the
		// worker owns while it runs.
		r.resubmit = true
		r.priority, r.placement, r.group, r.due = n.Priority, string(n.Placement), n.Group, dueMs(n.At)
	case r.state == Finished:
		r.state, r.canceled, r.resubmit = Pending, false, false
		r.priority, r.placement, r.group, r.due = n.Priority, string(n.Placement), n.Group, dueMs(n.At)
		if n.Data != nil {
			r.data = n.Data
		}
		j.enqueue(tx, b, n.Type, n.ID, r)
	}
	j.save(tx, n.Type, n.ID, r, false)
	if created {
		// Nobody can be subscribed to a job that did not exist (such a
		// subscription ends at once), so a creation wakes no subscriber.
		return nil
	}
	b.touched[n.Type] = true
	return nil
}

// ResubmitOptions say how a user resubmits a job.
type ResubmitOptions struct {
	// Priority, if not zero, is the job's new priority; zero keeps it.
	Priority int64
	// At, if set and in the future, is when the job may run again.
	At time.Time
	// Data replaces the job's data if not nil (not for a running job).
	Data json.RawMessage
	// Placement, if not empty, is where the job runs next; empty keeps it.
	Placement Placement
}

// Resubmit asks for a job to run again: a pending job is rescheduled, a
// running one is flagged to go back to the queue when its worker finishes,
// a finished one is enqueued again.
func (j *Jobs) Resubmit(ctx context.Context, typ, id string, o ResubmitOptions) error {
	_, err := j.store.Transact(ctx, func(tx kv.Tx) (any, error) { return nil, j.ResubmitTx(tx, typ, id, o) })
	return err
}

// ResubmitTx is Resubmit inside the caller's transaction.
func (j *Jobs) ResubmitTx(tx kv.Tx, typ, id string, o ResubmitOptions) error {
	b := newBatch()
	r, err := j.load(tx, typ, id)
	if err != nil {
		return err
	}
	if r == nil {
		return fmt.Errorf("%w: %s/%s", ErrNotFound, typ, id)
	}
	prio := r.priority
	if o.Priority != 0 {
		prio = o.Priority
	}
	place := Placement(r.placement)
	if o.Placement != "" {
		place = o.Placement
	}
	n := NewJob{Type: typ, ID: id, Priority: prio, At: o.At, Data: o.Data, Placement: place, Group: r.group}
	if err := n.check(); err != nil {
		return err
	}
	if err := j.upsert(tx, b, n, false); err != nil {
		return err
	}
	j.flush(tx, b)
	return nil
}

// Remove deletes a job. If it is running, its worker's next Update, Finish
// or Resubmit fails with ErrCanceled; subscribers see NotFound.
func (j *Jobs) Remove(ctx context.Context, typ, id string) error {
	_, err := j.store.Transact(ctx, func(tx kv.Tx) (any, error) { return nil, j.RemoveTx(tx, typ, id) })
	return err
}

// RemoveTx is Remove inside the caller's transaction.
func (j *Jobs) RemoveTx(tx kv.Tx, typ, id string) error {
	r, err := j.load(tx, typ, id)
	if err != nil {
		return err
	}
	if r == nil {
		return fmt.Errorf("%w: %s/%s", ErrNotFound, typ, id)
	}
	j.unlink(tx, typ, id, r)
	tx.Clear(j.dataKey(typ, id))
	j.touchType(tx, typ)
	if r.state == Running {
		j.stopped(tx, typ)
	}
	j.log.Info("job removed", "type", typ, "id", id, "state", r.state)
	return nil
}

// Cancel stops a job: a pending job leaves the queue, a running job's
// worker gets ErrCanceled on its next call. The job is then finished, with
// Canceled set. Canceling a finished job changes nothing.
func (j *Jobs) Cancel(ctx context.Context, typ, id string) error {
	_, err := j.store.Transact(ctx, func(tx kv.Tx) (any, error) { return nil, j.CancelTx(tx, typ, id) })
	return err
}

// CancelTx is Cancel inside the caller's transaction.
func (j *Jobs) CancelTx(tx kv.Tx, typ, id string) error {
	r, err := j.load(tx, typ, id)
	if err != nil {
		return err
	}
	if r == nil {
		return fmt.Errorf("%w: %s/%s", ErrNotFound, typ, id)
	}
	if r.state == Finished {
		return nil
	}
	if r.state == Running {
		j.stopped(tx, typ)
	}
	j.unlink(tx, typ, id, r)
	r.state, r.lock, r.canceled, r.resubmit = Finished, nil, true, false
	j.save(tx, typ, id, r, false)
	j.touchType(tx, typ)
	j.log.Info("job canceled", "type", typ, "id", id)
	return nil
}

// unlink removes a job's queue or activity entry, whichever it has. A
// pending job with a due time is in the delayed queue, or in the pending
// queue if an acceptor promoted it: both entries are cleared.
func (j *Jobs) unlink(tx kv.Tx, typ, id string, r *record) {
	switch r.state {
	case Pending:
		j.clearPending(tx, typ, id, r)
		if r.due != 0 {
			tx.Clear(j.delayedKey(typ, r.due, id))
		}
	case Running:
		tx.Clear(j.activityKey(typ, r.activityVS(), id))
	}
}

// enqueue puts a pending job in the pending queue, or, if it is not due
// yet, in the delayed queue, and wakes blocked acceptors either way (they
// may need to wake earlier for the new due time).
func (j *Jobs) enqueue(tx kv.Tx, b *batch, typ, id string, r *record) {
	if r.due > j.nowMs() {
		tx.Set(j.delayedKey(typ, r.due, id), nil)
	} else {
		j.setPending(tx, typ, id, r)
	}
	b.pending[typ] = true
}

// dueMs is the due time of a job scheduled at t: 0 for the zero time.
func dueMs(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return max(t.UnixMilli(), 1)
}

// pendingValue is a pending entry's value: the job's share group, so that
// acceptors and the scheduler see groups without reading job records, and
// for the entries of a node-list job after its first a mark, so that
// counts see the job once.
func pendingValue(group string, secondary bool) []byte {
	if secondary {
		return tuple.Tuple{group, true}.Pack()
	}
	return tuple.Tuple{group}.Pack()
}

// decodePendingValue reads a pending entry's value. Stores written before
// entries held groups have empty values, or 0x01 for a secondary entry.
func decodePendingValue(v []byte) (group string, secondary bool) {
	switch {
	case len(v) == 0:
		return "", false
	case len(v) == 1 && v[0] == 1:
		return "", true
	}
	t, err := tuple.Unpack(v)
	if err != nil || len(t) == 0 {
		return "", false
	}
	group, _ = t[0].(string)
	return group, len(t) > 1
}

// setPending writes a due pending job's queue entries, and their entries
// in the queue by group, where a ranking acceptor finds a group's jobs
// however far back the queue holds them.
func (j *Jobs) setPending(tx kv.Tx, typ, id string, r *record) {
	for i, q := range Placement(r.placement).queues() {
		tx.Set(j.pendingKey(typ, q, r.priority, id), pendingValue(r.group, i > 0))
		var mark []byte
		if i > 0 {
			mark = []byte{1} // counted once, like the queue's own entries
		}
		tx.Set(j.groupIndexKey(typ, r.group, q, r.priority, id), mark)
	}
}

// clearPending removes a pending job's queue entries.
func (j *Jobs) clearPending(tx kv.Tx, typ, id string, r *record) {
	for _, q := range Placement(r.placement).queues() {
		tx.Clear(j.pendingKey(typ, q, r.priority, id))
		tx.Clear(j.groupIndexKey(typ, r.group, q, r.priority, id))
	}
}
