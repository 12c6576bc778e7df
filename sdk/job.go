package sdk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	pluginv1 "github.com/couchjobs/couchjobs/sdk/proto/couchjobs/plugin/v1"
)

// Job is one run of a job, as its worker sees it.
type Job struct {
	// Type and ID identify the job.
	Type, ID string
	// Data is the job's data when the run started, a JSON object.
	Data json.RawMessage
	// Priority and Group are the job's schedule and share group.
	Priority int64
	Group    string

	run *run
	mu  sync.Mutex
	// result is the final data SetResult or the last Update set.
	result json.RawMessage
}

// Decode unmarshals the job's data into v.
func (j *Job) Decode(v any) error {
	if err := json.Unmarshal(j.Data, v); err != nil {
		return fmt.Errorf("job %s/%s: decode data: %w", j.Type, j.ID, err)
	}
	return nil
}

// SetResult sets the data the job is finished with when Run returns: a
// value that marshals to a JSON object.
func (j *Job) SetResult(v any) error {
	b, err := marshalObject(v)
	if err != nil {
		return err
	}
	j.mu.Lock()
	j.result = b
	j.mu.Unlock()
	return nil
}

// Host returns the host's services, for a plugin that manages jobs of its
// own types or reads its subspace.
func (j *Job) Host() *Host { return j.run.sess.srv.host }

// Update is a progress report.
type Update struct {
	// Data, if not nil, replaces the job's data; it must marshal to a JSON
	// object. It also becomes the final data unless SetResult overrides it.
	Data any
	// Writes go to the plugin's own subspace, in the same store
	// transaction as the job's update: they commit only while this node
	// still holds the job.
	Writes []Write
	// If are conditions on the plugin's subspace: the update (data and
	// writes) applies only if all hold, in the same transaction, and
	// otherwise Update returns ErrPrecondition and nothing applies: a
	// compare-and-set, say to claim a name for one job only.
	If []Condition
	// Fraction done (0 to 1; negative when unknown) and a message, for
	// display.
	Fraction float64
	Message  string
}

// Write is one change to the plugin's subspace.
type Write struct{ w *pluginv1.Write }

// Set writes value under key in the plugin's subspace.
func Set(key, value []byte) Write {
	return Write{&pluginv1.Write{Op: &pluginv1.Write_Set{Set: &pluginv1.KeyValue{Key: key, Value: value}}}}
}

// Clear removes key from the plugin's subspace.
func Clear(key []byte) Write {
	return Write{&pluginv1.Write{Op: &pluginv1.Write_Clear{Clear: key}}}
}

// ClearRange removes the keys in [begin, end) of the plugin's subspace.
func ClearRange(begin, end []byte) Write {
	return Write{&pluginv1.Write{Op: &pluginv1.Write_ClearRange{ClearRange: &pluginv1.Range{Begin: begin, End: end}}}}
}

// Condition is what one key of the plugin's subspace must hold for an
// update to apply.
type Condition struct{ c *pluginv1.Condition }

// Holds is the condition that key holds value.
func Holds(key, value []byte) Condition {
	return Condition{&pluginv1.Condition{Key: key, Value: value}}
}

// Absent is the condition that key does not exist.
func Absent(key []byte) Condition {
	return Condition{&pluginv1.Condition{Key: key, Absent: true}}
}

// ErrPrecondition: a condition of an update did not hold; nothing of the
// update applied. The run goes on.
var ErrPrecondition = errors.New("sdk: a condition of the update did not hold")

// Update sends a progress report and waits until the host stored it. It
// returns ErrConflict or ErrCanceled when the run must stop (its context
// is then canceled too), or the host's reason for refusing the update.
func (j *Job) Update(ctx context.Context, u Update) error {
	msg := &pluginv1.Update{Progress: &pluginv1.Progress{Fraction: u.Fraction, Message: u.Message}}
	if u.Data != nil {
		b, err := marshalObject(u.Data)
		if err != nil {
			return err
		}
		msg.Data = b
	}
	for _, w := range u.Writes {
		msg.Writes = append(msg.Writes, w.w)
	}
	for _, c := range u.If {
		msg.Conditions = append(msg.Conditions, c.c)
	}
	if err := j.run.update(ctx, msg); err != nil {
		return err
	}
	if msg.Data != nil {
		// Only data the host stored becomes the final data.
		j.mu.Lock()
		j.result = msg.Data
		j.mu.Unlock()
	}
	return nil
}

// Stopped reports whether the host stopped the run, and why. Call it when
// the run's context is done.
func Stopped(ctx context.Context) (StopReason, bool) {
	var s *stopError
	if errors.As(context.Cause(ctx), &s) {
		return s.reason, true
	}
	return "", false
}

// stopError is the cause of a stopped run's context.
type stopError struct{ reason StopReason }

func (s *stopError) Error() string { return fmt.Sprintf("%v: %s", ErrStopped, s.reason) }
func (s *stopError) Unwrap() error { return ErrStopped }

// marshalObject marshals v and checks it is a JSON object.
func marshalObject(v any) (json.RawMessage, error) {
	var b []byte
	switch v := v.(type) {
	case json.RawMessage:
		b = v
	case []byte:
		b = v
	default:
		var err error
		if b, err = json.Marshal(v); err != nil {
			return nil, fmt.Errorf("sdk: job data: %w", err)
		}
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(b, &obj); err != nil || obj == nil {
		return nil, fmt.Errorf("sdk: job data must be a JSON object: %.40s", b)
	}
	return b, nil
}
