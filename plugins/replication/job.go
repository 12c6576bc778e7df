package replication

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/couchjobs/couchjobs/plugins/internal/couch"
	"github.com/couchjobs/couchjobs/sdk"
)

// Kinds of replication.
const (
	Persistent = "persistent"
	Transient  = "transient"
)

// Replication states, as CouchDB names them.
const (
	StatePending   = "pending"
	StateRunning   = "running"
	StateCrashing  = "crashing"
	StateCompleted = "completed"
	StateFailed    = "failed"
)

// Data is a replication job's data. Secret holds the endpoints with their
// credentials and is a private field: the host shows it to its admins
// only, and nothing here logs it.
type Data struct {
	Kind string `json:"kind"`
	// Persistent: the _replicator document.
	Server string `json:"server,omitempty"`
	DB     string `json:"database,omitempty"`
	DocID  string `json:"doc_id,omitempty"`
	// DocHash identifies the document's replication fields, so that the
	// watcher restarts the job only when they change.
	DocHash string `json:"doc_hash,omitempty"`
	// Transient: who asked.
	User string `json:"user,omitempty"`

	// Rep is the replication with its endpoints redacted; Invalid is why
	// the document or request cannot run.
	Rep     *View  `json:"rep,omitempty"`
	Secret  *Spec  `json:"secret,omitempty"`
	Invalid string `json:"invalid,omitempty"`

	// Written by the runs.
	State     string     `json:"state,omitempty"`
	RepID     string     `json:"rep_id,omitempty"`
	Node      string     `json:"node,omitempty"`
	StartTime *time.Time `json:"start_time,omitempty"`
	Updated   *time.Time `json:"last_updated,omitempty"`
	Stats     *Stats     `json:"info,omitempty"`
	Error     string     `json:"error,omitempty"`
	Result    *Result    `json:"result,omitempty"`
	// Meta is the host's "_couchjobs" field: the last run's outcome.
	Meta *struct {
		Outcome string `json:"outcome"`
		Crashes int    `json:"crashes"`
		Reason  string `json:"reason"`
	} `json:"_couchjobs,omitempty"`
}

// parseData decodes a job's data.
func parseData(raw json.RawMessage) (*Data, error) {
	var d Data
	if err := json.Unmarshal(raw, &d); err != nil {
		return nil, fmt.Errorf("job data: %w", err)
	}
	return &d, nil
}

// state is a job's replication state: CouchDB's, mapped from the job
// layer's as the RFC maps it (crashing is a pending job whose last run
// crashed).
func state(info sdk.JobInfo, d *Data) string {
	switch info.State {
	case "running":
		return StateRunning
	case "finished":
		if d.State == StateCompleted || d.State == StateFailed {
			return d.State
		}
		if d.Meta != nil && d.Meta.Outcome == "completed" {
			return StateCompleted
		}
		return StateFailed
	}
	if d.Meta != nil && d.Meta.Outcome == "crashed" {
		return StateCrashing
	}
	return StatePending
}

// newData builds the data of a job for a replication body (nil spec and
// an error: an invalid one, which fails when it runs).
func newData(kind string, raw []byte) *Data {
	d := &Data{Kind: kind, State: StatePending}
	var doc map[string]any
	if json.Unmarshal(raw, &doc) == nil {
		d.DocHash = docHash(doc)
	}
	spec, err := Parse(raw)
	if err != nil {
		d.Invalid = err.Error()
		return d
	}
	v := spec.View()
	d.Rep, d.Secret = &v, spec
	return d
}

// admit checks a replication job before the host stores it: a job with
// an invalid replication is refused at once (a watcher's jobs carry the
// reason instead, so that the document ends failed).
func (p *plugin) admit(ctx context.Context, a *sdk.Admission) error {
	d, err := parseData(a.Data)
	if err != nil {
		return err
	}
	switch d.Kind {
	case Persistent, Transient:
	default:
		return fmt.Errorf("kind %q: want %q or %q", d.Kind, Persistent, Transient)
	}
	if d.Invalid == "" && d.Secret == nil {
		return errors.New("the job has no replication (secret)")
	}
	if d.Kind == Transient && d.Invalid != "" {
		return errors.New(d.Invalid)
	}
	if d.Secret != nil {
		// Check the endpoints and options as a body would be checked,
		// and derive the public view from them, whatever the submitter
		// wrote there.
		spec, err := Parse(specDoc(d.Secret))
		if err != nil {
			return err
		}
		v := spec.View()
		d.Rep, d.Secret = &v, spec
		if a.Data, err = json.Marshal(d); err != nil {
			return err
		}
	}
	return nil
}

