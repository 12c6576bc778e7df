// Package peruser is CouchDB's couch_peruser as a couchjobs job type: for
// every user of a server's authentication database, a private database
// that only that user (and admins) can use. One watcher job per server
// follows the authentication database's changes from its checkpoint and
// reconciles every user on start and periodically; being a job, it fails
// over to another node when its node dies. See README.md.
package peruser

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/couchjobs/couchjobs/sdk"
)

// TypeName is the watcher jobs' type.
const TypeName = "peruser"

// Version is the plugin's version.
const Version = "1.0.0"

// New returns the plugin, for sdk.Serve or sdktest.
func New() *sdk.Plugin {
	w := &worker{}
	p := &sdk.Plugin{
		Name:    "peruser",
		Version: Version,
		Types: []sdk.Type{{
			Name:            TypeName,
			ActivityTimeout: 30 * time.Second,
			Continuous:      true,
			Worker:          w,
		}},
	}
	p.Configure = func(ctx context.Context, c *sdk.Config) error {
		cfg, err := configure(c)
		if err != nil {
			return err
		}
		w.cfg, w.log = cfg, p.Logger
		if w.log == nil {
			w.log = hclog.NewNullLogger()
		}
		if c.Host == nil {
			return nil
		}
		for _, s := range cfg.Servers {
			if err := ensureWatcher(ctx, c.Host, s); err != nil {
				return fmt.Errorf("servers: %s: %w", s.Name, err)
			}
		}
		return nil
	}
	return p
}

// ensureWatcher adds a server's watcher job unless it is queued or
// running somewhere; every node does this at start, and the job layer
// lets one win.
func ensureWatcher(ctx context.Context, h *sdk.Host, s Server) error {
	info, err := h.GetJob(ctx, TypeName, s.Name)
	switch {
	case errors.Is(err, sdk.ErrNotFound):
		err = h.AddJob(ctx, sdk.NewJob{Type: TypeName, ID: s.Name, Data: State{Server: s.Name, URL: s.client.URL()}, Exclusive: true})
		if errors.Is(err, sdk.ErrExists) {
			return nil // another node added it first
		}
		return err
	case err != nil:
		return err
	case info.State == "finished":
		// It failed (say, the server was missing from the configuration):
		// run it again, from its checkpoint.
		return h.AddJob(ctx, sdk.NewJob{Type: TypeName, ID: s.Name})
	}
	return nil
}
