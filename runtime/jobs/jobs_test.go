package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/couchjobs/couchjobs/runtime/kv"
	"github.com/couchjobs/couchjobs/runtime/kv/sqlitekv"
)

const typ = "work"

// newStore opens an embedded store in a temporary directory.
func newStore(t testing.TB) (*sqlitekv.Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "jobs.db")
	s, err := sqlitekv.Open(path, sqlitekv.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, path
}

// newJobs returns a job layer on a new store, with type "work" registered.
func newJobs(t testing.TB, opts Options) *Jobs {
	t.Helper()
	s, _ := newStore(t)
	return onStore(t, s, opts)
}

func onStore(t testing.TB, s kv.Store, opts Options) *Jobs {
	t.Helper()
	j := New(s, opts)
	t.Cleanup(j.Close)
	if err := j.SetTypeTimeout(context.Background(), typ, time.Minute); err != nil {
		t.Fatal(err)
	}
	return j
}

var ctx = context.Background()

func mustAdd(t testing.TB, j *Jobs, n NewJob) {
	t.Helper()
	if n.Type == "" {
		n.Type = typ
	}
	if err := j.Add(ctx, n); err != nil {
		t.Fatalf("add %s: %v", n.ID, err)
	}
}

func mustAccept(t testing.TB, j *Jobs, o AcceptOptions) *Job {
	t.Helper()
	jobs, err := j.Accept(ctx, typ, o)
	if err != nil {
		t.Fatalf("accept: %v", err)
	}
	if len(jobs) != 1 {
		t.Fatalf("accepted %d jobs, want 1", len(jobs))
	}
	return jobs[0]
}

func state(t testing.TB, j *Jobs, id string) Info {
	t.Helper()
	in, err := j.Get(ctx, typ, id)
	if err != nil {
		t.Fatalf("get %s: %v", id, err)
	}
	return in
}

func TestAddAndGet(t *testing.T) {
	t.Parallel()
	j := newJobs(t, Options{})
	mustAdd(t, j, NewJob{ID: "a", Data: json.RawMessage(`{"x":1}`), Group: "g1"})
	mustAdd(t, j, NewJob{ID: "b"})
	in := state(t, j, "a")
	if in.State != Pending || string(in.Data) != `{"x":1}` || in.Group != "g1" || in.Placement != AnyNode {
		t.Fatalf("a = %+v", in)
	}
	if in.Created.IsZero() || in.Updated.Before(in.Created) {
		t.Errorf("times: created %v updated %v", in.Created, in.Updated)
	}
	if in := state(t, j, "b"); string(in.Data) != "{}" || in.Group != typ {
		t.Errorf("defaults: data %s group %s", in.Data, in.Group)
	}
	err := j.Add(ctx, NewJob{Type: typ, ID: "a", Exclusive: true})
	if !errors.Is(err, ErrJobExists) {
		t.Errorf("exclusive add of an existing id: %v", err)
	}
	if _, err := j.Get(ctx, typ, "missing"); !errors.Is(err, ErrNotFound) {
		t.Errorf("get missing: %v", err)
	}
}

func TestValidation(t *testing.T) {
	t.Parallel()
	j := newJobs(t, Options{})
	big := `{"x":"` + strings.Repeat("a", kv.MaxValueSize) + `"}`
	cases := []struct {
		name string
		n    NewJob
		want error
		text string
	}{
		{"empty type", NewJob{ID: "x"}, ErrInvalid, "empty job type"},
		{"empty id", NewJob{Type: typ}, ErrInvalid, "empty job id"},
		{"long id", NewJob{Type: typ, ID: strings.Repeat("i", MaxIDSize+1)}, ErrInvalid, "job id of 1025 bytes"},
		{"unknown type", NewJob{Type: "nope", ID: "x"}, ErrUnknownType, `"nope"`},
		{"array data", NewJob{Type: typ, ID: "x", Data: json.RawMessage(`[1]`)}, ErrInvalid, "not a JSON object"},
		{"null data", NewJob{Type: typ, ID: "x", Data: json.RawMessage(`null`)}, ErrInvalid, "not a JSON object"},
		{"broken data", NewJob{Type: typ, ID: "x", Data: json.RawMessage(`{"a":`)}, ErrInvalid, "not a JSON object"},
		{"data too large", NewJob{Type: typ, ID: "x", Data: json.RawMessage(big)}, ErrInvalid, "exceeds the limit"},
		{"negative priority", NewJob{Type: typ, ID: "x", Priority: -1}, ErrInvalid, "priority -1"},
		{"bad placement", NewJob{Type: typ, ID: "x", Placement: "rack:1"}, ErrInvalid, `placement "rack:1"`},
		{"empty node", NewJob{Type: typ, ID: "x", Placement: "node:"}, ErrInvalid, "placement"},
	}
	for _, c := range cases {
		err := j.Add(ctx, c.n)
		if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.text) {
			t.Errorf("%s: err = %v, want %v containing %q", c.name, err, c.want, c.text)
		}
	}
	// A batch with one bad job stores none of it.
	err := j.AddMany(ctx, []NewJob{{Type: typ, ID: "ok"}, {Type: typ, ID: "bad", Data: json.RawMessage(`"s"`)}})
	if !errors.Is(err, ErrInvalid) {
		t.Errorf("bad batch: %v", err)
	}
	err = j.AddMany(ctx, []NewJob{{Type: typ, ID: "dup"}, {Type: typ, ID: "dup"}})
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "twice") {
		t.Errorf("duplicate in batch: %v", err)
	}
	if infos, _, err := j.List(ctx, typ, ListOptions{}); err != nil || len(infos) != 0 {
		t.Fatalf("bad input stored %d jobs (%v)", len(infos), err)
	}
	if err := j.SetTypeTimeout(ctx, typ, 0); !errors.Is(err, ErrInvalid) {
		t.Errorf("zero timeout: %v", err)
	}
}

