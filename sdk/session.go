package sdk

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"runtime/debug"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"

	pluginv1 "github.com/couchjobs/couchjobs/sdk/proto/couchjobs/plugin/v1"
)

// server is the plugin's side of the protocol.
type server struct {
	pluginv1.UnimplementedPluginServer
	p      *Plugin
	broker *goplugin.GRPCBroker
	log    hclog.Logger
	types  map[string]*Type
	host   *Host
	mux    *http.ServeMux // the plugin's routes; nil if none
}

func newServer(p *Plugin, broker *goplugin.GRPCBroker) *server {
	log := p.Logger
	if log == nil {
		log = hclog.NewNullLogger()
	}
	s := &server{p: p, broker: broker, log: log, types: map[string]*Type{}}
	for i := range p.Types {
		s.types[p.Types[i].Name] = &p.Types[i]
	}
	if len(p.Routes) > 0 {
		// Validate has checked the routes.
		s.mux, _ = p.routes()
	}
	return s
}

func (s *server) Describe(context.Context, *pluginv1.DescribeRequest) (*pluginv1.DescribeResponse, error) {
	resp := &pluginv1.DescribeResponse{Name: s.p.Name, Version: s.p.Version}
	for _, t := range s.p.Types {
		resp.Types = append(resp.Types, &pluginv1.JobType{
			Name: t.Name, ActivityTimeoutMs: t.ActivityTimeout.Milliseconds(),
			Continuous: t.Continuous, ConfigSchema: t.ConfigSchema, Admits: t.Admit != nil,
			PrivateFields: t.PrivateFields,
		})
	}
	for _, r := range s.p.Routes {
		resp.Routes = append(resp.Routes, &pluginv1.Route{Pattern: r.Pattern, Admin: r.Admin})
	}
	return resp, nil
}

func (s *server) Configure(ctx context.Context, req *pluginv1.ConfigureRequest) (*pluginv1.ConfigureResponse, error) {
	if s.broker != nil && req.HostBrokerId != 0 {
		conn, err := s.broker.DialWithOptions(req.HostBrokerId, dialOptions()...)
		if err != nil {
			return nil, fmt.Errorf("dial the host service: %w", err)
		}
		s.host = &Host{c: pluginv1.NewHostClient(conn)}
	}
	if s.p.Configure == nil {
		return &pluginv1.ConfigureResponse{}, nil
	}
	cfg := req.ConfigJson
	if len(cfg) == 0 {
		cfg = []byte("{}")
	}
	err := s.p.Configure(ctx, &Config{JSON: cfg, Node: req.NodeName, Groups: req.NodeGroups, Host: s.host})
	resp := &pluginv1.ConfigureResponse{}
	var ces ConfigErrors
	switch {
	case err == nil:
	case errors.As(err, &ces):
		for _, c := range ces {
			resp.Errors = append(resp.Errors, &pluginv1.ConfigError{Key: c.Key, Message: c.Message})
		}
	default:
		resp.Errors = append(resp.Errors, &pluginv1.ConfigError{Message: err.Error()})
	}
	return resp, nil
}

func (s *server) Session(stream pluginv1.Plugin_SessionServer) error {
	sess := &session{
		srv:  s,
		out:  make(chan any, 1024),
		runs: map[uint64]*run{},
	}
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() { sess.send(ctx, stream) })
	wg.Go(func() { sess.heartbeats(ctx) })
	err := sess.receive(ctx, stream)
	cancel()
	sess.stopAll(StopLost)
	wg.Wait()
	sess.runsWG.Wait()
	return err
}

// session is one Session stream and the runs on it.
type session struct {
	srv    *server
	out    chan any // *pluginv1.Update and *pluginv1.End, for the sender
	mu     sync.Mutex
	runs   map[uint64]*run
	runsWG sync.WaitGroup
}

// send batches everything queued into one message and sends it, so that
// under load many updates and ends share one gRPC message.
func (s *session) send(ctx context.Context, stream pluginv1.Plugin_SessionServer) {
	const maxBatch = 512
	for {
		var first any
		select {
		case first = <-s.out:
		case <-ctx.Done():
			return
		}
		msg := &pluginv1.PluginMessage{}
		add := func(m any) {
			switch m := m.(type) {
			case *pluginv1.Update:
				msg.Updates = append(msg.Updates, m)
			case *pluginv1.End:
				msg.Ends = append(msg.Ends, m)
			}
		}
		add(first)
	drain:
		for len(msg.Updates)+len(msg.Ends) < maxBatch {
			select {
			case m := <-s.out:
				add(m)
			default:
				break drain
			}
		}
		if err := stream.Send(msg); err != nil {
			s.srv.log.Error("session send failed", "error", err)
			return
		}
	}
}

