package jobs

import (
	"context"
	"reflect"
	"sync"
	"time"

	"github.com/couchjobs/couchjobs/runtime/kv"
	"github.com/couchjobs/couchjobs/runtime/tuple"
)

// Event is a job's state and data as a subscription last saw them.
type Event struct {
	// State is the job's state, or NotFound once it was removed.
	State State
	// Info is the job as of this event; zero for NotFound.
	Info Info
}

// terminal reports whether no later event can follow.
func (e Event) terminal() bool { return e.State == Finished || e.State == NotFound }

// Subscription follows one job's changes. Events coalesce: a reader sees
// the latest state, not every intermediate one. A subscription ends by
// itself when the job finishes or is removed.
type Subscription struct {
	Type, ID string

	j       *Jobs
	mu      sync.Mutex
	last    Event
	seq     int           // counts events
	seen    int           // the last seq Next returned
	changed chan struct{} // closed at the next event
	ended   bool
}

// Subscribe returns a subscription to a job, with its current state as the
// first event (Latest). A finished or missing job gives an ended
// subscription. All subscriptions of a type share one store watch.
func (j *Jobs) Subscribe(ctx context.Context, typ, id string) (*Subscription, error) {
	if err := validName("job type", typ, MaxTypeSize); err != nil {
		return nil, err
	}
	v, err := j.store.ReadTransact(ctx, func(tx kv.ReadTx) (any, error) { return j.load(tx, typ, id) })
	if err != nil {
		return nil, err
	}
	s := &Subscription{Type: typ, ID: id, j: j, changed: make(chan struct{})}
	s.last = eventOf(v.(*record), typ, id)
	s.seq, s.seen = 1, 1
	if s.last.terminal() {
		s.ended = true
		return s, nil
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		s.ended = true
		return s, nil
	}
	n := j.notifiers[typ]
	if n == nil {
		n = j.startNotifier(typ)
	}
	n.subs[s] = struct{}{}
	n.kick()
	return s, nil
}

func eventOf(r *record, typ, id string) Event {
	if r == nil {
		return Event{State: NotFound}
	}
	return Event{State: r.state, Info: r.info(typ, id)}
}

// Latest returns the most recent event.
func (s *Subscription) Latest() Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

// Changed returns a channel closed at the next event, or already closed if
// the subscription ended.
func (s *Subscription) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

// Ended reports whether the subscription delivered its last event.
func (s *Subscription) Ended() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ended
}

// Next waits for an event newer than the last one Next (or Subscribe)
// returned and returns the latest. After the final event it returns that
// event again at once.
func (s *Subscription) Next(ctx context.Context) (Event, error) {
	for {
		s.mu.Lock()
		if s.seq > s.seen || s.ended {
			s.seen = s.seq
			ev := s.last
			s.mu.Unlock()
			return ev, nil
		}
		ch := s.changed
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return Event{}, ctx.Err()
		}
	}
}

// Close stops the subscription.
func (s *Subscription) Close() {
	s.j.mu.Lock()
	if n := s.j.notifiers[s.Type]; n != nil {
		delete(n.subs, s)
		n.kick() // so that a notifier left without subscriptions exits
	}
	s.j.mu.Unlock()
	s.end()
}

// deliver records a new event.
func (s *Subscription) deliver(ev Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return
	}
	s.last = ev
	s.seq++
	close(s.changed)
	if ev.terminal() {
		s.ended = true
		return
	}
	s.changed = make(chan struct{})
}

func (s *Subscription) end() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ended {
		s.ended = true
		close(s.changed)
	}
}

// version returns the versionstamp of the last event's change.
func (s *Subscription) version() (tuple.Versionstamp, State) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last.Info.Version, s.last.State
}

