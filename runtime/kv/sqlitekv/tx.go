package sqlitekv

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/couchjobs/couchjobs/runtime/kv"
	"github.com/couchjobs/couchjobs/runtime/tuple"
)

// tx is one attempt of a transaction on one connection. SQLite itself gives
// isolation and read-your-writes; tx adds FoundationDB's rules: the limits,
// the time limit, versionstamps and watches.
type tx struct {
	s        *Store // the store, for a write transaction; nil for reads
	ctx      context.Context
	c        *conn
	deadline time.Time
	writes   int   // calls of checkWrite
	err      error // the first deferred error; every later call returns it
	size     int   // bytes counted against kv.MaxTransactionSize
	mutated  bool
	version  int64               // the commit version, once allocated; 0 before
	stamped  map[string]struct{} // keys whose key or value holds this commit's versionstamp
	watches  []*watch
	vs       *versionstampFuture
	// touched records what the transaction wrote, while watches are
	// pending in this process; nil otherwise.
	touched *touches
}

// touch records a written key for the watch checker.
func (t *tx) touch(key []byte) {
	if t.touched != nil {
		t.touched.keys = append(t.touched.keys, key)
	}
}

// bg is the context statements run with. A cancelable context makes both
// database/sql and the drivers start a goroutine per statement, which would
// double the cost of small transactions; tx checks its own context between
// statements instead, and statements are short.
var bg = context.Background()

func (t *tx) check() error {
	if t.err != nil {
		return t.err
	}
	if err := t.ctx.Err(); err != nil {
		t.err = err
	} else if time.Now().After(t.deadline) {
		t.err = kv.ErrTransactionTooOld.With("transaction ran longer than its time limit")
	}
	return t.err
}

// checkWrite is check for writes, which read the clock only every 16th
// time: reading it on every write cost 3% of a bulk insert, and reads and
// the commit check it every time anyway, as FoundationDB does.
func (t *tx) checkWrite() error {
	if t.err != nil {
		return t.err
	}
	t.writes++
	if t.writes%16 == 1 {
		return t.check()
	}
	if err := t.ctx.Err(); err != nil {
		t.err = err
	}
	return t.err
}

// fail records err as the transaction's error if it is the first.
func (t *tx) fail(err error) {
	if t.err == nil {
		t.err = err
	}
}

// count adds n bytes to the transaction's size.
func (t *tx) count(n int) {
	t.size += n
	if t.size > kv.MaxTransactionSize {
		t.fail(kv.ErrTransactionTooLarge.With("transaction of at least %d bytes exceeds %d", t.size, kv.MaxTransactionSize))
	}
}

// conflictSize is what a read or write conflict range over one key costs,
// as FoundationDB counts it: the key and the key followed by 0x00.
func conflictSize(key []byte) int { return 2*len(key) + 1 }

func (t *tx) Get(key []byte) ([]byte, error) {
	v, err := t.get(key)
	if err == nil {
		t.count(conflictSize(key))
	}
	return v, err
}

func (t *tx) get(key []byte) ([]byte, error) {
	if err := t.check(); err != nil {
		return nil, err
	}
	if len(key) > kv.MaxKeySize {
		return nil, kv.ErrKeyTooLarge.With("read of a key of %d bytes", len(key))
	}
	if _, ok := t.stamped[string(key)]; ok {
		return nil, kv.ErrAccessedUnreadable.With("key %s was written with a versionstamp in this transaction", tuple.Printable(key))
	}
	var v []byte
	switch err := t.c.get.QueryRowContext(bg, key).Scan(&v); {
	case errors.Is(err, sql.ErrNoRows):
		return nil, nil
	case err != nil:
		t.fail(fmt.Errorf("get %s: %w", tuple.Printable(key), err))
		return nil, t.err
	}
	if v == nil {
		v = []byte{} // present, but empty
	}
	return v, nil
}

func (t *tx) GetRange(r kv.Range, opts kv.RangeOptions) ([]kv.KeyValue, error) {
	kvs, err := t.getRange(r, opts)
	if err == nil {
		t.count(len(r.Begin) + len(r.End))
	}
	return kvs, err
}

// rowsPerCheck is how many rows a range read returns between checks of the
// context and the time limit.
const rowsPerCheck = 256

