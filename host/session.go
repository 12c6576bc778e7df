package host

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/couchjobs/couchjobs/runtime/jobs"
	"github.com/couchjobs/couchjobs/runtime/kv"
	"github.com/couchjobs/couchjobs/sdk"
	pluginv1 "github.com/couchjobs/couchjobs/sdk/proto/couchjobs/plugin/v1"
)

// maxStartBatch bounds the jobs one accept transaction takes and one
// message hands to the plugin.
const maxStartBatch = 64

// session dispatches a plugin's jobs over its Session stream.
type session struct {
	p      *plugin
	ctx    context.Context // ends with the session
	cancel context.CancelFunc
	stream pluginv1.Plugin_SessionClient
	types  []*pluginv1.JobType
	out    chan *pluginv1.HostMessage

	mu       sync.Mutex
	runs     map[uint64]*hostRun
	next     uint64
	draining bool
	idle     chan struct{} // closed when draining and no run is left
}

// hostRun is a job the plugin runs.
type hostRun struct {
	handle  uint64
	job     *jobs.Job
	started time.Time
	data    json.RawMessage // the job's data as last stored
	stopped bool            // a stop was sent; guarded by session.mu
	// preempted: the scheduler stopped the run; it goes back to the queue
	// behind the jobs that waited. Guarded by session.mu.
	preempted bool
}

func newSession(ctx context.Context, p *plugin, c *sdk.Client, desc *pluginv1.DescribeResponse) (*session, error) {
	sctx, cancel := context.WithCancel(ctx)
	stream, err := c.Plugin.Session(sctx)
	if err != nil {
		cancel()
		return nil, err
	}
	return &session{
		p: p, ctx: sctx, cancel: cancel, stream: stream, types: desc.Types,
		out: make(chan *pluginv1.HostMessage, 256), runs: map[uint64]*hostRun{},
	}, nil
}

// serve runs the session until the plugin goes away or ctx is done; its
// acceptors take jobs until accept is done.
func (s *session) serve(ctx, accept context.Context) error {
	defer s.cancel()
	actx, stopAccepting := context.WithCancel(accept)
	var wg sync.WaitGroup
	wg.Go(func() { s.send(s.ctx) })
	for _, t := range s.types {
		wg.Go(func() { s.acceptor(actx, t) })
		wg.Go(func() { s.watchStops(s.ctx, t) })
	}
	err := s.receive(ctx)
	stopAccepting()
	s.cancel() // stops the sender; the stream is over
	wg.Wait()
	if ctx.Err() == nil {
		// The plugin died with jobs in hand: they run again, with backoff.
		s.abandon(true, fmt.Sprintf("plugin %s exited: %v", s.p.name, err))
	}
	return err
}

// send writes queued messages to the stream, merging whatever is queued
// into one message.
func (s *session) send(ctx context.Context) {
	for {
		var msg *pluginv1.HostMessage
		select {
		case msg = <-s.out:
		case <-ctx.Done():
			return
		}
	merge:
		for len(msg.Starts)+len(msg.Acks)+len(msg.Stops) < 4*maxStartBatch {
			select {
			case m := <-s.out:
				msg.Starts = append(msg.Starts, m.Starts...)
				msg.Acks = append(msg.Acks, m.Acks...)
				msg.Stops = append(msg.Stops, m.Stops...)
			default:
				break merge
			}
		}
		if err := s.stream.Send(msg); err != nil {
			return // receive sees the broken stream too
		}
	}
}

func (s *session) enqueue(m *pluginv1.HostMessage) {
	select {
	case s.out <- m:
	case <-s.ctx.Done():
	}
}

