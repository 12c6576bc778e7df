package kvtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/couchjobs/couchjobs/runtime/kv"
	"github.com/couchjobs/couchjobs/runtime/tuple"
)

// Run runs the conformance suite against b.
func Run(t *testing.T, b Backend) {
	tests := []struct {
		name string
		fn   func(*testing.T, Backend)
	}{
		{"GetSetClear", testGetSetClear},
		{"ReadYourWrites", testReadYourWrites},
		{"GetRange", testGetRange},
		{"ClearRange", testClearRange},
		{"Add", testAdd},
		{"Rollback", testRollback},
		{"Limits", testLimits},
		{"Versionstamps", testVersionstamps},
		{"VersionstampErrors", testVersionstampErrors},
		{"SerializableIncrements", testSerializableIncrements},
		{"ConsistentSnapshots", testConsistentSnapshots},
		{"RetryableErrorsRetry", testRetryableErrorsRetry},
		{"Cancellation", testCancellation},
		{"TransactionTimeLimit", testTransactionTimeLimit},
		{"WatchFiresAfterCommit", testWatchFiresAfterCommit},
		{"WatchNotFiredByRollback", testWatchNotFiredByRollback},
		{"WatchCancelAndFailure", testWatchCancelAndFailure},
		{"WatchAcrossProcesses", testWatchAcrossProcesses},
		{"IncrementsAcrossProcesses", testIncrementsAcrossProcesses},
		{"VersionstampsAcrossProcesses", testVersionstampsAcrossProcesses},
		{"CrashSafety", testCrashSafety},
		{"Close", testClose},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, b)
		})
	}
}

// transact runs fn and fails t on error.
func transact(t testing.TB, s kv.Transactor, fn func(kv.Tx) (any, error)) any {
	t.Helper()
	v, err := s.Transact(context.Background(), fn)
	if err != nil {
		t.Fatalf("transaction failed: %v", err)
	}
	return v
}

func key(sub kv.Subspace, elems ...tuple.Element) []byte { return sub.Pack(tuple.Tuple(elems)) }

func testGetSetClear(t *testing.T, b Backend) {
	s, _ := b.Open(t)
	sub := NewSubspace(t, s)
	k := key(sub, "k")
	if v := Get(t, s, k); v != nil {
		t.Fatalf("absent key read as %q, want nil", v)
	}
	Set(t, s, k, []byte("v1"))
	if v := Get(t, s, k); string(v) != "v1" {
		t.Fatalf("got %q, want v1", v)
	}
	Set(t, s, k, []byte{})
	if v := Get(t, s, k); v == nil || len(v) != 0 {
		t.Fatalf("empty value read as %#v, want an empty non-nil slice", v)
	}
	Set(t, s, k, nil)
	if v := Get(t, s, k); v == nil || len(v) != 0 {
		t.Fatalf("nil value read as %#v, want an empty non-nil slice", v)
	}
	stamped, err := sub.PackWithVersionstamp(tuple.Tuple{"stamped", tuple.IncompleteVersionstamp(0)})
	if err != nil {
		t.Fatal(err)
	}
	transact(t, s, func(tx kv.Tx) (any, error) { tx.SetVersionstampedKey(stamped, nil); return nil, nil })
	if kvs := Range(t, s, sub.RangeOf(tuple.Tuple{"stamped"})); len(kvs) != 1 || kvs[0].Value == nil || len(kvs[0].Value) != 0 {
		t.Fatalf("versionstamped key with a nil value read as %#v", kvs)
	}
	Set(t, s, k, []byte("v2"))
	transact(t, s, func(tx kv.Tx) (any, error) { tx.Clear(k); return nil, nil })
	if v := Get(t, s, k); v != nil {
		t.Fatalf("cleared key read as %q", v)
	}
	binary := []byte{0x00, 0xff, 0x00, 0x01}
	Set(t, s, key(sub, binary), binary)
	if v := Get(t, s, key(sub, binary)); !bytes.Equal(v, binary) {
		t.Fatalf("binary value read as % x", v)
	}
}

