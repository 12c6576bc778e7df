package host

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/couchjobs/couchjobs/runtime/jobs"
	"github.com/couchjobs/couchjobs/runtime/kv"
)

// maxBody bounds a request body: a job's data fits the store's value limit.
const maxBody = 1 << 20

// maxWait bounds a long-poll.
const maxWait = 5 * time.Minute

// JobJSON is a job as the API shows it.
type JobJSON struct {
	Type      string          `json:"type"`
	ID        string          `json:"id"`
	State     jobs.State      `json:"state"`
	Data      json.RawMessage `json:"data,omitempty"`
	Priority  int64           `json:"priority"`
	Placement string          `json:"placement,omitempty"`
	Group     string          `json:"group,omitempty"`
	Resubmit  bool            `json:"resubmit,omitempty"`
	Canceled  bool            `json:"canceled,omitempty"`
	Created   *time.Time      `json:"created,omitempty"`
	Updated   *time.Time      `json:"updated,omitempty"`
}

func jobJSON(in jobs.Info) JobJSON {
	j := JobJSON{
		Type: in.Type, ID: in.ID, State: in.State, Data: in.Data, Priority: in.Priority,
		Placement: string(in.Placement), Group: in.Group, Resubmit: in.Resubmit, Canceled: in.Canceled,
	}
	if !in.Created.IsZero() {
		j.Created, j.Updated = &in.Created, &in.Updated
	}
	return j
}

// AddRequest is the body of POST /jobs/{type}.
type AddRequest struct {
	ID        string          `json:"id"`
	Data      json.RawMessage `json:"data,omitempty"`
	Priority  int64           `json:"priority,omitempty"`
	At        *time.Time      `json:"at,omitempty"`
	Placement string          `json:"placement,omitempty"`
	Group     string          `json:"group,omitempty"`
	Exclusive bool            `json:"exclusive,omitempty"`
}

// ResubmitRequest is the body of POST /jobs/{type}/{id}/_resubmit.
type ResubmitRequest struct {
	Priority int64           `json:"priority,omitempty"`
	At       *time.Time      `json:"at,omitempty"`
	Data     json.RawMessage `json:"data,omitempty"`
}

// Handler returns the node's HTTP API.
func (n *Node) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /_up", n.getUp)
	mux.HandleFunc("GET /types", n.getTypes)
	mux.HandleFunc("GET /plugins", n.getPlugins)
	mux.HandleFunc("GET /nodes", n.getNodes)
	mux.HandleFunc("GET /metrics", n.getMetrics)
	mux.HandleFunc("GET /jobs/{type}", n.listJobs)
	mux.HandleFunc("POST /jobs/{type}", n.admin(n.addJob))
	mux.HandleFunc("GET /jobs/{type}/{id}", n.getJob)
	mux.HandleFunc("DELETE /jobs/{type}/{id}", n.admin(n.removeJob))
	mux.HandleFunc("POST /jobs/{type}/{id}/_cancel", n.admin(n.cancelJob))
	mux.HandleFunc("POST /jobs/{type}/{id}/_resubmit", n.admin(n.resubmitJob))
	mux.HandleFunc("GET /jobs/{type}/{id}/_wait", n.waitJob)
	mux.HandleFunc("GET /shares", n.getShares)
	mux.HandleFunc("PUT /shares/{group}", n.admin(n.putShares))
	mux.HandleFunc("DELETE /shares/{group}", n.admin(n.deleteShares))
	mux.HandleFunc("/", n.pluginRoute)
	return mux
}

// listenAPI opens the API's listener, so that a taken port fails the
// node's start with a clear error; serveAPI then serves it.
func (n *Node) listenAPI() (net.Listener, error) {
	if n.cfg.HTTP.Listen == "off" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", n.cfg.HTTP.Listen)
	if err != nil {
		return nil, fmt.Errorf("%s: http.listen %s: %w", n.cfg.Path(), n.cfg.HTTP.Listen, err)
	}
	addr := ln.Addr().String()
	n.apiAddr.Store(&addr)
	return ln, nil
}

