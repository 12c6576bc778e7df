package sdk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pluginv1 "github.com/couchjobs/couchjobs/sdk/proto/couchjobs/plugin/v1"
)

// Host is what a plugin may ask of its host: reads of its own subspace,
// and management of jobs of its own types. It is nil in a plugin whose
// host offers no services.
type Host struct{ c pluginv1.HostClient }

// ErrNotFound: no such job (or key).
var ErrNotFound = errors.New("sdk: not found")

// ErrExists: an exclusive AddJob found the job already there.
var ErrExists = errors.New("sdk: the job exists")

// KeyValue is one pair of the plugin's subspace.
type KeyValue struct {
	Key, Value []byte
}

// Get reads one key of the plugin's subspace; nil if absent.
func (h *Host) Get(ctx context.Context, key []byte) ([]byte, error) {
	resp, err := h.c.Read(ctx, &pluginv1.ReadRequest{Key: key})
	if err != nil {
		return nil, hostError(err)
	}
	if !resp.Found {
		return nil, nil
	}
	if resp.Value == nil {
		return []byte{}, nil
	}
	return resp.Value, nil
}

// Range reads the keys in [begin, end) of the plugin's subspace, at most
// limit of them (0: the host's maximum per call).
func (h *Host) Range(ctx context.Context, begin, end []byte, limit int, reverse bool) ([]KeyValue, error) {
	resp, err := h.c.Read(ctx, &pluginv1.ReadRequest{Range: &pluginv1.Range{Begin: begin, End: end}, Limit: int32(limit), Reverse: reverse})
	if err != nil {
		return nil, hostError(err)
	}
	out := make([]KeyValue, len(resp.Kvs))
	for i, p := range resp.Kvs {
		out[i] = KeyValue{Key: p.Key, Value: p.Value}
	}
	return out, nil
}

// NewJob describes a job a plugin adds.
type NewJob struct {
	Type, ID string
	// Data must marshal to a JSON object; nil keeps an existing job's data.
	Data any
	// Priority, Placement ("*", "node:NAME", "group:NAME"), Group and
	// Exclusive are as in the host's job API.
	Priority  int64
	Placement string
	Group     string
	Exclusive bool
}

// AddJob adds or re-adds a job of one of the plugin's types.
func (h *Host) AddJob(ctx context.Context, n NewJob) error {
	req := &pluginv1.AddJobRequest{Type: n.Type, Id: n.ID, Priority: n.Priority, Placement: n.Placement, Group: n.Group, Exclusive: n.Exclusive}
	if n.Data != nil {
		b, err := marshalObject(n.Data)
		if err != nil {
			return err
		}
		req.Data = b
	}
	_, err := h.c.AddJob(ctx, req)
	return hostError(err)
}

// RemoveJob removes a job of one of the plugin's types.
func (h *Host) RemoveJob(ctx context.Context, typ, id string) error {
	_, err := h.c.RemoveJob(ctx, &pluginv1.JobRef{Type: typ, Id: id})
	return hostError(err)
}

// JobInfo is a job's state as the host reports it.
type JobInfo struct {
	Type, ID string
	// State is pending, running, finished or not_found.
	State     string
	Data      json.RawMessage
	Priority  int64
	Canceled  bool
	Group     string
	Placement string
	// Created and Updated are when the job was first added and last
	// changed (zero if the host did not say).
	Created, Updated time.Time
}

func jobInfo(p *pluginv1.JobInfo) JobInfo {
	j := JobInfo{Type: p.Type, ID: p.Id, State: p.State, Data: p.Data, Priority: p.Priority, Canceled: p.Canceled, Group: p.Group, Placement: p.Placement}
	if p.CreatedMs != 0 {
		j.Created = time.UnixMilli(p.CreatedMs)
	}
	if p.UpdatedMs != 0 {
		j.Updated = time.UnixMilli(p.UpdatedMs)
	}
	return j
}

// ListJobs returns a page of a type's jobs in id order, those after the
// id after (""; from the first), at most limit (0: 100), in state (""
// for any), and the after of the next page ("" at the end).
func (h *Host) ListJobs(ctx context.Context, typ, after string, limit int, state string) ([]JobInfo, string, error) {
	resp, err := h.c.ListJobs(ctx, &pluginv1.ListJobsRequest{Type: typ, After: after, Limit: int32(limit), State: state})
	if err != nil {
		return nil, "", hostError(err)
	}
	out := make([]JobInfo, len(resp.Jobs))
	for i, j := range resp.Jobs {
		out[i] = jobInfo(j)
	}
	return out, resp.Next, nil
}

// GetJob returns a job of one of the plugin's types, or ErrNotFound.
func (h *Host) GetJob(ctx context.Context, typ, id string) (JobInfo, error) {
	p, err := h.c.GetJob(ctx, &pluginv1.JobRef{Type: typ, Id: id})
	if err != nil {
		return JobInfo{}, hostError(err)
	}
	return jobInfo(p), nil
}

// Subscribe calls fn with a job's state now and after each change, until
// the job finishes or is removed (fn then sees finished or not_found), fn
// returns an error, or ctx is done.
func (h *Host) Subscribe(ctx context.Context, typ, id string, fn func(JobInfo) error) error {
	stream, err := h.c.Subscribe(ctx, &pluginv1.JobRef{Type: typ, Id: id})
	if err != nil {
		return hostError(err)
	}
	for {
		p, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return hostError(err)
		}
		if err := fn(jobInfo(p)); err != nil {
			return err
		}
	}
}

// hostError maps the host's gRPC status to the SDK's errors.
func hostError(err error) error {
	if err == nil {
		return nil
	}
	if s, ok := status.FromError(err); ok {
		switch s.Code() {
		case codes.NotFound:
			return fmt.Errorf("%w: %s", ErrNotFound, s.Message())
		case codes.AlreadyExists:
			return fmt.Errorf("%w: %s", ErrExists, s.Message())
		case codes.InvalidArgument, codes.PermissionDenied, codes.FailedPrecondition:
			return errors.New(s.Message())
		}
	}
	return err
}
