// Package kv defines the ordered, transactional key-value store that every
// couchjobs layer is written against, with FoundationDB's semantics: strictly
// serializable transactions retried on conflict, range reads in byte order,
// atomic adds, versionstamps, watches, and FoundationDB's size limits.
//
// Two backends implement it: the embedded default (package sqlitekv, one
// SQLite file shared by the processes of one machine) and FoundationDB
// (package fdbkv, build tag fdb). Package kvtest holds the conformance suite
// both pass, so that layer code that works on one works on the other.
//
// Transaction functions may run more than once: on a retryable error the
// store runs them again from scratch. They must not have side effects outside
// the transaction, or must make them idempotent.
package kv

import (
	"context"
	"encoding/binary"
)

// FoundationDB's limits, enforced by every backend with the same errors.
const (
	// MaxKeySize is the largest key in bytes ([ErrKeyTooLarge]).
	MaxKeySize = 10_000
	// MaxValueSize is the largest value in bytes ([ErrValueTooLarge]).
	MaxValueSize = 100_000
	// MaxTransactionSize bounds the bytes a transaction writes and the
	// conflict ranges it declares ([ErrTransactionTooLarge]).
	MaxTransactionSize = 10_000_000
)

// Transactor runs read-write transactions. Layers take a Transactor rather
// than a whole Store when that is all they need.
type Transactor interface {
	// Transact runs fn in a transaction and commits it, running fn again
	// on retryable errors (conflicts) with backoff until it commits, fails
	// with a non-retryable error, or ctx is done. It returns fn's result.
	Transact(ctx context.Context, fn func(Tx) (any, error)) (any, error)
}

// ReadTransactor runs read-only transactions.
type ReadTransactor interface {
	// ReadTransact runs fn against a consistent snapshot, retrying on
	// retryable errors like Transact.
	ReadTransact(ctx context.Context, fn func(ReadTx) (any, error)) (any, error)
}

// Store is a transactional, ordered key-value store.
type Store interface {
	Transactor
	ReadTransactor
	// Close releases the store's resources and fails pending watches with
	// [ErrStoreClosed]. Transactions after Close fail.
	Close() error
}

// ReadTx reads within a transaction. Reads see the transaction's own writes.
type ReadTx interface {
	// Get returns the value of key, or nil if it is absent. An empty value
	// is returned as a non-nil empty slice.
	Get(key []byte) ([]byte, error)
	// GetRange returns the key-value pairs in r in key order (or reverse
	// order), at most opts.Limit of them when Limit > 0.
	GetRange(r Range, opts RangeOptions) ([]KeyValue, error)
	// Snapshot returns a view of the transaction whose reads add no read
	// conflicts: another transaction's write to what it read does not make
	// this one retry. Use it for reads that may be stale, such as picking a
	// candidate among many.
	Snapshot() ReadTx
}

// Tx reads and writes within a transaction. Writes are buffered by the
// transaction and become visible to others only when it commits. A write
// that breaks a limit makes the transaction fail at commit with the error
// that names it; reads after it return the same error.
type Tx interface {
	ReadTx
	// Set writes value under key.
	Set(key, value []byte)
	// Clear removes key.
	Clear(key []byte)
	// ClearRange removes every key in r.
	ClearRange(r Range)
	// Add adds delta to the value of key read as a little-endian integer of
	// 8 bytes, as FoundationDB's atomic ADD with an 8-byte operand: a
	// missing or shorter value counts as zero-extended, a longer one is
	// truncated, and the result wraps around. It adds no read conflict, so
	// concurrent adds never conflict.
	Add(key []byte, delta int64)
	// SetVersionstampedKey writes value under key after replacing the 10
	// bytes at the offset given by key's last 4 bytes (little-endian, and
	// removed from the key) with the transaction's versionstamp. Such keys
	// cannot be read in the same transaction ([ErrAccessedUnreadable]).
	// tuple.Tuple.PackWithVersionstamp builds such keys.
	SetVersionstampedKey(key, value []byte)
	// SetVersionstampedValue is SetVersionstampedKey for the value.
	SetVersionstampedValue(key, value []byte)
	// Versionstamp returns the versionstamp the transaction commits with. It
	// is known only after Transact returns: call its Get then.
	Versionstamp() VersionstampFuture
	// Watch returns a watch that fires when the value of key, as this
	// transaction leaves it, is changed by a later commit. It becomes
	// active when the transaction commits; if the transaction does not
	// commit, the watch fails.
	Watch(key []byte) Watch
	// AddReadConflictKey makes the transaction conflict with any concurrent
	// write to key, as if it had read it.
	AddReadConflictKey(key []byte)
	// AddReadConflictRange is AddReadConflictKey for every key in r.
	AddReadConflictRange(r Range)
	// AddWriteConflictKey makes concurrent readers of key conflict with
	// this transaction, as if it had written it.
	AddWriteConflictKey(key []byte)
}

// KeyValue is one pair returned by a range read.
type KeyValue struct {
	Key   []byte
	Value []byte
}

// RangeOptions tune a range read.
type RangeOptions struct {
	// Limit is the most pairs to return; zero or less means no limit.
	Limit int
	// Reverse returns pairs from the end of the range backwards.
	Reverse bool
}

// Versionstamp is the 10-byte commit version a transaction's versionstamped
// operations are completed with: 8 bytes of commit version, then 2 bytes of
// order within the commit, both big-endian. Versionstamps of later commits
// compare greater, across every process sharing the store.
type Versionstamp [10]byte

// VersionstampFuture yields a transaction's versionstamp after it commits.
type VersionstampFuture interface {
	// Get returns the versionstamp, or an error if the transaction did not
	// commit or wrote nothing (a read-only commit has no versionstamp).
	Get() (Versionstamp, error)
}

// Watch reports a change to one key.
type Watch interface {
	// Done is closed when the key changed, or when the watch failed or was
	// canceled; Err then says which.
	Done() <-chan struct{}
	// Err is nil while the watch is waiting and after the key changed. It
	// is [ErrWatchCanceled] after Cancel, [ErrStoreClosed] after the store
	// closed, or the transaction's error if it did not commit.
	Err() error
	// Cancel stops the watch and releases its resources. It is safe to
	// call more than once, and after the watch fired.
	Cancel()
}

// WaitWatch blocks until w fires or ctx is done. It returns nil if the key
// changed, the watch's error if it failed, or ctx's error. The watch is not
// canceled when ctx is done; the caller still owns it.
func WaitWatch(ctx context.Context, w Watch) error {
	select {
	case <-w.Done():
		return w.Err()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// DecodeInt64 reads a counter written by [Tx.Add]: little-endian, missing
// bytes counted as zero, bytes past the eighth ignored.
func DecodeInt64(b []byte) int64 {
	var buf [8]byte
	copy(buf[:], b)
	return int64(binary.LittleEndian.Uint64(buf[:]))
}

// EncodeInt64 writes n the way [Tx.Add] stores counters.
func EncodeInt64(n int64) []byte {
	return binary.LittleEndian.AppendUint64(nil, uint64(n))
}