// Wait blocks until one of subs reports state, or reaches a state it
// cannot leave (Finished, NotFound) on the way, and returns that
// subscription and its event. An empty state waits for any new event.
func (j *Jobs) Wait(ctx context.Context, subs []*Subscription, state State) (*Subscription, Event, error) {
	seqs := make([]int, len(subs))
	for i, s := range subs {
		s.mu.Lock()
		seqs[i] = s.seq
		s.mu.Unlock()
	}
	for {
		cases := make([]reflect.SelectCase, 0, len(subs)+1)
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())})
		for i, s := range subs {
			s.mu.Lock()
			ev, seq, ch := s.last, s.seq, s.changed
			s.mu.Unlock()
			if (state == "" && seq > seqs[i]) || (state != "" && (ev.State == state || ev.terminal())) {
				return s, ev, nil
			}
			cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ch)})
		}
		if i, _, _ := reflect.Select(cases); i == 0 {
			return nil, Event{}, ctx.Err()
		}
	}
}

// notifier serves a type's subscriptions with one store watch on the
// type's activity key, which every change of a job of the type advances.
type notifier struct {
	j      *Jobs
	typ    string
	subs   map[*Subscription]struct{} // guarded by j.mu
	wake   chan struct{}
	cancel context.CancelFunc
	done   chan struct{}
}

// startNotifier starts a type's notifier; j.mu is held.
func (j *Jobs) startNotifier(typ string) *notifier {
	ctx, cancel := context.WithCancel(context.Background())
	n := &notifier{j: j, typ: typ, subs: map[*Subscription]struct{}{}, wake: make(chan struct{}, 1), cancel: cancel, done: make(chan struct{})}
	j.notifiers[typ] = n
	j.wg.Go(func() {
		defer close(n.done)
		n.run(ctx)
	})
	return n
}

func (n *notifier) kick() {
	select {
	case n.wake <- struct{}{}:
	default:
	}
}

// stop ends the notifier and every subscription it serves.
func (n *notifier) stop() {
	n.cancel()
	<-n.done
}

func (n *notifier) run(ctx context.Context) {
	defer func() {
		n.j.mu.Lock()
		subs := n.subs
		n.subs = map[*Subscription]struct{}{}
		n.j.mu.Unlock()
		for s := range subs {
			s.end()
		}
	}()
	for {
		n.j.mu.Lock()
		if len(n.subs) == 0 {
			if n.j.notifiers[n.typ] == n {
				delete(n.j.notifiers, n.typ)
			}
			n.j.mu.Unlock()
			return
		}
		subs := make([]*Subscription, 0, len(n.subs))
		for s := range n.subs {
			subs = append(subs, s)
		}
		n.j.mu.Unlock()

		type state struct {
			w    kv.Watch
			recs []*record
		}
		v, err := n.j.store.Transact(ctx, func(tx kv.Tx) (any, error) {
			st := state{w: tx.Watch(n.j.watchActivityKey(n.typ)), recs: make([]*record, len(subs))}
			for i, s := range subs {
				r, err := n.j.load(tx, s.Type, s.ID)
				if err != nil {
					return nil, err
				}
				st.recs[i] = r
			}
			return st, nil
		})
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			n.j.log.Warn("reading subscribed jobs failed; retrying", "type", n.typ, "error", err)
			if kv.Sleep(ctx, 100*time.Millisecond) != nil {
				return
			}
			continue
		}
		st := v.(state)
		var ended []*Subscription
		for i, s := range subs {
			r := st.recs[i]
			vs, was := s.version()
			if r != nil && r.vs == vs && r.state == was {
				continue
			}
			ev := eventOf(r, s.Type, s.ID)
			s.deliver(ev)
			if ev.terminal() {
				ended = append(ended, s)
			}
		}
		if len(ended) > 0 {
			n.j.mu.Lock()
			for _, s := range ended {
				delete(n.subs, s)
			}
			n.j.mu.Unlock()
		}
		select {
		case <-st.w.Done():
		case <-n.wake:
		case <-ctx.Done():
		}
		st.w.Cancel()
		if ctx.Err() != nil {
			return
		}
	}
}
