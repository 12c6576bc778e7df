package host

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/couchjobs/couchjobs/runtime/jobs"
)

type apiClient struct {
	t    *testing.T
	base string
}

func (n *testNode) api(t *testing.T) *apiClient {
	waitFor(t, 10*time.Second, "the API to listen", func() bool { return n.APIAddr() != "" })
	return &apiClient{t: t, base: "http://" + n.APIAddr()}
}

// do sends a request, as the admin if admin is set, and decodes the
// response into a map.
func (c *apiClient) do(method, path, body string, admin bool) (int, map[string]any) {
	c.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, _ := http.NewRequest(method, c.base+path, rd)
	if admin {
		req.SetBasicAuth("admin", "secret")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		if err := json.Unmarshal(b, &out); err != nil {
			c.t.Fatalf("%s %s: %v: %s", method, path, err, b)
		}
	} else {
		out = map[string]any{"text": string(b)}
	}
	return resp.StatusCode, out
}

func TestAPI(t *testing.T) {
	t.Parallel()
	n := startNode(t, "[plugins.alpha]\n")
	n.waitRunning(t, "alpha")
	c := n.api(t)

	if code, body := c.do("GET", "/_up", "", false); code != 200 || body["status"] != "ok" {
		t.Fatalf("/_up: %d %v", code, body)
	}
	// Mutations need an admin.
	code, body := c.do("POST", "/jobs/alpha", `{"id":"a1"}`, false)
	if code != 401 || body["error"] != "unauthorized" {
		t.Fatalf("unauthenticated add: %d %v", code, body)
	}
	req, _ := http.NewRequest("POST", c.base+"/jobs/alpha", strings.NewReader(`{"id":"a1"}`))
	req.SetBasicAuth("admin", "wrong")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 401 {
		t.Fatalf("wrong password: %v %v", resp.StatusCode, err)
	}
	if code, body := c.do("POST", "/jobs/alpha", `{"id":"a1","data":{"updates":1}}`, true); code != 201 {
		t.Fatalf("add: %d %v", code, body)
	}
	// Wait until it finishes, by long-poll.
	code, body = c.do("GET", "/jobs/alpha/a1/_wait?state=finished&timeout=20s", "", false)
	job, _ := body["job"].(map[string]any)
	if code != 200 || job["state"] != "finished" {
		t.Fatalf("wait: %d %v", code, body)
	}
	if code, body := c.do("GET", "/jobs/alpha/a1", "", false); code != 200 || body["state"] != "finished" {
		t.Fatalf("get: %d %v", code, body)
	}
	// Bad requests get CouchDB's error shape, naming the problem.
	bad := []struct {
		method, path, body string
		code               int
		errName, text      string
	}{
		{"POST", "/jobs/alpha", `{"id":"x","bogus":1}`, 400, "bad_request", `unknown field "bogus"`},
		{"POST", "/jobs/alpha", `{"id":"x","data":[1]}`, 400, "bad_request", "not a JSON object"},
		{"POST", "/jobs/alpha", `{"id":""}`, 400, "bad_request", "empty job id"},
		{"POST", "/jobs/nope", `{"id":"x"}`, 404, "unknown_type", `"nope"`},
		{"GET", "/jobs/alpha/missing", "", 404, "not_found", "missing"},
		{"GET", "/jobs/alpha?state=sleeping", "", 400, "bad_request", `state "sleeping"`},
		{"GET", "/jobs/alpha?limit=0", "", 400, "bad_request", "limit"},
		{"GET", "/jobs/nope", "", 404, "unknown_type", `"nope"`},
		{"GET", "/jobs/alpha/a1/_wait?timeout=forever", "", 400, "bad_request", "timeout"},
		{"GET", "/nothing/here", "", 404, "not_found", "no endpoint"},
	}
	for _, b := range bad {
		code, body := c.do(b.method, b.path, b.body, true)
		reason, _ := body["reason"].(string)
		if code != b.code || body["error"] != b.errName || !strings.Contains(reason, b.text) {
			t.Errorf("%s %s: %d %v, want %d %s containing %q", b.method, b.path, code, body, b.code, b.errName, b.text)
		}
	}
	// Cancel, resubmit, remove, list.
	c.do("POST", "/jobs/alpha", `{"id":"later","at":"2100-01-01T00:00:00Z"}`, true)
	if code, body := c.do("POST", "/jobs/alpha/later/_cancel", "", true); code != 200 {
		t.Fatalf("cancel: %d %v", code, body)
	}
	if _, body := c.do("GET", "/jobs/alpha/later", "", false); body["state"] != "finished" || body["canceled"] != true {
		t.Fatalf("canceled job: %v", body)
	}
	if code, body := c.do("POST", "/jobs/alpha/later/_resubmit", `{"at":"2100-01-01T00:00:00Z"}`, true); code != 200 {
		t.Fatalf("resubmit: %d %v", code, body)
	}
	if _, body := c.do("GET", "/jobs/alpha?state=pending", "", false); len(body["jobs"].([]any)) != 1 {
		t.Fatalf("pending list: %v", body)
	}
	if code, _ := c.do("DELETE", "/jobs/alpha/later", "", true); code != 200 {
		t.Fatalf("remove: %d", code)
	}
	if code, _ := c.do("GET", "/jobs/alpha/later", "", false); code != 404 {
		t.Fatalf("removed job: %d", code)
	}
	_, body = c.do("GET", "/jobs/alpha?limit=1", "", false)
	if len(body["jobs"].([]any)) != 1 {
		t.Fatalf("limited list: %v", body)
	}
	// Types, plugins, nodes, metrics.
	if _, body := c.do("GET", "/types", "", false); !bytes.Contains(mustJSON(body), []byte(`"name":"alpha"`)) {
		t.Errorf("types: %v", body)
	}
	if _, body := c.do("GET", "/plugins", "", false); !bytes.Contains(mustJSON(body), []byte(`"state":"running"`)) {
		t.Errorf("plugins: %v", body)
	}
	waitFor(t, 10*time.Second, "the node to register", func() bool {
		_, body := c.do("GET", "/nodes", "", false)
		return bytes.Contains(mustJSON(body), []byte(`"name":"n1"`))
	})
	_, body = c.do("GET", "/metrics", "", false)
	text := body["text"].(string)
	for _, want := range []string{`couchjobs_jobs{type="alpha",state="finished"} 1`, "couchjobs_running_jobs", `couchjobs_plugin_restarts_total{plugin="alpha"} 0`, "couchjobs_accepted_jobs_total 1"} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %q:\n%s", want, text)
		}
	}
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