// serveAPI serves the API on ln until ctx is done.
func (n *Node) serveAPI(ctx context.Context, ln net.Listener) {
	srv := &http.Server{Handler: n.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	n.log.Info("API listening", "address", n.APIAddr())
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		n.log.Error("API stopped", "error", err)
	}
}

// APIAddr returns the address the API listens on, once it does.
func (n *Node) APIAddr() string {
	if a := n.apiAddr.Load(); a != nil {
		return *a
	}
	return ""
}

// admin wraps a handler that changes something: it needs an admin's basic
// auth.
func (n *Node) admin(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if _, ok := n.caller(r); !ok {
			w.Header().Set("WWW-Authenticate", `Basic realm="couchjobs"`)
			writeError(w, http.StatusUnauthorized, "unauthorized", "this endpoint needs an admin's name and password (http.admins in runtime.toml)")
			return
		}
		h(w, r)
	}
}

// caller returns the admin a request authenticates as, if it does.
func (n *Node) caller(r *http.Request) (string, bool) {
	user, pass, ok := r.BasicAuth()
	if !ok {
		return "", false
	}
	hash, known := n.cfg.HTTP.Admins[user]
	// bcrypt costs tens of milliseconds by design; credentials that
	// passed once are remembered (by a SHA-256 of name and password,
	// never the password) so that a client sending many requests pays
	// it once.
	seen := sha256.Sum256([]byte(user + "\x00" + pass))
	if known {
		if _, verified := n.verified.Load(seen); verified {
			return user, true
		}
	}
	if !known || bcrypt.CompareHashAndPassword([]byte(hash), []byte(pass)) != nil {
		// Spend the same time on unknown names as on known ones.
		if !known {
			bcrypt.CompareHashAndPassword(dummyHash, []byte(pass))
		}
		return "", false
	}
	n.verified.Store(seen, struct{}{})
	return user, true
}

// viewer returns how the caller of r may see jobs of a type: the type's
// private fields (credentials, say) only for admins. It checks the caller
// once, for a whole list.
func (n *Node) viewer(r *http.Request, typ string) func(jobs.Info) JobJSON {
	private := n.privateFields(typ)
	if len(private) == 0 {
		return jobJSON
	}
	if _, admin := n.caller(r); admin {
		return jobJSON
	}
	return func(in jobs.Info) JobJSON {
		j := jobJSON(in)
		var obj map[string]json.RawMessage
		if len(j.Data) == 0 || json.Unmarshal(j.Data, &obj) != nil {
			return j
		}
		for _, f := range private {
			delete(obj, f)
		}
		j.Data, _ = json.Marshal(obj)
		return j
	}
}

var dummyHash, _ = bcrypt.GenerateFromPassword([]byte("couchjobs"), bcrypt.MinCost)

// writeJSON writes v with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// writeError writes CouchDB's error shape.
func writeError(w http.ResponseWriter, status int, code, reason string) {
	writeJSON(w, status, map[string]string{"error": code, "reason": reason})
}

// writeJobError maps the job layer's errors to statuses.
func writeJobError(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, jobs.ErrNotFound):
		writeError(w, http.StatusNotFound, "not_found", err.Error())
	case errors.Is(err, jobs.ErrJobExists):
		writeError(w, http.StatusConflict, "conflict", err.Error())
	case errors.Is(err, jobs.ErrUnknownType):
		writeError(w, http.StatusNotFound, "unknown_type", err.Error())
	case errors.Is(err, jobs.ErrInvalid):
		writeError(w, http.StatusBadRequest, "bad_request", err.Error())
	case errors.Is(err, ErrNoAdmitter):
		writeError(w, http.StatusServiceUnavailable, "unavailable", err.Error())
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		writeError(w, http.StatusServiceUnavailable, "timeout", err.Error())
	default:
		writeError(w, http.StatusInternalServerError, "internal_error", err.Error())
	}
}

// readJSON decodes a request body strictly.
func readJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(io.LimitReader(r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeError(w, http.StatusBadRequest, "bad_request", "request body: "+err.Error())
		return false
	}
	return true
}

func (n *Node) getUp(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok", "node": n.cfg.Node.Name})
}

