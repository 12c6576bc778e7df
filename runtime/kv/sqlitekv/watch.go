package sqlitekv

import (
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/couchjobs/couchjobs/runtime/kv"
)

// Polling periods of the watch checker. With inotify the poll is only a
// safety net; without it (a file system that does not support it), polling
// is how changes from other processes are seen.
const (
	safetyPoll   = time.Second
	fallbackPoll = 2 * time.Millisecond
)

// watch is one kv.Watch. Its key's starting value is read inside the
// transaction that created it, just before commit.
type watch struct {
	key      []byte
	present  bool
	baseline []byte
	done     chan struct{}
	once     sync.Once
	err      error // written once, before done is closed
	owner    *watcher
	mu       sync.Mutex // guards owner
}

func newWatch(key []byte) *watch {
	return &watch{key: append([]byte(nil), key...), done: make(chan struct{})}
}

func (w *watch) fire(err error) {
	w.once.Do(func() {
		w.err = err
		close(w.done)
	})
}

func (w *watch) fired() bool {
	select {
	case <-w.done:
		return true
	default:
		return false
	}
}

func (w *watch) Done() <-chan struct{} { return w.done }

func (w *watch) Err() error {
	if w.fired() {
		return w.err
	}
	return nil
}

func (w *watch) Cancel() {
	w.fire(kv.ErrWatchCanceled)
	w.mu.Lock()
	owner := w.owner
	w.mu.Unlock()
	if owner != nil {
		owner.remove(w)
	}
}

// watcher checks the watched keys of one Store whenever a commit may have
// changed them: at once after a commit of this process, and when another
// process writes the notify file after its commit.
type watcher struct {
	s      *Store
	notify *os.File
	fsw    *fsnotify.Watcher // nil when the file system cannot notify
	wake   chan struct{}
	stop   chan struct{}
	exited chan struct{}

	mu          sync.Mutex
	byKey       map[string]map[*watch]struct{}
	force       bool  // a watch was added since the last check
	lastVersion int64 // the version the last check saw
}

func newWatcher(s *Store) (*watcher, error) {
	f, err := os.OpenFile(s.notifyPath(), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	w := &watcher{
		s:      s,
		notify: f,
		wake:   make(chan struct{}, 1),
		stop:   make(chan struct{}),
		exited: make(chan struct{}),
		byKey:  make(map[string]map[*watch]struct{}),
	}
	// Probe that the file system can notify; the file is then followed
	// only while watches are pending (see follow).
	if fsw, err := fsnotify.NewWatcher(); err != nil {
		s.log.Warn("no file notifications; polling for commits of other processes", "error", err)
	} else if err := fsw.Add(s.notifyPath()); err != nil {
		fsw.Close()
		s.log.Warn("no file notifications; polling for commits of other processes", "file", s.notifyPath(), "error", err)
	} else {
		fsw.Remove(s.notifyPath())
		w.fsw = fsw
	}
	go w.run()
	return w, nil
}

// committed is called after every write commit of this process.
// committed is called after every write commit of this process, with the
// keys and ranges the transaction wrote (recorded only while watches are
// pending). A commit that took the version right after the last one the
// checker processed, and touched no watched key, changed no watched value:
// the checker's mark moves on without reading anything. Otherwise (another
// process committed in between, or a watched key was written) the checker
// runs.
func (w *watcher) committed(version int64, touched *touches) {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(version))
	if _, err := w.notify.WriteAt(b[:], 0); err != nil {
		w.s.log.Warn("cannot write the notify file; other processes' watches will be late", "error", err)
	}
	w.mu.Lock()
	if len(w.byKey) == 0 {
		w.mu.Unlock()
		return
	}
	if !w.force && version == w.lastVersion+1 && touched != nil && !touched.any(w.byKey) {
		w.lastVersion = version
		w.mu.Unlock()
		return
	}
	w.mu.Unlock()
	w.poke()
}

// active reports whether watches are pending, so that transactions know to
// record the keys they write.
func (w *watcher) active() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.byKey) > 0
}

// touches are the keys and ranges a transaction wrote.
type touches struct {
	keys   [][]byte
	ranges []kv.Range
}

func (t *touches) any(watched map[string]map[*watch]struct{}) bool {
	for _, k := range t.keys {
		if _, ok := watched[string(k)]; ok {
			return true
		}
	}
	for _, r := range t.ranges {
		for k := range watched {
			if r.Contains([]byte(k)) {
				return true
			}
		}
	}
	return false
}

// seen reports whether the checker already processed the commit whose
// version the notify file holds, so that a notification of this
// process's own commit, or of one already checked, costs no read.
func (w *watcher) seen() bool {
	var b [8]byte
	if n, err := w.notify.ReadAt(b[:], 0); n != len(b) || err != nil {
		return false
	}
	v := int64(binary.BigEndian.Uint64(b[:]))
	w.mu.Lock()
	defer w.mu.Unlock()
	return !w.force && v <= w.lastVersion
}

