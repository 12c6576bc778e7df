package kvtest

import (
	"context"
	"sync"

	"github.com/couchjobs/couchjobs/runtime/kv"
)

// Point is where a Faulty store may inject an error: before an operation
// of a transaction, or at its commit.
type Point struct {
	// Op is "begin" (the start of an attempt), "get", "range", "set",
	// "clear", "clear_range", "add", "versionstamped_key",
	// "versionstamped_value", "watch" or "commit".
	Op string
	// Key is the operation's key (the range's begin); nil at commit.
	Key []byte
}

// Faulty wraps a store and fails transactions where its injector says, to
// test how a layer copes with a store that fails mid-operation: a conflict
// or a transient error (retried by Transact), or a limit error such as a
// transaction that grew too large (returned to the caller).
type Faulty struct {
	kv.Store

	mu       sync.Mutex
	inject   func(Point) error
	injected int
}

// NewFaulty wraps s; it injects nothing until SetInject.
func NewFaulty(s kv.Store) *Faulty { return &Faulty{Store: s} }

// SetInject sets the injector, called at every point of every transaction
// attempt: a non-nil error fails the attempt there. It may be called from
// many goroutines at once; nil injects nothing.
func (f *Faulty) SetInject(fn func(Point) error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.inject = fn
}

// Injected returns how many errors were injected so far.
func (f *Faulty) Injected() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.injected
}

func (f *Faulty) fault(p Point) error {
	f.mu.Lock()
	fn := f.inject
	f.mu.Unlock()
	if fn == nil {
		return nil
	}
	err := fn(p)
	if err != nil {
		f.mu.Lock()
		f.injected++
		f.mu.Unlock()
	}
	return err
}

// Transact runs fn on a transaction that fails where Inject says. An error
// injected at a write is reported by the next read or at commit, as
// FoundationDB reports errors of writes.
func (f *Faulty) Transact(ctx context.Context, fn func(kv.Tx) (any, error)) (any, error) {
	return f.Store.Transact(ctx, func(tx kv.Tx) (any, error) {
		if err := f.fault(Point{Op: "begin"}); err != nil {
			return nil, err
		}
		ft := &faultyTx{Tx: tx, f: f}
		v, err := fn(ft)
		if err == nil {
			err = ft.err
		}
		if err == nil {
			err = f.fault(Point{Op: "commit"})
		}
		return v, err
	})
}

// ReadTransact runs fn on a read transaction that fails where Inject says.
func (f *Faulty) ReadTransact(ctx context.Context, fn func(kv.ReadTx) (any, error)) (any, error) {
	return f.Store.ReadTransact(ctx, func(tx kv.ReadTx) (any, error) {
		return fn(faultyReadTx{ReadTx: tx, f: f})
	})
}

type faultyReadTx struct {
	kv.ReadTx
	f *Faulty
}

func (t faultyReadTx) Get(key []byte) ([]byte, error) {
	if err := t.f.fault(Point{Op: "get", Key: key}); err != nil {
		return nil, err
	}
	return t.ReadTx.Get(key)
}

func (t faultyReadTx) GetRange(r kv.Range, o kv.RangeOptions) ([]kv.KeyValue, error) {
	if err := t.f.fault(Point{Op: "range", Key: r.Begin}); err != nil {
		return nil, err
	}
	return t.ReadTx.GetRange(r, o)
}

func (t faultyReadTx) Snapshot() kv.ReadTx { return faultyReadTx{ReadTx: t.ReadTx.Snapshot(), f: t.f} }

type faultyTx struct {
	kv.Tx
	f   *Faulty
	err error // the first error injected at a write
}

func (t *faultyTx) write(op string, key []byte) bool {
	if t.err != nil {
		return false
	}
	t.err = t.f.fault(Point{Op: op, Key: key})
	return t.err == nil
}

func (t *faultyTx) Get(key []byte) ([]byte, error) {
	if t.err != nil {
		return nil, t.err
	}
	return faultyReadTx{ReadTx: t.Tx, f: t.f}.Get(key)
}

func (t *faultyTx) GetRange(r kv.Range, o kv.RangeOptions) ([]kv.KeyValue, error) {
	if t.err != nil {
		return nil, t.err
	}
	return faultyReadTx{ReadTx: t.Tx, f: t.f}.GetRange(r, o)
}

func (t *faultyTx) Snapshot() kv.ReadTx { return faultyReadTx{ReadTx: t.Tx.Snapshot(), f: t.f} }

func (t *faultyTx) Set(key, value []byte) {
	if t.write("set", key) {
		t.Tx.Set(key, value)
	}
}

func (t *faultyTx) Clear(key []byte) {
	if t.write("clear", key) {
		t.Tx.Clear(key)
	}
}

func (t *faultyTx) ClearRange(r kv.Range) {
	if t.write("clear_range", r.Begin) {
		t.Tx.ClearRange(r)
	}
}

func (t *faultyTx) Add(key []byte, delta int64) {
	if t.write("add", key) {
		t.Tx.Add(key, delta)
	}
}

func (t *faultyTx) SetVersionstampedKey(key, value []byte) {
	if t.write("versionstamped_key", key) {
		t.Tx.SetVersionstampedKey(key, value)
	}
}

func (t *faultyTx) SetVersionstampedValue(key, value []byte) {
	if t.write("versionstamped_value", key) {
		t.Tx.SetVersionstampedValue(key, value)
	}
}

func (t *faultyTx) Watch(key []byte) kv.Watch {
	t.write("watch", key)
	return t.Tx.Watch(key)
}
