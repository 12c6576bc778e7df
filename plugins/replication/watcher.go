package replication

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/couchjobs/couchjobs/plugins/internal/couch"
	"github.com/couchjobs/couchjobs/sdk"
)

// WatcherData is a watcher job's data: the database it follows and how
// far (the checkpoint).
type WatcherData struct {
	Server string          `json:"server"`
	DB     string          `json:"database"`
	Since  json.RawMessage `json:"since,omitempty"`
	// Counters since the watcher was created.
	Added   int64 `json:"added"`
	Removed int64 `json:"removed"`
}

// watchCheckpoint is how often at most a watcher records its place.
const watchCheckpoint = time.Second

// watch follows a _replicator database's changes from the job's
// checkpoint: each replication document added or changed (re)starts its
// job, each deleted one removes it. Documents in a terminal state
// (completed, failed) are left alone.
func (p *plugin) watch(ctx context.Context, job *sdk.Job) error {
	var d WatcherData
	if err := job.Decode(&d); err != nil {
		return sdk.Fail(err)
	}
	c := p.cfg.clients[d.Server]
	if c == nil {
		return sdk.Failf("server %q is not in plugins.replication.config.servers", d.Server)
	}
	log := p.log.With("type", job.Type, "id", job.ID)
	// The checkpoint is saved at most every second, and at a stop: a
	// change handled but not saved is handled again after a failover,
	// which is harmless (docChanged compares the document's hash).
	last := time.Now()
	dirty := false
	save := func(ctx context.Context) error {
		if !dirty {
			return nil
		}
		dirty, last = false, time.Now()
		return job.Update(ctx, sdk.Update{Data: d})
	}
	_, err := c.Feed(ctx, d.DB, couch.FeedOptions{Since: d.Since, Continuous: true, IncludeDocs: true}, func(ch couch.Change) error {
		if err := p.docChanged(ctx, &d, ch); err != nil {
			return err
		}
		d.Since, dirty = ch.Seq, true
		if time.Since(last) >= watchCheckpoint {
			return save(ctx)
		}
		return nil
	})
	if reason, stopped := sdk.Stopped(ctx); stopped {
		if reason != sdk.StopLost {
			save(context.WithoutCancel(ctx))
		}
		return err
	}
	if serr := save(ctx); serr != nil {
		return serr
	}
	log.Warn("the _replicator feed stopped", "error", err)
	return fmt.Errorf("follow %s: %w", d.DB, err)
}

// docChanged brings a document's job in line with the document.
func (p *plugin) docChanged(ctx context.Context, w *WatcherData, ch couch.Change) error {
	if strings.HasPrefix(ch.ID, "_design/") {
		return nil
	}
	id := persistentID(w.Server, w.DB, ch.ID)
	if ch.Deleted {
		err := p.host.RemoveJob(ctx, TypeReplication, id)
		if err == nil {
			w.Removed++
		}
		if errors.Is(err, sdk.ErrNotFound) {
			err = nil
		}
		return err
	}
	var doc map[string]any
	if err := json.Unmarshal(ch.Doc, &doc); err != nil {
		return nil // not an object: nothing CouchDB would run either
	}
	if st, _ := doc["_replication_state"].(string); st == StateCompleted || st == StateFailed {
		return nil
	}
	d := newData(Persistent, ch.Doc)
	d.Server, d.DB, d.DocID = w.Server, w.DB, ch.ID
	info, err := p.host.GetJob(ctx, TypeReplication, id)
	switch {
	case errors.Is(err, sdk.ErrNotFound):
	case err != nil:
		return err
	default:
		if old, perr := parseData(info.Data); perr == nil && old.DocHash == d.DocHash {
			return nil // this document's job already, running or done
		}
		// The replication changed: its job starts over.
		if err := p.host.RemoveJob(ctx, TypeReplication, id); err != nil && !errors.Is(err, sdk.ErrNotFound) {
			return err
		}
	}
	if err := p.host.AddJob(ctx, sdk.NewJob{Type: TypeReplication, ID: id, Data: d, Group: w.Server + "/" + w.DB}); err != nil {
		return fmt.Errorf("add the job of %s: %w", ch.ID, err)
	}
	w.Added++
	return nil
}

