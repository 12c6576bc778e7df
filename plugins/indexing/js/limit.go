package js

import (
	"errors"
	"fmt"
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dop251/goja"
)

// checkEvery is how often a running call's time and memory are checked. A
// map call usually ends in microseconds, long before the first check.
const checkEvery = 10 * time.Millisecond

// errShared: the heap grew past a call's memory limit while other calls
// ran beside it, so the growth may be theirs. The call runs again alone.
var errShared = errors.New("js: the heap grew past the limit during the call")

// calls lets a call run alone. Go cannot count what one goroutine
// allocates, only what the process holds; so every call holds calls
// shared, and a call stopped for memory with others beside it runs again
// holding it exclusively, where the heap's growth is its own. A well
// behaved call stopped for a neighbour's growth thus succeeds on its
// second run, and only the culprit fails with ErrTooMuchMemory.
var calls sync.RWMutex

// running counts the calls under way, and started every call ever
// started: a call that began with no other running, and during which no
// other began, is alone without taking calls exclusively.
var running, started atomic.Int64

// reruns counts the calls run again alone, for tests.
var reruns atomic.Int64

// reset is a program run after an interrupted call: goja keeps the
// values of an interrupted call on its stack until a call ends normally,
// and they would count against the next call.
var reset = goja.MustCompile("reset", "0", true)

// heapSample reads one runtime metric, in bytes.
func heapSample(name string) uint64 {
	s := []metrics.Sample{{Name: name}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}

// heapInUse is the heap's objects, live or not yet collected: cheap to
// read, and an upper bound of the live heap.
func heapInUse() uint64 { return heapSample("/memory/classes/heap/objects:bytes") }

// heapLive is the heap the last collection found live.
func heapLive() uint64 { return heapSample("/gc/heap/live:bytes") }

// recent caches heapLive for the starts of calls: reading it costs about
// a microsecond, a few percent of a short map call, and the figure only
// changes when a collection ends.
var recent struct {
	at   atomic.Int64 // unix nanoseconds of the read
	live atomic.Uint64
}

// recentLive is heapLive as read at most a millisecond before now.
func recentLive(now time.Time) uint64 {
	if now.UnixNano()-recent.at.Load() < int64(time.Millisecond) {
		return recent.live.Load()
	}
	live := heapLive()
	recent.live.Store(live)
	recent.at.Store(now.UnixNano())
	return live
}

// run calls f under the limits, running it again alone if the heap grew
// past the memory limit while other calls ran (see calls). f must start
// from a clean state each time it is called.
func (e *engine) run(f func() (goja.Value, error)) (goja.Value, error) {
	calls.RLock()
	v, err := e.watch(f, false)
	calls.RUnlock()
	if errors.Is(err, errShared) {
		reruns.Add(1)
		calls.Lock()
		defer calls.Unlock()
		v, err = e.watch(f, true)
	}
	return v, err
}

// watch calls f, checking every checkEvery whether the call has run past
// the timeout or grown the heap by more than the memory limit. Growth is
// the live heap, as the latest collection found it, minus the live heap
// at the start; collections run as the heap grows, so a growing call is
// seen by the one after it passes the limit. Alone, the start is measured
// after a collection of its own.
func (e *engine) watch(f func() (goja.Value, error), alone bool) (goja.Value, error) {
	var baseline uint64
	if alone {
		runtime.GC()
		baseline = heapLive() // not the cached figure, from before this collection
	}
	start := time.Now()
	if !alone {
		baseline = recentLive(start)
	}
	first := started.Add(1)
	beganAlone := running.Add(1) == 1
	defer running.Add(-1)
	var (
		mu    sync.Mutex // orders the checks' interrupts before the end of the call
		done  bool
		limit = uint64(e.limits.MaxMemory)
		t     *time.Timer
	)
	interrupt := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if !done {
			e.vm.Interrupt(err)
		}
	}
	check := func() {
		if time.Since(start) >= e.limits.Timeout {
			interrupt(ErrTimeout)
			return
		}
		live := heapLive()
		if live <= baseline+limit && heapInUse() > baseline+2*limit {
			// No collection has run for a while (the heap's goal is
			// far above the limit): run one. Forcing one whenever the
			// in-use figure passes the limit would collect at every
			// check while a call holds much garbage, and starve it.
			runtime.GC()
			live = heapLive()
		}
		if live > baseline+limit {
			if alone || (beganAlone && started.Load() == first) {
				interrupt(ErrTooMuchMemory)
			} else {
				interrupt(errShared)
			}
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if !done {
			t.Reset(min(checkEvery, e.limits.Timeout-time.Since(start)))
		}
	}
	mu.Lock()
	t = time.AfterFunc(min(checkEvery, e.limits.Timeout), check)
	mu.Unlock()
	v, err := f()
	mu.Lock()
	done = true
	t.Stop()
	mu.Unlock()
	// No check interrupts after done: clearing here leaves the next call
	// a clean runtime.
	e.vm.ClearInterrupt()
	var ie *goja.InterruptedError
	if errors.As(err, &ie) {
		if _, err := e.vm.RunProgram(reset); err != nil {
			return nil, fmt.Errorf("js: reset after an interrupted call: %w", err)
		}
		if cause, ok := ie.Value().(error); ok {
			return nil, cause
		}
		return nil, ErrTimeout
	}
	return v, err
}
