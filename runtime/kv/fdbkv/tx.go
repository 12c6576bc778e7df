//go:build fdb

package fdbkv

import (
	"sync"

	"github.com/apple/foundationdb/bindings/go/src/fdb"

	"github.com/couchjobs/couchjobs/runtime/kv"
)

// reader is what fdb.Transaction and fdb.Snapshot share.
type reader interface {
	Get(key fdb.KeyConvertible) fdb.FutureByteSlice
	GetRange(r fdb.Range, options fdb.RangeOptions) fdb.RangeResult
}

// readTx reads through a transaction or its snapshot.
type readTx struct{ r reader }

func (t readTx) Get(key []byte) ([]byte, error) {
	v, err := t.r.Get(fdb.Key(key)).Get()
	return v, convert(err)
}

func (t readTx) GetRange(r kv.Range, opts kv.RangeOptions) ([]kv.KeyValue, error) {
	kvs, err := t.r.GetRange(fdb.KeyRange{Begin: fdb.Key(r.Begin), End: fdb.Key(r.End)}, fdb.RangeOptions{
		Limit:   max(opts.Limit, 0),
		Reverse: opts.Reverse,
		Mode:    fdb.StreamingModeWantAll,
	}).GetSliceWithError()
	if err != nil {
		return nil, convert(err)
	}
	out := make([]kv.KeyValue, len(kvs))
	for i, p := range kvs {
		out[i] = kv.KeyValue{Key: p.Key, Value: p.Value}
	}
	return out, nil
}

func (t readTx) Snapshot() kv.ReadTx {
	if tr, ok := t.r.(fdb.Transaction); ok {
		return readTx{r: tr.Snapshot()}
	}
	return t
}

// tx is a read-write transaction.
type tx struct {
	readTx
	tr      fdb.Transaction
	s       *Store
	watches []*watch
}

func (t *tx) Set(key, value []byte) { t.tr.Set(fdb.Key(key), value) }
func (t *tx) Clear(key []byte)      { t.tr.Clear(fdb.Key(key)) }
func (t *tx) ClearRange(r kv.Range) {
	t.tr.ClearRange(fdb.KeyRange{Begin: fdb.Key(r.Begin), End: fdb.Key(r.End)})
}
func (t *tx) Add(key []byte, delta int64) {
	t.tr.Add(fdb.Key(key), kv.EncodeInt64(delta))
}
func (t *tx) SetVersionstampedKey(key, value []byte) {
	t.tr.SetVersionstampedKey(fdb.Key(key), value)
}
func (t *tx) SetVersionstampedValue(key, value []byte) {
	t.tr.SetVersionstampedValue(fdb.Key(key), value)
}

func (t *tx) Versionstamp() kv.VersionstampFuture { return versionstampFuture{t.tr.GetVersionstamp()} }

// Conflict ranges the bindings refuse (an oversized key) fail the commit by
// themselves, so their errors need no handling here.
func (t *tx) AddReadConflictKey(key []byte) { t.tr.AddReadConflictKey(fdb.Key(key)) }
func (t *tx) AddReadConflictRange(r kv.Range) {
	t.tr.AddReadConflictRange(fdb.KeyRange{Begin: fdb.Key(r.Begin), End: fdb.Key(r.End)})
}
func (t *tx) AddWriteConflictKey(key []byte) { t.tr.AddWriteConflictKey(fdb.Key(key)) }

func (t *tx) Watch(key []byte) kv.Watch {
	w := &watch{fut: t.tr.Watch(fdb.Key(key)), done: make(chan struct{}), s: t.s}
	t.watches = append(t.watches, w)
	return w
}

// activateWatches starts waiting on the watches of a committed transaction.
func (t *tx) activateWatches() {
	for _, w := range t.watches {
		if !t.s.track(w) {
			w.fire(kv.ErrStoreClosed)
			w.fut.Cancel()
			continue
		}
		go w.wait()
	}
}

func (t *tx) failWatches(err error) {
	for _, w := range t.watches {
		w.fire(err)
		w.fut.Cancel()
	}
	t.watches = nil
}

type versionstampFuture struct{ f fdb.FutureKey }

func (f versionstampFuture) Get() (kv.Versionstamp, error) {
	k, err := f.f.Get()
	if err != nil {
		return kv.Versionstamp{}, convert(err)
	}
	var vs kv.Versionstamp
	copy(vs[:], k)
	return vs, nil
}

// watch waits for a FoundationDB watch future in a goroutine of its own,
// which ends when the future does: on a change, on Cancel, or on Close.
type watch struct {
	fut  fdb.FutureNil
	s    *Store
	done chan struct{}
	once sync.Once
	err  error
}

func (w *watch) wait() {
	w.fire(convert(w.fut.Get()))
	w.s.untrack(w)
}

func (w *watch) fire(err error) {
	w.once.Do(func() {
		w.err = err
		close(w.done)
	})
}

func (w *watch) Done() <-chan struct{} { return w.done }

func (w *watch) Err() error {
	select {
	case <-w.done:
		return w.err
	default:
		return nil
	}
}

func (w *watch) Cancel() {
	w.fire(kv.ErrWatchCanceled)
	w.fut.Cancel()
}

func (s *Store) track(w *watch) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.watches == nil {
		return false
	}
	s.watches[w] = struct{}{}
	return true
}

func (s *Store) untrack(w *watch) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.watches, w)
}