// manage finds _replicator databases and keeps one watcher for each,
// removes the watchers (and jobs) of deleted ones, and removes transient
// jobs kept past transient_ttl, every scan_interval.
func (p *plugin) manage(ctx context.Context, job *sdk.Job) error {
	log := p.log.With("type", job.Type, "id", job.ID)
	for {
		for _, s := range p.cfg.Servers {
			if err := p.scanServer(ctx, s.Name); err != nil && ctx.Err() == nil {
				log.Warn("cannot scan a server for _replicator databases", "server", s.Name, "error", err)
			}
		}
		if err := p.expire(ctx); err != nil && ctx.Err() == nil {
			log.Warn("cannot remove expired transient replications", "error", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(p.cfg.scan):
		}
	}
}

// scanServer brings a server's watchers in line with its _replicator
// databases.
func (p *plugin) scanServer(ctx context.Context, server string) error {
	c := p.cfg.clients[server]
	dbs, err := c.AllDBs(ctx)
	if err != nil {
		return err
	}
	var reps []string
	for _, db := range dbs {
		if isReplicatorDB(db) {
			reps = append(reps, db)
		}
	}
	if len(reps) == 0 && *p.cfg.CreateReplicatorDB {
		if err := c.CreateDB(ctx, "_replicator", 0); err != nil && !errors.Is(err, couch.ErrExists) {
			return fmt.Errorf("create _replicator: %w", err)
		}
		reps = []string{"_replicator"}
	}
	for _, db := range reps {
		id := watcherID(server, db)
		info, err := p.host.GetJob(ctx, TypeWatcher, id)
		switch {
		case errors.Is(err, sdk.ErrNotFound):
			err = p.host.AddJob(ctx, sdk.NewJob{Type: TypeWatcher, ID: id, Data: WatcherData{Server: server, DB: db}, Exclusive: true})
			if errors.Is(err, sdk.ErrExists) {
				err = nil
			}
		case err == nil && info.State == "finished":
			err = p.host.AddJob(ctx, sdk.NewJob{Type: TypeWatcher, ID: id})
		}
		if err != nil {
			return err
		}
	}
	// Watchers of databases that are gone go, with their jobs.
	return p.eachJob(ctx, TypeWatcher, server+":", "", func(info sdk.JobInfo) error {
		_, db, _ := splitWatcherID(info.ID)
		if slices.Contains(reps, db) {
			return nil
		}
		if err := p.host.RemoveJob(ctx, TypeWatcher, info.ID); err != nil && !errors.Is(err, sdk.ErrNotFound) {
			return err
		}
		return p.eachJob(ctx, TypeReplication, persistentID(server, db, ""), "", func(j sdk.JobInfo) error {
			if err := p.host.RemoveJob(ctx, TypeReplication, j.ID); err != nil && !errors.Is(err, sdk.ErrNotFound) {
				return err
			}
			return nil
		})
	})
}

// expire removes transient jobs that ended more than transient_ttl ago.
func (p *plugin) expire(ctx context.Context) error {
	return p.eachJob(ctx, TypeReplication, "transient:", "finished", func(info sdk.JobInfo) error {
		if time.Since(info.Updated) < p.cfg.ttl {
			return nil
		}
		if err := p.host.RemoveJob(ctx, TypeReplication, info.ID); err != nil && !errors.Is(err, sdk.ErrNotFound) {
			return err
		}
		return nil
	})
}

// eachJob calls fn for the jobs of a type whose ids start with prefix,
// in state ("" for any).
func (p *plugin) eachJob(ctx context.Context, typ, prefix, state string, fn func(sdk.JobInfo) error) error {
	// Start just before the prefix: ListJobs lists ids after "after",
	// and the prefixes here end in an ASCII byte above 0x00.
	after := ""
	if prefix != "" {
		after = prefix[:len(prefix)-1] + string(rune(prefix[len(prefix)-1]-1)) + "\U0010FFFF"
	}
	for {
		infos, next, err := p.host.ListJobs(ctx, typ, after, 500, state)
		if err != nil {
			return err
		}
		for _, in := range infos {
			if !strings.HasPrefix(in.ID, prefix) {
				if in.ID > prefix {
					return nil
				}
				continue
			}
			if err := fn(in); err != nil {
				return err
			}
		}
		if next == "" {
			return nil
		}
		after = next
	}
}
