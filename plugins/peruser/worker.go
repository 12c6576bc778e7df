package peruser

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/couchjobs/couchjobs/plugins/internal/couch"
	"github.com/couchjobs/couchjobs/sdk"
)

// State is a watcher job's data: which server it watches, how far it has
// read the authentication database's changes, and what it did.
type State struct {
	Server string `json:"server"`
	// URL is the server's URL without credentials, for display.
	URL string `json:"url,omitempty"`
	// Since is the checkpoint: the last change handled (opaque).
	Since json.RawMessage `json:"since,omitempty"`
	// ReconciledAt is when every user was last checked.
	ReconciledAt *time.Time `json:"reconciled_at,omitempty"`
	// Counters since the job was created.
	Provisioned int64 `json:"provisioned"`
	Removed     int64 `json:"removed"`
	Skipped     int64 `json:"skipped"`
}

// changesBatch bounds the changes handled between checkpoints.
const changesBatch = 100

// watcher follows one server's users.
type watcher struct {
	cfg   *Config
	srv   *Server
	job   *sdk.Job
	log   hclog.Logger
	state State
}

// worker runs watcher jobs.
type worker struct {
	cfg *Config
	log hclog.Logger
}

// Run follows a server's authentication database until the run is
// stopped: it reconciles every user on start and every
// reconcile_interval, and provisions or unprovisions users as their
// documents change, checkpointing after each batch. A server that does not
// answer makes the run crash; the host retries it with backoff.
func (w *worker) Run(ctx context.Context, job *sdk.Job) error {
	var st State
	if err := job.Decode(&st); err != nil {
		return sdk.Fail(err)
	}
	srv := w.cfg.server(st.Server)
	if srv == nil {
		return sdk.Failf("server %q is not in this node's plugins.peruser.config.servers", st.Server)
	}
	wt := &watcher{cfg: w.cfg, srv: srv, job: job, state: st,
		log: w.log.With("type", job.Type, "id", job.ID, "server", srv.Name)}
	return wt.run(ctx)
}

func (w *watcher) run(ctx context.Context) error {
	c := w.srv.client
	w.state.URL = c.URL()
	if len(w.state.Since) == 0 {
		// A new watcher starts at the current end of the feed: the
		// reconciliation below covers what came before.
		info, err := c.DBInfo(ctx, w.cfg.AuthenticationDB)
		if err != nil {
			return w.crash(ctx, "read the authentication database", err)
		}
		w.state.Since = info.UpdateSeq
	}
	if err := w.reconcile(ctx); err != nil {
		return err
	}
	for {
		fctx, cancel := context.WithTimeout(ctx, w.cfg.feedTimeout)
		ch, err := c.Changes(fctx, w.cfg.AuthenticationDB, couch.ChangesOptions{
			Since: w.state.Since, IncludeDocs: true, Limit: changesBatch, Wait: true, Timeout: w.cfg.feedTimeout,
		})
		cancel()
		switch {
		case ctx.Err() != nil:
			return context.Cause(ctx)
		case errors.Is(err, context.DeadlineExceeded):
			// No change for a while, or a hung server: ask it.
			pctx, cancel := context.WithTimeout(ctx, w.cfg.feedTimeout)
			_, err = c.Server(pctx)
			cancel()
			if err != nil {
				return w.crash(ctx, "the server does not answer", err)
			}
		case err != nil:
			return w.crash(ctx, "read the changes feed", err)
		default:
			for _, change := range ch.Results {
				if err := w.handle(ctx, change); err != nil {
					return w.crash(ctx, "handle the change of "+change.ID, err)
				}
			}
			w.state.Since = ch.LastSeq
			if err := w.save(ctx); err != nil {
				return err
			}
		}
		if w.state.ReconciledAt == nil || time.Since(*w.state.ReconciledAt) >= w.cfg.reconcile {
			if err := w.reconcile(ctx); err != nil {
				return err
			}
		}
	}
}

// crash ends the run with an error the host retries with backoff, or
// with the stop if the run was stopped.
func (w *watcher) crash(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	return fmt.Errorf("%s on %s: %w", what, w.srv.client.URL(), err)
}

// save checkpoints the state.
func (w *watcher) save(ctx context.Context) error {
	return w.job.Update(ctx, sdk.Update{Data: w.state, Fraction: -1,
		Message: fmt.Sprintf("%d provisioned, %d removed, %d skipped", w.state.Provisioned, w.state.Removed, w.state.Skipped)})
}