func TestReAddFollowsCouchJobs(t *testing.T) {
	t.Parallel()
	j := newJobs(t, Options{AcceptSpread: -1})
	// Pending: data and schedule are updated.
	mustAdd(t, j, NewJob{ID: "p", Data: json.RawMessage(`{"v":1}`), Priority: 50})
	mustAdd(t, j, NewJob{ID: "q", Priority: 10})
	mustAdd(t, j, NewJob{ID: "p", Data: json.RawMessage(`{"v":2}`), Priority: 5})
	if in := state(t, j, "p"); string(in.Data) != `{"v":2}` || in.Priority != 5 {
		t.Fatalf("re-added pending job: %+v", in)
	}
	if n, _ := j.PendingCount(ctx, typ, math.MaxInt64, 0); n != 2 {
		t.Fatalf("%d pending entries after re-adding a pending job, want 2", n)
	}
	job := mustAccept(t, j, AcceptOptions{})
	if job.ID != "p" {
		t.Fatalf("accepted %s first, want p (priority 5)", job.ID)
	}
	// Running: flagged for resubmission, data kept.
	mustAdd(t, j, NewJob{ID: "p", Data: json.RawMessage(`{"v":3}`), Priority: 7})
	if in := state(t, j, "p"); in.State != Running || !in.Resubmit || string(in.Data) != `{"v":2}` {
		t.Fatalf("re-added running job: %+v", in)
	}
	if err := j.Update(ctx, job, json.RawMessage(`{"v":"worker"}`)); err != nil || !job.ResubmitRequested {
		t.Fatalf("update: %v, ResubmitRequested %v", err, job.ResubmitRequested)
	}
	if err := j.Finish(ctx, job, nil); err != nil {
		t.Fatal(err)
	}
	if in := state(t, j, "p"); in.State != Pending || in.Resubmit || in.Priority != 7 || string(in.Data) != `{"v":"worker"}` {
		t.Fatalf("finished resubmitted job: %+v", in)
	}
	// Finished: enqueued again with new data.
	job = mustAccept(t, j, AcceptOptions{})
	if err := j.Finish(ctx, job, json.RawMessage(`{"done":true}`)); err != nil {
		t.Fatal(err)
	}
	if in := state(t, j, job.ID); in.State != Finished {
		t.Fatalf("not finished: %+v", in)
	}
	mustAdd(t, j, NewJob{ID: job.ID, Data: json.RawMessage(`{"again":1}`)})
	if in := state(t, j, job.ID); in.State != Pending || string(in.Data) != `{"again":1}` {
		t.Fatalf("re-added finished job: %+v", in)
	}
}

func TestAcceptOrderAndLimit(t *testing.T) {
	t.Parallel()
	j := newJobs(t, Options{AcceptSpread: -1})
	var batch []NewJob
	for i, p := range []int64{30, 10, 20, 0, 40} {
		batch = append(batch, NewJob{Type: typ, ID: fmt.Sprintf("j%d", i), Priority: p})
	}
	if err := j.AddMany(ctx, batch); err != nil {
		t.Fatal(err)
	}
	jobs, err := j.Accept(ctx, typ, AcceptOptions{Limit: 3})
	if err != nil {
		t.Fatal(err)
	}
	var got []int64
	for _, job := range jobs {
		got = append(got, job.Priority)
	}
	if fmt.Sprint(got) != "[0 10 20]" {
		t.Fatalf("accepted priorities %v, want [0 10 20]", got)
	}
	seen := map[string]bool{}
	for _, job := range jobs {
		if seen[string(job.Lock[:])] {
			t.Fatal("two jobs share a lock")
		}
		seen[string(job.Lock[:])] = true
		if state(t, j, job.ID).State != Running {
			t.Fatalf("%s not running", job.ID)
		}
	}
	jobs, _ = j.Accept(ctx, typ, AcceptOptions{Limit: 10})
	if len(jobs) != 2 {
		t.Fatalf("second accept took %d, want the 2 left", len(jobs))
	}
	if _, err := j.Accept(ctx, typ, AcceptOptions{}); !errors.Is(err, ErrNoJobs) {
		t.Fatalf("empty queue: %v", err)
	}
	if _, err := j.Accept(ctx, "nope", AcceptOptions{}); !errors.Is(err, ErrUnknownType) {
		t.Fatalf("unknown type: %v", err)
	}
}