// acceptor takes jobs of one type while the node and the plugin have free
// slots, as many per transaction as are free (up to maxStartBatch).
func (s *session) acceptor(ctx context.Context, t *pluginv1.JobType) {
	n := s.p.n
	log := s.p.log.With("type", t.Name)
	for {
		if !s.p.acquire(ctx, t.Name) {
			return
		}
		free := 1 + s.p.tryAcquire(t.Name, maxStartBatch-1)
		start := time.Now()
		o := jobs.AcceptOptions{Node: n.cfg.Node.Name, Groups: n.cfg.Node.Groups, Limit: free}
		o.Rank, o.RankGroups = n.rank()
		accepted, err := n.jobs.Accept(ctx, t.Name, o)
		s.p.release(t.Name, free-len(accepted))
		if errors.Is(err, jobs.ErrNoJobs) {
			// Wait without holding slots, which other types may use.
			err = n.jobs.WaitPending(ctx, t.Name, o)
			if err == nil {
				continue
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			log.Error("accept failed", "error", err)
			if kv.Sleep(ctx, time.Second) != nil {
				return
			}
			continue
		}
		n.metrics.observeAccept(time.Since(start), len(accepted))
		msg := &pluginv1.HostMessage{}
		heartbeat := t.ActivityTimeoutMs / 3
		now := time.Now()
		for _, job := range accepted {
			r := s.add(job)
			n.acct.Start(runID(job), job.Group, t.Continuous, now)
			msg.Starts = append(msg.Starts, &pluginv1.StartJob{
				Handle: r.handle, Type: job.Type, Id: job.ID, Data: job.Data,
				Priority: job.Priority, Group: job.Group, HeartbeatMs: heartbeat,
			})
			if log.IsDebug() {
				log.Debug("job started", "id", job.ID)
			}
		}
		s.enqueue(msg)
	}
}

// watchStops stops this node's runs of a type whose jobs were canceled or
// removed, as soon as that commits anywhere in the cluster. A run that
// ignores the stop for longer than stopGrace is given up: its slot is
// freed and whatever it sends later is answered with a conflict.
func (s *session) watchStops(ctx context.Context, t *pluginv1.JobType) {
	j := s.p.n.jobs
	for ctx.Err() == nil {
		v, err := s.p.n.store.Transact(ctx, func(tx kv.Tx) (any, error) { return j.WatchStopsTx(tx, t.Name), nil })
		if err != nil {
			if kv.Sleep(ctx, time.Second) != nil {
				return
			}
			continue
		}
		w := v.(kv.Watch)
		err = kv.WaitWatch(ctx, w)
		w.Cancel()
		if err != nil {
			return
		}
		s.stopCanceled(ctx, t.Name)
	}
}

// stopGrace is how long a canceled run has to end before the host gives
// it up.
const stopGrace = 10 * time.Second

// stopCanceled sends a stop to every run of typ whose job is canceled or
// gone.
func (s *session) stopCanceled(ctx context.Context, typ string) {
	s.mu.Lock()
	var runs []*hostRun
	for _, r := range s.runs {
		if r.job.Type == typ && !r.stopped {
			runs = append(runs, r)
		}
	}
	s.mu.Unlock()
	if len(runs) == 0 {
		return
	}
	v, err := s.p.n.store.ReadTransact(ctx, func(tx kv.ReadTx) (any, error) {
		var stop []*hostRun
		for _, r := range runs {
			in, err := s.p.n.jobs.GetTx(tx, r.job.Type, r.job.ID)
			if errors.Is(err, jobs.ErrNotFound) || (err == nil && in.Canceled) {
				stop = append(stop, r)
			} else if err != nil {
				return nil, err
			}
		}
		return stop, nil
	})
	if err != nil {
		return
	}
	msg := &pluginv1.HostMessage{}
	for _, r := range v.([]*hostRun) {
		s.mu.Lock()
		r.stopped = true
		s.mu.Unlock()
		msg.Stops = append(msg.Stops, &pluginv1.StopJob{Handle: r.handle, Reason: pluginv1.StopJob_CANCEL, GraceMs: stopGrace.Milliseconds()})
		s.p.log.Info("stopping a canceled job", "type", r.job.Type, "id", r.job.ID)
		time.AfterFunc(stopGrace, func() {
			if s.get(r.handle) == r {
				s.p.log.Warn("a canceled job ignored its stop; giving up its slot", "type", r.job.Type, "id", r.job.ID, "grace", stopGrace)
				s.remove(r.handle)
			}
		})
	}
	if len(msg.Stops) > 0 {
		s.enqueue(msg)
	}
}

func (s *session) add(job *jobs.Job) *hostRun {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next++
	r := &hostRun{handle: s.next, job: job, data: job.Data, started: time.Now()}
	s.runs[r.handle] = r
	return r
}

// remove forgets a run and frees its slot.
func (s *session) remove(h uint64) {
	s.mu.Lock()
	r, ok := s.runs[h]
	delete(s.runs, h)
	if ok && s.draining && len(s.runs) == 0 && s.idle != nil {
		close(s.idle)
		s.idle = nil
	}
	s.mu.Unlock()
	if ok {
		s.p.n.acct.Stop(runID(r.job), time.Now())
		s.p.release(r.job.Type, 1)
	}
}

// running counts the jobs the plugin runs now.
func (s *session) running() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.runs)
}

