package jobs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/couchjobs/couchjobs/runtime/kv"
	"github.com/couchjobs/couchjobs/runtime/kv/kvtest"
	"github.com/couchjobs/couchjobs/runtime/tuple"
)

// runMonitor runs the type's monitor until the test ends.
func runMonitor(t *testing.T, j *Jobs) {
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		j.Monitor(mctx, typ)
	}()
	t.Cleanup(func() { cancel(); <-done })
}

func TestMonitorRequeuesInactiveJobs(t *testing.T) {
	t.Parallel()
	j := newJobs(t, Options{})
	const timeout = 300 * time.Millisecond
	if err := j.SetTypeTimeout(ctx, typ, timeout); err != nil {
		t.Fatal(err)
	}
	mustAdd(t, j, NewJob{ID: "dead"})
	mustAdd(t, j, NewJob{ID: "alive"})
	jobs, err := j.Accept(ctx, typ, AcceptOptions{Limit: 2})
	if err != nil || len(jobs) != 2 {
		t.Fatalf("accept: %v", err)
	}
	var alive *Job
	for _, job := range jobs {
		if job.ID == "alive" {
			alive = job
		}
	}
	accepted := time.Now()
	runMonitor(t, j)
	// The live worker updates well within the timeout; the dead one never.
	stop := make(chan struct{})
	updates := make(chan error, 1)
	go func() {
		tick := time.NewTicker(timeout / 4)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				updates <- nil
				return
			case <-tick.C:
				if err := j.Update(ctx, alive, nil); err != nil {
					updates <- err
					return
				}
			}
		}
	}()
	deadline := time.Now().Add(10 * timeout)
	for state(t, j, "dead").State == Running {
		if time.Now().After(deadline) {
			t.Fatal("the inactive job was not re-enqueued")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if d := time.Since(accepted); d < timeout {
		t.Fatalf("re-enqueued after %v, before a whole timeout of %v", d, timeout)
	}
	time.Sleep(2 * timeout) // the live job keeps running past several checks
	close(stop)
	if err := <-updates; err != nil {
		t.Fatalf("the live worker lost its job: %v", err)
	}
	if in := state(t, j, "alive"); in.State != Running {
		t.Fatalf("the updated job is %s", in.State)
	}
	// The re-enqueued job runs again, and its old worker is shut out.
	again := mustAccept(t, j, AcceptOptions{})
	if again.ID != "dead" {
		t.Fatalf("accepted %s", again.ID)
	}
	for _, job := range jobs {
		if job.ID == "dead" {
			if err := j.Finish(ctx, job, nil); !errors.Is(err, ErrWorkerConflict) {
				t.Fatalf("the dead worker's late finish: %v", err)
			}
		}
	}
	if err := j.Finish(ctx, again, nil); err != nil {
		t.Fatal(err)
	}
}

// TestMonitorBacklog re-enqueues thousands of stale jobs while the store
// rejects every transaction that re-enqueues more than 300 of them as too
// large: the batches must shrink until they fit.
func TestMonitorBacklog(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	var sets atomic.Int64
	f := kvtest.NewFaulty(s)
	j := onStore(t, f, Options{})
	const n = 3000
	batch := make([]NewJob, n)
	for i := range batch {
		batch[i] = NewJob{Type: typ, ID: fmt.Sprintf("j%05d", i)}
	}
	if err := j.AddMany(ctx, batch); err != nil {
		t.Fatal(err)
	}
	if _, err := j.Accept(ctx, typ, AcceptOptions{Limit: n}); err != nil {
		t.Fatal(err)
	}
	// Count pending-entry writes per transaction; fail the big ones.
	pendingPrefix := j.sub.Sub(keyPending).Bytes()
	f.SetInject(func(p kvtest.Point) error {
		switch {
		case p.Op == "set" && bytes.HasPrefix(p.Key, pendingPrefix):
			if sets.Add(1) > 300 {
				return kv.ErrTransactionTooLarge
			}
		case p.Op == "begin":
			sets.Store(0)
		}
		return nil
	})
	// Every job is stale against a cutoff taken now.
	v, _ := s.ReadTransact(ctx, func(tx kv.ReadTx) (any, error) { return tx.Get(j.watchActivityKey(typ)) })
	cutoff := v.([]byte)
	if _, err := j.monitorPass(ctx, typ, time.Nanosecond, []mark{{at: time.Now().Add(-time.Hour), vs: mustVS(t, cutoff)}}); err != nil {
		t.Fatalf("monitor pass: %v", err)
	}
	if f.Injected() == 0 {
		t.Fatal("no batch was too large: the test tests nothing")
	}
	if c, _ := j.PendingCount(ctx, typ, 0, n+1); c != n {
		t.Fatalf("%d of %d stale jobs re-enqueued", c, n)
	}
}

func TestFaultsDuringAcceptUpdateFinish(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	f := kvtest.NewFaulty(s)
	j := onStore(t, f, Options{})
	const n = 100
	batch := make([]NewJob, n)
	for i := range batch {
		batch[i] = NewJob{Type: typ, ID: fmt.Sprintf("j%03d", i)}
	}
	if err := j.AddMany(ctx, batch); err != nil {
		t.Fatal(err)
	}
	// From now on one in twenty reads, writes and commits fails with a
	// conflict or a transient error; Transact retries them.
	retryable := []error{kv.ErrNotCommitted, kv.ErrTransactionTooOld, kv.ErrCommitUnknownResult}
	f.SetInject(func(p kvtest.Point) error {
		if rand.IntN(20) == 0 {
			return retryable[rand.IntN(len(retryable))]
		}
		return nil
	})
	finished := map[string]int{}
	for {
		jobs, err := j.Accept(ctx, typ, AcceptOptions{Limit: 3})
		if errors.Is(err, ErrNoJobs) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, job := range jobs {
			if err := j.Update(ctx, job, json.RawMessage(`{"half":true}`)); err != nil {
				t.Fatalf("update %s: %v", job.ID, err)
			}
			if err := j.Finish(ctx, job, json.RawMessage(`{"done":true}`)); err != nil {
				t.Fatalf("finish %s: %v", job.ID, err)
			}
			finished[job.ID]++
		}
	}
	if f.Injected() < 20 {
		t.Fatalf("only %d faults were injected", f.Injected())
	}
	f.SetInject(nil)
	if len(finished) != n {
		t.Fatalf("%d of %d jobs finished", len(finished), n)
	}
	for id, c := range finished {
		if c != 1 {
			t.Errorf("%s finished %d times", id, c)
		}
		if in := state(t, j, id); in.State != Finished || string(in.Data) != `{"done":true}` {
			t.Errorf("%s: %+v", id, in)
		}
	}
	// The monitor survives faults too: a stale job is still re-enqueued.
	if err := j.SetTypeTimeout(ctx, typ, 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	mustAdd(t, j, NewJob{ID: "stale"})
	mustAccept(t, j, AcceptOptions{})
	f.SetInject(func(p kvtest.Point) error {
		if rand.IntN(5) == 0 {
			return kv.ErrNotCommitted
		}
		return nil
	})
	runMonitor(t, j)
	deadline := time.Now().Add(10 * time.Second)
	for {
		in, err := j.Get(ctx, typ, "stale")
		if err == nil && in.State == Pending {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the monitor did not re-enqueue the stale job under faults")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// mustVS decodes the type's activity versionstamp value.
func mustVS(t *testing.T, b []byte) tuple.Versionstamp {
	t.Helper()
	tup, err := tuple.Unpack(b)
	if err != nil || len(tup) != 1 {
		t.Fatalf("activity versionstamp %x: %v", b, err)
	}
	return tup[0].(tuple.Versionstamp)
}

// TestTooLargeFailsCleanly makes the store refuse the commit of an accept,
// an update and a finish as too large: each call returns the error, and
// the job is left as it was.
func TestTooLargeFailsCleanly(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	f := kvtest.NewFaulty(s)
	j := onStore(t, f, Options{})
	mustAdd(t, j, NewJob{ID: "a", Data: json.RawMessage(`{"v":0}`)})
	refuse := func(on bool) {
		f.SetInject(func(p kvtest.Point) error {
			if on && p.Op == "commit" {
				return kv.ErrTransactionTooLarge
			}
			return nil
		})
	}
	refuse(true)
	if _, err := j.Accept(ctx, typ, AcceptOptions{}); !errors.Is(err, kv.ErrTransactionTooLarge) {
		t.Fatalf("accept: %v", err)
	}
	refuse(false)
	if in := state(t, j, "a"); in.State != Pending {
		t.Fatalf("after a refused accept the job is %s", in.State)
	}
	job := mustAccept(t, j, AcceptOptions{})
	refuse(true)
	if err := j.Update(ctx, job, json.RawMessage(`{"v":1}`)); !errors.Is(err, kv.ErrTransactionTooLarge) {
		t.Fatalf("update: %v", err)
	}
	if err := j.Finish(ctx, job, json.RawMessage(`{"v":2}`)); !errors.Is(err, kv.ErrTransactionTooLarge) {
		t.Fatalf("finish: %v", err)
	}
	refuse(false)
	if in := state(t, j, "a"); in.State != Running || string(in.Data) != `{"v":0}` {
		t.Fatalf("after refused update and finish: %+v", in)
	}
	// The worker still holds the job and can finish it.
	if err := j.Finish(ctx, job, json.RawMessage(`{"v":3}`)); err != nil {
		t.Fatal(err)
	}
}

// TestRunMonitorsStartsNewTypesAtOnce registers a type while RunMonitors
// runs, with the periodic look for types an hour away: the new type's
// monitor must start at once.
func TestRunMonitorsStartsNewTypesAtOnce(t *testing.T) {
	t.Parallel()
	j := newJobs(t, Options{MonitorTypesEvery: time.Hour})
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { j.RunMonitors(mctx); close(done) }()
	defer func() { cancel(); <-done }()
	time.Sleep(50 * time.Millisecond) // the first listing has passed
	if err := j.SetTypeTimeout(ctx, "late", 200*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := j.Add(ctx, NewJob{Type: "late", ID: "x"}); err != nil {
		t.Fatal(err)
	}
	if _, err := j.Accept(ctx, "late", AcceptOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		in, err := j.Get(ctx, "late", "x")
		if err != nil {
			t.Fatal(err)
		}
		if in.State == Pending {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the new type's stale job was not re-enqueued: its monitor did not start")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