// reconcile checks every user: a missing database or a _security object
// without the user is repaired, so a change the feed lost cannot leave a
// user without a database.
func (w *watcher) reconcile(ctx context.Context) error {
	c := w.srv.client
	rows, err := c.AllDocs(ctx, w.cfg.AuthenticationDB, userPrefix, userPrefix+"\uffff", true)
	if err != nil {
		return w.crash(ctx, "list the users", err)
	}
	for _, r := range rows {
		if err := w.handle(ctx, couch.Change{ID: r.ID, Doc: r.Doc}); err != nil {
			return w.crash(ctx, "reconcile "+r.ID, err)
		}
	}
	now := time.Now().UTC()
	w.state.ReconciledAt = &now
	w.log.Info("reconciled", "users", len(rows))
	return w.save(ctx)
}

// handle applies one change of the authentication database. Documents
// that are not users, and users whose database has a security object of
// an unexpected shape, are logged and skipped; a failed request is
// returned (the run crashes and resumes from the checkpoint, and every
// step is idempotent).
func (w *watcher) handle(ctx context.Context, ch couch.Change) error {
	if !strings.HasPrefix(ch.ID, userPrefix) {
		if !strings.HasPrefix(ch.ID, "_design/") {
			w.log.Warn("a document that is not a user in the authentication database; skipped", "doc", ch.ID)
			w.state.Skipped++
		}
		return nil
	}
	name := strings.TrimPrefix(ch.ID, userPrefix)
	if ch.Deleted {
		return w.remove(ctx, name)
	}
	var doc struct {
		Type    string `json:"type"`
		Name    string `json:"name"`
		Deleted bool   `json:"_deleted"`
	}
	if err := json.Unmarshal(ch.Doc, &doc); err != nil || doc.Type != "user" || doc.Name != name {
		w.log.Warn("a user document without type \"user\" and a matching name; skipped", "doc", ch.ID)
		w.state.Skipped++
		return nil
	}
	if doc.Deleted {
		return w.remove(ctx, name)
	}
	return w.provision(ctx, name)
}

// provision makes sure the user's database exists and lists the user in
// its admins and members, keeping every other entry.
func (w *watcher) provision(ctx context.Context, name string) error {
	c, db := w.srv.client, DBName(w.cfg.DatabasePrefix, name)
	if err := c.CreateDB(ctx, db, w.cfg.Q); err != nil && !errors.Is(err, couch.ErrExists) {
		return err
	}
	changed, err := w.editSecurity(ctx, db, name, true)
	if errors.Is(err, errShape) {
		w.log.Warn("the user database's _security has an unexpected shape; left alone", "user", name, "db", db, "error", err)
		w.state.Skipped++
		return nil
	}
	if err != nil {
		return err
	}
	if changed {
		w.state.Provisioned++
		w.log.Info("user provisioned", "user", name, "db", db)
	}
	return nil
}

// remove takes a deleted user's database away: deleted with delete_dbs,
// otherwise the user is taken out of its _security.
func (w *watcher) remove(ctx context.Context, name string) error {
	c, db := w.srv.client, DBName(w.cfg.DatabasePrefix, name)
	if w.cfg.DeleteDBs {
		err := c.DeleteDB(ctx, db)
		if err != nil && !errors.Is(err, couch.ErrNotFound) {
			return err
		}
		w.state.Removed++
		w.log.Info("user database deleted", "user", name, "db", db)
		return nil
	}
	changed, err := w.editSecurity(ctx, db, name, false)
	switch {
	case errors.Is(err, couch.ErrNotFound):
		return nil
	case errors.Is(err, errShape):
		w.log.Warn("the user database's _security has an unexpected shape; left alone", "user", name, "db", db, "error", err)
		w.state.Skipped++
		return nil
	case err != nil:
		return err
	}
	if changed {
		w.state.Removed++
		w.log.Info("user removed from its database's _security", "user", name, "db", db)
	}
	return nil
}

// editSecurity adds or removes the user in a database's _security.
func (w *watcher) editSecurity(ctx context.Context, db, name string, add bool) (bool, error) {
	c := w.srv.client
	raw, err := c.Security(ctx, db)
	if err != nil {
		return false, err
	}
	sec, err := parseSecurity(raw)
	if err != nil {
		return false, err
	}
	changed, err := sec.edit(name, add)
	if err != nil || !changed {
		return false, err
	}
	return true, c.PutSecurity(ctx, db, sec)
}