func (n *Node) getTypes(w http.ResponseWriter, r *http.Request) {
	types, err := n.jobs.Types(r.Context())
	if err != nil {
		writeJobError(w, err)
		return
	}
	out := []map[string]any{}
	for _, t := range types {
		out = append(out, map[string]any{"name": t.Name, "activity_timeout_ms": t.Timeout.Milliseconds()})
	}
	writeJSON(w, http.StatusOK, map[string]any{"types": out})
}

func (n *Node) getPlugins(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"plugins": n.Plugins()})
}

func (n *Node) getNodes(w http.ResponseWriter, r *http.Request) {
	nodes, err := n.nodes(r.Context())
	if err != nil {
		writeJobError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"nodes": nodes})
}

func (n *Node) listJobs(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	o := jobs.ListOptions{After: q.Get("after"), State: jobs.State(q.Get("state"))}
	switch o.State {
	case "", jobs.Pending, jobs.Running, jobs.Finished:
	default:
		writeError(w, http.StatusBadRequest, "bad_request", fmt.Sprintf("state %q: want pending, running or finished", o.State))
		return
	}
	if l := q.Get("limit"); l != "" {
		v, err := strconv.Atoi(l)
		if err != nil || v < 1 || v > 10_000 {
			writeError(w, http.StatusBadRequest, "bad_request", fmt.Sprintf("limit %q: want 1 to 10000", l))
			return
		}
		o.Limit = v
	}
	// An unknown type gets an error, not an empty list that looks like an
	// idle type.
	if _, err := n.jobs.TypeTimeout(r.Context(), r.PathValue("type")); err != nil {
		writeJobError(w, err)
		return
	}
	infos, next, err := n.jobs.List(r.Context(), r.PathValue("type"), o)
	if err != nil {
		writeJobError(w, err)
		return
	}
	out := make([]JobJSON, len(infos))
	view := n.viewer(r, r.PathValue("type"))
	for i, in := range infos {
		out[i] = view(in)
	}
	writeJSON(w, http.StatusOK, map[string]any{"jobs": out, "next": next})
}

func (n *Node) addJob(w http.ResponseWriter, r *http.Request) {
	var req AddRequest
	if !readJSON(w, r, &req) {
		return
	}
	nj := jobs.NewJob{
		Type: r.PathValue("type"), ID: req.ID, Data: req.Data, Priority: req.Priority,
		Placement: jobs.Placement(req.Placement), Group: req.Group, Exclusive: req.Exclusive,
	}
	if req.At != nil {
		nj.At = *req.At
	}
	if err := n.Admit(r.Context(), &nj); err != nil {
		writeJobError(w, err)
		return
	}
	if err := n.jobs.Add(r.Context(), nj); err != nil {
		writeJobError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, map[string]any{"ok": true, "type": nj.Type, "id": nj.ID})
}

func (n *Node) getJob(w http.ResponseWriter, r *http.Request) {
	in, err := n.jobs.Get(r.Context(), r.PathValue("type"), r.PathValue("id"))
	if err != nil {
		writeJobError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, n.viewer(r, in.Type)(in))
}

func (n *Node) removeJob(w http.ResponseWriter, r *http.Request) {
	if err := n.jobs.Remove(r.Context(), r.PathValue("type"), r.PathValue("id")); err != nil {
		writeJobError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"ok": true})
}

func (n *Node) cancelJob(w http.ResponseWriter, r *http.Request) {
	if err := n.jobs.Cancel(r.Context(), r.PathValue("type"), r.PathValue("id")); err != nil {
		writeJobError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"ok": true})
}

func (n *Node) resubmitJob(w http.ResponseWriter, r *http.Request) {
	var req ResubmitRequest
	if r.ContentLength != 0 && !readJSON(w, r, &req) {
		return
	}
	o := jobs.ResubmitOptions{Priority: req.Priority, Data: req.Data}
	if req.At != nil {
		o.At = *req.At
	}
	if err := n.jobs.Resubmit(r.Context(), r.PathValue("type"), r.PathValue("id"), o); err != nil {
		writeJobError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"ok": true})
}

