// Package jobs is the couch_jobs layer: background jobs of any type in a
// transactional store, following CouchDB's "Background jobs with
// FoundationDB" RFC and its implementation, couch_jobs.
//
// A job has a type and an id, JSON data, and a state: pending (in the
// pending queue), running (accepted by a worker, which holds its lock), or
// finished. Workers Accept jobs, Update them at least once per activity
// timeout of their type, and Finish or Resubmit them. An activity monitor
// re-enqueues running jobs whose worker stopped updating. Subscriptions
// report a job's changes.
//
// Every call that changes a job has a form that runs inside the caller's
// transaction (the ...Tx methods and the Job methods), so a worker's own
// writes commit atomically with the job update that proves it still holds
// the job: if the activity monitor gave the job to another worker, the
// update fails with ErrWorkerConflict and the worker's writes are rolled
// back with it. This is the RFC's mutual-exclusion rule.
package jobs

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/couchjobs/couchjobs/runtime/kv"
	"github.com/couchjobs/couchjobs/runtime/tuple"
)

// Errors callers act on.
var (
	// ErrWorkerConflict: the job is no longer held by this worker (the
	// activity monitor re-enqueued it, or another worker runs it). The
	// worker must stop and must not write for the job again.
	ErrWorkerConflict = errors.New("jobs: worker conflict: the job's lock is held by another worker or none")
	// ErrCanceled: the job was canceled or removed. The worker must stop.
	ErrCanceled = errors.New("jobs: job canceled or removed")
	// ErrJobExists: Add with Exclusive found a job with the same id.
	ErrJobExists = errors.New("jobs: job already exists")
	// ErrNotFound: no job of that type and id.
	ErrNotFound = errors.New("jobs: job not found")
	// ErrUnknownType: the type has no activity timeout set; types are
	// registered by setting one (SetTypeTimeout).
	ErrUnknownType = errors.New("jobs: unknown job type")
	// ErrInvalid: bad input; the error says what was wrong. Nothing was
	// changed.
	ErrInvalid = errors.New("jobs: invalid input")
	// ErrNoJobs: a non-blocking Accept found no eligible job.
	ErrNoJobs = errors.New("jobs: no eligible pending job")
)

// State is a job's state.
type State string

// Job states. NotFound is reported by subscriptions of removed jobs.
const (
	Pending  State = "pending"
	Running  State = "running"
	Finished State = "finished"
	NotFound State = "not_found"
)

// Limits on input.
const (
	// MaxTypeSize and MaxIDSize bound type names and job ids, in bytes.
	MaxTypeSize = 256
	MaxIDSize   = 1024
	// MaxPriority is the largest priority a job may have.
	MaxPriority = 1<<62 - 1
)

// Key layout, under the layer prefix (default ("couch_jobs")). The codes
// are couch_jobs' own; see docs/ARCHITECTURE.md.
const (
	keyData            = 1 // (1, type, id) = job record
	keyPending         = 2 // (2, type, placement, priority, id) = ""
	keyWatchPending    = 3 // (3, type) = versionstamp of the type's last enqueue
	keyWatchActivity   = 4 // (4, type) = versionstamp of the type's last change
	keyActivityTimeout = 5 // (5, type) = activity timeout in milliseconds; the type registry
	keyActivity        = 6 // (6, type, versionstamp, id) = "", one per running job
	keyWatchStop       = 7 // (7, type) = versionstamp of the last cancel or removal of a running job
	keyDelayed         = 8 // (8, type, due_ms, id) = "", pending jobs not due yet
	keyGroupIndex      = 9 // (9, type, group, placement, priority, id) = "", the pending queue by share group
)

// Options configure a Jobs layer.
type Options struct {
	// Prefix is the tuple under which every key of the layer lives;
	// default ("couch_jobs").
	Prefix tuple.Tuple
	// Logger receives the layer's logs; every line about a job carries
	// its type and id.
	Logger hclog.Logger
	// AcceptSpread is how many eligible jobs at the head of the queue an
	// acceptor chooses among at random, so that concurrent acceptors on
	// FoundationDB rarely pick the same job and conflict. couch_jobs reads
	// 1,024; a smaller head keeps the queue order closer to priority order
	// and each accept's read cheap. Zero means 16; a negative value means
	// none: strict priority order, for a store without conflicts (the
	// embedded store) or a caller that needs it.
	AcceptSpread int
	// Now is the clock; tests inject one. Default time.Now.
	Now func() time.Time
	// MonitorTypesEvery is how often RunMonitors looks for new job types.
	// Default 15 s, as couch_jobs.
	MonitorTypesEvery time.Duration
}

// Jobs is the job layer on one store. It is safe for concurrent use.
type Jobs struct {
	store kv.Store
	sub   kv.Subspace
	log   hclog.Logger
	opts  Options

	mu        sync.Mutex
	notifiers map[string]*notifier // by type, while it has subscriptions
	types     map[string]time.Time // registered types seen, until when to trust that
	// typesChanged wakes RunMonitors when this process registers a type,
	// so that its monitor starts at once rather than at the next listing.
	typesChanged chan struct{}
	// promoted is when this process last looked for due jobs, by type.
	promoted map[string]time.Time
	closed   bool
	wg       sync.WaitGroup // the notifiers' goroutines
}