func (s *session) get(h uint64) *hostRun {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runs[h]
}

func (s *session) receive(ctx context.Context) error {
	for {
		msg, err := s.stream.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("session ended: %w", err)
		}
		acks := s.apply(ctx, msg)
		if len(acks) > 0 {
			s.enqueue(&pluginv1.HostMessage{Acks: acks})
		}
	}
}

// item is one update or end of a plugin message, with its outcome.
type item struct {
	run  *hostRun
	upd  *pluginv1.Update
	end  *pluginv1.End
	ack  *pluginv1.Ack
	data json.RawMessage // the job's data if the item applies
}

// apply stores a message's updates and ends, all in one transaction. If
// that transaction fails (one item's writes are too large, say), each item
// gets a transaction of its own, so one bad item cannot sink the others.
func (s *session) apply(ctx context.Context, msg *pluginv1.PluginMessage) []*pluginv1.Ack {
	var items []*item
	for _, u := range msg.Updates {
		items = append(items, &item{run: s.get(u.Handle), upd: u, ack: &pluginv1.Ack{Handle: u.Handle, Seq: u.Seq}})
	}
	for _, e := range msg.Ends {
		items = append(items, &item{run: s.get(e.Handle), end: e, ack: &pluginv1.Ack{Handle: e.Handle, Seq: e.Seq}})
	}
	if err := s.applyTx(ctx, items); err != nil {
		for _, it := range items {
			if err := s.applyTx(ctx, []*item{it}); err != nil {
				it.ack.Status, it.ack.Message = pluginv1.Ack_ERROR, err.Error()
			}
		}
	}
	acks := make([]*pluginv1.Ack, len(items))
	for i, it := range items {
		acks[i] = it.ack
		if it.run != nil && it.ack.Status == pluginv1.Ack_OK && it.data != nil {
			it.run.data = it.data
		}
		if it.end != nil {
			if it.run != nil && it.ack.Status == pluginv1.Ack_ERROR {
				// An end the store refused (its data over the limit, say)
				// must not leave the job running until the activity
				// timeout: it runs again, as after a crash.
				s.p.log.Error("refused a job's end; it runs again", "type", it.run.job.Type, "id", it.run.job.ID, "error", it.ack.Message)
				s.giveBack(it.run, true, "the host refused the run's end: "+it.ack.Message)
			}
			s.remove(it.end.Handle)
		}
	}
	return acks
}

func (s *session) applyTx(ctx context.Context, items []*item) error {
	_, err := s.p.n.store.Transact(ctx, func(tx kv.Tx) (any, error) {
		for _, it := range items {
			it.ack.Status, it.ack.Message, it.data = pluginv1.Ack_OK, "", nil
			if it.run == nil {
				it.ack.Status = pluginv1.Ack_CONFLICT // a run this host gave up
				continue
			}
			err := s.applyOne(tx, it)
			switch {
			case err == nil:
			case errors.Is(err, jobs.ErrWorkerConflict):
				it.ack.Status = pluginv1.Ack_CONFLICT
			case errors.Is(err, jobs.ErrCanceled):
				it.ack.Status = pluginv1.Ack_CANCELED
			case errors.Is(err, errPrecondition):
				it.ack.Status = pluginv1.Ack_PRECONDITION
			case errors.Is(err, jobs.ErrInvalid), errors.Is(err, errBadWrite):
				it.ack.Status, it.ack.Message = pluginv1.Ack_ERROR, err.Error()
			default:
				return nil, err // a store error: the whole transaction
			}
		}
		return nil, nil
	})
	return err
}