func testReadYourWrites(t *testing.T, b Backend) {
	s, _ := b.Open(t)
	sub := NewSubspace(t, s)
	Set(t, s, key(sub, "old"), []byte("x"))
	transact(t, s, func(tx kv.Tx) (any, error) {
		tx.Set(key(sub, "a"), []byte("1"))
		if v, err := tx.Get(key(sub, "a")); err != nil || string(v) != "1" {
			t.Errorf("own write read as %q, %v", v, err)
		}
		tx.Clear(key(sub, "old"))
		if v, err := tx.Get(key(sub, "old")); err != nil || v != nil {
			t.Errorf("own clear read as %q, %v", v, err)
		}
		tx.Add(key(sub, "n"), 5)
		tx.Add(key(sub, "n"), 2)
		if v, err := tx.Get(key(sub, "n")); err != nil || kv.DecodeInt64(v) != 7 {
			t.Errorf("own adds read as %d, %v", kv.DecodeInt64(v), err)
		}
		tx.Set(key(sub, "b"), []byte("2"))
		tx.ClearRange(kv.Range{Begin: key(sub, "b"), End: key(sub, "c")})
		kvs, err := tx.GetRange(sub.Range(), kv.RangeOptions{})
		if err != nil {
			t.Errorf("range: %v", err)
		}
		var keys []string
		for _, p := range kvs {
			el, _ := sub.Unpack(p.Key)
			keys = append(keys, el[0].(string))
		}
		if got := strings.Join(keys, ","); got != "a,n" {
			t.Errorf("range over own writes gave keys %s, want a,n", got)
		}
		return nil, nil
	})
}

func testGetRange(t *testing.T, b Backend) {
	s, _ := b.Open(t)
	sub := NewSubspace(t, s)
	transact(t, s, func(tx kv.Tx) (any, error) {
		for i := range 100 {
			tx.Set(key(sub, i), []byte(fmt.Sprint(i)))
		}
		return nil, nil
	})
	ints := func(kvs []kv.KeyValue) []int64 {
		var out []int64
		for _, p := range kvs {
			el, err := sub.Unpack(p.Key)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, el[0].(int64))
			if string(p.Value) != fmt.Sprint(el[0]) {
				t.Fatalf("key %v has value %q", el, p.Value)
			}
		}
		return out
	}
	read := func(r kv.Range, o kv.RangeOptions) []int64 {
		v := transact(t, s, func(tx kv.Tx) (any, error) { return tx.GetRange(r, o) })
		return ints(v.([]kv.KeyValue))
	}
	all := read(sub.Range(), kv.RangeOptions{})
	if len(all) != 100 || all[0] != 0 || all[99] != 99 {
		t.Fatalf("full range gave %d keys from %v", len(all), all[:min(3, len(all))])
	}
	for i := 1; i < len(all); i++ {
		if all[i] <= all[i-1] {
			t.Fatalf("range out of order at %d: %v", i, all[i-1:i+1])
		}
	}
	cases := []struct {
		name  string
		r     kv.Range
		o     kv.RangeOptions
		first int64
		n     int
	}{
		{"limit", sub.Range(), kv.RangeOptions{Limit: 10}, 0, 10},
		{"reverse", sub.Range(), kv.RangeOptions{Reverse: true}, 99, 100},
		{"reverse limit", sub.Range(), kv.RangeOptions{Reverse: true, Limit: 3}, 99, 3},
		{"bounded", kv.Range{Begin: key(sub, 10), End: key(sub, 20)}, kv.RangeOptions{}, 10, 10},
		{"bounded reverse", kv.Range{Begin: key(sub, 10), End: key(sub, 20)}, kv.RangeOptions{Reverse: true, Limit: 5}, 19, 5},
		{"limit past end", kv.Range{Begin: key(sub, 95), End: sub.Range().End}, kv.RangeOptions{Limit: 50}, 95, 5},
		{"empty", kv.Range{Begin: key(sub, 5), End: key(sub, 5)}, kv.RangeOptions{}, 0, 0},
	}
	for _, c := range cases {
		got := read(c.r, c.o)
		if len(got) != c.n || (c.n > 0 && got[0] != c.first) {
			t.Errorf("%s: got %d keys starting %v, want %d starting %d", c.name, len(got), got[:min(1, len(got))], c.n, c.first)
		}
	}
	_, err := s.Transact(context.Background(), func(tx kv.Tx) (any, error) {
		return tx.GetRange(kv.Range{Begin: key(sub, 20), End: key(sub, 10)}, kv.RangeOptions{})
	})
	if !errors.Is(err, kv.ErrInvertedRange) {
		t.Errorf("inverted range: err = %v, want ErrInvertedRange", err)
	}
	// A snapshot read sees the same data.
	v := transact(t, s, func(tx kv.Tx) (any, error) { return tx.Snapshot().GetRange(sub.Range(), kv.RangeOptions{Limit: 2}) })
	if got := ints(v.([]kv.KeyValue)); len(got) != 2 || got[1] != 1 {
		t.Errorf("snapshot range gave %v", got)
	}
}