// New returns the job layer on store. Call Close to stop its
// subscription notifiers.
func New(store kv.Store, opts Options) *Jobs {
	if opts.Prefix == nil {
		opts.Prefix = tuple.Tuple{"couch_jobs"}
	}
	if opts.Logger == nil {
		opts.Logger = hclog.NewNullLogger()
	}
	switch {
	case opts.AcceptSpread == 0:
		opts.AcceptSpread = 16
	case opts.AcceptSpread < 0:
		opts.AcceptSpread = 0
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.MonitorTypesEvery <= 0 {
		opts.MonitorTypesEvery = 15 * time.Second
	}
	return &Jobs{
		store:        store,
		sub:          kv.Sub(opts.Prefix...),
		log:          opts.Logger.Named("jobs"),
		opts:         opts,
		notifiers:    make(map[string]*notifier),
		types:        make(map[string]time.Time),
		typesChanged: make(chan struct{}, 1),
		promoted:     make(map[string]time.Time),
	}
}

// Store returns the store the layer runs on.
func (j *Jobs) Store() kv.Store { return j.store }

// Close stops the subscription notifiers and releases every open
// subscription. It does not close the store.
func (j *Jobs) Close() {
	j.mu.Lock()
	j.closed = true
	ns := j.notifiers
	j.notifiers = map[string]*notifier{}
	j.mu.Unlock()
	for _, n := range ns {
		n.stop()
	}
	j.wg.Wait()
}

func (j *Jobs) now() time.Time { return j.opts.Now() }

// nowMs is the current Unix time in milliseconds, the unit of due times.
func (j *Jobs) nowMs() int64 { return j.now().UnixMilli() }

// Keys.

func (j *Jobs) dataKey(typ, id string) []byte { return j.sub.Pack(tuple.Tuple{keyData, typ, id}) }

func (j *Jobs) pendingKey(typ, placement string, priority int64, id string) []byte {
	return j.sub.Pack(tuple.Tuple{keyPending, typ, placement, priority, id})
}

func (j *Jobs) groupIndexKey(typ, group, placement string, priority int64, id string) []byte {
	return j.sub.Pack(tuple.Tuple{keyGroupIndex, typ, group, placement, priority, id})
}

func (j *Jobs) delayedKey(typ string, due int64, id string) []byte {
	return j.sub.Pack(tuple.Tuple{keyDelayed, typ, due, id})
}

func (j *Jobs) watchPendingKey(typ string) []byte {
	return j.sub.Pack(tuple.Tuple{keyWatchPending, typ})
}

func (j *Jobs) watchActivityKey(typ string) []byte {
	return j.sub.Pack(tuple.Tuple{keyWatchActivity, typ})
}

func (j *Jobs) timeoutKey(typ string) []byte {
	return j.sub.Pack(tuple.Tuple{keyActivityTimeout, typ})
}

func (j *Jobs) activityKey(typ string, vs tuple.Versionstamp, id string) []byte {
	return j.sub.Pack(tuple.Tuple{keyActivity, typ, vs, id})
}

// stampedActivityKey is the activity key of a job updated by this
// transaction, for SetVersionstampedKey.
func (j *Jobs) stampedActivityKey(typ, id string) []byte {
	k, err := j.sub.PackWithVersionstamp(tuple.Tuple{keyActivity, typ, tuple.IncompleteVersionstamp(0), id})
	if err != nil {
		panic(err) // one incomplete versionstamp, always
	}
	return k
}

// touchType records a change of a job of typ: subscribers of the type wake
// on it, and the activity monitor reads it as the type's latest activity.
func (j *Jobs) touchType(tx kv.Tx, typ string) {
	tx.SetVersionstampedValue(j.watchActivityKey(typ), stampValue)
}

// WatchStopsTx returns a watch that fires when a running job of typ is
// canceled or removed, so that the node running it can stop it at once
// rather than at its worker's next update. Check the node's running jobs
// (GetTx) when it fires.
func (j *Jobs) WatchStopsTx(tx kv.Tx, typ string) kv.Watch {
	return tx.Watch(j.sub.Pack(tuple.Tuple{keyWatchStop, typ}))
}

// stopped records that a running job of typ was canceled or removed.
func (j *Jobs) stopped(tx kv.Tx, typ string) {
	tx.SetVersionstampedValue(j.sub.Pack(tuple.Tuple{keyWatchStop, typ}), stampValue)
}

// bumpPending wakes acceptors of typ blocked on an empty queue. The key
// holds the versionstamp of the type's last enqueue: a counter that every
// enqueue advances, written blindly, so that concurrent enqueues never
// conflict (on FoundationDB) and cost one write (on the embedded store,
// where an atomic add is a read and a write).
func (j *Jobs) bumpPending(tx kv.Tx, typ string) {
	tx.SetVersionstampedValue(j.watchPendingKey(typ), stampValue)
}

// stampValue is a value holding only this transaction's versionstamp.
var stampValue = func() []byte {
	v, err := tuple.Tuple{tuple.IncompleteVersionstamp(0)}.PackWithVersionstamp(nil)
	if err != nil {
		panic(err)
	}
	return v
}()

// validName checks a type name or job id.
func validName(what, s string, max int) error {
	if s == "" {
		return fmt.Errorf("%w: empty %s", ErrInvalid, what)
	}
	if len(s) > max {
		return fmt.Errorf("%w: %s of %d bytes exceeds %d", ErrInvalid, what, len(s), max)
	}
	return nil
}
