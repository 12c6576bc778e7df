//go:build fdb

// Package fdbkv is the kv interface on FoundationDB, for clusters of many
// nodes. It builds only with the build tag fdb, because the official Go
// bindings need cgo and the FoundationDB client library (libfdb_c); see
// docs/FOUNDATIONDB.md for installing them.
//
// The adapter is deliberately thin: each kv call is one call of the
// bindings, and FoundationDB errors become *kv.Error values with the same
// codes, so errors.Is(err, kv.ErrNotCommitted) works on both backends.
// Limits, conflicts, versionstamps and watches are FoundationDB's own.
package fdbkv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"

	"github.com/apple/foundationdb/bindings/go/src/fdb"

	"github.com/couchjobs/couchjobs/runtime/kv"
)

// DefaultAPIVersion is the API version selected when Options.APIVersion is
// zero: 730, the highest the bindings' header supports. The client library
// installed must support it (FoundationDB 7.3 or later).
const DefaultAPIVersion = 730

// Options configure the connection.
type Options struct {
	// ClusterFile is the path of the cluster file. Empty means the
	// FDB_CLUSTER_FILE environment variable, then the client's default
	// (/etc/foundationdb/fdb.cluster on Linux).
	ClusterFile string
	// APIVersion is the FoundationDB API version; zero means
	// DefaultAPIVersion. A process can select only one.
	APIVersion int
}

// Store is a FoundationDB database behind the kv interface.
type Store struct {
	db     fdb.Database
	closed atomic.Bool

	mu      sync.Mutex
	watches map[*watch]struct{} // pending, to fail on Close
}

// Open selects the API version and opens the database.
func Open(opts Options) (*Store, error) {
	version := opts.APIVersion
	if version == 0 {
		version = DefaultAPIVersion
	}
	if err := fdb.APIVersion(version); err != nil {
		return nil, fmt.Errorf("select FoundationDB API version %d: %w", version, err)
	}
	cluster := opts.ClusterFile
	if cluster == "" {
		cluster = os.Getenv("FDB_CLUSTER_FILE")
	}
	db, err := fdb.OpenDatabase(cluster)
	if err != nil {
		return nil, fmt.Errorf("open FoundationDB database (cluster file %q): %w", cluster, convert(err))
	}
	return &Store{db: db, watches: make(map[*watch]struct{})}, nil
}

// Transact runs fn in a transaction, retrying as FoundationDB's onError
// says, until it commits, fails for good, or ctx is done.
func (s *Store) Transact(ctx context.Context, fn func(kv.Tx) (any, error)) (any, error) {
	v, err := s.run(ctx, func(tr fdb.Transaction) (any, error) {
		t := &tx{readTx: readTx{r: tr}, tr: tr, s: s}
		v, err := fn(t)
		if err == nil {
			err = tr.Commit().Get()
		}
		if err != nil {
			t.failWatches(convert(err))
			return nil, err
		}
		t.activateWatches()
		return v, nil
	})
	return v, err
}

// ReadTransact runs fn in a transaction that is never committed.
func (s *Store) ReadTransact(ctx context.Context, fn func(kv.ReadTx) (any, error)) (any, error) {
	return s.run(ctx, func(tr fdb.Transaction) (any, error) {
		return fn(readTx{r: tr})
	})
}

// run is the retry loop shared by both kinds of transaction. A context
// cancels the transaction in flight through Transaction.Cancel.
func (s *Store) run(ctx context.Context, attempt func(fdb.Transaction) (any, error)) (any, error) {
	if s.closed.Load() {
		return nil, kv.ErrStoreClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	tr, err := s.db.CreateTransaction()
	if err != nil {
		return nil, convert(err)
	}
	stop := context.AfterFunc(ctx, tr.Cancel)
	defer stop()
	for {
		v, err := attempt(tr)
		if err == nil {
			return v, nil
		}
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, ctxErr
		}
		code := errorCode(err)
		if code == 0 {
			return nil, err
		}
		// onError waits out FoundationDB's backoff and resets the
		// transaction if the code is retryable, and returns it otherwise.
		// Errors a layer returns as *kv.Error (a read's converted error,
		// or a conflict it detected) take the same path.
		if oerr := tr.OnError(fdb.Error{Code: code}).Get(); oerr != nil {
			if errorCode(oerr) == code {
				return nil, convert(err)
			}
			return nil, convert(oerr)
		}
	}
}

// errorCode returns the FoundationDB code err carries, or 0.
func errorCode(err error) int {
	var fe fdb.Error
	if errors.As(err, &fe) {
		return fe.Code
	}
	var ke *kv.Error
	if errors.As(err, &ke) && ke.Code < 10000 {
		return ke.Code
	}
	return 0
}

// Close fails pending watches with kv.ErrStoreClosed and closes the
// database.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	s.mu.Lock()
	pending := s.watches
	s.watches = nil
	s.mu.Unlock()
	for w := range pending {
		w.fire(kv.ErrStoreClosed)
		w.fut.Cancel()
	}
	s.db.Close()
	return nil
}

// convert turns a FoundationDB error into a *kv.Error with its code, and
// leaves other errors alone.
func convert(err error) error {
	var fe fdb.Error
	if err == nil || !errors.As(err, &fe) {
		return err
	}
	return &kv.Error{Code: fe.Code, Name: errorName(fe.Code), Detail: fe.Error()}
}

// errorName names the codes couchjobs reacts to; others keep a generic name
// and FoundationDB's message in the detail.
func errorName(code int) string {
	for _, e := range []*kv.Error{
		kv.ErrTransactionTooOld, kv.ErrNotCommitted, kv.ErrCommitUnknownResult,
		kv.ErrTransactionCanceled, kv.ErrTransactionTimedOut, kv.ErrAccessedUnreadable,
		kv.ErrWatchCanceled, kv.ErrInvalidOperation, kv.ErrKeyOutsideLegalRange,
		kv.ErrInvertedRange, kv.ErrNoCommitVersion, kv.ErrTransactionTooLarge,
		kv.ErrKeyTooLarge, kv.ErrValueTooLarge,
	} {
		if e.Code == code {
			return e.Name
		}
	}
	return "fdb_error"
}

var _ kv.Store = (*Store)(nil)