// TestAdmission adds jobs of a type that checks them at add time: a
// refused job is not stored, an admitted one goes where the plugin placed
// it, and a node without the plugin refuses the type's jobs instead of
// storing them unchecked.
func TestAdmission(t *testing.T) {
	t.Parallel()
	store := filepath.Join(t.TempDir(), "store.db")
	n := startNodeOn(t, store, "n1", "[plugins.gatekeeper]\nactivity_timeout = \"900ms\"\n")
	n.waitRunning(t, "gatekeeper")
	c := n.api(t)
	if d, err := n.Jobs().TypeTimeout(context.Background(), "gatekeeper"); err != nil || d != 900*time.Millisecond {
		t.Fatalf("activity timeout %v, %v; runtime.toml says 900ms", d, err)
	}
	code, body := c.do("POST", "/jobs/gatekeeper", `{"id":"no","data":{"refuse":"widgets must be blue"}}`, true)
	if code != 400 || !strings.Contains(fmt.Sprint(body["reason"]), "gatekeeper/no: widgets must be blue") {
		t.Fatalf("refused add: %d %v", code, body)
	}
	if code, _ := c.do("GET", "/jobs/gatekeeper/no", "", false); code != 404 {
		t.Fatalf("a refused job was stored: %d", code)
	}
	// Placed on this node, the job runs here and then moves itself on.
	code, body = c.do("POST", "/jobs/gatekeeper", `{"id":"yes","data":{"place":"node:n1","move_to":"nodes:x,y"}}`, true)
	if code != 201 {
		t.Fatalf("admitted add: %d %v", code, body)
	}
	waitFor(t, 20*time.Second, "the job to move on", func() bool {
		in := n.get(t, "gatekeeper", "yes")
		return in.State == jobs.Pending && in.Placement == "nodes:x,y"
	})
	other := startNodeOn(t, store, "n2", "")
	code, body = other.api(t).do("POST", "/jobs/gatekeeper", `{"id":"unchecked","data":{}}`, true)
	if code != 503 || !strings.Contains(fmt.Sprint(body["reason"]), "needs plugin gatekeeper, which node n2 does not run") {
		t.Fatalf("add through a node without the plugin: %d %v", code, body)
	}
}

