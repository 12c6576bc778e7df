package sdk

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	pluginv1 "github.com/couchjobs/couchjobs/sdk/proto/couchjobs/plugin/v1"
)

// Placement says which nodes may run a job's next run. Its wire form is
// the runtime's: "*", "node:NAME", "nodes:A,B" or "group:NAME".
type Placement string

// AnyNode lets any node run the job.
const AnyNode Placement = "*"

// OnNode places a run on one node.
func OnNode(name string) Placement { return Placement("node:" + name) }

// OnNodes places a run on any one of the named nodes.
func OnNodes(names ...string) Placement {
	if len(names) == 1 {
		return OnNode(names[0])
	}
	return Placement("nodes:" + strings.Join(names, ","))
}

// InGroup places a run on the nodes of a node group (node.groups in
// runtime.toml).
func InGroup(group string) Placement { return Placement("group:" + group) }

// ResubmitTo is Resubmit with a new placement: the next run, at time at,
// goes to the nodes p allows. A job whose steps belong to different
// nodes moves this way.
func ResubmitTo(at time.Time, p Placement) error { return &resubmit{at: at, placement: p} }

// Admission is a new job the host is about to store, handed to
// Type.Admit. Admit may normalize Data and choose Placement.
type Admission struct {
	Type, ID string
	// Data is the job's data, a JSON object.
	Data json.RawMessage
	// Placement is where the job's first run goes; the submitter's choice
	// (empty if none) until Admit changes it.
	Placement Placement
}

// Admit answers the host's admission call for a type with an Admit hook.
func (s *server) Admit(ctx context.Context, req *pluginv1.AdmitRequest) (*pluginv1.AdmitResponse, error) {
	t := s.p.typ(req.Type)
	if t == nil || t.Admit == nil {
		return &pluginv1.AdmitResponse{Error: "plugin " + s.p.Name + " does not admit jobs of type " + req.Type}, nil
	}
	a := &Admission{Type: req.Type, ID: req.Id, Data: req.Data, Placement: Placement(req.Placement)}
	if err := t.Admit(ctx, a); err != nil {
		return &pluginv1.AdmitResponse{Error: err.Error()}, nil
	}
	data, err := marshalObject(a.Data)
	if err != nil {
		return &pluginv1.AdmitResponse{Error: err.Error()}, nil
	}
	return &pluginv1.AdmitResponse{Data: data, Placement: string(a.Placement)}, nil
}

// typ returns the named type, or nil.
func (p *Plugin) typ(name string) *Type {
	for i := range p.Types {
		if p.Types[i].Name == name {
			return &p.Types[i]
		}
	}
	return nil
}