// specDoc turns a Spec back into a replication body.
func specDoc(s *Spec) []byte {
	body := map[string]any{"source": endpointDoc(s.Source), "target": endpointDoc(s.Target)}
	opts, _ := json.Marshal(s.Options)
	var m map[string]any
	json.Unmarshal(opts, &m)
	for k, v := range m {
		body[k] = v
	}
	b, _ := json.Marshal(body)
	return b
}

func endpointDoc(e Endpoint) map[string]any {
	out := map[string]any{"url": e.URL}
	if len(e.Headers) > 0 {
		out["headers"] = e.Headers
	}
	if e.User != "" {
		out["auth"] = map[string]any{"basic": map[string]string{"username": e.User, "password": e.Password}}
	}
	return out
}

// collision is a replication id another live job already runs.
type collision struct {
	owner, ownerKind string
	repID            string
}

func (c *collision) Error() string {
	return fmt.Sprintf("replication_id %s collides with %s job %s", c.repID, c.ownerKind, c.owner)
}

// replicate runs one session of a replication job.
func (p *plugin) replicate(ctx context.Context, job *sdk.Job) error {
	d, err := parseData(job.Data)
	if err != nil {
		return sdk.Fail(err)
	}
	log := p.log.With("type", job.Type, "id", job.ID)
	if d.Invalid != "" || d.Secret == nil {
		reason := d.Invalid
		if reason == "" {
			reason = "the job has no replication"
		}
		return p.fail(ctx, job, d, errors.New(reason))
	}
	now := time.Now().UTC()
	d.State, d.Node, d.StartTime, d.Updated, d.Error, d.Result = StateRunning, p.node, &now, &now, "", nil
	r := &Replication{Spec: d.Secret, Log: log}
	r.Claim = func(ctx context.Context, repID string) error {
		cond, err := p.claim(ctx, job.ID, repID)
		if err != nil {
			return err
		}
		// Record the claim (and that the job runs) before any document
		// moves, if the claim is still as read: of two jobs claiming at
		// once, one wins and the other finds the collision.
		d.RepID = repID
		err = job.Update(ctx, sdk.Update{Data: d, If: []sdk.Condition{cond}, Writes: []sdk.Write{sdk.Set(repIDKey(repID), []byte(job.ID))}})
		if errors.Is(err, sdk.ErrPrecondition) {
			d.RepID = ""
			if _, err := p.claim(ctx, job.ID, repID); err != nil {
				return err
			}
			return fmt.Errorf("replication_id %s: another job claimed it at the same time", repID)
		}
		return err
	}
	r.Progress = func(ctx context.Context, repID string, s Stats) error {
		now := time.Now().UTC()
		d.Stats, d.Updated = &s, &now
		return job.Update(ctx, sdk.Update{Data: d})
	}
	res, err := r.Run(ctx)
	if err == nil {
		s := r.Stats()
		now := time.Now().UTC()
		d.State, d.Stats, d.Updated, d.Result = StateCompleted, &s, &now, res
		if d.Kind == Persistent {
			p.markDoc(ctx, d, StateCompleted, "", &s)
		}
		log.Info("replication completed", "docs_written", s.DocsWritten, "doc_write_failures", s.DocWriteFailures)
		return job.SetResult(d)
	}
	if _, stopped := sdk.Stopped(ctx); stopped {
		return err
	}
	var c *collision
	var perr *ParseError
	switch {
	case errors.As(err, &c):
		if d.Kind == Persistent && c.ownerKind == Persistent {
			return p.fail(ctx, job, d, err)
		}
		log.Warn("replication id collision; retrying later", "error", err)
		return err
	case errors.As(err, &perr):
		return p.fail(ctx, job, d, err)
	case errors.Is(err, sdk.ErrConflict), errors.Is(err, sdk.ErrCanceled):
		return err
	case d.Kind == Transient:
		// Transient replications that crash end failed, as the RFC's
		// final revision has it: their caller is told at once.
		return p.fail(ctx, job, d, err)
	}
	log.Warn("replication crashed", "error", err)
	return err
}

