package replication_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/couchjobs/couchjobs/plugins/internal/couch"
	"github.com/couchjobs/couchjobs/plugins/internal/couchtest"
	"github.com/couchjobs/couchjobs/plugins/replication"
	"github.com/couchjobs/couchjobs/sdk/sdktest"
)

// node runs the plugin on a node with an API on loopback, configured for
// server s.
type node struct {
	t   *testing.T
	h   *sdktest.Harness
	api *httptest.Server
}

func startNode(t *testing.T, s *couchtest.Server, extra ...string) *node {
	t.Helper()
	cfg := map[string]any{"scan_interval": "100ms"}
	for i := 0; i+1 < len(extra); i += 2 {
		cfg[extra[i]] = extra[i+1]
	}
	if s != nil {
		cfg["servers"] = []map[string]any{{"name": "local", "url": s.AdminURL()}}
	}
	h := sdktest.NewWith(t, replication.New(), cfg, sdktest.Options{Admins: map[string]string{"alice": "pw"}})
	api := httptest.NewServer(h.Handler())
	t.Cleanup(api.Close)
	return &node{t: t, h: h, api: api}
}

// call sends a request, as alice unless anonymous, and decodes the JSON
// answer into out (if not nil); it returns the status and the raw body.
func (n *node) call(method, path, body string, anonymous bool, out any) (int, string) {
	n.t.Helper()
	req, _ := http.NewRequest(method, n.api.URL+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if !anonymous {
		req.SetBasicAuth("alice", "pw")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		n.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil {
		json.Unmarshal(b, out)
	}
	return resp.StatusCode, string(b)
}

// eventually polls cond for up to 20 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestTransient(t *testing.T) {
	t.Parallel()
	s, c := serve(t, "src")
	fill(t, c, "src", "d", 50)
	conflicted(t, c, "src", "conflict")
	n := startNode(t, nil)

	// One-shot: the answer is the result.
	var res replication.Result
	status, body := n.call("POST", "/_replicate", fmt.Sprintf(`{"source":%q,"target":%q,"create_target":true}`, dbURL(s, "src"), dbURL(s, "once")), false, &res)
	if status != 200 || !res.OK || len(res.History) != 1 || res.History[0].DocsWritten != 53 {
		t.Fatalf("one-shot: %d %s", status, body)
	}
	same(t, c, c, "src", "once")

	// Continuous: answered once running, delivers new changes at once,
	// shows in the monitoring endpoints, and stops on cancel.
	doc := fmt.Sprintf(`{"source":%q,"target":{"url":%q,"auth":{"basic":{"username":%q,"password":%q}}},"create_target":true,"continuous":true}`,
		dbURL(s, "src"), s.URL+"/live", couchtest.Admin, couchtest.Password)
	var started struct {
		OK      bool   `json:"ok"`
		LocalID string `json:"_local_id"`
	}
	status, body = n.call("POST", "/_replicate", doc, false, &started)
	if status != 202 || !strings.HasSuffix(started.LocalID, "+continuous+create_target") {
		t.Fatalf("continuous: %d %s", status, body)
	}
	eventually(t, "the first documents", func() bool {
		ok, _ := c.DBExists(bg, "live")
		return ok && len(leaves(t, c, "live")) == 51
	})
	at := time.Now()
	if _, err := c.Put(bg, "src", "late", map[string]any{"x": 1}); err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	eventually(t, "the new change", func() bool { return c.Get(bg, "live", "late", &got) == nil })
	if d := time.Since(at); d > time.Second {
		t.Errorf("a change took %v to arrive", d)
	}
	for _, path := range []string{"/_scheduler/jobs", "/_active_tasks", "/_scheduler/jobs/" + started.LocalID, "/jobs/replication"} {
		status, body := n.call("GET", path, "", true, nil)
		if status != 200 || !strings.Contains(body, "/live/") {
			t.Errorf("%s: %d %s", path, status, body)
		}
		if strings.Contains(body, couchtest.Password) {
			t.Errorf("%s shows a password: %s", path, body)
		}
	}
	var jobs struct {
		Jobs []struct {
			ID, User, State string
			Source          string
			Info            replication.Stats
		}
	}
	n.call("GET", "/_scheduler/jobs", "", true, &jobs)
	if len(jobs.Jobs) != 1 || jobs.Jobs[0].User != "alice" || jobs.Jobs[0].State != "running" || !strings.Contains(jobs.Jobs[0].Source, "admin:*****@") {
		t.Errorf("scheduler jobs: %+v", jobs)
	}
	status, body = n.call("POST", "/_replicate", `{"replication_id":"`+started.LocalID+`","cancel":true}`, false, nil)
	if status != 200 {
		t.Fatalf("cancel: %d %s", status, body)
	}
	eventually(t, "the job to go", func() bool {
		n.call("GET", "/_scheduler/jobs", "", true, &jobs)
		return len(jobs.Jobs) == 0
	})
	if status, _ := n.call("POST", "/_replicate", `{"replication_id":"`+started.LocalID+`","cancel":true}`, false, nil); status != 404 {
		t.Errorf("cancel again: %d", status)
	}

	// Bad requests are refused, naming the problem, and store nothing.
	src, tgt := fmt.Sprintf("%q", dbURL(s, "src")), fmt.Sprintf("%q", dbURL(s, "x"))
	bad := []struct{ body, reason string }{
		{`{"target":` + tgt + `}`, "`source` is missing"},
		{`{"source":"http://[::1:5984/db","target":` + tgt + `}`, "`source`: bad URL"},
		{`{"source":"db","target":` + tgt + `}`, "local database names are not supported"},
		{`{"source":"ftp://h/db","target":` + tgt + `}`, "not an http(s) database URL"},
		{`{"source":` + src + `,"target":` + tgt + `,"doc_ids":["a"],"selector":{"a":1}}`, "mutually exclusive"},
		{`{"source":` + src + `,"target":` + tgt + `,"worker_processes":"four"}`, "`worker_processes` must be a positive integer"},
		{`{"source":` + src + `,"target":` + tgt + `,"continuous":"yes"}`, "`continuous` must be a boolean"},
		{`{"source":` + src + `,"target":` + tgt + `,"filter":"nofilter"}`, "design_doc/filter_name"},
		{`[1]`, "JSON object"},
	}
	for _, b := range bad {
		status, body := n.call("POST", "/_replicate", b.body, false, nil)
		if status != 400 || !strings.Contains(body, b.reason) {
			t.Errorf("%s: %d %s; want 400 naming %q", b.body, status, body, b.reason)
		}
	}
	var list struct{ Jobs []json.RawMessage }
	n.call("GET", "/jobs/replication", "", false, &list)
	if len(list.Jobs) != 1 {
		t.Errorf("%d jobs stored, want the one-shot one (the canceled one is gone)", len(list.Jobs))
	}
	if status, _ := n.call("POST", "/_replicate", `{}`, true, nil); status != 401 {
		t.Errorf("anonymous _replicate: %d", status)
	}
	// A one-shot replication that cannot run fails, and says why.
	status, body = n.call("POST", "/_replicate", fmt.Sprintf(`{"source":%q,"target":%q}`, dbURL(s, "missing"), dbURL(s, "x")), false, nil)
	if status != 500 || !strings.Contains(body, "does not exist") {
		t.Errorf("missing source: %d %s", status, body)
	}
}

// TestPersistent runs replications from _replicator documents: they end
// in the document as completed or failed with a reason, show in
// _scheduler/docs, stop when their document goes, and a second document
// of the same replication fails as a collision.
func TestPersistent(t *testing.T) {
	t.Parallel()
	s, c := serve(t, "src")
	fill(t, c, "src", "d", 20)
	n := startNode(t, s)
	eventually(t, "the _replicator database", func() bool { ok, _ := c.DBExists(bg, "_replicator"); return ok })
	docs := map[string]string{
		"once":      fmt.Sprintf(`{"source":%q,"target":%q,"create_target":true}`, dbURL(s, "src"), dbURL(s, "once")),
		"live":      fmt.Sprintf(`{"source":%q,"target":%q,"create_target":true,"continuous":true}`, dbURL(s, "src"), dbURL(s, "live")),
		"nosource":  fmt.Sprintf(`{"target":%q}`, dbURL(s, "x")),
		"exclusive": fmt.Sprintf(`{"source":%q,"target":%q,"doc_ids":["a"],"selector":{"a":1}}`, dbURL(s, "src"), dbURL(s, "x")),
	}
	for id, d := range docs {
		if _, err := c.Put(bg, "_replicator", id, json.RawMessage(d)); err != nil {
			t.Fatal(err)
		}
	}
	type repDoc struct {
		State  string          `json:"_replication_state"`
		Reason string          `json:"_replication_state_reason"`
		Stats  json.RawMessage `json:"_replication_stats"`
	}
	want := map[string]string{"once": "completed", "nosource": "`source` is missing", "exclusive": "mutually exclusive"}
	for id, w := range want {
		var d repDoc
		eventually(t, id+" to end", func() bool { return c.Get(bg, "_replicator", id, &d) == nil && d.State != "" })
		if id == "once" && (d.State != "completed" || !strings.Contains(string(d.Stats), `"docs_written":20`)) ||
			id != "once" && (d.State != "failed" || !strings.Contains(d.Reason, w)) {
			t.Errorf("%s: %+v", id, d)
		}
	}
	same(t, c, c, "src", "once")
	eventually(t, "the continuous one", func() bool {
		ok, _ := c.DBExists(bg, "live")
		return ok && len(leaves(t, c, "live")) == 20
	})

	var sd struct {
		Docs []struct {
			DocID    string `json:"doc_id"`
			State    string `json:"state"`
			Database string `json:"database"`
			Source   string `json:"source"`
			Info     json.RawMessage
		}
	}
	status, body := n.call("GET", "/_scheduler/docs/_replicator", "", true, &sd)
	if status != 200 || len(sd.Docs) != 4 || strings.Contains(body, couchtest.Password) {
		t.Fatalf("_scheduler/docs: %d %s", status, body)
	}
	states := map[string]string{}
	for _, d := range sd.Docs {
		states[d.DocID] = d.State
	}
	if states["once"] != "completed" || states["live"] != "running" || states["nosource"] != "failed" {
		t.Errorf("states %v", states)
	}
	if status, body := n.call("GET", "/_scheduler/docs/_replicator/nosource", "", true, nil); status != 200 || !strings.Contains(body, "source") {
		t.Errorf("one doc: %d %s", status, body)
	}

	// The same replication in a second document collides.
	if _, err := c.Put(bg, "_replicator", "twin", json.RawMessage(docs["live"])); err != nil {
		t.Fatal(err)
	}
	var twin repDoc
	eventually(t, "the twin to fail", func() bool { return c.Get(bg, "_replicator", "twin", &twin) == nil && twin.State != "" })
	if twin.State != "failed" || !strings.Contains(twin.Reason, "collides") {
		t.Errorf("twin: %+v", twin)
	}

	// Deleting the document stops its replication.
	var live struct {
		Rev string `json:"_rev"`
	}
	c.Get(bg, "_replicator", "live", &live)
	if err := c.Delete(bg, "_replicator", "live", live.Rev); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the job to go", func() bool {
		n.call("GET", "/_scheduler/docs/_replicator/live", "", true, nil)
		status, _ := n.call("GET", "/_scheduler/docs/_replicator/live", "", true, nil)
		return status == 404
	})
	if _, err := c.Put(bg, "src", "after", map[string]any{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	var gone map[string]any
	if err := c.Get(bg, "live", "after", &gone); err == nil {
		t.Error("a deleted document's replication still runs")
	}
	_ = couch.ErrNotFound
}

// TestTargetDown: a persistent replication whose target server is down
// crashes, backs off (showing as crashing, with its error), and
// completes once the target is back.
func TestTargetDown(t *testing.T) {
	t.Parallel()
	s, down := couchtest.Start(t), couchtest.Start(t)
	c := admin(t, s)
	for _, db := range []string{"src", "_replicator"} {
		if err := c.CreateDB(bg, db, 0); err != nil {
			t.Fatal(err)
		}
	}
	fill(t, c, "src", "d", 30)
	down.Stop()
	n := startNode(t, s)
	doc := fmt.Sprintf(`{"source":%q,"target":%q,"create_target":true,"retries_per_request":1,"connection_timeout":2000}`, dbURL(s, "src"), dbURL(down, "tgt"))
	if _, err := c.Put(bg, "_replicator", "r", json.RawMessage(doc)); err != nil {
		t.Fatal(err)
	}
	var v struct {
		State      string `json:"state"`
		ErrorCount int    `json:"error_count"`
		Info       struct{ Error string }
	}
	eventually(t, "crashing", func() bool {
		n.call("GET", "/_scheduler/docs/_replicator/r", "", true, &v)
		return v.State == "crashing" && v.ErrorCount >= 2
	})
	if !strings.Contains(v.Info.Error, "connection refused") {
		t.Errorf("crashing without the reason: %+v", v)
	}
	if err := down.Restart(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "completion", func() bool {
		n.call("GET", "/_scheduler/docs/_replicator/r", "", true, &v)
		return v.State == "completed"
	})
	same(t, c, admin(t, down), "src", "tgt")
}

// TestTransientLifetime: a transient job is kept transient_ttl after it
// ends, in its user's share group, then removed; a transient replication
// that collides with a persistent one goes crashing and retries.
func TestTransientLifetime(t *testing.T) {
	t.Parallel()
	s, c := serve(t, "src", "_replicator")
	fill(t, c, "src", "d", 5)
	n := startNode(t, s, "transient_ttl", "1s")
	body := fmt.Sprintf(`{"source":%q,"target":%q,"create_target":true}`, dbURL(s, "src"), dbURL(s, "once"))
	if status, b := n.call("POST", "/_replicate", body, false, nil); status != 200 {
		t.Fatalf("%d %s", status, b)
	}
	var list struct {
		Jobs []struct{ ID, Group, State string }
	}
	n.call("GET", "/jobs/replication", "", false, &list)
	if len(list.Jobs) != 1 || list.Jobs[0].Group != "alice" || list.Jobs[0].State != "finished" {
		t.Fatalf("after the run: %+v", list)
	}
	eventually(t, "the job to expire", func() bool {
		list.Jobs = nil
		n.call("GET", "/jobs/replication", "", false, &list)
		return len(list.Jobs) == 0
	})

	// Collision: the persistent replication runs; the same one posted
	// goes crashing, its reason naming the other job.
	live := fmt.Sprintf(`{"source":%q,"target":%q,"create_target":true,"continuous":true}`, dbURL(s, "src"), dbURL(s, "live"))
	if _, err := c.Put(bg, "_replicator", "live", json.RawMessage(live)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the persistent one to run with its claim", func() bool {
		var v struct {
			State string
			ID    *string `json:"id"`
		}
		n.call("GET", "/_scheduler/docs/_replicator/live", "", true, &v)
		return v.State == "running" && v.ID != nil
	})
	var started struct {
		JobID string `json:"job_id"`
	}
	if status, b := n.call("POST", "/_replicate", live, false, &started); status != 202 {
		t.Fatalf("%d %s", status, b)
	}
	eventually(t, "crashing", func() bool {
		var j struct {
			Data struct {
				Meta struct {
					Crashes int
					Reason  string
				} `json:"_couchjobs"`
			}
		}
		n.call("GET", "/jobs/replication/"+started.JobID, "", false, &j)
		return j.Data.Meta.Crashes >= 2 && strings.Contains(j.Data.Meta.Reason, "collides with persistent job doc:local:_replicator:live")
	})
}