// applyOne stores one update or end: first the job operation, which checks
// that this node still holds the job, then the plugin's writes.
func (s *session) applyOne(tx kv.Tx, it *item) error {
	job, sched := it.run.job, s.p.n.cfg.Scheduler
	var writes []*pluginv1.Write
	var err error
	if u := it.upd; u != nil {
		if err := s.p.check(tx, u.Conditions); err != nil {
			return err
		}
		var data json.RawMessage
		if len(u.Data) > 0 {
			data = u.Data
		}
		if p := u.Progress; p != nil && (p.Fraction != 0 || p.Message != "") {
			// Progress is for display: it goes in the job's data, where
			// the API and `couchjobs jobs wait` show it.
			base := data
			if base == nil {
				base = it.run.data
			}
			if data, err = mergeMeta(base, map[string]any{"progress": p.Fraction, "message": p.Message}); err != nil {
				return err
			}
		}
		if err = job.Update(tx, data); err != nil {
			return err
		}
		it.data, writes = data, u.Writes
	} else {
		e := it.end
		data := json.RawMessage(e.Data)
		if len(data) == 0 {
			data = it.run.data
		}
		if data, err = healed(data, it.run.started, sched.HealthThreshold.Duration); err != nil {
			return err
		}
		switch e.Outcome {
		case pluginv1.End_COMPLETED:
			data, err = withMeta(data, map[string]any{"outcome": "completed"})
			if err == nil {
				err = job.Finish(tx, data)
			}
		case pluginv1.End_FAILED:
			data, err = withMeta(data, map[string]any{"outcome": "failed", "reason": e.Reason})
			if err == nil {
				err = job.Finish(tx, data)
			}
		case pluginv1.End_RESUBMIT:
			o := jobs.ResubmitOptions{Data: data, Placement: jobs.Placement(e.Placement)}
			s.mu.Lock()
			if it.run.preempted {
				// Behind every job that waited: never-run jobs (priority 0)
				// first, then the others by when they stopped.
				o.Priority = time.Now().UnixMicro()
			}
			s.mu.Unlock()
			if e.ResubmitAtMs > 0 {
				o.At = time.UnixMilli(e.ResubmitAtMs)
			}
			err = job.Resubmit(tx, o)
		default: // CRASHED, or an outcome this host does not know
			var at time.Time
			data, at, err = crashed(data, e.Reason, sched.MinBackoff.Duration, sched.MaxBackoff.Duration)
			if err == nil {
				err = job.Resubmit(tx, jobs.ResubmitOptions{At: at, Data: data})
			}
			s.p.log.Warn("job crashed; it runs again later", "type", job.Type, "id", job.ID, "reason", e.Reason, "at", at)
		}
		if err != nil {
			return err
		}
		it.data, writes = data, e.Writes
	}
	return s.p.write(tx, writes)
}

var errBadWrite = errors.New("bad write")

// errPrecondition: a condition of an update did not hold.
var errPrecondition = errors.New("a condition did not hold")

// check reads an update's conditions on the plugin's subspace, in the
// update's transaction: the reads make a concurrent change to those keys
// conflict with it, so a compare-and-set is exact.
func (p *plugin) check(tx kv.Tx, conds []*pluginv1.Condition) error {
	prefix := p.sub.Bytes()
	for _, c := range conds {
		if c == nil {
			return fmt.Errorf("%w: an empty condition", errBadWrite)
		}
		v, err := tx.Get(append(append(make([]byte, 0, len(prefix)+len(c.Key)), prefix...), c.Key...))
		if err != nil {
			return err
		}
		if c.Absent && v != nil || !c.Absent && (v == nil || !bytes.Equal(v, c.Value)) {
			return errPrecondition
		}
	}
	return nil
}

// write applies a plugin's writes to its own subspace.
func (p *plugin) write(tx kv.Tx, writes []*pluginv1.Write) error {
	prefix := p.sub.Bytes()
	key := func(k []byte) []byte { return append(append(make([]byte, 0, len(prefix)+len(k)), prefix...), k...) }
	for _, w := range writes {
		switch op := w.Op.(type) {
		case *pluginv1.Write_Set:
			if op.Set == nil {
				return fmt.Errorf("%w: a set without a key", errBadWrite)
			}
			tx.Set(key(op.Set.Key), op.Set.Value)
		case *pluginv1.Write_Clear:
			tx.Clear(key(op.Clear))
		case *pluginv1.Write_ClearRange:
			if op.ClearRange == nil {
				return fmt.Errorf("%w: a clear range without a range", errBadWrite)
			}
			tx.ClearRange(kv.Range{Begin: key(op.ClearRange.Begin), End: key(op.ClearRange.End)})
		default:
			return fmt.Errorf("%w: a write with no operation", errBadWrite)
		}
	}
	return nil
}

