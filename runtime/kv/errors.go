package kv

import (
	"errors"
	"fmt"

	"github.com/couchjobs/couchjobs/runtime/tuple"
)

// Error is a store error with FoundationDB's error code, so that code
// written against one backend handles the other's errors the same way.
// Compare errors with errors.Is against the sentinels below: two *Error
// values match when their codes do, whatever the message.
type Error struct {
	// Code is FoundationDB's numeric error code.
	Code int
	// Name is FoundationDB's name for the code, such as "not_committed".
	Name string
	// Detail says what happened in this instance; it may be empty.
	Detail string
}

// Error formats the error as "name (code): detail".
func (e *Error) Error() string {
	if e.Detail == "" {
		return fmt.Sprintf("%s (%d)", e.Name, e.Code)
	}
	return fmt.Sprintf("%s (%d): %s", e.Name, e.Code, e.Detail)
}

// Is matches another *Error with the same code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

// With returns a copy of e carrying detail, for an error that names the key
// or size at fault while still matching e with errors.Is.
func (e *Error) With(format string, args ...any) *Error {
	return &Error{Code: e.Code, Name: e.Name, Detail: fmt.Sprintf(format, args...)}
}

// The errors callers act on. Their codes are FoundationDB's.
var (
	// ErrTransactionTooOld: the transaction ran past the store's
	// transaction time limit (5 s on FoundationDB). Retryable.
	ErrTransactionTooOld = &Error{Code: 1007, Name: "transaction_too_old"}
	// ErrNotCommitted: the transaction conflicted with another. Retryable.
	ErrNotCommitted = &Error{Code: 1020, Name: "not_committed"}
	// ErrCommitUnknownResult: the commit may or may not have happened.
	// Retryable, so transaction functions must be idempotent.
	ErrCommitUnknownResult = &Error{Code: 1021, Name: "commit_unknown_result"}
	// ErrTransactionCanceled: the transaction was canceled.
	ErrTransactionCanceled = &Error{Code: 1025, Name: "transaction_cancelled"}
	// ErrTransactionTimedOut: a timeout set on the transaction expired.
	ErrTransactionTimedOut = &Error{Code: 1031, Name: "transaction_timed_out"}
	// ErrAccessedUnreadable: a read touched a key written with a
	// versionstamp in the same transaction.
	ErrAccessedUnreadable = &Error{Code: 1036, Name: "accessed_unreadable"}
	// ErrWatchCanceled: the watch was canceled.
	ErrWatchCanceled = &Error{Code: 1101, Name: "operation_cancelled"}
	// ErrNoCommitVersion: the versionstamp of a transaction that wrote
	// nothing, and so committed no version.
	ErrNoCommitVersion = &Error{Code: 2021, Name: "no_commit_version"}
	// ErrInvalidOperation: a malformed call, such as a versionstamp offset
	// outside the key.
	ErrInvalidOperation = &Error{Code: 2000, Name: "client_invalid_operation"}
	// ErrKeyOutsideLegalRange: keys starting with 0xFF are the store's own.
	ErrKeyOutsideLegalRange = &Error{Code: 2004, Name: "key_outside_legal_range"}
	// ErrInvertedRange: a range whose end sorts before its begin.
	ErrInvertedRange = &Error{Code: 2005, Name: "inverted_range"}
	// ErrTransactionTooLarge: the transaction's writes and conflict ranges
	// exceed [MaxTransactionSize].
	ErrTransactionTooLarge = &Error{Code: 2101, Name: "transaction_too_large"}
	// ErrKeyTooLarge: a key exceeds [MaxKeySize].
	ErrKeyTooLarge = &Error{Code: 2102, Name: "key_too_large"}
	// ErrValueTooLarge: a value exceeds [MaxValueSize].
	ErrValueTooLarge = &Error{Code: 2103, Name: "value_too_large"}
	// ErrStoreClosed: the store was closed. Codes from 10000 up are
	// couchjobs' own; FoundationDB's stop below 10000.
	ErrStoreClosed = &Error{Code: 10001, Name: "store_closed"}
)

// retryable holds the codes Transact retries, as FoundationDB's onError
// does.
var retryable = map[int]bool{
	1007: true, // transaction_too_old
	1009: true, // future_version
	1020: true, // not_committed
	1021: true, // commit_unknown_result
	1037: true, // process_behind
	1038: true, // database_locked
	1213: true, // tag_throttled
}

// IsRetryable reports whether err is a store error that a transaction
// retry may cure.
func IsRetryable(err error) bool {
	var e *Error
	return errors.As(err, &e) && retryable[e.Code]
}

// CheckKey returns an error if key is not a legal key for writing.
func CheckKey(key []byte) error {
	if len(key) > MaxKeySize {
		return ErrKeyTooLarge.With("key of %d bytes exceeds %d", len(key), MaxKeySize)
	}
	if len(key) > 0 && key[0] == 0xFF {
		return ErrKeyOutsideLegalRange.With("key %s is in the system keyspace", printable(key))
	}
	return nil
}

// CheckValue returns an error if value is too large to store.
func CheckValue(value []byte) error {
	if len(value) > MaxValueSize {
		return ErrValueTooLarge.With("value of %d bytes exceeds %d", len(value), MaxValueSize)
	}
	return nil
}

// printable renders a key for an error message, shortened.
func printable(key []byte) string {
	const max = 64
	if len(key) > max {
		return tuple.Printable(key[:max]) + "…"
	}
	return tuple.Printable(key)
}
