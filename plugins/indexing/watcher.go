package indexing

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
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
	// Designs counts design document changes handled.
	Designs int64 `json:"designs"`
}

// watchCheckpoint is how often at most a watcher records its place when
// only other documents changed.
const watchCheckpoint = time.Second

// Signature states, under sigKey.
const sigLive = "live"

func sigDead(at time.Time) string { return "dead:" + strconv.FormatInt(at.UnixMilli(), 10) }

// watch follows a database's changes from the job's checkpoint and keeps
// the records of its design documents: a new or changed one gets its
// index (and a build), a changed or removed one's old index is deleted
// once nothing uses it.
func (p *plugin) watch(ctx context.Context, job *sdk.Job) error {
	var d WatcherData
	if err := job.Decode(&d); err != nil {
		return sdk.Fail(err)
	}
	c := p.cfg.clients[d.Server]
	if c == nil {
		return sdk.Failf("server %q is not in plugins.indexing.config.servers", d.Server)
	}
	log := p.log.With("type", job.Type, "id", job.ID)
	last := time.Now()
	dirty := false
	save := func(ctx context.Context) error {
		if !dirty {
			return nil
		}
		dirty, last = false, time.Now()
		return job.Update(ctx, sdk.Update{Data: d})
	}
	_, err := c.Feed(ctx, d.DB, couch.FeedOptions{Since: d.Since, Continuous: true}, func(ch couch.Change) error {
		d.Since = ch.Seq
		if isDesign(ch.ID) {
			d.Designs++
			dirty = false
			return p.designChanged(ctx, job, c, &d, ch)
		}
		dirty = true
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
	log.Warn("the changes feed stopped", "database", d.DB, "error", err)
	return fmt.Errorf("follow %s: %w", d.DB, err)
}

// designChanged records a design document's new state, with the
// watcher's checkpoint, in one update; then it makes sure the new index
// is built and the old one cleaned up.
func (p *plugin) designChanged(ctx context.Context, job *sdk.Job, c *couch.Client, w *WatcherData, ch couch.Change) error {
	old, err := p.readDesign(ctx, w.Server, w.DB, ch.ID)
	if err != nil {
		return err
	}
	var now *Design
	if !ch.Deleted {
		var raw json.RawMessage
		err := c.Get(ctx, w.DB, ch.ID, &raw)
		switch {
		case errors.Is(err, couch.ErrNotFound):
		case err != nil:
			return fmt.Errorf("read %s: %w", ch.ID, err)
		default:
			d := parseDesign(ch.ID, raw, p.cfg.limits)
			now = &d
		}
	}
	var writes []sdk.Write
	key := ddocKey(w.Server, w.DB, ch.ID)
	if now != nil {
		b, _ := json.Marshal(now)
		writes = append(writes, sdk.Set(key, b))
		if now.Sig != "" {
			writes = append(writes, sdk.Set(sigKey(w.Server, w.DB, now.Sig), []byte(sigLive)))
		}
	} else if old != nil {
		writes = append(writes, sdk.Clear(key))
	}
	dead := ""
	if old != nil && old.Sig != "" && (now == nil || now.Sig != old.Sig) {
		used, err := p.sigUsed(ctx, w.Server, w.DB, old.Sig, ch.ID)
		if err != nil {
			return err
		}
		if !used {
			dead = old.Sig
			writes = append(writes, sdk.Set(sigKey(w.Server, w.DB, dead), []byte(sigDead(time.Now()))))
		}
	}
	if err := job.Update(ctx, sdk.Update{Data: w, Writes: writes}); err != nil {
		return err
	}
	log := p.log.With("type", job.Type, "id", job.ID, "ddoc", ch.ID)
	if now != nil && now.Error != "" {
		log.Warn("design document cannot be indexed", "error", now.Error)
	}
	if now != nil && now.Sig != "" {
		log.Info("index", "sig", now.Sig)
		if err := ensureJob(ctx, p.host, sdk.NewJob{Type: TypeIndex, ID: indexID(w.Server, w.DB, now.Sig),
			Data: IndexData{Server: w.Server, DB: w.DB, Design: *now}, Group: w.Server + "/" + w.DB}); err != nil {
			return fmt.Errorf("add the index of %s: %w", ch.ID, err)
		}
	}
	if dead != "" {
		log.Info("index unused; deleting it after the query timeout", "sig", dead)
		if err := ensureJob(ctx, p.host, sdk.NewJob{Type: TypeCleanup, ID: indexID(w.Server, w.DB, dead),
			Data: CleanupData{Server: w.Server, DB: w.DB, Sig: dead}, Group: w.Server + "/" + w.DB}); err != nil {
			return fmt.Errorf("add the cleanup of %s: %w", dead, err)
		}
	}
	return nil
}

// readDesign reads a design document's record; nil if there is none.
func (p *plugin) readDesign(ctx context.Context, server, db, id string) (*Design, error) {
	b, err := p.host.Get(ctx, ddocKey(server, db, id))
	if err != nil || b == nil {
		return nil, err
	}
	var d Design
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("%w: design record %s: %v", errCorrupt, id, err)
	}
	return &d, nil
}

// sigUsed: does a design document other than except use the signature?
func (p *plugin) sigUsed(ctx context.Context, server, db, sig, except string) (bool, error) {
	prefix := ddocPrefix(server, db)
	begin, end := prefix, strinc(prefix)
	for {
		kvs, err := p.host.Range(ctx, begin, end, 0, false)
		if err != nil || len(kvs) == 0 {
			return false, err
		}
		for _, kv := range kvs {
			id, _, err := readPart(kv.Key[len(prefix):])
			if err != nil {
				return false, err
			}
			var d Design
			if json.Unmarshal(kv.Value, &d) == nil && d.Sig == sig && id != except {
				return true, nil
			}
		}
		if len(kvs) < maxPage {
			return false, nil
		}
		begin = append(bytes.Clone(kvs[len(kvs)-1].Key), 0)
	}
}

// CleanupData is a cleanup job's data: the index to delete.
type CleanupData struct {
	Server string `json:"server"`
	DB     string `json:"database"`
	Sig    string `json:"sig"`
}

// cleanup deletes an index once no design document has used it for the
// query timeout: a query reads the signature at its start, and no query
// lasts longer. The delete is conditional on the signature still being
// dead, so an index revived meanwhile is kept.
func (p *plugin) cleanup(ctx context.Context, job *sdk.Job) error {
	var d CleanupData
	if err := job.Decode(&d); err != nil {
		return sdk.Fail(err)
	}
	key := sigKey(d.Server, d.DB, d.Sig)
	state, err := p.host.Get(ctx, key)
	if err != nil {
		return err
	}
	var ms int64
	if _, err := fmt.Sscanf(string(state), "dead:%d", &ms); err != nil {
		return nil // live again, or already deleted
	}
	if at := time.UnixMilli(ms).Add(p.cfg.query); time.Now().Before(at) {
		return sdk.Resubmit(at)
	}
	id := indexID(d.Server, d.DB, d.Sig)
	info, err := p.host.GetJob(ctx, TypeIndex, id)
	if err != nil && !errors.Is(err, sdk.ErrNotFound) {
		return err
	}
	if err := p.host.RemoveJob(ctx, TypeIndex, id); err != nil && !errors.Is(err, sdk.ErrNotFound) {
		return err
	}
	begin, end := newIndex(d.Server, d.DB, d.Sig).all()
	err = job.Update(ctx, sdk.Update{Writes: []sdk.Write{sdk.ClearRange(begin, end), sdk.Clear(key)}, If: []sdk.Condition{sdk.Holds(key, state)}})
	if errors.Is(err, sdk.ErrPrecondition) {
		// A design document took the signature back: its index stays,
		// and so does its job.
		if len(info.Data) > 0 {
			err = ensureJob(ctx, p.host, sdk.NewJob{Type: TypeIndex, ID: id, Data: info.Data, Group: info.Group})
		} else {
			err = nil
		}
		return err
	}
	if err == nil {
		p.log.Info("index deleted", "type", job.Type, "id", job.ID)
	}
	return err
}