// waitJob long-polls a job: it answers when the job reaches ?state= (or a
// state it cannot leave); without state, at once if ?since= is absent, or
// at the job's next change after since (the version of the state the
// client saw); or when ?timeout= (default 30s) passes, with "timeout":
// true.
func (n *Node) waitJob(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	timeout := 30 * time.Second
	if t := q.Get("timeout"); t != "" {
		d, err := time.ParseDuration(t)
		if err != nil || d <= 0 || d > maxWait {
			writeError(w, http.StatusBadRequest, "bad_request", fmt.Sprintf("timeout %q: want a duration up to %v", t, maxWait))
			return
		}
		timeout = d
	}
	state := jobs.State(q.Get("state"))
	switch state {
	case "", jobs.Pending, jobs.Running, jobs.Finished:
	default:
		writeError(w, http.StatusBadRequest, "bad_request", fmt.Sprintf("state %q: want pending, running or finished", state))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), timeout)
	defer cancel()
	sub, err := n.jobs.Subscribe(ctx, r.PathValue("type"), r.PathValue("id"))
	if err != nil {
		writeJobError(w, err)
		return
	}
	defer sub.Close()
	ev := sub.Latest()
	since := q.Get("since")
	for {
		if ev.State == jobs.NotFound {
			writeError(w, http.StatusNotFound, "not_found", fmt.Sprintf("job %s/%s", r.PathValue("type"), r.PathValue("id")))
			return
		}
		// Without a state to wait for, a client that has seen nothing yet
		// (no since) gets the current state at once, and one that has seen
		// a version gets the next change after it.
		changed := since == "" || fmt.Sprintf("%x", ev.Info.Version.Bytes()) != since
		if (state != "" && (ev.State == state || ev.State == jobs.Finished)) || (state == "" && (changed || sub.Ended())) {
			break
		}
		if ev, err = sub.Next(ctx); err != nil {
			writeJSON(w, http.StatusOK, map[string]any{"job": n.viewer(r, r.PathValue("type"))(sub.Latest().Info), "version": fmt.Sprintf("%x", sub.Latest().Info.Version.Bytes()), "timeout": true})
			return
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"job": n.viewer(r, r.PathValue("type"))(ev.Info), "version": fmt.Sprintf("%x", ev.Info.Version.Bytes())})
}

// metricsScanLimit bounds the jobs /metrics counts per type, to keep a
// scrape's cost bounded on a large table.
const metricsScanLimit = 100_000

