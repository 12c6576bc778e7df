package host

import (
	"context"
	"encoding/json"
	"errors"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/couchjobs/couchjobs/runtime/jobs"
	"github.com/couchjobs/couchjobs/runtime/kv"
	pluginv1 "github.com/couchjobs/couchjobs/sdk/proto/couchjobs/plugin/v1"
)

// maxReadKeys bounds one range read a plugin asks for.
const maxReadKeys = 10_000

// hostService serves one plugin's requests. A plugin reaches only its own
// subspace and the jobs of the types it declared.
type hostService struct {
	pluginv1.UnimplementedHostServer
	p *plugin
}

func (h *hostService) Read(ctx context.Context, req *pluginv1.ReadRequest) (*pluginv1.ReadResponse, error) {
	prefix := h.p.sub.Bytes()
	key := func(k []byte) []byte { return append(append(make([]byte, 0, len(prefix)+len(k)), prefix...), k...) }
	v, err := h.p.n.store.ReadTransact(ctx, func(tx kv.ReadTx) (any, error) {
		if req.Range == nil {
			v, err := tx.Get(key(req.Key))
			return &pluginv1.ReadResponse{Found: v != nil, Value: v}, err
		}
		limit := int(req.Limit)
		if limit <= 0 || limit > maxReadKeys {
			limit = maxReadKeys
		}
		kvs, err := tx.GetRange(kv.Range{Begin: key(req.Range.Begin), End: key(req.Range.End)}, kv.RangeOptions{Limit: limit, Reverse: req.Reverse})
		if err != nil {
			return nil, err
		}
		resp := &pluginv1.ReadResponse{}
		for _, p := range kvs {
			resp.Kvs = append(resp.Kvs, &pluginv1.KeyValue{Key: p.Key[len(prefix):], Value: p.Value})
		}
		return resp, nil
	})
	if err != nil {
		return nil, grpcError(err)
	}
	return v.(*pluginv1.ReadResponse), nil
}

// own checks that a type belongs to the plugin.
func (h *hostService) own(typ string) error {
	h.p.mu.Lock()
	defer h.p.mu.Unlock()
	if h.p.desc != nil && slices.ContainsFunc(h.p.desc.Types, func(t *pluginv1.JobType) bool { return t.Name == typ }) {
		return nil
	}
	return status.Errorf(codes.PermissionDenied, "plugin %s does not own job type %q", h.p.name, typ)
}

func (h *hostService) AddJob(ctx context.Context, req *pluginv1.AddJobRequest) (*pluginv1.AddJobResponse, error) {
	if err := h.own(req.Type); err != nil {
		return nil, err
	}
	n := jobs.NewJob{Type: req.Type, ID: req.Id, Priority: req.Priority, Placement: jobs.Placement(req.Placement), Group: req.Group, Exclusive: req.Exclusive}
	if len(req.Data) > 0 {
		n.Data = json.RawMessage(req.Data)
	}
	if err := h.p.n.Admit(ctx, &n); err != nil {
		return nil, grpcError(err)
	}
	if err := h.p.n.jobs.Add(ctx, n); err != nil {
		return nil, grpcError(err)
	}
	return &pluginv1.AddJobResponse{}, nil
}

func (h *hostService) RemoveJob(ctx context.Context, req *pluginv1.JobRef) (*pluginv1.RemoveJobResponse, error) {
	if err := h.own(req.Type); err != nil {
		return nil, err
	}
	if err := h.p.n.jobs.Remove(ctx, req.Type, req.Id); err != nil {
		return nil, grpcError(err)
	}
	return &pluginv1.RemoveJobResponse{}, nil
}

func (h *hostService) GetJob(ctx context.Context, req *pluginv1.JobRef) (*pluginv1.JobInfo, error) {
	if err := h.own(req.Type); err != nil {
		return nil, err
	}
	in, err := h.p.n.jobs.Get(ctx, req.Type, req.Id)
	if err != nil {
		return nil, grpcError(err)
	}
	return jobInfo(req.Type, req.Id, jobs.Event{State: in.State, Info: in}), nil
}

func (h *hostService) Subscribe(req *pluginv1.JobRef, stream pluginv1.Host_SubscribeServer) error {
	if err := h.own(req.Type); err != nil {
		return err
	}
	ctx := stream.Context()
	sub, err := h.p.n.jobs.Subscribe(ctx, req.Type, req.Id)
	if err != nil {
		return grpcError(err)
	}
	defer sub.Close()
	// Decide from the event just sent, not from Ended: the subscription
	// may end between a send and the check, and its final event must
	// still go out.
	ev := sub.Latest()
	for {
		if err := stream.Send(jobInfo(req.Type, req.Id, ev)); err != nil {
			return err
		}
		if ev.State == jobs.Finished || ev.State == jobs.NotFound {
			return nil
		}
		if ev, err = sub.Next(ctx); err != nil {
			return nil // the plugin went away
		}
	}
}

func jobInfo(typ, id string, ev jobs.Event) *pluginv1.JobInfo {
	j := &pluginv1.JobInfo{
		Type: typ, Id: id, State: string(ev.State), Data: ev.Info.Data,
		Priority: ev.Info.Priority, Canceled: ev.Info.Canceled,
		Group: ev.Info.Group, Placement: string(ev.Info.Placement),
	}
	if !ev.Info.Created.IsZero() {
		j.CreatedMs, j.UpdatedMs = ev.Info.Created.UnixMilli(), ev.Info.Updated.UnixMilli()
	}
	return j
}

// maxListJobs bounds a page of ListJobs.
const maxListJobs = 1000

func (h *hostService) ListJobs(ctx context.Context, req *pluginv1.ListJobsRequest) (*pluginv1.ListJobsResponse, error) {
	if err := h.own(req.Type); err != nil {
		return nil, err
	}
	o := jobs.ListOptions{After: req.After, Limit: min(int(req.Limit), maxListJobs), State: jobs.State(req.State)}
	switch o.State {
	case "", jobs.Pending, jobs.Running, jobs.Finished:
	default:
		return nil, status.Errorf(codes.InvalidArgument, "state %q: want pending, running or finished", req.State)
	}
	infos, next, err := h.p.n.jobs.List(ctx, req.Type, o)
	if err != nil {
		return nil, grpcError(err)
	}
	resp := &pluginv1.ListJobsResponse{Next: next}
	for _, in := range infos {
		resp.Jobs = append(resp.Jobs, jobInfo(in.Type, in.ID, jobs.Event{State: in.State, Info: in}))
	}
	return resp, nil
}

// grpcError maps the job layer's errors to gRPC codes the SDK understands.
func grpcError(err error) error {
	switch {
	case errors.Is(err, jobs.ErrNotFound):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, jobs.ErrJobExists):
		return status.Error(codes.AlreadyExists, err.Error())
	case errors.Is(err, jobs.ErrInvalid), errors.Is(err, jobs.ErrUnknownType):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, ErrNoAdmitter):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, kv.ErrKeyTooLarge), errors.Is(err, kv.ErrInvertedRange), errors.Is(err, kv.ErrKeyOutsideLegalRange):
		return status.Error(codes.InvalidArgument, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}
