package jobs

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/couchjobs/couchjobs/runtime/kv"
	"github.com/couchjobs/couchjobs/runtime/tuple"
)

// recordFormat is the version of the job record encoding.
const recordFormat = 2

// record is a job's entry in the job table, (data, type, id). It is stored
// as a packed tuple:
//
//	(format, state, vs, activity, lock, priority, resubmit, canceled,
//	 placement, group, created, updated, data, due)
//
// vs is the versionstamp of the record's last change, written by the store
// at commit, so subscribers see every change. activity is the versionstamp
// of the job's activity entry while it runs; nil means "the same as vs",
// because one value can hold only one versionstamp the store fills in.
type record struct {
	state     State
	vs        tuple.Versionstamp
	activity  *tuple.Versionstamp
	lock      *tuple.UUID
	priority  int64
	resubmit  bool
	canceled  bool
	placement string
	group     string
	created   int64 // Unix milliseconds
	updated   int64
	data      []byte // a JSON object
	// due is the Unix time in milliseconds before which the job may not
	// run; 0 for a job due at once. A pending job whose due time had not
	// come when it was enqueued waits in the delayed queue until an
	// acceptor promotes it.
	due int64
}

// activityVS returns the versionstamp of the job's activity entry.
func (r *record) activityVS() tuple.Versionstamp {
	if r.activity != nil {
		return *r.activity
	}
	return r.vs
}

// encode packs the record for SetVersionstampedValue. If stampActivity is
// set, the activity entry is the one written in this transaction.
func (r *record) encode(stampActivity bool) []byte {
	var activity tuple.Element
	if r.state == Running && !stampActivity {
		activity = r.activityVS()
	}
	var lock tuple.Element
	if r.lock != nil {
		lock = *r.lock
	}
	t := tuple.Tuple{
		recordFormat, string(r.state), tuple.IncompleteVersionstamp(0), activity, lock,
		r.priority, r.resubmit, r.canceled, r.placement, r.group, r.created, r.updated, r.data, r.due,
	}
	v, err := t.PackWithVersionstamp(nil)
	if err != nil {
		panic(err) // exactly one incomplete versionstamp
	}
	return v
}

// recordOverhead bounds the bytes a record adds to its data, to check data
// against the store's value limit before writing.
const recordOverhead = 512

func decodeRecord(b []byte) (*record, error) {
	t, err := tuple.Unpack(b)
	if err != nil {
		return nil, fmt.Errorf("corrupt job record: %w", err)
	}
	if len(t) != 14 {
		return nil, fmt.Errorf("corrupt job record: %d fields, want 14", len(t))
	}
	if f, ok := t[0].(int64); !ok || f != recordFormat {
		return nil, fmt.Errorf("job record format %v is not %d, the one this build reads", t[0], recordFormat)
	}
	r := &record{}
	var ok [13]bool
	var state string
	state, ok[0] = t[1].(string)
	r.state = State(state)
	r.vs, ok[1] = t[2].(tuple.Versionstamp)
	switch a := t[3].(type) {
	case nil:
		ok[2] = true
	case tuple.Versionstamp:
		r.activity, ok[2] = &a, true
	}
	switch l := t[4].(type) {
	case nil:
		ok[3] = true
	case tuple.UUID:
		r.lock, ok[3] = &l, true
	}
	r.priority, ok[4] = t[5].(int64)
	r.resubmit, ok[5] = t[6].(bool)
	r.canceled, ok[6] = t[7].(bool)
	r.placement, ok[7] = t[8].(string)
	r.group, ok[8] = t[9].(string)
	r.created, ok[9] = t[10].(int64)
	r.updated, ok[10] = t[11].(int64)
	r.data, ok[11] = t[12].([]byte)
	r.due, ok[12] = t[13].(int64)
	for i, good := range ok {
		if !good {
			return nil, fmt.Errorf("corrupt job record: field %d has type %T", i+1, t[i+1])
		}
	}
	switch r.state {
	case Pending, Running, Finished:
	default:
		return nil, fmt.Errorf("corrupt job record: state %q", r.state)
	}
	return r, nil
}

// load reads a job's record; nil if there is none.
func (j *Jobs) load(tx kv.ReadTx, typ, id string) (*record, error) {
	b, err := tx.Get(j.dataKey(typ, id))
	if err != nil || b == nil {
		return nil, err
	}
	r, err := decodeRecord(b)
	if err != nil {
		return nil, fmt.Errorf("job %s/%s: %w", typ, id, err)
	}
	return r, nil
}

// save writes a job's record, stamped with this transaction's versionstamp.
func (j *Jobs) save(tx kv.Tx, typ, id string, r *record, stampActivity bool) {
	r.updated = j.now().UnixMilli()
	tx.SetVersionstampedValue(j.dataKey(typ, id), r.encode(stampActivity))
}

// checkData validates job data: a JSON object small enough to store. Empty
// data means an empty object.
func checkData(data []byte) ([]byte, error) {
	if len(data) == 0 {
		return []byte("{}"), nil
	}
	if limit := kv.MaxValueSize - recordOverhead; len(data) > limit {
		return nil, fmt.Errorf("%w: job data of %d bytes exceeds the limit of %d (the store's value limit less the job record)", ErrInvalid, len(data), limit)
	}
	trimmed := bytes.TrimLeft(data, " \t\r\n")
	if len(trimmed) == 0 || trimmed[0] != '{' || !json.Valid(data) {
		return nil, fmt.Errorf("%w: job data is not a JSON object: %s", ErrInvalid, firstBytes(data))
	}
	return data, nil
}

func firstBytes(b []byte) string {
	if len(b) > 40 {
		return string(b[:40]) + "…"
	}
	return string(b)
}