func (s *session) enqueue(ctx context.Context, m any) error {
	select {
	case s.out <- m:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *session) receive(ctx context.Context, stream pluginv1.Plugin_SessionServer) error {
	for {
		msg, err := stream.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		for _, st := range msg.Starts {
			s.start(ctx, st)
		}
		for _, a := range msg.Acks {
			if r := s.get(a.Handle); r != nil {
				r.ack(a)
			}
		}
		for _, st := range msg.Stops {
			if r := s.get(st.Handle); r != nil {
				r.stop(stopReason(st.Reason))
			}
		}
	}
}

func stopReason(r pluginv1.StopJob_Reason) StopReason {
	switch r {
	case pluginv1.StopJob_CANCEL:
		return StopCancel
	case pluginv1.StopJob_SHUTDOWN:
		return StopShutdown
	}
	return StopPreempt
}

func (s *session) get(h uint64) *run {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runs[h]
}

func (s *session) stopAll(reason StopReason) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.runs {
		r.stop(reason)
	}
}

// run is one running job.
type run struct {
	sess   *session
	handle uint64
	job    *Job
	log    hclog.Logger
	ctx    context.Context
	cancel context.CancelCauseFunc

	// heartbeat is how often the run must send an update; 0: never.
	heartbeat time.Duration

	mu      sync.Mutex
	seq     uint64
	waiting map[uint64]chan *pluginv1.Ack
	last    time.Time // when the last update was sent
	beating bool      // a heartbeat is on its way
	// held is when the last update the host stored was sent: the store
	// saw the job alive at or after it. A run whose lease (held plus the
	// activity timeout) nears its end without a newer one stops, since
	// another node may take the job: a node cut off from the store never
	// runs a job beside its new owner.
	held time.Time
}

func (s *session) start(parent context.Context, st *pluginv1.StartJob) {
	ctx, cancel := context.WithCancelCause(parent)
	r := &run{
		sess: s, handle: st.Handle, ctx: ctx, cancel: cancel,
		heartbeat: time.Duration(st.HeartbeatMs) * time.Millisecond,
		log:       s.srv.log.With("type", st.Type, "id", st.Id),
		waiting:   map[uint64]chan *pluginv1.Ack{},
		last:      time.Now(),
		held:      time.Now(),
	}
	r.job = &Job{Type: st.Type, ID: st.Id, Data: st.Data, Priority: st.Priority, Group: st.Group, run: r}
	s.mu.Lock()
	s.runs[st.Handle] = r
	s.mu.Unlock()
	t := s.srv.types[st.Type]
	s.runsWG.Go(func() {
		defer func() {
			s.mu.Lock()
			delete(s.runs, r.handle)
			s.mu.Unlock()
			cancel(nil)
		}()
		if t == nil || t.Worker == nil {
			r.end(crashed(fmt.Errorf("this plugin has no worker for job type %q", st.Type)))
			return
		}
		r.end(r.work(t.Worker))
	})
}

// crashed marks an error as a crash, for end.
type crash struct{ err error }

func (c *crash) Error() string { return c.err.Error() }

func crashed(err error) error { return &crash{err: err} }

// work runs the worker, turning a panic into a crash with its stack.
func (r *run) work(w Worker) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = crashed(fmt.Errorf("panic: %v\n%s", p, debug.Stack()))
		}
	}()
	return w.Run(r.ctx, r.job)
}