func (n *Node) getMetrics(w http.ResponseWriter, r *http.Request) {
	var b strings.Builder
	types, err := n.jobs.Types(r.Context())
	if err != nil {
		writeJobError(w, err)
		return
	}
	b.WriteString("# HELP couchjobs_jobs Jobs by type and state (counted up to 100000 per type).\n# TYPE couchjobs_jobs gauge\n")
	for _, t := range types {
		counts := map[jobs.State]int{}
		seen := 0
		n.jobs.Fold(r.Context(), t.Name, jobs.ListOptions{Limit: 1000}, func(in jobs.Info) error {
			counts[in.State]++
			if seen++; seen >= metricsScanLimit {
				return errStopFold
			}
			return nil
		})
		for _, s := range []jobs.State{jobs.Pending, jobs.Running, jobs.Finished} {
			fmt.Fprintf(&b, "couchjobs_jobs{type=%q,state=%q} %d\n", t.Name, s, counts[s])
		}
	}
	b.WriteString("# HELP couchjobs_running_jobs Jobs running on this node.\n# TYPE couchjobs_running_jobs gauge\n")
	running := 0
	for _, p := range n.Plugins() {
		running += p.Running
	}
	fmt.Fprintf(&b, "couchjobs_running_jobs{node=%q} %d\n", n.cfg.Node.Name, running)
	b.WriteString("# HELP couchjobs_accepted_jobs_total Jobs this node accepted.\n# TYPE couchjobs_accepted_jobs_total counter\n")
	fmt.Fprintf(&b, "couchjobs_accepted_jobs_total %d\n", n.metrics.accepts.Load())
	b.WriteString("# HELP couchjobs_accept_seconds_total Time spent in accept transactions (not in waiting for jobs).\n# TYPE couchjobs_accept_seconds_total counter\n")
	fmt.Fprintf(&b, "couchjobs_accept_seconds_total %g\n", time.Duration(n.metrics.acceptNanos.Load()).Seconds())
	b.WriteString("# HELP couchjobs_plugin_restarts_total Plugin relaunches after a crash or exit.\n# TYPE couchjobs_plugin_restarts_total counter\n")
	ps := n.Plugins()
	sort.Slice(ps, func(i, j int) bool { return ps[i].Name < ps[j].Name })
	for _, p := range ps {
		fmt.Fprintf(&b, "couchjobs_plugin_restarts_total{plugin=%q} %d\n", p.Name, p.Restarts)
	}
	if groups, err := n.Groups(r.Context()); err == nil {
		for _, m := range []struct {
			name, help string
			value      func(GroupJSON) float64
		}{
			{"couchjobs_group_shares", "Shares of each share group.", func(g GroupJSON) float64 { return float64(g.Shares) }},
			{"couchjobs_group_usage_seconds", "Decayed run time charged to each share group.", func(g GroupJSON) float64 { return g.Usage }},
			{"couchjobs_group_running", "Running jobs of each share group in the cluster.", func(g GroupJSON) float64 { return float64(g.Running) }},
			{"couchjobs_group_pending", "Pending jobs of each share group (counted up to 10000 per group and type).", func(g GroupJSON) float64 { return float64(g.Pending) }},
			{"couchjobs_group_effective_share", "Each share group's fraction of the cluster's usage.", func(g GroupJSON) float64 { return g.EffectiveShare }},
		} {
			fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s gauge\n", m.name, m.help, m.name)
			for _, g := range groups {
				fmt.Fprintf(&b, "%s{group=%q} %g\n", m.name, g.Name, m.value(g))
			}
		}
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	io.WriteString(w, b.String())
}

var errStopFold = errors.New("stop")

// Node registry: every node records itself in the store, so that any
// node's API lists the cluster.

var nodesSub = kv.Sub("nodes")

// NodeJSON is a node as /nodes shows it.
type NodeJSON struct {
	Name      string    `json:"name"`
	Groups    []string  `json:"groups,omitempty"`
	API       string    `json:"api,omitempty"`
	Started   time.Time `json:"started"`
	Heartbeat time.Time `json:"heartbeat"`
	Alive     bool      `json:"alive"`
}

const nodeHeartbeat = 15 * time.Second

// heartbeat records the node every nodeHeartbeat until ctx is done.
func (n *Node) heartbeat(ctx context.Context) {
	started := time.Now().UTC()
	for {
		rec := NodeJSON{Name: n.cfg.Node.Name, Groups: n.cfg.Node.Groups, API: n.APIAddr(), Started: started, Heartbeat: time.Now().UTC()}
		b, _ := json.Marshal(rec)
		if _, err := n.store.Transact(ctx, func(tx kv.Tx) (any, error) {
			tx.Set(nodesSub.Pack([]any{n.cfg.Node.Name}), b)
			return nil, nil
		}); err != nil && ctx.Err() == nil {
			n.log.Warn("recording the node in the store failed", "error", err)
		}
		if kv.Sleep(ctx, nodeHeartbeat) != nil {
			return
		}
	}
}

func (n *Node) nodes(ctx context.Context) ([]NodeJSON, error) {
	v, err := n.store.ReadTransact(ctx, func(tx kv.ReadTx) (any, error) {
		return tx.GetRange(nodesSub.Range(), kv.RangeOptions{})
	})
	if err != nil {
		return nil, err
	}
	out := []NodeJSON{}
	for _, p := range v.([]kv.KeyValue) {
		var rec NodeJSON
		if json.Unmarshal(p.Value, &rec) != nil {
			continue
		}
		rec.Alive = time.Since(rec.Heartbeat) < 3*nodeHeartbeat
		out = append(out, rec)
	}
	return out, nil
}