func TestAcceptSpreadStaysInHead(t *testing.T) {
	t.Parallel()
	j := newJobs(t, Options{AcceptSpread: 4})
	for i := range 50 {
		mustAdd(t, j, NewJob{ID: fmt.Sprintf("j%02d", i), Priority: int64(i)})
	}
	for range 5 {
		job := mustAccept(t, j, AcceptOptions{})
		if job.Priority > 9 {
			t.Fatalf("accepted priority %d from far behind the head", job.Priority)
		}
	}
}

// TestScheduledJobs checks that a job scheduled for later waits in the
// delayed queue until it is due, whatever its priority, and then runs in
// priority order.
func TestScheduledJobs(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	now := time.UnixMilli(1_800_000_000_000)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	j := newJobs(t, Options{Now: clock, AcceptSpread: -1})
	mustAdd(t, j, NewJob{ID: "later", At: now.Add(time.Hour), Priority: 0})
	mustAdd(t, j, NewJob{ID: "now-low", Priority: 50})
	if in := state(t, j, "later"); in.State != Pending || !in.Due.Equal(now.Add(time.Hour)) {
		t.Fatalf("scheduled job: %+v", in)
	}
	if n, _ := j.PendingCount(ctx, typ, 0, 0); n != 1 {
		t.Fatalf("pending count of due jobs = %d, want 1", n)
	}
	// Even with the better priority, the scheduled job waits.
	if job := mustAccept(t, j, AcceptOptions{}); job.ID != "now-low" {
		t.Fatalf("accepted %s", job.ID)
	}
	if _, err := j.Accept(ctx, typ, AcceptOptions{}); !errors.Is(err, ErrNoJobs) {
		t.Fatalf("a job scheduled in an hour was accepted now: %v", err)
	}
	mu.Lock()
	now = now.Add(time.Hour)
	mu.Unlock()
	if n, _ := j.PendingCount(ctx, typ, 0, 0); n != 1 {
		t.Fatalf("pending count once due = %d, want 1", n)
	}
	if job := mustAccept(t, j, AcceptOptions{}); job.ID != "later" {
		t.Fatalf("accepted %s", job.ID)
	}
	// Canceling a scheduled job removes its delayed entry too.
	mustAdd(t, j, NewJob{ID: "gone", At: now.Add(time.Minute)})
	if err := j.Cancel(ctx, typ, "gone"); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	now = now.Add(time.Hour)
	mu.Unlock()
	if _, err := j.Accept(ctx, typ, AcceptOptions{}); !errors.Is(err, ErrNoJobs) {
		t.Fatalf("a canceled scheduled job was accepted: %v", err)
	}
}

func TestMaxPriority(t *testing.T) {
	t.Parallel()
	j := newJobs(t, Options{AcceptSpread: -1})
	mustAdd(t, j, NewJob{ID: "ten", Priority: 10})
	mustAdd(t, j, NewJob{ID: "twenty", Priority: 20})
	if n, _ := j.PendingCount(ctx, typ, 15, 0); n != 1 {
		t.Fatalf("pending count up to 15 = %d", n)
	}
	jobs, err := j.Accept(ctx, typ, AcceptOptions{MaxPriority: 15, Limit: 5})
	if err != nil || len(jobs) != 1 || jobs[0].ID != "ten" {
		t.Fatalf("accept up to 15: %v %v", jobs, err)
	}
	if _, err := j.Accept(ctx, typ, AcceptOptions{MaxPriority: 15}); !errors.Is(err, ErrNoJobs) {
		t.Fatalf("accepted a priority over the bound: %v", err)
	}
}