func (t *tx) getRange(r kv.Range, opts kv.RangeOptions) ([]kv.KeyValue, error) {
	if err := t.check(); err != nil {
		return nil, err
	}
	switch c := bytes.Compare(r.Begin, r.End); {
	case c > 0:
		return nil, kv.ErrInvertedRange.With("range begin %s sorts after its end %s", tuple.Printable(r.Begin), tuple.Printable(r.End))
	case c == 0:
		return nil, nil
	}
	for k := range t.stamped {
		if r.Contains([]byte(k)) {
			return nil, kv.ErrAccessedUnreadable.With("range holds key %s, written with a versionstamp in this transaction", tuple.Printable([]byte(k)))
		}
	}
	limit := opts.Limit
	if limit <= 0 {
		limit = -1
	}
	stmt := t.c.rangeAsc
	if opts.Reverse {
		stmt = t.c.rangeDsc
	}
	rows, err := stmt.QueryContext(bg, r.Begin, r.End, limit)
	if err != nil {
		t.fail(fmt.Errorf("range read: %w", err))
		return nil, t.err
	}
	defer rows.Close()
	var out []kv.KeyValue
	if opts.Limit > 0 {
		out = make([]kv.KeyValue, 0, min(opts.Limit, 1024))
	}
	for rows.Next() {
		var p kv.KeyValue
		if err := rows.Scan(&p.Key, &p.Value); err != nil {
			t.fail(fmt.Errorf("range read: %w", err))
			return nil, t.err
		}
		if p.Value == nil {
			p.Value = []byte{}
		}
		out = append(out, p)
		if len(out)%rowsPerCheck == 0 {
			if err := t.check(); err != nil {
				return nil, err
			}
		}
	}
	if err := rows.Err(); err != nil {
		t.fail(fmt.Errorf("range read: %w", err))
		return nil, t.err
	}
	return out, nil
}

func (t *tx) Snapshot() kv.ReadTx { return snapshot{t} }

// snapshot reads without counting conflict ranges: with SQLite's single
// writer there are no conflicts to avoid, but the size must not differ from
// what FoundationDB would count.
type snapshot struct{ t *tx }

func (s snapshot) Get(key []byte) ([]byte, error) { return s.t.get(key) }
func (s snapshot) GetRange(r kv.Range, opts kv.RangeOptions) ([]kv.KeyValue, error) {
	return s.t.getRange(r, opts)
}
func (s snapshot) Snapshot() kv.ReadTx { return s }

// mutate runs a write statement unless the transaction already failed.
func (t *tx) mutate(what string, key []byte, stmt *sql.Stmt, args ...any) {
	if t.checkWrite() != nil {
		return
	}
	if _, err := stmt.ExecContext(bg, args...); err != nil {
		t.fail(fmt.Errorf("%s %s: %w", what, tuple.Printable(key), err))
		return
	}
	t.mutated = true
}

func (t *tx) Set(key, value []byte) {
	if err := errors.Join(kv.CheckKey(key), kv.CheckValue(value)); err != nil {
		t.fail(fmt.Errorf("set %s: %w", tuple.Printable(truncate(key)), err))
		return
	}
	t.count(len(key) + len(value) + conflictSize(key))
	t.mutate("set", key, t.c.set, key, nonNil(value))
	t.touch(key)
}

func (t *tx) Clear(key []byte) {
	if err := kv.CheckKey(key); err != nil {
		t.fail(fmt.Errorf("clear: %w", err))
		return
	}
	t.count(2 * conflictSize(key))
	t.mutate("clear", key, t.c.clear, key)
	t.touch(key)
}

func (t *tx) ClearRange(r kv.Range) {
	if bytes.Compare(r.Begin, r.End) > 0 {
		t.fail(kv.ErrInvertedRange.With("clear range begin %s sorts after its end %s", tuple.Printable(r.Begin), tuple.Printable(r.End)))
		return
	}
	if len(r.Begin) > 0 && r.Begin[0] == 0xFF {
		t.fail(kv.ErrKeyOutsideLegalRange.With("clear range starts in the system keyspace"))
		return
	}
	t.count(2 * (len(r.Begin) + len(r.End)))
	t.mutate("clear range", r.Begin, t.c.clearRng, r.Begin, r.End)
	if t.touched != nil {
		t.touched.ranges = append(t.touched.ranges, r)
	}
}

func (t *tx) Add(key []byte, delta int64) {
	if err := kv.CheckKey(key); err != nil {
		t.fail(fmt.Errorf("add: %w", err))
		return
	}
	old, err := t.get(key)
	if err != nil {
		return
	}
	t.count(len(key) + 8 + conflictSize(key))
	t.mutate("add", key, t.c.set, key, kv.EncodeInt64(kv.DecodeInt64(old)+delta))
	t.touch(key)
}

