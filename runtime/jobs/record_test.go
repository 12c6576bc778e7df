package jobs

import (
	"testing"

	"github.com/couchjobs/couchjobs/runtime/tuple"
)

func TestRecordRoundTrip(t *testing.T) {
	t.Parallel()
	lock := tuple.UUID{1, 2, 3}
	act := tuple.Versionstamp{TransactionVersion: [10]byte{9}}
	r := &record{state: Running, activity: &act, lock: &lock, priority: 42, resubmit: true,
		placement: "node:a", group: "g", created: 1, updated: 2, data: []byte(`{"a":1}`)}
	enc := r.encode(false)
	// Fill in the versionstamp as the store would at commit.
	off := int(enc[len(enc)-4]) | int(enc[len(enc)-3])<<8
	b := append([]byte(nil), enc[:len(enc)-4]...)
	copy(b[off:], []byte{0, 0, 0, 0, 0, 0, 0, 7, 0, 0})
	got, err := decodeRecord(b)
	if err != nil {
		t.Fatal(err)
	}
	if got.state != Running || *got.lock != lock || got.activityVS() != act || got.priority != 42 ||
		!got.resubmit || got.placement != "node:a" || got.group != "g" || string(got.data) != `{"a":1}` {
		t.Fatalf("round trip gave %+v", got)
	}
	if got.vs.TransactionVersion[7] != 7 {
		t.Fatalf("vs = %v", got.vs)
	}
}

// FuzzDecodeRecord feeds arbitrary bytes to the record decoder: a corrupt
// record is an error, never a panic.
func FuzzDecodeRecord(f *testing.F) {
	r := &record{state: Pending, placement: "*", group: "g", data: []byte(`{}`)}
	enc := r.encode(false)
	f.Add(enc[:len(enc)-4])
	f.Add([]byte{0x15, 0x01})
	f.Add(tuple.Tuple{1, "running", nil, nil, nil, 1, true, false, "*", "g", 1, 2, []byte("{}")}.Pack())
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeRecord(b)
		if err == nil && r.state != Pending && r.state != Running && r.state != Finished {
			t.Fatalf("decoded state %q", r.state)
		}
	})
}