func testClearRange(t *testing.T, b Backend) {
	s, _ := b.Open(t)
	sub := NewSubspace(t, s)
	transact(t, s, func(tx kv.Tx) (any, error) {
		for i := range 10 {
			tx.Set(key(sub, i), []byte("x"))
		}
		return nil, nil
	})
	transact(t, s, func(tx kv.Tx) (any, error) {
		tx.ClearRange(kv.Range{Begin: key(sub, 3), End: key(sub, 7)})
		return nil, nil
	})
	if n := len(Range(t, s, sub.Range())); n != 6 {
		t.Fatalf("%d keys left after clearing 4 of 10", n)
	}
	if Get(t, s, key(sub, 7)) == nil || Get(t, s, key(sub, 2)) == nil {
		t.Fatal("clear range removed a key outside it")
	}
	transact(t, s, func(tx kv.Tx) (any, error) { tx.ClearRange(sub.Range()); return nil, nil })
	if n := len(Range(t, s, sub.Range())); n != 0 {
		t.Fatalf("%d keys left after clearing the subspace", n)
	}
}

func testAdd(t *testing.T, b Backend) {
	s, _ := b.Open(t)
	sub := NewSubspace(t, s)
	cases := []struct {
		name    string
		initial []byte // nil: absent
		delta   int64
		want    []byte
	}{
		{"absent", nil, 5, kv.EncodeInt64(5)},
		{"existing", kv.EncodeInt64(40), 2, kv.EncodeInt64(42)},
		{"negative", kv.EncodeInt64(1), -3, kv.EncodeInt64(-2)},
		{"shorter value is zero-extended", []byte{0x01, 0x01}, 1, kv.EncodeInt64(0x0102)},
		{"longer value is truncated", append(kv.EncodeInt64(7), 0xAA, 0xBB), 1, kv.EncodeInt64(8)},
		{"wraps around", kv.EncodeInt64(-1), 1, kv.EncodeInt64(0)},
	}
	for _, c := range cases {
		k := key(sub, c.name)
		if c.initial != nil {
			Set(t, s, k, c.initial)
		}
		transact(t, s, func(tx kv.Tx) (any, error) { tx.Add(k, c.delta); return nil, nil })
		if got := Get(t, s, k); !bytes.Equal(got, c.want) {
			t.Errorf("%s: got % x, want % x", c.name, got, c.want)
		}
	}
	// Concurrent adds are exact.
	k := key(sub, "concurrent")
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 50 {
				transact(t, s, func(tx kv.Tx) (any, error) { tx.Add(k, 1); return nil, nil })
			}
		})
	}
	wg.Wait()
	if got := kv.DecodeInt64(Get(t, s, k)); got != 400 {
		t.Errorf("8×50 concurrent adds summed to %d", got)
	}
}