// withMeta sets the host's own field, "_couchjobs", in a job's data: the
// outcome of the last run, crash counts and reasons. An end replaces the
// field, so a completed run clears the crash count.
func withMeta(data json.RawMessage, meta map[string]any) (json.RawMessage, error) {
	return editMeta(data, func(map[string]any) map[string]any { return meta })
}

// mergeMeta sets some keys of "_couchjobs" and keeps the others.
func mergeMeta(data json.RawMessage, set map[string]any) (json.RawMessage, error) {
	return editMeta(data, func(old map[string]any) map[string]any {
		for k, v := range set {
			old[k] = v
		}
		return old
	})
}

func editMeta(data json.RawMessage, edit func(map[string]any) map[string]any) (json.RawMessage, error) {
	if !bytes.Contains(data, []byte(`"_couchjobs"`)) {
		// The common case, a run's first end or progress: append the field
		// to the object instead of decoding and encoding the whole data.
		if obj := bytes.TrimSpace(data); len(obj) >= 2 && obj[0] == '{' && obj[len(obj)-1] == '}' {
			m, err := json.Marshal(edit(map[string]any{}))
			if err != nil {
				return nil, err
			}
			out := make([]byte, 0, len(obj)+len(m)+16)
			out = append(out, obj[:len(obj)-1]...)
			if len(bytes.TrimSpace(obj[1:len(obj)-1])) > 0 {
				out = append(out, ',')
			}
			out = append(out, `"_couchjobs":`...)
			out = append(out, m...)
			return append(out, '}'), nil
		}
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(data, &obj); err != nil || obj == nil {
		obj = map[string]json.RawMessage{}
	}
	old := map[string]any{}
	json.Unmarshal(obj["_couchjobs"], &old)
	if old == nil {
		old = map[string]any{}
	}
	b, err := json.Marshal(edit(old))
	if err != nil {
		return nil, err
	}
	obj["_couchjobs"] = b
	return json.Marshal(obj)
}

// crashed counts a crash in the job's data and returns when the job runs
// again: minBackoff × 2^crashes, capped at maxBackoff, ±25% jitter.
func crashed(data json.RawMessage, reason string, minBackoff, maxBackoff time.Duration) (json.RawMessage, time.Time, error) {
	var prev struct {
		Meta struct {
			Crashes int `json:"crashes"`
		} `json:"_couchjobs"`
	}
	json.Unmarshal(data, &prev)
	crashes := prev.Meta.Crashes + 1
	delay := maxBackoff
	if crashes < 40 {
		delay = min(maxBackoff, minBackoff<<(crashes-1))
	}
	delay += time.Duration(float64(delay) * (rand.Float64()/2 - 0.25))
	at := time.Now().Add(delay)
	out, err := mergeMeta(data, map[string]any{"outcome": "crashed", "crashes": crashes, "reason": reason, "retry_at": at.UTC().Format(time.RFC3339Nano)})
	return out, at, err
}

// healed resets a job's crash count once a run of it has lasted the
// health threshold: a job that ran that long without crashing is healthy
// again, and its next crash backs off from the minimum.
func healed(data json.RawMessage, started time.Time, threshold time.Duration) (json.RawMessage, error) {
	if time.Since(started) < threshold {
		return data, nil
	}
	var prev struct {
		Meta struct {
			Crashes int `json:"crashes"`
		} `json:"_couchjobs"`
	}
	if json.Unmarshal(data, &prev) != nil || prev.Meta.Crashes == 0 {
		return data, nil
	}
	return mergeMeta(data, map[string]any{"crashes": 0})
}

// giveBack hands a run back to the queue from the host's side: after a
// crash of the plugin (with backoff) or on shutdown (at once, so that
// another node starts it without waiting for the activity timeout).
func (s *session) giveBack(r *hostRun, crash bool, reason string) {
	sched := s.p.n.cfg.Scheduler
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := s.p.n.store.Transact(ctx, func(tx kv.Tx) (any, error) {
		o := jobs.ResubmitOptions{}
		if crash {
			data, err := healed(r.data, r.started, sched.HealthThreshold.Duration)
			if err != nil {
				return nil, err
			}
			data, at, err := crashed(data, reason, sched.MinBackoff.Duration, sched.MaxBackoff.Duration)
			if err != nil {
				return nil, err
			}
			o.At, o.Data = at, data
		}
		return nil, r.job.Resubmit(tx, o)
	})
	if err != nil && !errors.Is(err, jobs.ErrWorkerConflict) && !errors.Is(err, jobs.ErrCanceled) {
		s.p.log.Error("could not hand a job back; the activity monitor will", "type", r.job.Type, "id", r.job.ID, "error", err)
	}
}

// abandon hands back every run still in hand.
func (s *session) abandon(crash bool, reason string) {
	s.mu.Lock()
	runs := make([]*hostRun, 0, len(s.runs))
	for _, r := range s.runs {
		runs = append(runs, r)
	}
	s.mu.Unlock()
	for _, r := range runs {
		s.giveBack(r, crash, reason)
		s.remove(r.handle)
	}
}

// drain asks every run to stop within grace, waits for their ends, and
// hands back the runs that did not end in time.
func (s *session) drain(grace time.Duration) {
	s.mu.Lock()
	s.draining = true
	msg := &pluginv1.HostMessage{}
	for h := range s.runs {
		msg.Stops = append(msg.Stops, &pluginv1.StopJob{Handle: h, Reason: pluginv1.StopJob_SHUTDOWN, GraceMs: grace.Milliseconds()})
	}
	var idle chan struct{}
	if len(s.runs) > 0 {
		idle = make(chan struct{})
		s.idle = idle
	}
	s.mu.Unlock()
	if idle == nil {
		return
	}
	s.enqueue(msg)
	select {
	case <-idle:
	case <-time.After(grace):
		s.p.log.Warn("jobs did not stop within the grace period; handing them back", "grace", grace)
		s.abandon(false, "")
	}
}

// Slots: a job holds one slot of the node and one of its plugin.

// semaphores are the slot pools a run of typ takes one slot of: its
// type's cap (if set), its plugin's, and the node's, most specific first.
func (p *plugin) semaphores(typ string) []chan struct{} {
	if t := p.typeSlots[typ]; t != nil {
		return []chan struct{}{t, p.slots, p.n.slots}
	}
	return []chan struct{}{p.slots, p.n.slots}
}

// acquire takes a slot of every pool of typ, waiting for them.
func (p *plugin) acquire(ctx context.Context, typ string) bool {
	sems := p.semaphores(typ)
	for i, sem := range sems {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			for _, held := range sems[:i] {
				<-held
			}
			return false
		}
	}
	return true
}

