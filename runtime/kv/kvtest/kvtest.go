// Package kvtest is the conformance suite every kv backend passes, so that
// code that works on the embedded store works on FoundationDB too. A
// backend's test package runs it with
//
//	func TestMain(m *testing.M) { kvtest.Main(m, backend) }
//	func TestConformance(t *testing.T) { kvtest.Run(t, backend) }
//	func BenchmarkStore(b *testing.B) { kvtest.Bench(b, backend) }
//
// Main lets the suite re-run the test binary as helper processes, for the
// tests that need several OS processes on one store.
//
// Every test keeps its keys in a subspace of its own and clears it at the
// end, so backends may hand out one shared store.
package kvtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/couchjobs/couchjobs/runtime/kv"
)

// Backend opens the stores under test.
type Backend interface {
	// Name names the backend in test output.
	Name() string
	// Open returns a store for one test, and a spec that OpenSpec turns into
	// the same store in another process. The backend closes the store when
	// the test ends.
	Open(t testing.TB) (kv.Store, string)
	// OpenSpec opens the store a spec names, in a helper process.
	OpenSpec(spec string) (kv.Store, error)
	// TransactionTimeout is the time limit of a transaction on the stores
	// Open returns.
	TransactionTimeout() time.Duration
}

// NewSubspace returns a subspace no other test uses, and clears it when t
// ends.
func NewSubspace(t testing.TB, s kv.Store) kv.Subspace {
	var id [8]byte
	rand.Read(id[:])
	sub := kv.Sub("kvtest", hex.EncodeToString(id[:]))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s.Transact(ctx, func(tx kv.Tx) (any, error) {
			tx.ClearRange(sub.Range())
			return nil, nil
		})
	})
	return sub
}

// Set commits one key, failing t on error.
func Set(t testing.TB, s kv.Transactor, key, value []byte) {
	t.Helper()
	if _, err := s.Transact(context.Background(), func(tx kv.Tx) (any, error) {
		tx.Set(key, value)
		return nil, nil
	}); err != nil {
		t.Fatalf("set: %v", err)
	}
}

// Get reads one key in its own transaction, failing t on error.
func Get(t testing.TB, s kv.ReadTransactor, key []byte) []byte {
	t.Helper()
	v, err := s.ReadTransact(context.Background(), func(tx kv.ReadTx) (any, error) {
		return tx.Get(key)
	})
	if err != nil {
		t.Fatalf("get: %v", err)
	}
	return v.([]byte)
}

// Range reads a whole range in its own transaction, failing t on error.
func Range(t testing.TB, s kv.ReadTransactor, r kv.Range) []kv.KeyValue {
	t.Helper()
	v, err := s.ReadTransact(context.Background(), func(tx kv.ReadTx) (any, error) {
		return tx.GetRange(r, kv.RangeOptions{})
	})
	if err != nil {
		t.Fatalf("range: %v", err)
	}
	return v.([]kv.KeyValue)
}
