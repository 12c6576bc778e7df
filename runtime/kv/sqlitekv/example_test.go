package sqlitekv_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/couchjobs/couchjobs/runtime/kv"
	"github.com/couchjobs/couchjobs/runtime/kv/sqlitekv"
	"github.com/couchjobs/couchjobs/runtime/tuple"
)

// Open a store, write in a transaction, and wait for another commit to
// change a key.
func Example() {
	dir, _ := os.MkdirTemp("", "couchjobs-example")
	defer os.RemoveAll(dir)
	store, err := sqlitekv.Open(filepath.Join(dir, "jobs.db"), sqlitekv.Options{})
	if err != nil {
		panic(err)
	}
	defer store.Close()
	ctx := context.Background()
	counters := kv.Sub("example", "counters")
	hits := counters.Pack(tuple.Tuple{"hits"})

	// Transact retries the function until it commits; it must be
	// idempotent apart from its writes to the transaction.
	w, err := store.Transact(ctx, func(tx kv.Tx) (any, error) {
		tx.Add(hits, 1)
		return tx.Watch(hits), nil
	})
	if err != nil {
		panic(err)
	}
	store.Transact(ctx, func(tx kv.Tx) (any, error) {
		tx.Add(hits, 1)
		return nil, nil
	})
	if err := kv.WaitWatch(ctx, w.(kv.Watch)); err != nil {
		panic(err)
	}
	v, _ := store.ReadTransact(ctx, func(tx kv.ReadTx) (any, error) { return tx.Get(hits) })
	fmt.Println("hits:", kv.DecodeInt64(v.([]byte)))
	// Output: hits: 2
}