func TestBlockingAccept(t *testing.T) {
	t.Parallel()
	j := newJobs(t, Options{})
	got := make(chan *Job, 1)
	go func() {
		jobs, err := j.Accept(ctx, typ, AcceptOptions{Wait: true})
		if err != nil {
			t.Error(err)
		}
		got <- jobs[0]
	}()
	time.Sleep(50 * time.Millisecond) // let it block
	select {
	case <-got:
		t.Fatal("accept returned with an empty queue")
	default:
	}
	mustAdd(t, j, NewJob{ID: "wake"})
	select {
	case job := <-got:
		if job.ID != "wake" {
			t.Fatalf("accepted %s", job.ID)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a blocked accept did not wake when a job was added")
	}
	// A blocked accept also wakes when a scheduled job becomes due.
	mustAdd(t, j, NewJob{ID: "soon", At: time.Now().Add(150 * time.Millisecond)})
	start := time.Now()
	jobs, err := j.Accept(ctx, typ, AcceptOptions{Wait: true})
	if err != nil || jobs[0].ID != "soon" {
		t.Fatalf("accept = %v, %v", jobs, err)
	}
	if d := time.Since(start); d < 100*time.Millisecond {
		t.Fatalf("a job due in 150ms was accepted after %v", d)
	}
	// A context ends the wait.
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := j.Accept(cctx, typ, AcceptOptions{Wait: true}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("accept with an expiring context: %v", err)
	}
}

func TestPlacement(t *testing.T) {
	t.Parallel()
	j := newJobs(t, Options{AcceptSpread: -1})
	mustAdd(t, j, NewJob{ID: "any", Priority: 30})
	mustAdd(t, j, NewJob{ID: "on-a", Priority: 10, Placement: OnNode("a")})
	mustAdd(t, j, NewJob{ID: "in-g", Priority: 20, Placement: InGroup("g")})
	mustAdd(t, j, NewJob{ID: "on-b", Priority: 0, Placement: OnNode("b")})
	if n, _ := j.PendingCount(ctx, typ, 0, 0); n != 4 {
		t.Fatalf("pending count across placements = %d", n)
	}
	// Node c in no group sees only the job for any node.
	if job := mustAccept(t, j, AcceptOptions{Node: "c"}); job.ID != "any" {
		t.Fatalf("node c took %s", job.ID)
	}
	if _, err := j.Accept(ctx, typ, AcceptOptions{Node: "c"}); !errors.Is(err, ErrNoJobs) {
		t.Fatalf("node c took another job: %v", err)
	}
	// Node a in group g takes its jobs in priority order across placements.
	var order []string
	for range 2 {
		order = append(order, mustAccept(t, j, AcceptOptions{Node: "a", Groups: []string{"g"}}).ID)
	}
	if fmt.Sprint(order) != "[on-a in-g]" {
		t.Fatalf("node a took %v", order)
	}
	if job := mustAccept(t, j, AcceptOptions{Node: "b"}); job.ID != "on-b" {
		t.Fatalf("node b took %s", job.ID)
	}
}

func TestUpdateAndFinish(t *testing.T) {
	t.Parallel()
	j := newJobs(t, Options{})
	mustAdd(t, j, NewJob{ID: "a", Data: json.RawMessage(`{"step":0}`)})
	job := mustAccept(t, j, AcceptOptions{})
	if string(job.Data) != `{"step":0}` {
		t.Fatalf("accepted data %s", job.Data)
	}
	for i := 1; i <= 3; i++ {
		if err := j.Update(ctx, job, json.RawMessage(fmt.Sprintf(`{"step":%d}`, i))); err != nil {
			t.Fatal(err)
		}
	}
	if in := state(t, j, "a"); in.State != Running || string(in.Data) != `{"step":3}` {
		t.Fatalf("after updates: %+v", in)
	}
	if err := j.Update(ctx, job, json.RawMessage(`"bad"`)); !errors.Is(err, ErrInvalid) {
		t.Fatalf("update with bad data: %v", err)
	}
	if err := j.Finish(ctx, job, json.RawMessage(`{"result":"ok"}`)); err != nil {
		t.Fatal(err)
	}
	if in := state(t, j, "a"); in.State != Finished || string(in.Data) != `{"result":"ok"}` {
		t.Fatalf("after finish: %+v", in)
	}
	// The activity entry is gone: the monitor has nothing to look at.
	v, _ := j.store.ReadTransact(ctx, func(tx kv.ReadTx) (any, error) {
		return tx.GetRange(j.sub.Sub(keyActivity).Range(), kv.RangeOptions{})
	})
	if n := len(v.([]kv.KeyValue)); n != 0 {
		t.Fatalf("%d activity entries after finish", n)
	}
	if err := j.Update(ctx, job, nil); !errors.Is(err, ErrWorkerConflict) {
		t.Fatalf("update after finish: %v", err)
	}
	if err := j.Finish(ctx, job, nil); !errors.Is(err, ErrWorkerConflict) {
		t.Fatalf("second finish: %v", err)
	}
}

func TestMutualExclusion(t *testing.T) {
	t.Parallel()
	j := newJobs(t, Options{})
	mustAdd(t, j, NewJob{ID: "a"})
	old := mustAccept(t, j, AcceptOptions{})
	// The job is taken from the old worker (as the monitor would) and
	// given to a new one.
	if _, err := j.store.Transact(ctx, func(tx kv.Tx) (any, error) {
		return j.requeueStaleTx(tx, typ, "a")
	}); err != nil {
		t.Fatal(err)
	}
	fresh := mustAccept(t, j, AcceptOptions{})
	// The old worker's update and its own write in the same transaction
	// both fail; nothing of it commits.
	side := []byte("side-effect")
	_, err := j.store.Transact(ctx, func(tx kv.Tx) (any, error) {
		tx.Set(side, []byte("stale worker"))
		return nil, old.Update(tx, json.RawMessage(`{"by":"old"}`))
	})
	if !errors.Is(err, ErrWorkerConflict) {
		t.Fatalf("stale worker's update: %v", err)
	}
	v, _ := j.store.ReadTransact(ctx, func(tx kv.ReadTx) (any, error) { return tx.Get(side) })
	if v.([]byte) != nil {
		t.Fatal("the stale worker's write committed")
	}
	if err := j.Finish(ctx, fresh, nil); err != nil {
		t.Fatalf("the new worker: %v", err)
	}
}

// requeueStaleTx takes a running job back as the activity monitor does.
func (j *Jobs) requeueStaleTx(tx kv.Tx, typ, id string) (any, error) {
	r, err := j.load(tx, typ, id)
	if err != nil || r == nil || r.state != Running {
		return nil, fmt.Errorf("job %s not running: %v", id, err)
	}
	tx.Clear(j.activityKey(typ, r.activityVS(), id))
	r.state, r.lock = Pending, nil
	tx.Set(j.pendingKey(typ, r.placement, r.priority, id), nil)
	j.save(tx, typ, id, r, false)
	j.bumpPending(tx, typ)
	return nil, nil
}

func TestCancelAndRemove(t *testing.T) {
	t.Parallel()
	j := newJobs(t, Options{AcceptSpread: -1})
	mustAdd(t, j, NewJob{ID: "p1", Priority: 1})
	mustAdd(t, j, NewJob{ID: "r1", Priority: 2})
	mustAdd(t, j, NewJob{ID: "r2", Priority: 3})
	mustAdd(t, j, NewJob{ID: "p2", Priority: 4})
	if err := j.Cancel(ctx, typ, "p1"); err != nil {
		t.Fatal(err)
	}
	if in := state(t, j, "p1"); in.State != Finished || !in.Canceled {
		t.Fatalf("canceled pending job: %+v", in)
	}
	r1 := mustAccept(t, j, AcceptOptions{})
	r2 := mustAccept(t, j, AcceptOptions{})
	if r1.ID != "r1" || r2.ID != "r2" {
		t.Fatalf("accepted %s, %s: a canceled job was accepted", r1.ID, r2.ID)
	}
	// Cancel a running job: its worker is told on its next call.
	if err := j.Cancel(ctx, typ, "r1"); err != nil {
		t.Fatal(err)
	}
	if err := j.Update(ctx, r1, nil); !errors.Is(err, ErrCanceled) {
		t.Fatalf("update of a canceled job: %v", err)
	}
	if err := j.Cancel(ctx, typ, "r1"); err != nil {
		t.Fatalf("canceling a finished job: %v", err)
	}
	// Remove a running job: the worker gets a halt, readers not-found.
	if err := j.Remove(ctx, typ, "r2"); err != nil {
		t.Fatal(err)
	}
	if err := j.Finish(ctx, r2, nil); !errors.Is(err, ErrCanceled) {
		t.Fatalf("finish of a removed job: %v", err)
	}
	if _, err := j.Get(ctx, typ, "r2"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("get of a removed job: %v", err)
	}
	// Remove a pending job: it leaves the queue.
	if err := j.Remove(ctx, typ, "p2"); err != nil {
		t.Fatal(err)
	}
	if _, err := j.Accept(ctx, typ, AcceptOptions{}); !errors.Is(err, ErrNoJobs) {
		t.Fatalf("a removed job was accepted: %v", err)
	}
	if err := j.Remove(ctx, typ, "p2"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second remove: %v", err)
	}
	if err := j.Cancel(ctx, typ, "nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("cancel of a missing job: %v", err)
	}
}

func TestResubmitVariants(t *testing.T) {
	t.Parallel()
	now := time.Now()
	j := newJobs(t, Options{})
	mustAdd(t, j, NewJob{ID: "a", Data: json.RawMessage(`{"n":1}`)})
	job := mustAccept(t, j, AcceptOptions{})
	// The worker resubmits itself for later, with new data.
	at := now.Add(time.Hour)
	if _, err := j.store.Transact(ctx, func(tx kv.Tx) (any, error) {
		return nil, job.Resubmit(tx, ResubmitOptions{At: at, Data: json.RawMessage(`{"n":2}`)})
	}); err != nil {
		t.Fatal(err)
	}
	in := state(t, j, "a")
	if in.State != Pending || in.Due.UnixMilli() != at.UnixMilli() || string(in.Data) != `{"n":2}` {
		t.Fatalf("worker resubmit: %+v", in)
	}
	if _, err := j.Accept(ctx, typ, AcceptOptions{}); !errors.Is(err, ErrNoJobs) {
		t.Fatal("a job resubmitted for later ran now")
	}
	// A user resubmits the pending job to run now.
	if err := j.Resubmit(ctx, typ, "a", ResubmitOptions{}); err != nil {
		t.Fatal(err)
	}
	job = mustAccept(t, j, AcceptOptions{})
	// A user resubmits the running job: it keeps its data and runs again.
	if err := j.Resubmit(ctx, typ, "a", ResubmitOptions{Data: json.RawMessage(`{"n":3}`)}); err != nil {
		t.Fatal(err)
	}
	if in := state(t, j, "a"); !in.Resubmit || string(in.Data) != `{"n":2}` {
		t.Fatalf("resubmitted running job: %+v", in)
	}
	if err := j.Finish(ctx, job, nil); err != nil {
		t.Fatal(err)
	}
	job = mustAccept(t, j, AcceptOptions{})
	if err := j.Finish(ctx, job, nil); err != nil {
		t.Fatal(err)
	}
	// A finished job gets new data when resubmitted.
	if err := j.Resubmit(ctx, typ, "a", ResubmitOptions{Data: json.RawMessage(`{"n":4}`)}); err != nil {
		t.Fatal(err)
	}
	if in := state(t, j, "a"); in.State != Pending || string(in.Data) != `{"n":4}` {
		t.Fatalf("resubmitted finished job: %+v", in)
	}
	if err := j.Resubmit(ctx, typ, "nope", ResubmitOptions{}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("resubmit of a missing job: %v", err)
	}
}

func TestFinishMany(t *testing.T) {
	t.Parallel()
	j := newJobs(t, Options{})
	for i := range 5 {
		mustAdd(t, j, NewJob{ID: fmt.Sprint(i)})
	}
	jobs, err := j.Accept(ctx, typ, AcceptOptions{Limit: 5})
	if err != nil || len(jobs) != 5 {
		t.Fatalf("accept: %d, %v", len(jobs), err)
	}
	if err := j.Cancel(ctx, typ, jobs[1].ID); err != nil {
		t.Fatal(err)
	}
	done := make([]Done, len(jobs))
	for i, job := range jobs {
		done[i] = Done{Job: job, Data: json.RawMessage(`{"ok":true}`)}
	}
	done[3].Data = json.RawMessage(`[]`)
	errs, err := j.FinishMany(ctx, done)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range errs {
		want := error(nil)
		switch i {
		case 1:
			want = ErrCanceled
		case 3:
			want = ErrInvalid
		}
		if !errors.Is(e, want) || (want == nil && e != nil) {
			t.Errorf("job %d: %v, want %v", i, e, want)
		}
	}
	for _, i := range []int{0, 2, 4} {
		if in := state(t, j, jobs[i].ID); in.State != Finished {
			t.Errorf("job %d: %s", i, in.State)
		}
	}
	if in := state(t, j, jobs[3].ID); in.State != Running {
		t.Errorf("the job with bad data changed: %s", in.State)
	}
}

func TestListAndFold(t *testing.T) {
	t.Parallel()
	j := newJobs(t, Options{})
	var batch []NewJob
	for i := range 250 {
		batch = append(batch, NewJob{Type: typ, ID: fmt.Sprintf("job-%03d", i)})
	}
	if err := j.AddMany(ctx, batch); err != nil {
		t.Fatal(err)
	}
	jobs, _ := j.Accept(ctx, typ, AcceptOptions{Limit: 30})
	var ids []string
	after := ""
	for pages := 0; ; pages++ {
		infos, next, err := j.List(ctx, typ, ListOptions{After: after, Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		for _, in := range infos {
			ids = append(ids, in.ID)
		}
		if next == "" {
			break
		}
		if pages > 5 {
			t.Fatal("paging does not end")
		}
		after = next
	}
	if len(ids) != 250 || ids[0] != "job-000" || ids[249] != "job-249" {
		t.Fatalf("paged through %d ids, %v … %v", len(ids), ids[:1], ids[len(ids)-1:])
	}
	running := 0
	if err := j.Fold(ctx, typ, ListOptions{State: Running, Limit: 7}, func(in Info) error {
		if in.State != Running {
			t.Errorf("fold by state gave %s", in.State)
		}
		running++
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if running != len(jobs) {
		t.Fatalf("fold found %d running, want %d", running, len(jobs))
	}
	stop := errors.New("stop")
	if err := j.Fold(ctx, typ, ListOptions{}, func(Info) error { return stop }); !errors.Is(err, stop) {
		t.Fatalf("fold did not stop: %v", err)
	}
}

func TestTypes(t *testing.T) {
	t.Parallel()
	j := newJobs(t, Options{})
	if err := j.SetTypeTimeout(ctx, "other", 3*time.Second); err != nil {
		t.Fatal(err)
	}
	types, err := j.Types(ctx)
	if err != nil || fmt.Sprint(types) != "[{other 3s} {work 1m0s}]" {
		t.Fatalf("types = %v, %v", types, err)
	}
	if d, err := j.TypeTimeout(ctx, "other"); err != nil || d != 3*time.Second {
		t.Fatalf("timeout = %v, %v", d, err)
	}
	if err := j.ClearTypeTimeout(ctx, "other"); err != nil {
		t.Fatal(err)
	}
	if _, err := j.TypeTimeout(ctx, "other"); !errors.Is(err, ErrUnknownType) {
		t.Fatalf("cleared type: %v", err)
	}
	if err := j.Add(ctx, NewJob{Type: "other", ID: "x"}); !errors.Is(err, ErrUnknownType) {
		t.Fatalf("add to a cleared type: %v", err)
	}
}

func TestWatchStops(t *testing.T) {
	t.Parallel()
	j := newJobs(t, Options{AcceptSpread: -1})
	watch := func() kv.Watch {
		v, err := j.store.Transact(ctx, func(tx kv.Tx) (any, error) { return j.WatchStopsTx(tx, typ), nil })
		if err != nil {
			t.Fatal(err)
		}
		return v.(kv.Watch)
	}
	fired := func(w kv.Watch, d time.Duration) bool {
		select {
		case <-w.Done():
			return true
		case <-time.After(d):
			return false
		}
	}
	mustAdd(t, j, NewJob{ID: "pending"})
	w := watch()
	if err := j.Cancel(ctx, typ, "pending"); err != nil {
		t.Fatal(err)
	}
	if fired(w, 100*time.Millisecond) {
		t.Fatal("canceling a pending job fired the stop watch")
	}
	w.Cancel()
	for _, stop := range []func(id string) error{
		func(id string) error { return j.Cancel(ctx, typ, id) },
		func(id string) error { return j.Remove(ctx, typ, id) },
	} {
		mustAdd(t, j, NewJob{ID: "run"})
		mustAccept(t, j, AcceptOptions{})
		w := watch()
		if err := stop("run"); err != nil {
			t.Fatal(err)
		}
		if !fired(w, 5*time.Second) {
			t.Fatal("stopping a running job did not fire the stop watch")
		}
		j.Remove(ctx, typ, "run")
	}
}

func TestNodeListPlacement(t *testing.T) {
	t.Parallel()
	j := newJobs(t, Options{AcceptSpread: -1})
	mustAdd(t, j, NewJob{ID: "ab", Placement: "nodes:b,a,b"})
	info, err := j.Get(ctx, typ, "ab")
	if err != nil || info.Placement != "nodes:a,b" {
		t.Fatalf("normalized placement %q, %v", info.Placement, err)
	}
	if n, _ := j.PendingCount(ctx, typ, 0, 0); n != 1 {
		t.Fatalf("a node-list job counts %d times", n)
	}
	if _, err := j.Accept(ctx, typ, AcceptOptions{Node: "c"}); !errors.Is(err, ErrNoJobs) {
		t.Fatalf("node c took a job for a and b: %v", err)
	}
	job := mustAccept(t, j, AcceptOptions{Node: "b"})
	// Taking it from b's queue removed it from a's too.
	if _, err := j.Accept(ctx, typ, AcceptOptions{Node: "a"}); !errors.Is(err, ErrNoJobs) {
		t.Fatalf("node a took a job b runs: %v", err)
	}
	// The worker sends it on to node c alone.
	if _, err := j.store.Transact(ctx, func(tx kv.Tx) (any, error) {
		return nil, job.Resubmit(tx, ResubmitOptions{Placement: OnNode("c")})
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := j.Accept(ctx, typ, AcceptOptions{Node: "b"}); !errors.Is(err, ErrNoJobs) {
		t.Fatalf("node b took a job resubmitted to c: %v", err)
	}
	if job := mustAccept(t, j, AcceptOptions{Node: "c"}); job.Placement != "node:c" {
		t.Fatalf("node c took a job placed %q", job.Placement)
	}
	// A list of one is a node; bad lists are refused.
	mustAdd(t, j, NewJob{ID: "one", Placement: OnNodes("d")})
	if info, _ := j.Get(ctx, typ, "one"); info.Placement != "node:d" {
		t.Fatalf("list of one placed %q", info.Placement)
	}
	for _, p := range []Placement{"nodes:", "nodes:a,,b"} {
		if err := j.Add(ctx, NewJob{Type: typ, ID: "bad", Placement: p}); !errors.Is(err, ErrInvalid) {
			t.Errorf("placement %q: %v", p, err)
		}
	}
	// A pending node-list job that is removed or rescheduled leaves no
	// entry behind in any of its queues.
	mustAdd(t, j, NewJob{ID: "xy", Placement: OnNodes("x", "y")})
	if err := j.Resubmit(ctx, typ, "xy", ResubmitOptions{Placement: OnNodes("y", "z")}); err != nil {
		t.Fatal(err)
	}
	if _, err := j.Accept(ctx, typ, AcceptOptions{Node: "x"}); !errors.Is(err, ErrNoJobs) {
		t.Fatalf("node x took a job moved to y and z: %v", err)
	}
	if err := j.Remove(ctx, typ, "xy"); err != nil {
		t.Fatal(err)
	}
	for _, node := range []string{"y", "z"} {
		if _, err := j.Accept(ctx, typ, AcceptOptions{Node: node}); !errors.Is(err, ErrNoJobs) {
			t.Fatalf("node %s took a removed job: %v", node, err)
		}
	}
}

// An acceptor with a ranking takes the best-ranked groups' jobs first,
// in priority order within a rank; PendingGroups counts who waits.
func TestAcceptRankAndPendingGroups(t *testing.T) {
	t.Parallel()
	j := newJobs(t, Options{})
	for i := range 5 {
		mustAdd(t, j, NewJob{ID: fmt.Sprint("a", i), Group: "a", Priority: int64(1 + i)})
	}
	for i := range 3 {
		mustAdd(t, j, NewJob{ID: fmt.Sprint("b", i), Group: "b", Priority: int64(10 + i)})
	}
	mustAdd(t, j, NewJob{ID: "listed", Group: "c", Placement: OnNodes("n", "m")})
	counts, err := j.PendingGroups(ctx, typ, 0)
	if err != nil || counts["a"] != 5 || counts["b"] != 3 || counts["c"] != 1 {
		t.Fatalf("pending groups %v, %v", counts, err)
	}
	rank := func(g string, picked int) int {
		if g == "b" {
			return 0
		}
		return 1
	}
	got, err := j.Accept(ctx, typ, AcceptOptions{Node: "x", Limit: 2, Rank: rank})
	if err != nil || len(got) != 2 || got[0].ID != "b0" || got[1].ID != "b1" {
		t.Fatalf("accepted %v, %v", got, err)
	}
	got, _ = j.Accept(ctx, typ, AcceptOptions{Node: "x", Limit: 3, Rank: rank})
	var ids []string
	for _, job := range got {
		ids = append(ids, job.ID)
	}
	// The b left first, then a's head in priority order.
	if len(ids) != 3 || ids[0] != "a0" || ids[1] != "a1" || ids[2] != "b2" {
		t.Fatalf("with one b left, took %v", ids)
	}
	// A rank that counts the batch's picks spreads a batch over groups.
	for i := range 4 {
		mustAdd(t, j, NewJob{ID: fmt.Sprint("c", i), Group: "c", Priority: 1})
		mustAdd(t, j, NewJob{ID: fmt.Sprint("d", i), Group: "d", Priority: 2})
	}
	got, _ = j.Accept(ctx, typ, AcceptOptions{Node: "x", Limit: 4, Rank: func(g string, picked int) int {
		if g == "c" || g == "d" {
			return picked
		}
		return 100
	}})
	perGroup := map[string]int{}
	for _, job := range got {
		perGroup[job.Group]++
	}
	if perGroup["c"] != 2 || perGroup["d"] != 2 {
		t.Fatalf("a batch of 4 took %v", perGroup)
	}
}

// WaitPending returns at once when a job waits, and otherwise when one is
// added, without taking it.
func TestWaitPending(t *testing.T) {
	t.Parallel()
	j := newJobs(t, Options{})
	o := AcceptOptions{Node: "n"}
	done := make(chan error, 1)
	go func() { done <- j.WaitPending(ctx, typ, o) }()
	select {
	case err := <-done:
		t.Fatalf("returned with nothing pending: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	mustAdd(t, j, NewJob{ID: "w"})
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("did not return after an add")
	}
	if err := j.WaitPending(ctx, typ, o); err != nil {
		t.Fatalf("with a job pending: %v", err)
	}
	if n, _ := j.PendingCount(ctx, typ, 0, 0); n != 1 {
		t.Fatalf("WaitPending took the job: %d pending", n)
	}
	// A job for another node does not count.
	j2 := newJobs(t, Options{})
	mustAdd(t, j2, NewJob{ID: "elsewhere", Placement: OnNode("x")})
	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if err := j2.WaitPending(cctx, typ, o); err == nil {
		t.Fatal("returned for a job placed on another node")
	}
}

// An entry of the queue by group whose job is gone is cleared when a
// ranked acceptor finds it, and does not hide the group's real jobs.
func TestStaleGroupIndexEntry(t *testing.T) {
	t.Parallel()
	j := newJobs(t, Options{})
	if _, err := j.store.Transact(ctx, func(tx kv.Tx) (any, error) {
		tx.Set(j.groupIndexKey(typ, "g", string(AnyNode), 0, "ghost"), nil)
		return nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	mustAdd(t, j, NewJob{ID: "real", Group: "g", Priority: 5})
	rank := func(string, int) int { return 0 }
	var got []string
	for range 2 {
		jobs, err := j.Accept(ctx, typ, AcceptOptions{Rank: rank, RankGroups: []string{"g"}})
		if err != nil && !errors.Is(err, ErrNoJobs) {
			t.Fatal(err)
		}
		for _, job := range jobs {
			got = append(got, job.ID)
		}
	}
	if fmt.Sprint(got) != "[real]" {
		t.Fatalf("took %v", got)
	}
	counts, _ := j.PendingGroups(ctx, typ, 0)
	if counts["g"] != 0 {
		t.Fatalf("the stale entry is still counted: %v", counts)
	}
}
