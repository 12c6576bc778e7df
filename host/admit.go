package host

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/couchjobs/couchjobs/runtime/jobs"
	"github.com/couchjobs/couchjobs/runtime/kv"
	pluginv1 "github.com/couchjobs/couchjobs/sdk/proto/couchjobs/plugin/v1"
)

// ErrNoAdmitter: the job's type checks its jobs in its plugin before they
// are stored, and that plugin is not running on this node. The job is not
// stored; add it through a node that runs the plugin.
var ErrNoAdmitter = errors.New("no running plugin on this node admits jobs of this type")

// typesSub records, per job type, what nodes that run its plugin
// declared: ("types", name) = typeRecord as JSON. A node that does not run
// a type's plugin learns from it whether the type admits its jobs.
var typesSub = kv.Sub("types")

type typeRecord struct {
	Plugin     string `json:"plugin"`
	Admits     bool   `json:"admits"`
	Continuous bool   `json:"continuous"`
}

// registerTypes records the plugin's types for other nodes.
func (p *plugin) registerTypes(ctx context.Context, desc *pluginv1.DescribeResponse) error {
	_, err := p.n.store.Transact(ctx, func(tx kv.Tx) (any, error) {
		for _, t := range desc.Types {
			b, _ := json.Marshal(typeRecord{Plugin: p.name, Admits: t.Admits, Continuous: t.Continuous})
			tx.Set(typesSub.Pack([]any{t.Name}), b)
		}
		return nil, nil
	})
	return err
}

// Admit passes a new job through its type's Admit hook, if the type has
// one: the plugin may refuse it (jobs.ErrInvalid, with the plugin's
// reason), normalize its data, and place its first run.
func (n *Node) Admit(ctx context.Context, nj *jobs.NewJob) error {
	for _, p := range n.plugins {
		p.mu.Lock()
		desc, client := p.desc, p.client
		p.mu.Unlock()
		if desc == nil {
			continue
		}
		i := slices.IndexFunc(desc.Types, func(t *pluginv1.JobType) bool { return t.Name == nj.Type })
		if i < 0 {
			continue
		}
		if !desc.Types[i].Admits {
			return nil
		}
		if client == nil {
			return fmt.Errorf("add %s/%s: %w: plugin %s is %s", nj.Type, nj.ID, ErrNoAdmitter, p.name, p.Status().State)
		}
		data := nj.Data
		if data == nil {
			data = json.RawMessage("{}")
		}
		resp, err := client.Plugin.Admit(ctx, &pluginv1.AdmitRequest{Type: nj.Type, Id: nj.ID, Data: data, Placement: string(nj.Placement)})
		if err != nil {
			return fmt.Errorf("add %s/%s: plugin %s: admit: %w", nj.Type, nj.ID, p.name, err)
		}
		if resp.Error != "" {
			return fmt.Errorf("%w: job %s/%s: %s", jobs.ErrInvalid, nj.Type, nj.ID, resp.Error)
		}
		if len(resp.Data) > 0 {
			nj.Data = resp.Data
		}
		if resp.Placement != "" {
			nj.Placement = jobs.Placement(resp.Placement)
		}
		return nil
	}
	v, err := n.store.ReadTransact(ctx, func(tx kv.ReadTx) (any, error) {
		return tx.Get(typesSub.Pack([]any{nj.Type}))
	})
	if err != nil {
		return fmt.Errorf("add %s/%s: %w", nj.Type, nj.ID, err)
	}
	var rec typeRecord
	if b, _ := v.([]byte); b != nil && json.Unmarshal(b, &rec) == nil && rec.Admits {
		return fmt.Errorf("add %s/%s: %w: it needs plugin %s, which node %s does not run", nj.Type, nj.ID, ErrNoAdmitter, rec.Plugin, n.cfg.Node.Name)
	}
	return nil
}