// TestShares runs jobs of a share group and checks that the node's
// accounting reaches GET /shares and /metrics, that shares are set and
// reset through the API (admins only, 1 to 1000), and that runtime.toml
// seeds them.
func TestShares(t *testing.T) {
	t.Parallel()
	// The extra lines continue the test node's [scheduler] table.
	n := startNode(t, "interval = \"100ms\"\n[scheduler.shares]\nseeded = 300\n[plugins.alpha]\n")
	n.waitRunning(t, "alpha")
	c := n.api(t)
	for i := range 3 {
		if code, body := c.do("POST", "/jobs/alpha", fmt.Sprintf(`{"id":"s%d","group":"g1","data":{"sleep_ms":3000}}`, i), true); code != 201 {
			t.Fatalf("add: %d %v", code, body)
		}
	}
	// g2's job is not due: it does not count as waiting.
	c.do("POST", "/jobs/alpha", `{"id":"later","group":"g2","at":"2099-01-01T00:00:00Z"}`, true)
	// g3's job waits for a plugin no node runs: it counts.
	n.Jobs().SetTypeTimeout(context.Background(), "nobody", time.Minute)
	n.Jobs().Add(context.Background(), jobs.NewJob{Type: "nobody", ID: "w", Group: "g3"})
	group := func(name string) map[string]any {
		_, body := c.do("GET", "/shares", "", false)
		for _, g := range body["groups"].([]any) {
			if g := g.(map[string]any); g["group"] == name {
				return g
			}
		}
		return nil
	}
	waitFor(t, 10*time.Second, "g1's running jobs and usage to be published", func() bool {
		g := group("g1")
		return g != nil && g["running"] == 3.0 && g["usage"].(float64) > 0.1
	})
	if g := group("seeded"); g == nil || g["shares"] != 300.0 {
		t.Fatalf("seeded group: %v", g)
	}
	// 3 running jobs shared by g1 (3 wanted) and g3 (1 wanted): 2 and 1.
	if g := group("g1"); g["shares"] != 100.0 || g["effective_share"] != 1.0 || g["target"] != 2.0 {
		t.Fatalf("g1: %v", g)
	}
	if g := group("g3"); g["pending"] != 1.0 || g["target"] != 1.0 {
		t.Fatalf("g3: %v", g)
	}
	if g := group("g2"); g != nil {
		t.Fatalf("g2, with only a job due in 2099: %v", g)
	}
	if code, _ := c.do("PUT", "/shares/g1", `{"shares":250}`, false); code != 401 {
		t.Fatalf("unauthenticated shares change: %d", code)
	}
	for _, bad := range []string{`{"shares":0}`, `{"shares":1001}`, `{"shares":"many"}`, `{"share":5}`} {
		if code, body := c.do("PUT", "/shares/g1", bad, true); code != 400 {
			t.Errorf("PUT %s: %d %v", bad, code, body)
		}
	}
	if code, body := c.do("PUT", "/shares/g1", `{"shares":250}`, true); code != 200 || body["shares"] != 250.0 {
		t.Fatalf("set shares: %d %v", code, body)
	}
	if g := group("g1"); g["shares"] != 250.0 {
		t.Fatalf("after the change: %v", g)
	}
	resp, err := http.Get(c.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`couchjobs_group_shares{group="g1"} 250`, `couchjobs_group_running{group="g1"} 3`, `couchjobs_group_pending{group="g3"} 1`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if code, _ := c.do("DELETE", "/shares/g1", "", true); code != 200 {
		t.Fatalf("reset: %d", code)
	}
	if g := group("g1"); g["shares"] != 100.0 {
		t.Fatalf("after the reset: %v", g)
	}
}