func (t *tx) SetVersionstampedKey(key, value []byte) {
	k, err := t.stamp(key)
	if err == nil {
		err = errors.Join(kv.CheckKey(k), kv.CheckValue(value))
	}
	if err != nil {
		t.fail(fmt.Errorf("set versionstamped key: %w", err))
		return
	}
	t.count(len(key) + len(value) + conflictSize(k))
	t.mutate("set versionstamped key", k, t.c.set, k, nonNil(value))
	t.markStamped(k)
	t.touch(k)
}

func (t *tx) SetVersionstampedValue(key, value []byte) {
	v, err := t.stamp(value)
	if err == nil {
		err = errors.Join(kv.CheckKey(key), kv.CheckValue(v))
	}
	if err != nil {
		t.fail(fmt.Errorf("set versionstamped value of %s: %w", tuple.Printable(truncate(key)), err))
		return
	}
	t.count(len(key) + len(value) + conflictSize(key))
	t.mutate("set versionstamped value", key, t.c.set, key, v)
	t.markStamped(key)
	t.touch(key)
}

// markStamped makes a key unreadable for the rest of the transaction, as
// FoundationDB does with keys whose key or value it completes at commit.
func (t *tx) markStamped(key []byte) {
	if t.stamped == nil {
		t.stamped = make(map[string]struct{})
	}
	t.stamped[string(key)] = struct{}{}
}

// stamp returns b without its 4-byte offset suffix and with this commit's
// versionstamp written at that offset.
func (t *tx) stamp(b []byte) ([]byte, error) {
	if len(b) < 4 {
		return nil, kv.ErrInvalidOperation.With("versionstamped operand of %d bytes has no 4-byte offset", len(b))
	}
	body := b[:len(b)-4]
	off := binary.LittleEndian.Uint32(b[len(b)-4:])
	if uint64(off)+10 > uint64(len(body)) {
		return nil, kv.ErrInvalidOperation.With("versionstamp offset %d does not leave 10 bytes in an operand of %d", off, len(body))
	}
	vs, err := t.allocate()
	if err != nil {
		return nil, err
	}
	out := append([]byte(nil), body...)
	copy(out[off:], vs[:])
	return out, nil
}

// allocate takes this commit's version from the store's counter. The writer
// holds SQLite's write lock from BEGIN to COMMIT, so versions are taken in
// commit order by every process: strictly increasing.
func (t *tx) allocate() (kv.Versionstamp, error) {
	if t.version == 0 {
		if err := t.check(); err != nil {
			return kv.Versionstamp{}, err
		}
		v, err := t.s.nextVersion()
		if err == nil {
			_, err = t.c.bump.ExecContext(bg, v)
		}
		if err != nil {
			t.fail(fmt.Errorf("allocate commit version: %w", err))
			return kv.Versionstamp{}, t.err
		}
		t.version = v
	}
	return versionstamp(t.version), nil
}

func versionstamp(version int64) kv.Versionstamp {
	var vs kv.Versionstamp
	binary.BigEndian.PutUint64(vs[:8], uint64(version))
	return vs // the two order bytes stay zero: one batch per commit
}

func (t *tx) Versionstamp() kv.VersionstampFuture {
	if t.vs == nil {
		t.vs = &versionstampFuture{}
	}
	return t.vs
}

func (t *tx) Watch(key []byte) kv.Watch {
	w := newWatch(key)
	if err := kv.CheckKey(key); err != nil {
		w.fire(fmt.Errorf("watch: %w", err))
		return w
	}
	t.watches = append(t.watches, w)
	return w
}

func (t *tx) AddReadConflictKey(key []byte)   { t.count(conflictSize(key)) }
func (t *tx) AddWriteConflictKey(key []byte)  { t.count(conflictSize(key)) }
func (t *tx) AddReadConflictRange(r kv.Range) { t.count(len(r.Begin) + len(r.End)) }

// nonNil stores a nil value as an empty one: a key is present or absent,
// and a present key's value may be empty.
func nonNil(v []byte) []byte {
	if v == nil {
		return []byte{}
	}
	return v
}

// truncate shortens a key for an error message about its size.
func truncate(key []byte) []byte {
	if len(key) > 64 {
		return key[:64]
	}
	return key
}

// versionstampFuture is set when the transaction commits.
type versionstampFuture struct {
	vs  kv.Versionstamp
	err error
	set bool
}

func (f *versionstampFuture) Get() (kv.Versionstamp, error) {
	if !f.set {
		return kv.Versionstamp{}, kv.ErrInvalidOperation.With("versionstamp read before the transaction committed")
	}
	return f.vs, f.err
}
