package replication

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/couchjobs/couchjobs/sdk"
)

// routes are CouchDB's replication endpoints, served on the host's API.
func (p *plugin) routes() []sdk.Route {
	return []sdk.Route{
		{Pattern: "POST /_replicate", Admin: true, Handler: http.HandlerFunc(p.postReplicate)},
		{Pattern: "GET /_scheduler/jobs", Handler: http.HandlerFunc(p.schedulerJobs)},
		{Pattern: "GET /_scheduler/jobs/{id}", Handler: http.HandlerFunc(p.schedulerJob)},
		{Pattern: "GET /_scheduler/docs", Handler: http.HandlerFunc(p.schedulerDocs)},
		{Pattern: "GET /_scheduler/docs/{rest...}", Handler: http.HandlerFunc(p.schedulerDocs)},
		{Pattern: "GET /_active_tasks", Handler: http.HandlerFunc(p.activeTasks)},
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, name, reason string) {
	writeJSON(w, status, map[string]string{"error": name, "reason": reason})
}

// transientID is a transient replication's job id: a hash of who asked
// and what (no network needed, unlike the replication id), so that the
// same request twice names the same job.
func transientID(user string, spec *Spec) string {
	b, _ := json.Marshal([]any{user, ReplicationID(spec, ""), spec.Options.Filter})
	sum := md5.Sum(b)
	return "transient:" + hex.EncodeToString(sum[:])
}

// postReplicate is POST /_replicate: it starts a transient replication
// and, for a one-shot one, waits for its result, as CouchDB does; with
// "cancel": true it stops one.
func (p *plugin) postReplicate(w http.ResponseWriter, r *http.Request) {
	if p.host == nil {
		writeError(w, http.StatusServiceUnavailable, "unavailable", "the replication plugin is not configured")
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		writeError(w, http.StatusBadRequest, "bad_request", err.Error())
		return
	}
	var req struct {
		Cancel        bool   `json:"cancel"`
		ReplicationID string `json:"replication_id"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		writeError(w, http.StatusBadRequest, "bad_request", "the body must be a JSON object: "+err.Error())
		return
	}
	user := sdk.RequestCaller(r).User
	if req.Cancel && req.ReplicationID != "" {
		p.cancelByRepID(w, r, req.ReplicationID)
		return
	}
	spec, err := Parse(body)
	if err != nil {
		writeError(w, http.StatusBadRequest, "bad_request", err.Error())
		return
	}
	id := transientID(user, spec)
	ctx := r.Context()
	if req.Cancel {
		info, err := p.host.GetJob(ctx, TypeReplication, id)
		if err == nil && info.State != "finished" {
			err = p.host.RemoveJob(ctx, TypeReplication, id)
		} else if err == nil {
			err = sdk.ErrNotFound
		}
		if errors.Is(err, sdk.ErrNotFound) {
			writeError(w, http.StatusNotFound, "not_found", "no such replication is running")
			return
		}
		if err != nil {
			writeError(w, http.StatusInternalServerError, "error", err.Error())
			return
		}
		d, _ := parseData(info.Data)
		writeJSON(w, http.StatusOK, map[string]any{"ok": true, "_local_id": d.RepID})
		return
	}
	d := newData(Transient, body)
	d.User = user
	info, err := p.host.GetJob(ctx, TypeReplication, id)
	switch {
	case errors.Is(err, sdk.ErrNotFound) || err == nil && info.State == "finished":
		if err == nil {
			// The same replication ran before: start it afresh.
			if err := p.host.RemoveJob(ctx, TypeReplication, id); err != nil && !errors.Is(err, sdk.ErrNotFound) {
				writeError(w, http.StatusInternalServerError, "error", err.Error())
				return
			}
		}
		err = p.host.AddJob(ctx, sdk.NewJob{Type: TypeReplication, ID: id, Data: d, Group: user, Exclusive: true})
		if errors.Is(err, sdk.ErrExists) {
			err = nil // the same request, at once from another client
		}
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, "bad_request", err.Error())
		return
	}
	if spec.Options.Continuous {
		p.started(w, r, id, spec)
		return
	}
	p.await(w, r, id)
}

// started answers a continuous _replicate request once its job is stored,
// as CouchDB does, with the replication id (for a filtered replication,
// that needs the filter's code from the source).
func (p *plugin) started(w http.ResponseWriter, r *http.Request, id string, spec *Spec) {
	out := map[string]any{"ok": true, "job_id": id}
	code := ""
	if spec.Options.Filter != "" {
		ctx, cancel := context.WithTimeout(r.Context(), spec.Options.connectionTimeout())
		defer cancel()
		c, db, err := newClient(spec.Source, spec.Options)
		if err == nil {
			code, err = filterCode(ctx, c, db, spec.Options.Filter)
		}
		if err != nil {
			// The job reports the problem as it runs.
			writeJSON(w, http.StatusAccepted, out)
			return
		}
	}
	out["_local_id"] = ReplicationID(spec, code)
	writeJSON(w, http.StatusAccepted, out)
}

// await answers a one-shot _replicate request when its replication ends.
func (p *plugin) await(w http.ResponseWriter, r *http.Request, id string) {
	ctx := r.Context()
	var answered bool
	err := p.host.Subscribe(ctx, TypeReplication, id, func(info sdk.JobInfo) error {
		if info.State == "not_found" {
			writeError(w, http.StatusNotFound, "not_found", "the replication was canceled")
			answered = true
			return errDone
		}
		d, err := parseData(info.Data)
		if err != nil {
			return err
		}
		switch st := state(info, d); {
		case st == StateFailed:
			writeError(w, http.StatusInternalServerError, "replication_failed", d.Error)
		case st == StateCompleted && d.Result != nil:
			writeJSON(w, http.StatusOK, d.Result)
		case st == StateCompleted:
			writeJSON(w, http.StatusOK, map[string]any{"ok": true})
		default:
			return nil
		}
		answered = true
		return errDone
	})
	if answered || ctx.Err() != nil {
		return
	}
	if err == nil || errors.Is(err, errDone) {
		err = errors.New("the job ended without a result")
	}
	writeError(w, http.StatusInternalServerError, "error", err.Error())
}

var errDone = errors.New("done")

// cancelByRepID cancels the transient replication running a replication
// id ("id+continuous" as _replicate answered it).
func (p *plugin) cancelByRepID(w http.ResponseWriter, r *http.Request, repID string) {
	ctx := r.Context()
	owner, err := p.host.Get(ctx, repIDKey(repID))
	if err == nil && owner != nil {
		var info sdk.JobInfo
		if info, err = p.host.GetJob(ctx, TypeReplication, string(owner)); err == nil {
			d, _ := parseData(info.Data)
			if d == nil || d.Kind != Transient || info.State == "finished" {
				owner = nil
			} else {
				err = p.host.RemoveJob(ctx, TypeReplication, string(owner))
			}
		}
	}
	if errors.Is(err, sdk.ErrNotFound) || err == nil && owner == nil {
		writeError(w, http.StatusNotFound, "not_found", fmt.Sprintf("no transient replication %s is running", repID))
		return
	}
	if err != nil {
		writeError(w, http.StatusInternalServerError, "error", err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"ok": true, "_local_id": repID})
}

// jobView is a replication as _scheduler/jobs shows it.
type jobView struct {
	Database  *string    `json:"database"`
	ID        string     `json:"id"`
	DocID     *string    `json:"doc_id"`
	Source    string     `json:"source"`
	Target    string     `json:"target"`
	User      *string    `json:"user"`
	Node      string     `json:"node,omitempty"`
	State     string     `json:"state"`
	StartTime *time.Time `json:"start_time,omitempty"`
	History   []event    `json:"history"`
	Info      *Stats     `json:"info"`
	JobID     string     `json:"job_id"`
}

type event struct {
	Timestamp time.Time `json:"timestamp"`
	Type      string    `json:"type"`
	Reason    string    `json:"reason,omitempty"`
}

// docView is a replication document as _scheduler/docs shows it.
type docView struct {
	Database    string     `json:"database"`
	DocID       string     `json:"doc_id"`
	ID          *string    `json:"id"`
	Node        string     `json:"node,omitempty"`
	Source      string     `json:"source,omitempty"`
	Target      string     `json:"target,omitempty"`
	State       string     `json:"state"`
	Info        any        `json:"info"`
	ErrorCount  int        `json:"error_count"`
	StartTime   *time.Time `json:"start_time,omitempty"`
	LastUpdated *time.Time `json:"last_updated,omitempty"`
	Server      string     `json:"server"`
	Continuous  bool       `json:"continuous"`
	JobID       string     `json:"job_id"`
}

func strp(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// replications folds over the replication jobs (an id prefix narrows
// them), decoding their data.
func (p *plugin) replications(ctx context.Context, prefix string, fn func(sdk.JobInfo, *Data) error) error {
	return p.eachJob(ctx, TypeReplication, prefix, "", func(info sdk.JobInfo) error {
		d, err := parseData(info.Data)
		if err != nil {
			return nil
		}
		return fn(info, d)
	})
}

func toJobView(info sdk.JobInfo, d *Data) jobView {
	v := jobView{ID: d.RepID, Node: d.Node, State: state(info, d), StartTime: d.StartTime, Info: d.Stats, JobID: info.ID, History: []event{{Timestamp: info.Created, Type: "added"}}}
	if d.Kind == Persistent {
		v.Database, v.DocID = strp(d.DB), strp(d.DocID)
	} else {
		v.User = strp(d.User)
	}
	if d.Rep != nil {
		v.Source, v.Target = d.Rep.Source, d.Rep.Target
	}
	if d.StartTime != nil {
		v.History = append([]event{{Timestamp: *d.StartTime, Type: "started"}}, v.History...)
	}
	if d.Meta != nil && d.Meta.Outcome == "crashed" {
		v.History = append([]event{{Timestamp: info.Updated, Type: "crashed", Reason: d.Meta.Reason}}, v.History...)
	}
	return v
}

// page reads CouchDB's limit and skip.
func page(r *http.Request) (limit, skip int, err error) {
	limit = 1 << 30
	q := r.URL.Query()
	for name, dst := range map[string]*int{"limit": &limit, "skip": &skip} {
		if s := q.Get(name); s != "" {
			n, perr := strconv.Atoi(s)
			if perr != nil || n < 0 {
				return 0, 0, fmt.Errorf("%s %q: want a non-negative integer", name, s)
			}
			*dst = n
		}
	}
	return limit, skip, nil
}

// schedulerJobs is GET /_scheduler/jobs: the replications not finished.
func (p *plugin) schedulerJobs(w http.ResponseWriter, r *http.Request) {
	limit, skip, err := page(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, "bad_request", err.Error())
		return
	}
	var all []jobView
	err = p.replications(r.Context(), "", func(info sdk.JobInfo, d *Data) error {
		if info.State != "finished" {
			all = append(all, toJobView(info, d))
		}
		return nil
	})
	if err != nil {
		writeError(w, http.StatusInternalServerError, "error", err.Error())
		return
	}
	total := len(all)
	all = all[min(skip, total):min(skip+limit, total)]
	writeJSON(w, http.StatusOK, map[string]any{"total_rows": total, "offset": skip, "jobs": nonNil(all)})
}

// schedulerJob is GET /_scheduler/jobs/{id}, by replication id or job id.
func (p *plugin) schedulerJob(w http.ResponseWriter, r *http.Request) {
	want := r.PathValue("id")
	var found *jobView
	err := p.replications(r.Context(), "", func(info sdk.JobInfo, d *Data) error {
		if info.ID == want || d.RepID != "" && (d.RepID == want || baseID(d.RepID) == want) && info.State != "finished" {
			v := toJobView(info, d)
			found = &v
			return errDone
		}
		return nil
	})
	if err != nil && !errors.Is(err, errDone) {
		writeError(w, http.StatusInternalServerError, "error", err.Error())
		return
	}
	if found == nil {
		writeError(w, http.StatusNotFound, "not_found", "unknown job "+want)
		return
	}
	writeJSON(w, http.StatusOK, found)
}

func toDocView(info sdk.JobInfo, d *Data) docView {
	v := docView{
		Database: d.DB, DocID: d.DocID, ID: strp(d.RepID), Node: d.Node, State: state(info, d),
		StartTime: d.StartTime, LastUpdated: d.Updated, Server: d.Server, JobID: info.ID,
	}
	if d.Rep != nil {
		v.Source, v.Target, v.Continuous = d.Rep.Source, d.Rep.Target, d.Rep.Options.Continuous
	}
	if d.Meta != nil {
		v.ErrorCount = d.Meta.Crashes
	}
	switch {
	case v.State == StateFailed:
		reason := d.Error
		if reason == "" {
			reason = d.Invalid
		}
		v.Info = map[string]string{"error": reason}
	case v.State == StateCrashing && d.Meta != nil:
		v.Info = map[string]string{"error": d.Meta.Reason}
	case d.Stats != nil:
		v.Info = d.Stats
	}
	return v
}

// schedulerDocs is GET /_scheduler/docs[/{db}[/{docid}]]: replication
// documents with their states. A database name with '/' is given
// %2F-escaped, as CouchDB wants; ?server= narrows to one server.
func (p *plugin) schedulerDocs(w http.ResponseWriter, r *http.Request) {
	var db, docID string
	if rest := strings.TrimPrefix(r.URL.EscapedPath(), "/_scheduler/docs"); strings.Trim(rest, "/") != "" {
		segs := strings.SplitN(strings.TrimPrefix(rest, "/"), "/", 2)
		var err error
		if db, err = url.PathUnescape(segs[0]); err == nil && len(segs) == 2 {
			docID, err = url.PathUnescape(segs[1])
		}
		if err != nil {
			writeError(w, http.StatusBadRequest, "bad_request", "bad path: "+err.Error())
			return
		}
		if !isReplicatorDB(db) {
			writeError(w, http.StatusBadRequest, "bad_request", fmt.Sprintf("%q is not a _replicator database", db))
			return
		}
	}
	server := r.URL.Query().Get("server")
	limit, skip, err := page(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, "bad_request", err.Error())
		return
	}
	var all []docView
	err = p.replications(r.Context(), "doc:", func(info sdk.JobInfo, d *Data) error {
		if db != "" && d.DB != db || docID != "" && d.DocID != docID || server != "" && d.Server != server {
			return nil
		}
		all = append(all, toDocView(info, d))
		return nil
	})
	if err != nil {
		writeError(w, http.StatusInternalServerError, "error", err.Error())
		return
	}
	if docID != "" {
		if len(all) == 0 {
			writeError(w, http.StatusNotFound, "not_found", fmt.Sprintf("no replication document %s in %s", docID, db))
			return
		}
		writeJSON(w, http.StatusOK, all[0])
		return
	}
	total := len(all)
	all = all[min(skip, total):min(skip+limit, total)]
	writeJSON(w, http.StatusOK, map[string]any{"total_rows": total, "offset": skip, "docs": nonNil(all)})
}

// activeTasks is GET /_active_tasks: the running replications, in
// CouchDB's shape.
func (p *plugin) activeTasks(w http.ResponseWriter, r *http.Request) {
	tasks := []map[string]any{}
	err := p.replications(r.Context(), "", func(info sdk.JobInfo, d *Data) error {
		if info.State != "running" || d.Rep == nil {
			return nil
		}
		t := map[string]any{
			"type": "replication", "replication_id": d.RepID, "node": d.Node,
			"source": d.Rep.Source, "target": d.Rep.Target, "continuous": d.Rep.Options.Continuous,
			"doc_id": strp(d.DocID), "database": strp(d.DB), "user": strp(d.User),
			"checkpoint_interval": d.Rep.Options.CheckpointInterval,
		}
		if d.StartTime != nil {
			t["started_on"] = d.StartTime.Unix()
		}
		if d.Updated != nil {
			t["updated_on"] = d.Updated.Unix()
		}
		if s := d.Stats; s != nil {
			t["docs_read"], t["docs_written"], t["doc_write_failures"] = s.DocsRead, s.DocsWritten, s.DocWriteFailures
			t["missing_revisions_found"], t["revisions_checked"] = s.MissingRevisionsFound, s.RevisionsChecked
			t["changes_pending"], t["source_seq"], t["checkpointed_source_seq"] = s.ChangesPending, s.SourceSeq, s.CheckpointedSourceSeq
		}
		tasks = append(tasks, t)
		return nil
	})
	if err != nil {
		writeError(w, http.StatusInternalServerError, "error", err.Error())
		return
	}
	writeJSON(w, http.StatusOK, tasks)
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