func testRollback(t *testing.T, b Backend) {
	s, _ := b.Open(t)
	sub := NewSubspace(t, s)
	Set(t, s, key(sub, "keep"), []byte("old"))
	boom := errors.New("boom")
	_, err := s.Transact(context.Background(), func(tx kv.Tx) (any, error) {
		tx.Set(key(sub, "keep"), []byte("new"))
		tx.Set(key(sub, "new"), []byte("x"))
		tx.ClearRange(sub.Range())
		return nil, boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want the function's error", err)
	}
	func() {
		defer func() {
			if r := recover(); r != "panic in transaction" {
				t.Errorf("recovered %v, want the transaction's panic", r)
			}
		}()
		s.Transact(context.Background(), func(tx kv.Tx) (any, error) {
			tx.Set(key(sub, "keep"), []byte("panicked"))
			panic("panic in transaction")
		})
	}()
	if v := Get(t, s, key(sub, "keep")); string(v) != "old" {
		t.Errorf("after rollbacks the key holds %q, want old", v)
	}
	if v := Get(t, s, key(sub, "new")); v != nil {
		t.Errorf("a rolled back write is visible: %q", v)
	}
	// The store still works after a panic.
	Set(t, s, key(sub, "after"), []byte("ok"))
}

func testLimits(t *testing.T, b Backend) {
	s, _ := b.Open(t)
	sub := NewSubspace(t, s)
	Set(t, s, key(sub, "keep"), []byte("old"))
	pad := func(n int) []byte { return bytes.Repeat([]byte{'k'}, n) }
	maxKey := append(append([]byte(nil), sub.Bytes()...), pad(kv.MaxKeySize-len(sub.Bytes()))...)
	cases := []struct {
		name string
		fn   func(tx kv.Tx)
		want error
	}{
		{"largest key", func(tx kv.Tx) { tx.Set(maxKey, []byte("v")) }, nil},
		{"key too large", func(tx kv.Tx) { tx.Set(append(maxKey, 'x'), []byte("v")) }, kv.ErrKeyTooLarge},
		{"largest value", func(tx kv.Tx) { tx.Set(key(sub, "big"), pad(kv.MaxValueSize)) }, nil},
		{"value too large", func(tx kv.Tx) { tx.Set(key(sub, "big"), pad(kv.MaxValueSize+1)) }, kv.ErrValueTooLarge},
		{"system key", func(tx kv.Tx) { tx.Set([]byte{0xff, 'x'}, []byte("v")) }, kv.ErrKeyOutsideLegalRange},
		{"transaction too large", func(tx kv.Tx) {
			v := pad(kv.MaxValueSize)
			for i := range kv.MaxTransactionSize/kv.MaxValueSize + 1 {
				tx.Set(key(sub, "many", i), v)
			}
		}, kv.ErrTransactionTooLarge},
		{"add with key too large", func(tx kv.Tx) { tx.Add(append(maxKey, 'x'), 1) }, kv.ErrKeyTooLarge},
		{"clear with key too large", func(tx kv.Tx) { tx.Clear(append(maxKey, 'x')) }, kv.ErrKeyTooLarge},
	}
	for _, c := range cases {
		_, err := s.Transact(context.Background(), func(tx kv.Tx) (any, error) {
			tx.Set(key(sub, "keep"), []byte("changed by "+c.name))
			c.fn(tx)
			return nil, nil
		})
		if c.want == nil {
			if err != nil {
				t.Errorf("%s: %v", c.name, err)
			}
			Set(t, s, key(sub, "keep"), []byte("old"))
			continue
		}
		if !errors.Is(err, c.want) {
			t.Errorf("%s: err = %v, want %v", c.name, err, c.want)
		}
		if v := Get(t, s, key(sub, "keep")); string(v) != "old" {
			t.Errorf("%s: a failed transaction changed the store: keep = %q", c.name, v)
		}
	}
	if n := len(Range(t, s, sub.RangeOf(tuple.Tuple{"many"}))); n != 0 {
		t.Errorf("a transaction over the size limit stored %d keys", n)
	}
}

func testVersionstamps(t *testing.T, b Backend) {
	s, _ := b.Open(t)
	sub := NewSubspace(t, s)
	var stamps []kv.Versionstamp
	for i := range 5 {
		var fut kv.VersionstampFuture
		transact(t, s, func(tx kv.Tx) (any, error) {
			for u := range 2 {
				k, err := sub.PackWithVersionstamp(tuple.Tuple{"log", tuple.IncompleteVersionstamp(uint16(u))})
				if err != nil {
					return nil, err
				}
				tx.SetVersionstampedKey(k, []byte(fmt.Sprintf("%d/%d", i, u)))
			}
			v, err := tuple.Tuple{"value", tuple.IncompleteVersionstamp(9)}.PackWithVersionstamp(nil)
			if err != nil {
				return nil, err
			}
			tx.SetVersionstampedValue(key(sub, "latest"), v)
			fut = tx.Versionstamp()
			return nil, nil
		})
		vs, err := fut.Get()
		if err != nil {
			t.Fatalf("versionstamp of a committed transaction: %v", err)
		}
		stamps = append(stamps, vs)
		latest, err := tuple.Unpack(Get(t, s, key(sub, "latest")))
		if err != nil {
			t.Fatal(err)
		}
		if got := latest[1].(tuple.Versionstamp); got.TransactionVersion != vs || got.UserVersion != 9 {
			t.Errorf("versionstamped value holds %v, want %x/9", got, vs)
		}
	}
	for i := 1; i < len(stamps); i++ {
		if bytes.Compare(stamps[i-1][:], stamps[i][:]) >= 0 {
			t.Fatalf("versionstamps not increasing: %x then %x", stamps[i-1], stamps[i])
		}
	}
	kvs := Range(t, s, sub.RangeOf(tuple.Tuple{"log"}))
	if len(kvs) != 10 {
		t.Fatalf("%d versionstamped keys, want 10", len(kvs))
	}
	for i, p := range kvs {
		el, err := sub.Unpack(p.Key)
		if err != nil {
			t.Fatal(err)
		}
		vs := el[1].(tuple.Versionstamp)
		if vs.TransactionVersion != stamps[i/2] || int(vs.UserVersion) != i%2 {
			t.Errorf("key %d holds %v, want %x/%d", i, vs, stamps[i/2], i%2)
		}
		if want := fmt.Sprintf("%d/%d", i/2, i%2); string(p.Value) != want {
			t.Errorf("key %d has value %s, want %s", i, p.Value, want)
		}
	}
}

func testVersionstampErrors(t *testing.T, b Backend) {
	s, _ := b.Open(t)
	sub := NewSubspace(t, s)
	k, err := sub.PackWithVersionstamp(tuple.Tuple{tuple.IncompleteVersionstamp(0)})
	if err != nil {
		t.Fatal(err)
	}
	// Reading a versionstamped key in its own transaction is an error.
	_, err = s.Transact(context.Background(), func(tx kv.Tx) (any, error) {
		tx.SetVersionstampedKey(k, []byte("v"))
		return tx.GetRange(sub.Range(), kv.RangeOptions{})
	})
	if !errors.Is(err, kv.ErrAccessedUnreadable) {
		t.Errorf("range over an own versionstamped key: err = %v, want ErrAccessedUnreadable", err)
	}
	_, err = s.Transact(context.Background(), func(tx kv.Tx) (any, error) {
		v, _ := tuple.Tuple{tuple.IncompleteVersionstamp(0)}.PackWithVersionstamp(nil)
		tx.SetVersionstampedValue(key(sub, "v"), v)
		return tx.Get(key(sub, "v"))
	})
	if !errors.Is(err, kv.ErrAccessedUnreadable) {
		t.Errorf("get of an own versionstamped value: err = %v, want ErrAccessedUnreadable", err)
	}
	// An offset that leaves no room for the stamp.
	bad := append([]byte("short"), 0x03, 0, 0, 0)
	_, err = s.Transact(context.Background(), func(tx kv.Tx) (any, error) {
		tx.SetVersionstampedKey(bad, []byte("v"))
		return nil, nil
	})
	if !errors.Is(err, kv.ErrInvalidOperation) {
		t.Errorf("bad versionstamp offset: err = %v, want ErrInvalidOperation", err)
	}
	// A transaction that writes nothing has no versionstamp.
	var fut kv.VersionstampFuture
	transact(t, s, func(tx kv.Tx) (any, error) {
		fut = tx.Versionstamp()
		_, err := tx.Get(key(sub, "x"))
		return nil, err
	})
	if _, err := fut.Get(); !errors.Is(err, kv.ErrNoCommitVersion) {
		t.Errorf("versionstamp of a read-only commit: err = %v, want ErrNoCommitVersion", err)
	}
	if n := len(Range(t, s, sub.Range())); n != 0 {
		t.Errorf("failed versionstamp transactions stored %d keys", n)
	}
}

func testSerializableIncrements(t *testing.T, b Backend) {
	s, _ := b.Open(t)
	sub := NewSubspace(t, s)
	const goroutines, each = 8, 100
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for range each {
				if err := increment(context.Background(), s, counterKey(sub)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if got := string(Get(t, s, counterKey(sub))); got != fmt.Sprint(goroutines*each) {
		t.Fatalf("counter = %s after %d read-modify-write increments", got, goroutines*each)
	}
}

// testConsistentSnapshots moves money between accounts while readers check
// that every snapshot sees the same total.
func testConsistentSnapshots(t *testing.T, b Backend) {
	s, _ := b.Open(t)
	sub := NewSubspace(t, s)
	const accounts, total = 10, 1000
	transact(t, s, func(tx kv.Tx) (any, error) {
		for i := range accounts {
			tx.Set(key(sub, "acct", i), kv.EncodeInt64(total/accounts))
		}
		return nil, nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var stop atomic.Bool
	for w := range 4 {
		wg.Go(func() {
			for i := 0; i < 100; i++ {
				from, to := (w+i)%accounts, (w+3*i+1)%accounts
				if from == to {
					continue
				}
				_, err := s.Transact(ctx, func(tx kv.Tx) (any, error) {
					a, err := tx.Get(key(sub, "acct", from))
					if err != nil {
						return nil, err
					}
					tx.Set(key(sub, "acct", from), kv.EncodeInt64(kv.DecodeInt64(a)-7))
					tx.Add(key(sub, "acct", to), 7)
					return nil, nil
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	var readers sync.WaitGroup
	for range 2 {
		readers.Go(func() {
			for !stop.Load() {
				v, err := s.ReadTransact(ctx, func(tx kv.ReadTx) (any, error) {
					kvs, err := tx.GetRange(sub.RangeOf(tuple.Tuple{"acct"}), kv.RangeOptions{})
					var sum int64
					for _, p := range kvs {
						sum += kv.DecodeInt64(p.Value)
					}
					return sum, err
				})
				if err != nil {
					t.Error(err)
					return
				}
				if v.(int64) != total {
					t.Errorf("a snapshot saw a total of %d, want %d", v, total)
					return
				}
			}
		})
	}
	wg.Wait()
	stop.Store(true)
	readers.Wait()
}

func testRetryableErrorsRetry(t *testing.T, b Backend) {
	s, _ := b.Open(t)
	sub := NewSubspace(t, s)
	attempts := 0
	v, err := s.Transact(context.Background(), func(tx kv.Tx) (any, error) {
		attempts++
		tx.Set(key(sub, "attempt", attempts), []byte("x"))
		if attempts < 3 {
			return nil, fmt.Errorf("simulated conflict: %w", kv.ErrNotCommitted)
		}
		return attempts, nil
	})
	if err != nil || v != 3 {
		t.Fatalf("Transact = %v, %v after %d attempts; want 3, nil", v, err, attempts)
	}
	kvs := Range(t, s, sub.RangeOf(tuple.Tuple{"attempt"}))
	if len(kvs) != 1 {
		t.Fatalf("%d attempts left writes, want only the committed one", len(kvs))
	}
	// Non-retryable errors are returned at once.
	attempts = 0
	_, err = s.Transact(context.Background(), func(tx kv.Tx) (any, error) {
		attempts++
		return nil, kv.ErrKeyTooLarge
	})
	if attempts != 1 || !errors.Is(err, kv.ErrKeyTooLarge) {
		t.Fatalf("a non-retryable error ran %d attempts and returned %v", attempts, err)
	}
}

func testCancellation(t *testing.T, b Backend) {
	s, _ := b.Open(t)
	sub := NewSubspace(t, s)
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Transact(canceled, func(tx kv.Tx) (any, error) {
		tx.Set(key(sub, "a"), []byte("x"))
		return nil, nil
	}); !errors.Is(err, context.Canceled) {
		t.Errorf("Transact with a canceled context: err = %v", err)
	}
	if _, err := s.ReadTransact(canceled, func(tx kv.ReadTx) (any, error) { return nil, nil }); !errors.Is(err, context.Canceled) {
		t.Errorf("ReadTransact with a canceled context: err = %v", err)
	}
	// Canceled midway: nothing commits.
	ctx, cancel := context.WithCancel(context.Background())
	_, err := s.Transact(ctx, func(tx kv.Tx) (any, error) {
		tx.Set(key(sub, "b"), []byte("x"))
		cancel()
		_, err := tx.Get(key(sub, "b"))
		return nil, err
	})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("canceled midway: err = %v", err)
	}
	if Get(t, s, key(sub, "b")) != nil {
		t.Error("a canceled transaction committed")
	}
	// A context ends an endless retry loop.
	ctx, cancel = context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = s.Transact(ctx, func(tx kv.Tx) (any, error) { return nil, kv.ErrNotCommitted })
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("endless retries: err = %v, want DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the deadline stopped the retries only after %v", d)
	}
}

func testTransactionTimeLimit(t *testing.T, b Backend) {
	s, _ := b.Open(t)
	sub := NewSubspace(t, s)
	limit := b.TransactionTimeout()
	attempts := 0
	_, err := s.Transact(context.Background(), func(tx kv.Tx) (any, error) {
		attempts++
		tx.Set(key(sub, "slow"), []byte(fmt.Sprint(attempts)))
		if attempts == 1 {
			time.Sleep(limit + limit/5)
		}
		_, err := tx.Get(key(sub, "slow"))
		return nil, err
	})
	if err != nil {
		t.Fatalf("a transaction that was too old once was not retried: %v", err)
	}
	if attempts != 2 || string(Get(t, s, key(sub, "slow"))) != "2" {
		t.Fatalf("attempts = %d, stored %q; want the second attempt committed", attempts, Get(t, s, key(sub, "slow")))
	}
}

// waitFired waits up to d for w to fire.
func waitFired(w kv.Watch, d time.Duration) bool {
	select {
	case <-w.Done():
		return true
	case <-time.After(d):
		return false
	}
}

func watchKey(t testing.TB, s kv.Transactor, k []byte) kv.Watch {
	t.Helper()
	return transact(t, s, func(tx kv.Tx) (any, error) { return tx.Watch(k), nil }).(kv.Watch)
}

func testWatchFiresAfterCommit(t *testing.T, b Backend) {
	s, _ := b.Open(t)
	sub := NewSubspace(t, s)
	k := key(sub, "w")
	Set(t, s, k, []byte("1"))
	w := watchKey(t, s, k)
	defer w.Cancel()
	if waitFired(w, 50*time.Millisecond) {
		t.Fatalf("watch fired with no change: %v", w.Err())
	}
	Set(t, s, k, []byte("2"))
	if !waitFired(w, 5*time.Second) {
		t.Fatal("watch did not fire after a commit changed its key")
	}
	if w.Err() != nil {
		t.Fatalf("fired watch has error %v", w.Err())
	}
	// A watch on an absent key fires when it is created, and one whose
	// transaction set the key compares against that value.
	absent := watchKey(t, s, key(sub, "absent"))
	own := transact(t, s, func(tx kv.Tx) (any, error) {
		tx.Set(key(sub, "own"), []byte("mine"))
		return tx.Watch(key(sub, "own")), nil
	}).(kv.Watch)
	defer own.Cancel()
	Set(t, s, key(sub, "own"), []byte("mine")) // same value: no change
	Set(t, s, key(sub, "absent"), []byte("now"))
	if !waitFired(absent, 5*time.Second) {
		t.Fatal("watch on an absent key did not fire when the key was created")
	}
	if waitFired(own, 50*time.Millisecond) {
		t.Fatal("watch fired although the key kept the value its transaction left")
	}
	transact(t, s, func(tx kv.Tx) (any, error) { tx.Clear(key(sub, "own")); return nil, nil })
	if !waitFired(own, 5*time.Second) {
		t.Fatal("watch did not fire when its key was cleared")
	}
	// A watch sees an atomic add.
	w = watchKey(t, s, key(sub, "n"))
	transact(t, s, func(tx kv.Tx) (any, error) { tx.Add(key(sub, "n"), 1); return nil, nil })
	if !waitFired(w, 5*time.Second) {
		t.Fatal("watch did not fire after an atomic add")
	}
}

func testWatchNotFiredByRollback(t *testing.T, b Backend) {
	s, _ := b.Open(t)
	sub := NewSubspace(t, s)
	k := key(sub, "w")
	Set(t, s, k, []byte("1"))
	w := watchKey(t, s, k)
	defer w.Cancel()
	s.Transact(context.Background(), func(tx kv.Tx) (any, error) {
		tx.Set(k, []byte("2"))
		return nil, errors.New("roll back")
	})
	Set(t, s, key(sub, "other"), []byte("x")) // a commit that wakes checkers
	if waitFired(w, 200*time.Millisecond) {
		t.Fatal("watch fired after a rolled back transaction")
	}
	Set(t, s, k, []byte("3"))
	if !waitFired(w, 5*time.Second) {
		t.Fatal("watch did not fire after a real change")
	}
}

func testWatchCancelAndFailure(t *testing.T, b Backend) {
	s, _ := b.Open(t)
	sub := NewSubspace(t, s)
	k := key(sub, "w")
	Set(t, s, k, []byte("1"))
	w := watchKey(t, s, k)
	w.Cancel()
	w.Cancel() // twice is fine
	if !waitFired(w, time.Second) || !errors.Is(w.Err(), kv.ErrWatchCanceled) {
		t.Fatalf("canceled watch: err = %v, want ErrWatchCanceled", w.Err())
	}
	// The watch of a transaction that does not commit fails.
	var failed kv.Watch
	boom := errors.New("boom")
	s.Transact(context.Background(), func(tx kv.Tx) (any, error) {
		failed = tx.Watch(k)
		return nil, boom
	})
	if !waitFired(failed, time.Second) || failed.Err() == nil {
		t.Fatalf("watch of a failed transaction: fired and err = %v, want an error", failed.Err())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	w = watchKey(t, s, k)
	defer w.Cancel()
	if err := kv.WaitWatch(ctx, w); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitWatch with an expiring context = %v", err)
	}
}

func testWatchAcrossProcesses(t *testing.T, b Backend) {
	s, spec := b.Open(t)
	sub := NewSubspace(t, s)
	echo := startChild(t, orders{Role: "echo", Spec: spec, Prefix: sub.Bytes()})
	if l := echo.line(30 * time.Second); l != "ready" {
		t.Fatalf("helper said %q", l)
	}
	pong := key(sub, "pong")
	for i := range 5 {
		w := watchKey(t, s, pong)
		Set(t, s, key(sub, "ping"), []byte(fmt.Sprint(i)))
		if !waitFired(w, 10*time.Second) {
			t.Fatalf("round %d: no answer from the other process", i)
		}
		if v := string(Get(t, s, pong)); !strings.HasSuffix(v, fmt.Sprintf(" %d", i)) {
			t.Fatalf("round %d: pong = %q", i, v)
		}
	}
	Set(t, s, key(sub, "ping"), []byte("stop"))
	echo.finish(10 * time.Second)
}

func testIncrementsAcrossProcesses(t *testing.T, b Backend) {
	s, spec := b.Open(t)
	sub := NewSubspace(t, s)
	const procs, goroutines, each = 3, 4, 100
	var children []*child
	for i := range procs {
		children = append(children, startChild(t, orders{Role: "increment", Spec: spec, Prefix: sub.Bytes(), ID: i, N: each, Goroutines: goroutines}))
	}
	// This process increments too.
	for range each {
		if err := increment(context.Background(), s, counterKey(sub)); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range children {
		c.finish(2 * time.Minute)
	}
	want := procs*goroutines*each + each
	if got := string(Get(t, s, counterKey(sub))); got != fmt.Sprint(want) {
		t.Fatalf("counter = %s after %d increments from %d processes", got, want, procs+1)
	}
}

func testVersionstampsAcrossProcesses(t *testing.T, b Backend) {
	s, spec := b.Open(t)
	sub := NewSubspace(t, s)
	const procs, each = 3, 100
	var children []*child
	for i := range procs {
		children = append(children, startChild(t, orders{Role: "versionstamps", Spec: spec, Prefix: sub.Bytes(), ID: i, N: each}))
	}
	for _, c := range children {
		c.finish(2 * time.Minute)
	}
	kvs := Range(t, s, sub.RangeOf(tuple.Tuple{"vs"}))
	if len(kvs) != procs*each {
		t.Fatalf("%d versionstamped keys, want %d: some collided", len(kvs), procs*each)
	}
	next := make([]int64, procs)
	for _, p := range kvs {
		v, err := tuple.Unpack(p.Value)
		if err != nil {
			t.Fatal(err)
		}
		id, seq := v[0].(int64), v[1].(int64)
		if seq != next[id] {
			t.Fatalf("process %d's write %d sorts where %d was due: versionstamps out of commit order", id, seq, next[id])
		}
		next[id]++
	}
}

// testCrashSafety kills a writer with SIGKILL in the middle of its
// transactions and checks that the store holds exactly the transactions it
// reported committed, or one more (committed but not yet reported).
func testCrashSafety(t *testing.T, b Backend) {
	s, spec := b.Open(t)
	sub := NewSubspace(t, s)
	const rows = 500
	w := startChild(t, orders{Role: "crash-writer", Spec: spec, Prefix: sub.Bytes(), N: rows})
	last := -1
	for range 5 + time.Now().Nanosecond()%10 {
		fmt.Sscan(w.line(30*time.Second), &last)
	}
	if err := w.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-w.wait
	w.wait <- nil
	for l := range w.lines { // what it reported before it died
		fmt.Sscan(l, &last)
	}
	stored := -1
	if v := Get(t, s, key(sub, "last")); v != nil {
		fmt.Sscan(string(v), &stored)
	}
	if stored < last || stored > last+1 {
		t.Fatalf("store says transaction %d committed last; the writer reported %d", stored, last)
	}
	for i := 0; i <= stored+1; i++ {
		n := len(Range(t, s, sub.RangeOf(tuple.Tuple{"row", i})))
		want := rows
		if i > stored {
			want = 0
		}
		if n != want {
			t.Fatalf("transaction %d left %d rows, want %d", i, n, want)
		}
	}
	// The store still takes writes, and a backend that can check its files
	// finds them intact.
	Set(t, s, key(sub, "after"), []byte("ok"))
	if c, ok := s.(IntegrityChecker); ok {
		if err := c.IntegrityCheck(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// IntegrityChecker is implemented by stores that can verify their own
// files, such as the embedded store; the crash test uses it.
type IntegrityChecker interface {
	IntegrityCheck(ctx context.Context) error
}

func testClose(t *testing.T, b Backend) {
	_, spec := b.Open(t)
	s, err := b.OpenSpec(spec)
	if err != nil {
		t.Fatal(err)
	}
	sub := NewSubspace(t, s)
	k := key(sub, "w")
	w := watchKey(t, s, k)
	if err := s.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if !waitFired(w, 5*time.Second) || !errors.Is(w.Err(), kv.ErrStoreClosed) {
		t.Errorf("pending watch after close: err = %v, want ErrStoreClosed", w.Err())
	}
	if _, err := s.Transact(context.Background(), func(tx kv.Tx) (any, error) { return nil, nil }); !errors.Is(err, kv.ErrStoreClosed) {
		t.Errorf("Transact after close: err = %v, want ErrStoreClosed", err)
	}
	if _, err := s.ReadTransact(context.Background(), func(tx kv.ReadTx) (any, error) { return nil, nil }); !errors.Is(err, kv.ErrStoreClosed) {
		t.Errorf("ReadTransact after close: err = %v, want ErrStoreClosed", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second close: %v", err)
	}
}