// end reports the run's outcome.
func (r *run) end(err error) {
	r.mu.Lock()
	r.seq++
	seq := r.seq
	r.mu.Unlock()
	r.job.mu.Lock()
	data := r.job.result
	r.job.mu.Unlock()
	e := &pluginv1.End{Handle: r.handle, Seq: seq, Data: data}
	var (
		f  *failure
		rs *resubmit
		c  *crash
	)
	reason, stopped := Stopped(r.ctx)
	switch {
	case err == nil:
		e.Outcome = pluginv1.End_COMPLETED
	case errors.As(err, &f):
		e.Outcome, e.Reason = pluginv1.End_FAILED, f.Error()
	case errors.As(err, &rs):
		e.Outcome = pluginv1.End_RESUBMIT
		if !rs.at.IsZero() {
			e.ResubmitAtMs = rs.at.UnixMilli()
		}
		e.Placement = string(rs.placement)
	case stopped && (reason == StopPreempt || reason == StopShutdown):
		// The worker returned because it was asked to stop: it runs again.
		e.Outcome = pluginv1.End_RESUBMIT
	case errors.As(err, &c):
		e.Outcome, e.Reason = pluginv1.End_CRASHED, c.Error()
	default:
		e.Outcome, e.Reason = pluginv1.End_CRASHED, err.Error()
	}
	switch {
	case e.Outcome != pluginv1.End_CRASHED:
	case stopped && (reason == StopCancel || reason == StopLost):
		// Not a crash: the job went away; the host writes nothing.
		r.log.Debug("run stopped", "reason", reason)
	default:
		r.log.Error("job crashed", "error", e.Reason)
	}
	// The session context, not the run's: the end must go out even when
	// the run was stopped.
	r.sess.enqueue(context.Background(), e)
}

// update sends an update and waits for its ack.
func (r *run) update(ctx context.Context, u *pluginv1.Update) error {
	r.mu.Lock()
	r.seq++
	u.Handle, u.Seq = r.handle, r.seq
	ch := make(chan *pluginv1.Ack, 1)
	r.waiting[u.Seq] = ch
	sent := time.Now()
	r.last = sent
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		delete(r.waiting, u.Seq)
		r.mu.Unlock()
	}()
	if err := r.sess.enqueue(ctx, u); err != nil {
		return err
	}
	select {
	case a := <-ch:
		if a.Status == pluginv1.Ack_OK {
			r.mu.Lock()
			if sent.After(r.held) {
				r.held = sent
			}
			r.mu.Unlock()
		}
		return ackError(a)
	case <-ctx.Done():
		return ctx.Err()
	case <-r.ctx.Done():
		return context.Cause(r.ctx)
	}
}

func ackError(a *pluginv1.Ack) error {
	switch a.Status {
	case pluginv1.Ack_OK:
		return nil
	case pluginv1.Ack_CONFLICT:
		return ErrConflict
	case pluginv1.Ack_CANCELED:
		return ErrCanceled
	case pluginv1.Ack_PRECONDITION:
		return ErrPrecondition
	}
	return fmt.Errorf("sdk: the host refused the update: %s", a.Message)
}

func (r *run) ack(a *pluginv1.Ack) {
	switch a.Status {
	case pluginv1.Ack_CONFLICT:
		r.cancel(&stopError{reason: StopLost})
	case pluginv1.Ack_CANCELED:
		r.cancel(&stopError{reason: StopCancel})
	}
	r.mu.Lock()
	ch := r.waiting[a.Seq]
	r.mu.Unlock()
	if ch != nil {
		ch <- a
	}
}

func (r *run) stop(reason StopReason) { r.cancel(&stopError{reason: reason}) }

// heartbeats sends an empty update for every run that has sent none for
// its heartbeat interval, so that a live job is never taken for a dead
// one. One loop serves the whole session: a goroutine and a ticker per
// run cost more than most short jobs themselves.
func (s *session) heartbeats(ctx context.Context) {
	const maxTick = 250 * time.Millisecond
	for {
		tick := maxTick
		now := time.Now()
		var due []*run
		s.mu.Lock()
		for _, r := range s.runs {
			if r.heartbeat <= 0 {
				continue
			}
			tick = min(tick, max(r.heartbeat/2, time.Millisecond))
			r.mu.Lock()
			if !r.beating && now.Sub(r.last) >= r.heartbeat {
				r.beating = true
				due = append(due, r)
			}
			// The activity timeout is three heartbeats; stop at 80% of it.
			expired := now.Sub(r.held) >= r.heartbeat*12/5
			r.mu.Unlock()
			if expired && r.ctx.Err() == nil {
				r.log.Warn("no update reached the store within the activity timeout; stopping, as another node may take the job")
				r.stop(StopLost)
			}
		}
		s.mu.Unlock()
		for _, r := range due {
			go r.beat()
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(tick):
		}
	}
}

// beat sends one heartbeat and waits for its ack.
func (r *run) beat() {
	err := r.update(r.ctx, &pluginv1.Update{})
	if err != nil && r.ctx.Err() == nil {
		r.log.Warn("heartbeat failed", "error", err)
	}
	r.mu.Lock()
	r.beating = false
	r.mu.Unlock()
}
