package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/couchjobs/couchjobs/runtime/kv"
	"github.com/couchjobs/couchjobs/runtime/tuple"
)

// Job is a running job as its worker holds it: Accept returns it, and its
// methods update, finish or resubmit it inside the worker's transaction.
// Each method first checks that the worker still holds the job's lock, so
// writes made in the same transaction commit only while it does.
type Job struct {
	Type, ID string
	// Lock is the worker lock Accept took; it is the worker's proof of
	// ownership.
	Lock tuple.UUID
	// Data is the job's data when it was accepted.
	Data json.RawMessage
	// Priority, Placement and Group are the job's schedule.
	Priority  int64
	Placement Placement
	Group     string
	// ResubmitRequested is set by Update when a user asked, while the job ran, for
	// it to run again; Finish will then put it back in the queue.
	ResubmitRequested bool

	j *Jobs
}

// Bind returns the handle of a job held under lock, for a worker that
// knows its job only by type, id and lock (one restarted from a
// checkpoint, or a test simulating a late worker).
func (j *Jobs) Bind(typ, id string, lock tuple.UUID) *Job {
	return &Job{Type: typ, ID: id, Lock: lock, j: j}
}

// owned reads the job and checks the worker still holds it.
func (job *Job) owned(tx kv.Tx) (*record, error) {
	r, err := job.j.load(tx, job.Type, job.ID)
	switch {
	case err != nil:
		return nil, err
	case r == nil:
		return nil, fmt.Errorf("%s/%s: %w (removed)", job.Type, job.ID, ErrCanceled)
	case r.canceled:
		return nil, fmt.Errorf("%s/%s: %w", job.Type, job.ID, ErrCanceled)
	case r.state != Running || r.lock == nil || *r.lock != job.Lock:
		return nil, fmt.Errorf("%s/%s: %w", job.Type, job.ID, ErrWorkerConflict)
	}
	return r, nil
}

// begin starts every worker call: it checks the worker still holds the
// job, takes the new data (nil keeps the data), and removes the job's
// activity entry, which the call replaces or ends.
func (job *Job) begin(tx kv.Tx, op string, data json.RawMessage) (*record, error) {
	r, err := job.owned(tx)
	if err != nil {
		return nil, err
	}
	if data != nil {
		if r.data, err = checkData(data); err != nil {
			return nil, fmt.Errorf("%s %s/%s: %w", op, job.Type, job.ID, err)
		}
	}
	tx.Clear(job.j.activityKey(job.Type, r.activityVS(), job.ID))
	return r, nil
}

// Update records the worker's progress: new data (nil keeps the data) and
// fresh activity, which keeps the activity monitor from re-enqueueing the
// job. It fails with ErrWorkerConflict or ErrCanceled when the worker must
// stop.
func (job *Job) Update(tx kv.Tx, data json.RawMessage) error {
	r, err := job.begin(tx, "update", data)
	if err != nil {
		return err
	}
	tx.SetVersionstampedKey(job.j.stampedActivityKey(job.Type, job.ID), nil)
	job.j.save(tx, job.Type, job.ID, r, true)
	job.j.touchType(tx, job.Type)
	job.ResubmitRequested = r.resubmit
	return nil
}

// Finish ends the run with final data (nil keeps the data). The job is
// finished, or, if it was resubmitted while it ran, pending again.
func (job *Job) Finish(tx kv.Tx, data json.RawMessage) error {
	b := newBatch()
	if err := job.finish(tx, b, data); err != nil {
		return err
	}
	job.j.flush(tx, b)
	return nil
}

func (job *Job) finish(tx kv.Tx, b *batch, data json.RawMessage) error {
	r, err := job.begin(tx, "finish", data)
	if err != nil {
		return err
	}
	r.lock = nil
	if r.resubmit {
		r.state, r.resubmit = Pending, false
		job.j.enqueue(tx, b, job.Type, job.ID, r)
	} else {
		r.state = Finished
	}
	job.j.save(tx, job.Type, job.ID, r, false)
	b.touched[job.Type] = true
	return nil
}

// Resubmit ends the run and puts the job back in the queue: due at o.At
// (the zero time: at once), with o.Priority (zero keeps the priority) and
// o.Data (nil keeps the data).
func (job *Job) Resubmit(tx kv.Tx, o ResubmitOptions) error {
	n := NewJob{Type: job.Type, ID: job.ID, Priority: o.Priority, At: o.At, Data: o.Data, Placement: o.Placement}
	if err := n.check(); err != nil {
		return err
	}
	r, err := job.begin(tx, "resubmit", n.Data)
	if err != nil {
		return err
	}
	r.state, r.lock, r.resubmit, r.due = Pending, nil, false, dueMs(o.At)
	if o.Priority != 0 {
		r.priority = o.Priority
	}
	if o.Placement != "" {
		r.placement = string(n.Placement)
	}
	b := newBatch()
	job.j.enqueue(tx, b, job.Type, job.ID, r)
	job.j.save(tx, job.Type, job.ID, r, false)
	b.touched[job.Type] = true
	job.j.flush(tx, b)
	return nil
}

// Update runs job.Update in a transaction of its own.
func (j *Jobs) Update(ctx context.Context, job *Job, data json.RawMessage) error {
	_, err := j.store.Transact(ctx, func(tx kv.Tx) (any, error) { return nil, job.Update(tx, data) })
	return err
}

// Finish runs job.Finish in a transaction of its own.
func (j *Jobs) Finish(ctx context.Context, job *Job, data json.RawMessage) error {
	_, err := j.store.Transact(ctx, func(tx kv.Tx) (any, error) { return nil, job.Finish(tx, data) })
	return err
}

// Done pairs a job with its final data, for FinishMany.
type Done struct {
	Job  *Job
	Data json.RawMessage
}

// FinishMany finishes jobs in one transaction. A job that fails its lock
// check (ErrWorkerConflict, ErrCanceled) or its data check (ErrInvalid)
// does not stop the others: its error is in the returned slice, at its
// index, and nothing was written for it. The error return is the
// transaction's: a store error fails them all.
func (j *Jobs) FinishMany(ctx context.Context, done []Done) ([]error, error) {
	v, err := j.store.Transact(ctx, func(tx kv.Tx) (any, error) { return j.FinishManyTx(tx, done) })
	if err != nil {
		return nil, err
	}
	return v.([]error), nil
}

// FinishManyTx is FinishMany inside the caller's transaction.
func (j *Jobs) FinishManyTx(tx kv.Tx, done []Done) ([]error, error) {
	b := newBatch()
	errs := make([]error, len(done))
	for i, d := range done {
		err := d.Job.finish(tx, b, d.Data)
		if err != nil && !errors.Is(err, ErrWorkerConflict) && !errors.Is(err, ErrCanceled) && !errors.Is(err, ErrInvalid) {
			return nil, err
		}
		errs[i] = err
	}
	j.flush(tx, b)
	return errs, nil
}
