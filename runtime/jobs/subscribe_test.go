package jobs

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/couchjobs/couchjobs/runtime/kv/kvtest"
)

func next(t *testing.T, s *Subscription) Event {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ev, err := s.Next(c)
	if err != nil {
		t.Fatalf("no event for %s: %v", s.ID, err)
	}
	return ev
}

func TestSubscribeFollowsAJob(t *testing.T) {
	t.Parallel()
	j := newJobs(t, Options{})
	mustAdd(t, j, NewJob{ID: "a"})
	s, err := j.Subscribe(ctx, typ, "a")
	if err != nil {
		t.Fatal(err)
	}
	if ev := s.Latest(); ev.State != Pending {
		t.Fatalf("first event %s", ev.State)
	}
	job := mustAccept(t, j, AcceptOptions{})
	if ev := next(t, s); ev.State != Running {
		t.Fatalf("after accept: %s", ev.State)
	}
	if err := j.Update(ctx, job, json.RawMessage(`{"progress":50}`)); err != nil {
		t.Fatal(err)
	}
	if ev := next(t, s); ev.State != Running || string(ev.Info.Data) != `{"progress":50}` {
		t.Fatalf("after update: %+v", ev)
	}
	if err := j.Finish(ctx, job, json.RawMessage(`{"result":1}`)); err != nil {
		t.Fatal(err)
	}
	ev := next(t, s)
	if ev.State != Finished || string(ev.Info.Data) != `{"result":1}` || !s.Ended() {
		t.Fatalf("after finish: %+v, ended %v", ev, s.Ended())
	}
	// A finished job's subscription starts ended.
	s2, err := j.Subscribe(ctx, typ, "a")
	if err != nil || !s2.Ended() || s2.Latest().State != Finished {
		t.Fatalf("subscription to a finished job: %+v, %v", s2.Latest(), err)
	}
	s3, err := j.Subscribe(ctx, typ, "missing")
	if err != nil || !s3.Ended() || s3.Latest().State != NotFound {
		t.Fatalf("subscription to a missing job: %+v, %v", s3.Latest(), err)
	}
}

func TestSubscribeRemovedJob(t *testing.T) {
	t.Parallel()
	j := newJobs(t, Options{})
	mustAdd(t, j, NewJob{ID: "a"})
	s, _ := j.Subscribe(ctx, typ, "a")
	if err := j.Remove(ctx, typ, "a"); err != nil {
		t.Fatal(err)
	}
	if ev := next(t, s); ev.State != NotFound || !s.Ended() {
		t.Fatalf("removed job: %+v", ev)
	}
}

func TestWaitOnManyJobs(t *testing.T) {
	t.Parallel()
	j := newJobs(t, Options{AcceptSpread: -1})
	var subs []*Subscription
	for i := range 3 {
		id := fmt.Sprint(i)
		mustAdd(t, j, NewJob{ID: id, Priority: int64(i)})
		s, err := j.Subscribe(ctx, typ, id)
		if err != nil {
			t.Fatal(err)
		}
		subs = append(subs, s)
	}
	running := make(chan *Subscription, 1)
	go func() {
		s, ev, err := j.Wait(ctx, subs, Running)
		if err != nil || ev.State != Running {
			t.Errorf("wait: %v, %v", ev.State, err)
		}
		running <- s
	}()
	job := mustAccept(t, j, AcceptOptions{})
	select {
	case s := <-running:
		if s.ID != job.ID {
			t.Fatalf("wait reported %s, %s runs", s.ID, job.ID)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("wait did not see the job start")
	}
	// Waiting for running stops at a job that finished without being seen
	// running: it can no longer get there.
	if err := j.Cancel(ctx, typ, "2"); err != nil {
		t.Fatal(err)
	}
	c, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s, ev, err := j.Wait(c, subs[1:], Running)
	if err != nil || s.ID != "2" || ev.State != Finished || !ev.Info.Canceled {
		t.Fatalf("wait = %v %+v %v", s, ev, err)
	}
	// A context ends a wait.
	c2, cancel2 := context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancel2()
	if _, _, err := j.Wait(c2, subs[1:2], Finished); err == nil {
		t.Fatal("wait returned without an event")
	}
}

// TestOneWatchPerType checks that many subscribers of one type cost one
// store watch per notification round, not one each.
func TestOneWatchPerType(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	f := kvtest.NewFaulty(s)
	var watches atomic.Int64
	f.SetInject(func(p kvtest.Point) error {
		if p.Op == "watch" {
			watches.Add(1)
		}
		return nil
	})
	j := onStore(t, f, Options{})
	const n = 100
	batch := make([]NewJob, n)
	for i := range batch {
		batch[i] = NewJob{Type: typ, ID: fmt.Sprint(i)}
	}
	if err := j.AddMany(ctx, batch); err != nil {
		t.Fatal(err)
	}
	subs := make([]*Subscription, n)
	for i := range subs {
		var err error
		if subs[i], err = j.Subscribe(ctx, typ, fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(100 * time.Millisecond) // let subscriptions settle
	before := watches.Load()
	if _, err := j.Accept(ctx, typ, AcceptOptions{Limit: n}); err != nil {
		t.Fatal(err)
	}
	for _, s := range subs {
		if ev := next(t, s); ev.State != Running {
			t.Fatalf("%s: %s", s.ID, ev.State)
		}
	}
	if w := watches.Load() - before; w > 3 {
		t.Fatalf("%d store watches for one change seen by %d subscribers", w, n)
	}
	j.mu.Lock()
	notifiers := len(j.notifiers)
	j.mu.Unlock()
	if notifiers != 1 {
		t.Fatalf("%d notifiers for one type", notifiers)
	}
	// Close releases every subscriber.
	j.Close()
	for _, s := range subs {
		if !s.Ended() {
			t.Fatalf("subscription %s still open after Close", s.ID)
		}
	}
}
