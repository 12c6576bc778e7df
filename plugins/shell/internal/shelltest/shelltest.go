// Package shelltest adds and reads shell jobs in a cluster of real nodes
// (plugins/internal/cluster), for the plugin's failure tests and its
// thesis benchmark.
package shelltest

import (
	"context"
	"encoding/json"

	"github.com/couchjobs/couchjobs/plugins/internal/cluster"
	"github.com/couchjobs/couchjobs/plugins/shell"
	"github.com/couchjobs/couchjobs/runtime/jobs"
)

// Plugin is the shell plugin to build.
var Plugin = cluster.Plugin{Name: "shell", Package: "github.com/couchjobs/couchjobs/plugins/shell/cmd/couchjobs-shell"}

// Add adds a shell job as the host's API would: checked, and queued for
// its first step's target.
func Add(ctx context.Context, c *cluster.Cluster, id string, doc any) error {
	b, err := json.Marshal(doc)
	if err != nil {
		return err
	}
	data, place, err := shell.Prepare(b)
	if err != nil {
		return err
	}
	return c.Jobs.Add(ctx, jobs.NewJob{Type: shell.TypeName, ID: id, Data: data, Placement: jobs.Placement(place)})
}

// Doc returns a job's document and state.
func Doc(ctx context.Context, c *cluster.Cluster, id string) (*shell.Doc, jobs.State, error) {
	in, err := c.Jobs.Get(ctx, shell.TypeName, id)
	if err != nil {
		return nil, "", err
	}
	var d shell.Doc
	if err := json.Unmarshal(in.Data, &d); err != nil {
		return nil, "", err
	}
	return &d, in.State, nil
}