// tryAcquire takes up to n more slots of typ without waiting and says how
// many.
func (p *plugin) tryAcquire(typ string, n int) int {
	sems := p.semaphores(typ)
	for got := 0; got < n; got++ {
		for i, sem := range sems {
			select {
			case sem <- struct{}{}:
			default:
				for _, held := range sems[:i] {
					<-held
				}
				return got
			}
		}
	}
	return n
}

// release gives back n slots of typ.
func (p *plugin) release(typ string, n int) {
	for range n {
		for _, sem := range p.semaphores(typ) {
			<-sem
		}
	}
}

// preempt asks a run of the session to stop for the scheduler; it reports
// whether the session had the run.
func (s *session) preempt(typ, id string) bool {
	s.mu.Lock()
	var r *hostRun
	for _, run := range s.runs {
		if run.job.Type == typ && run.job.ID == id {
			r = run
			break
		}
	}
	if r == nil || r.stopped {
		s.mu.Unlock()
		return r != nil
	}
	r.stopped, r.preempted = true, true
	s.mu.Unlock()
	s.p.log.Debug("preempting a job", "type", typ, "id", id)
	s.enqueue(&pluginv1.HostMessage{Stops: []*pluginv1.StopJob{{Handle: r.handle, Reason: pluginv1.StopJob_PREEMPT, GraceMs: stopGrace.Milliseconds()}}})
	return true
}