func (w *watcher) poke() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (w *watcher) register(ws []*watch) {
	w.mu.Lock()
	if len(w.byKey) == 0 {
		w.follow(true)
	}
	for _, x := range ws {
		if x.fired() {
			continue
		}
		x.mu.Lock()
		x.owner = w
		x.mu.Unlock()
		set := w.byKey[string(x.key)]
		if set == nil {
			set = make(map[*watch]struct{})
			w.byKey[string(x.key)] = set
		}
		set[x] = struct{}{}
	}
	// The key may have changed between the commit and now (or before the
	// notify file was followed), and the last check may already have seen
	// that version.
	w.force = true
	w.mu.Unlock()
	w.poke()
}

func (w *watcher) remove(x *watch) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if set := w.byKey[string(x.key)]; set != nil {
		delete(set, x)
		if len(set) == 0 {
			delete(w.byKey, string(x.key))
			if len(w.byKey) == 0 {
				w.follow(false)
			}
		}
	}
}

// follow starts or stops following the notify file; w.mu is held. Only a
// process with pending watches follows it, so that a process without any is
// not woken by every commit, its own included. Following starts before the
// forced check of a new watch, so no commit falls between the two.
func (w *watcher) follow(on bool) {
	if w.fsw == nil {
		return
	}
	var err error
	if on {
		err = w.fsw.Add(w.s.notifyPath())
	} else {
		err = w.fsw.Remove(w.s.notifyPath())
	}
	if err != nil {
		w.s.log.Warn("cannot follow the notify file; the safety poll will find changes late", "follow", on, "error", err)
	}
}

func (w *watcher) run() {
	defer close(w.exited)
	period := safetyPoll
	var events <-chan fsnotify.Event
	var errs <-chan error
	if w.fsw != nil {
		events, errs = w.fsw.Events, w.fsw.Errors
	} else {
		period = fallbackPoll
	}
	tick := time.NewTicker(period)
	defer tick.Stop()
	// Wake-ups coalesce in the one-slot wake channel: under a stream of
	// commits the checker runs back to back, one check covering every
	// commit since the last. It never sleeps between checks, because an
	// idle Go process rounds sub-millisecond sleeps up to a millisecond.
	for {
		select {
		case <-w.stop:
			return
		case <-w.wake:
		case _, ok := <-events:
			if !ok {
				events, errs = nil, nil
				tick.Reset(fallbackPoll)
			} else if w.seen() {
				continue
			}
		case err, ok := <-errs:
			if ok {
				w.s.log.Warn("file notification error; checking watches", "error", err)
			}
		case <-tick.C:
		}
		w.check()
	}
}

// check reads every watched key once and fires the watches whose key no
// longer holds its starting value. It reads nothing when no commit happened
// since the last check and no watch was added.
func (w *watcher) check() {
	w.mu.Lock()
	if len(w.byKey) == 0 {
		w.mu.Unlock()
		return
	}
	force := w.force
	w.force = false
	keys := make([][]byte, 0, len(w.byKey))
	for k := range w.byKey {
		keys = append(keys, []byte(k))
	}
	last := w.lastVersion
	w.mu.Unlock()

	type state struct {
		version int64
		values  [][]byte
	}
	res, err := w.s.ReadTransact(context.Background(), func(rt kv.ReadTx) (any, error) {
		t := rt.(*tx)
		var st state
		if err := t.c.version.QueryRowContext(bg).Scan(&st.version); err != nil {
			return nil, err
		}
		if st.version == last && !force {
			return st, nil
		}
		st.values = make([][]byte, len(keys))
		for i, k := range keys {
			v, err := t.get(k)
			if err != nil {
				return nil, err
			}
			st.values[i] = v
		}
		return st, nil
	})
	if err != nil {
		w.s.log.Warn("checking watches failed; will retry", "error", err)
		w.mu.Lock()
		w.force = true
		w.mu.Unlock()
		return
	}
	st := res.(state)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.lastVersion = st.version
	for i, k := range keys {
		if st.values == nil {
			break
		}
		v := st.values[i]
		for x := range w.byKey[string(k)] {
			if x.present != (v != nil) || !bytes.Equal(x.baseline, v) {
				x.fire(nil)
				delete(w.byKey[string(k)], x)
			}
		}
		if len(w.byKey[string(k)]) == 0 {
			delete(w.byKey, string(k))
		}
	}
	if len(w.byKey) == 0 {
		w.follow(false)
	}
}

// close stops the checker and fails every pending watch.
func (w *watcher) close() {
	close(w.stop)
	<-w.exited
	if w.fsw != nil {
		w.fsw.Close()
	}
	w.notify.Close()
	w.mu.Lock()
	defer w.mu.Unlock()
	for k, set := range w.byKey {
		for x := range set {
			x.fire(kv.ErrStoreClosed)
		}
		delete(w.byKey, k)
	}
}