// fail ends a job as failed with the reason, recording it in the
// _replicator document of a persistent job.
func (p *plugin) fail(ctx context.Context, job *sdk.Job, d *Data, reason error) error {
	now := time.Now().UTC()
	d.State, d.Error, d.Updated = StateFailed, reason.Error(), &now
	if d.Kind == Persistent {
		p.markDoc(ctx, d, StateFailed, reason.Error(), nil)
	}
	p.log.Warn("replication failed", "type", job.Type, "id", job.ID, "reason", reason)
	if err := job.SetResult(d); err != nil {
		p.log.Warn("cannot record the failure in the job data", "type", job.Type, "id", job.ID, "error", err)
	}
	return sdk.Fail(reason)
}

// repIDKey is where the plugin's subspace records which job runs a
// replication id.
func repIDKey(repID string) []byte { return []byte("repid/" + baseID(repID)) }

// claim checks that no other live job runs the replication id, and
// returns the condition under which this job may record its claim: the
// registry entry as read.
func (p *plugin) claim(ctx context.Context, self, repID string) (sdk.Condition, error) {
	key := repIDKey(repID)
	if p.host == nil {
		return sdk.Absent(key), nil
	}
	owner, err := p.host.Get(ctx, key)
	if err != nil {
		return sdk.Condition{}, err
	}
	if owner == nil {
		return sdk.Absent(key), nil
	}
	cond := sdk.Holds(key, owner)
	if string(owner) == self {
		return cond, nil
	}
	info, err := p.host.GetJob(ctx, TypeReplication, string(owner))
	if errors.Is(err, sdk.ErrNotFound) {
		return cond, nil
	}
	if err != nil {
		return sdk.Condition{}, err
	}
	od, err := parseData(info.Data)
	if err != nil || info.State == "finished" || od.RepID != repID {
		return cond, nil
	}
	return sdk.Condition{}, &collision{owner: string(owner), ownerKind: od.Kind, repID: repID}
}

// markDoc records a terminal state in a _replicator document, as CouchDB
// does (and only terminal states): _replication_state, its time, the
// reason of a failure, the statistics of a completion.
func (p *plugin) markDoc(ctx context.Context, d *Data, st, reason string, stats *Stats) {
	if p.cfg == nil {
		return
	}
	c := p.cfg.clients[d.Server]
	if c == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	for range 3 {
		var doc map[string]any
		if err := c.Get(ctx, d.DB, d.DocID, &doc); err != nil {
			if !errors.Is(err, couch.ErrNotFound) {
				p.log.Warn("cannot record the state in the replication document", "server", d.Server, "database", d.DB, "doc_id", d.DocID, "error", err)
			}
			return
		}
		if hash := docHash(doc); hash != d.DocHash {
			return // the document changed since: its new job decides
		}
		doc["_replication_state"] = st
		doc["_replication_state_time"] = time.Now().UTC().Format(time.RFC3339)
		delete(doc, "_replication_state_reason")
		delete(doc, "_replication_stats")
		if reason != "" {
			doc["_replication_state_reason"] = reason
		}
		if stats != nil {
			doc["_replication_stats"] = stats
		}
		_, err := c.Put(ctx, d.DB, d.DocID, doc)
		if !errors.Is(err, couch.ErrConflict) {
			if err != nil {
				p.log.Warn("cannot record the state in the replication document", "server", d.Server, "database", d.DB, "doc_id", d.DocID, "error", err)
			}
			return
		}
	}
}

// docHash is the hash of a _replicator document's replication fields:
// all but its revision and CouchDB's _replication_* bookkeeping.
func docHash(doc map[string]any) string {
	cp := make(map[string]any, len(doc))
	for k, v := range doc {
		switch k {
		case "_rev", "_revisions", "_replication_state", "_replication_state_time",
			"_replication_state_reason", "_replication_stats", "_replication_id":
			continue
		}
		cp[k] = v
	}
	b, _ := json.Marshal(cp) // map keys marshal sorted
	sum := md5.Sum(b)
	return hex.EncodeToString(sum[:])
}
