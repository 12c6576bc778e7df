package kv_test

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/couchjobs/couchjobs/runtime/kv"
	"github.com/couchjobs/couchjobs/runtime/tuple"
)

func TestSubspace(t *testing.T) {
	t.Parallel()
	jobs := kv.Sub("couch_jobs")
	data := jobs.Sub(1, "replication")
	if want := (tuple.Tuple{"couch_jobs", 1, "replication"}).Pack(); !bytes.Equal(data.Bytes(), want) {
		t.Fatalf("nested prefix = % x, want % x", data.Bytes(), want)
	}
	k := data.Pack(tuple.Tuple{"db1/doc"})
	if !data.Contains(k) || !jobs.Contains(k) || kv.Sub("other").Contains(k) {
		t.Fatal("Contains disagrees with the prefix")
	}
	back, err := data.Unpack(k)
	if err != nil || len(back) != 1 || back[0] != "db1/doc" {
		t.Fatalf("Unpack = %v, %v", back, err)
	}
	if _, err := kv.Sub("other").Unpack(k); err == nil {
		t.Fatal("Unpack of a key outside the subspace succeeded")
	}
	r := data.Range()
	if !r.Contains(k) || r.Contains(data.Bytes()) || r.Contains(jobs.Pack(tuple.Tuple{2})) {
		t.Fatal("Range holds the wrong keys")
	}
	if !data.RangeOf(tuple.Tuple{"db1/doc"}).Contains(data.Pack(tuple.Tuple{"db1/doc", 7})) {
		t.Fatal("RangeOf misses a longer tuple")
	}
	// Packing into a subspace never writes into the subspace's own prefix.
	a, b := data.Pack(tuple.Tuple{"a"}), data.Pack(tuple.Tuple{"b"})
	if bytes.Equal(a, b) || !bytes.Equal(data.Bytes(), jobs.Sub(1, "replication").Bytes()) {
		t.Fatal("Pack aliased the prefix")
	}
	raw := kv.SubspaceFromBytes([]byte{0x42})
	if got := raw.Pack(tuple.Tuple{1}); !bytes.Equal(got, []byte{0x42, 0x15, 0x01}) {
		t.Fatalf("raw prefix key = % x", got)
	}
}

func TestRanges(t *testing.T) {
	t.Parallel()
	cases := []struct {
		prefix, end []byte
	}{
		{[]byte("ab"), []byte("ac")},
		{[]byte{'a', 0xff}, []byte("b")},
		{[]byte{0xff, 0xff}, []byte{0xff}},
		{[]byte{}, []byte{0xff}},
	}
	for _, c := range cases {
		if r := kv.PrefixRange(c.prefix); !bytes.Equal(r.End, c.end) || !bytes.Equal(r.Begin, c.prefix) {
			t.Errorf("PrefixRange(% x) = [% x, % x), want end % x", c.prefix, r.Begin, r.End, c.end)
		}
	}
	r := kv.KeyRange([]byte("k"))
	if !r.Contains([]byte("k")) || r.Contains([]byte("k\x00")) || r.Contains([]byte("j")) {
		t.Error("KeyRange holds more or less than its key")
	}
}

func TestErrors(t *testing.T) {
	t.Parallel()
	err := fmt.Errorf("set doc: %w", kv.ErrKeyTooLarge.With("key of %d bytes", 20000))
	if !errors.Is(err, kv.ErrKeyTooLarge) || errors.Is(err, kv.ErrValueTooLarge) {
		t.Fatal("errors.Is does not match by code")
	}
	if got := err.Error(); got != "set doc: key_too_large (2102): key of 20000 bytes" {
		t.Fatalf("message = %q", got)
	}
	// An error from another backend with the same code matches.
	if !errors.Is(&kv.Error{Code: 1020, Name: "not_committed", Detail: "from fdb"}, kv.ErrNotCommitted) {
		t.Fatal("same code, other instance: no match")
	}
	for _, c := range []struct {
		err  error
		want bool
	}{
		{kv.ErrNotCommitted, true},
		{fmt.Errorf("wrapped: %w", kv.ErrTransactionTooOld), true},
		{kv.ErrCommitUnknownResult, true},
		{kv.ErrKeyTooLarge, false},
		{kv.ErrStoreClosed, false},
		{errors.New("plain"), false},
	} {
		if got := kv.IsRetryable(c.err); got != c.want {
			t.Errorf("IsRetryable(%v) = %v", c.err, got)
		}
	}
	if err := kv.CheckKey([]byte{0xff, 1}); !errors.Is(err, kv.ErrKeyOutsideLegalRange) {
		t.Errorf("CheckKey(system key) = %v", err)
	}
	if err := kv.CheckValue(make([]byte, kv.MaxValueSize+1)); !errors.Is(err, kv.ErrValueTooLarge) {
		t.Errorf("CheckValue(too large) = %v", err)
	}
}

func TestBackoff(t *testing.T) {
	t.Parallel()
	b := kv.Backoff{Min: time.Millisecond, Max: 8 * time.Millisecond}
	ceilings := []time.Duration{1, 2, 4, 8, 8, 8}
	for i, c := range ceilings {
		d := b.Next()
		if d < c*time.Millisecond/2 || d >= c*time.Millisecond {
			t.Fatalf("delay %d = %v, want in [%v, %v)", i, d, c*time.Millisecond/2, c*time.Millisecond)
		}
	}
	b.Reset()
	if d := b.Next(); d >= time.Millisecond {
		t.Fatalf("after Reset the delay is %v", d)
	}
}

func TestCounters(t *testing.T) {
	t.Parallel()
	for _, n := range []int64{0, 1, -1, 1 << 40, -(1 << 62)} {
		if got := kv.DecodeInt64(kv.EncodeInt64(n)); got != n {
			t.Errorf("round trip of %d gave %d", n, got)
		}
	}
	if got := kv.DecodeInt64([]byte{1}); got != 1 {
		t.Errorf("short counter decoded as %d", got)
	}
}

// Keys in a subspace sort by their tuples, so a range read over a subspace
// visits them in tuple order.
func ExampleSubspace() {
	queue := kv.Sub("couch_jobs", "pending", "replication")
	for _, prio := range []int{30, 5, 100} {
		fmt.Printf("%x\n", queue.Pack(tuple.Tuple{prio, "job"}))
	}
	r := queue.Range()
	fmt.Println(r.Contains(queue.Pack(tuple.Tuple{5, "job"})))
	// Output:
	// 02636f7563685f6a6f6273000270656e64696e6700027265706c69636174696f6e00151e026a6f6200
	// 02636f7563685f6a6f6273000270656e64696e6700027265706c69636174696f6e001505026a6f6200
	// 02636f7563685f6a6f6273000270656e64696e6700027265706c69636174696f6e001564026a6f6200
	// true
}
