package sdktest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/couchjobs/couchjobs/sdk"
	"github.com/couchjobs/couchjobs/sdk/sdktest"
)

// TestRoutes: the host forwards its plugins' routes, says who called,
// enforces admin routes, hides private fields from non-admins, and lets
// a plugin page through its jobs.
func TestRoutes(t *testing.T) {
	t.Parallel()
	var host *sdk.Host
	p := &sdk.Plugin{
		Name: "routed",
		Types: []sdk.Type{{
			Name: "routed", PrivateFields: []string{"secret"},
			Worker: sdk.WorkerFunc(func(ctx context.Context, job *sdk.Job) error { return nil }),
		}},
		Configure: func(ctx context.Context, c *sdk.Config) error { host = c.Host; return nil },
		Routes: []sdk.Route{
			{Pattern: "GET /_hello/{name}", Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				c := sdk.RequestCaller(r)
				w.Header().Set("X-Hello", "yes")
				fmt.Fprintf(w, "%s %s user=%q admin=%t auth=%q q=%s", r.Method, r.PathValue("name"), c.User, c.Admin, r.Header.Get("Authorization"), r.URL.Query().Get("q"))
			})},
			{Pattern: "POST /_secret", Admin: true, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				infos, next, err := host.ListJobs(r.Context(), "routed", "", 2, "")
				if err != nil {
					http.Error(w, err.Error(), 500)
					return
				}
				w.WriteHeader(http.StatusCreated)
				fmt.Fprintf(w, "%d next=%s group=%s created=%t", len(infos), next, infos[0].Group, !infos[0].Created.IsZero())
			})},
		},
	}
	h := sdktest.NewWith(t, p, nil, sdktest.Options{Admins: map[string]string{"adm": "pw"}})
	for i := range 3 {
		if err := host.AddJob(context.Background(), sdk.NewJob{Type: "routed", ID: fmt.Sprint("j", i), Group: "g", Data: map[string]any{"secret": "s3cr3t", "open": 1}}); err != nil {
			t.Fatal(err)
		}
	}
	srv := httptest.NewServer(h.Handler())
	defer srv.Close()
	do := func(method, path, user string) (int, string, http.Header) {
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader("{}"))
		if user != "" {
			req.SetBasicAuth(user, "pw")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), resp.Header
	}
	cases := []struct {
		method, path, user string
		status             int
		body               string
	}{
		{"GET", "/_hello/a%2Fb?q=1", "", 200, `GET a/b user="" admin=false auth="" q=1`},
		{"GET", "/_hello/x", "adm", 200, `GET x user="adm" admin=true auth=""`},
		{"GET", "/_hello/x", "intruder", 200, `GET x user="" admin=false`},
		{"POST", "/_hello/x", "", 404, "no endpoint"},
		{"POST", "/_secret", "", 401, "unauthorized"},
		{"POST", "/_secret", "adm", 201, "2 next=j1 group=g created=true"},
		{"GET", "/_nothing", "", 404, "no endpoint GET /_nothing"},
		{"GET", "/jobs/routed/j0", "", 200, `"open":1}`},
		{"GET", "/jobs/routed/j0", "adm", 200, `"secret":"s3cr3t"`},
		{"GET", "/jobs/routed", "", 200, `"open":1}`},
	}
	for _, c := range cases {
		status, body, hdr := do(c.method, c.path, c.user)
		if status != c.status || !strings.Contains(body, c.body) {
			t.Errorf("%s %s as %q: %d %s; want %d with %s", c.method, c.path, c.user, status, body, c.status, c.body)
		}
		if status == 200 && strings.HasPrefix(c.path, "/_hello") && hdr.Get("X-Hello") != "yes" {
			t.Errorf("%s: the plugin's header is lost", c.path)
		}
		if c.user == "" && strings.Contains(body, "s3cr3t") {
			t.Errorf("%s: an anonymous caller sees a private field", c.path)
		}
	}
	var list struct{ Jobs []json.RawMessage }
	_, body, _ := do("GET", "/jobs/routed", "")
	if json.Unmarshal([]byte(body), &list); len(list.Jobs) != 3 {
		t.Fatalf("list: %s", body)
	}
}

func TestBadRoutes(t *testing.T) {
	t.Parallel()
	w := sdk.WorkerFunc(func(ctx context.Context, job *sdk.Job) error { return nil })
	for _, pattern := range []string{"GET /{", "BAD PATTERN HERE"} {
		p := &sdk.Plugin{Name: "x", Types: []sdk.Type{{Name: "x", Worker: w}}, Routes: []sdk.Route{{Pattern: pattern, Handler: http.NotFoundHandler()}}}
		if err := p.Validate(); err == nil || !strings.Contains(err.Error(), "routes") {
			t.Errorf("%q: %v", pattern, err)
		}
	}
	p := &sdk.Plugin{Name: "x", Types: []sdk.Type{{Name: "x", Worker: w}}, Routes: []sdk.Route{{Pattern: "/a", Handler: http.NotFoundHandler()}, {Pattern: "/a", Handler: http.NotFoundHandler()}}}
	if err := p.Validate(); err == nil {
		t.Error("a duplicate route passes")
	}
}

// TestConditions: an update with conditions applies only when they hold,
// a compare-and-set on the plugin's subspace.
func TestConditions(t *testing.T) {
	t.Parallel()
	key := []byte("claim")
	var steps []string
	p := &sdk.Plugin{Name: "cas", Types: []sdk.Type{{Name: "cas", Worker: sdk.WorkerFunc(func(ctx context.Context, job *sdk.Job) error {
		for _, u := range []sdk.Update{
			{If: []sdk.Condition{sdk.Absent(key)}, Writes: []sdk.Write{sdk.Set(key, []byte("a"))}, Data: map[string]int{"step": 1}},
			{If: []sdk.Condition{sdk.Absent(key)}, Writes: []sdk.Write{sdk.Set(key, []byte("x"))}, Data: map[string]int{"step": 2}},
			{If: []sdk.Condition{sdk.Holds(key, []byte("z"))}, Writes: []sdk.Write{sdk.Set(key, []byte("x"))}},
			{If: []sdk.Condition{sdk.Holds(key, []byte("a"))}, Writes: []sdk.Write{sdk.Set(key, []byte("b"))}},
		} {
			err := job.Update(ctx, u)
			switch {
			case err == nil:
				steps = append(steps, "ok")
			case errors.Is(err, sdk.ErrPrecondition):
				steps = append(steps, "refused")
			default:
				return err
			}
		}
		return nil
	})}}}
	h := sdktest.New(t, p, nil)
	res := h.Run("cas", "j", map[string]any{})
	if res.Outcome != sdktest.Completed {
		t.Fatalf("%+v", res)
	}
	if got := strings.Join(steps, " "); got != "ok refused refused ok" {
		t.Errorf("steps: %s", got)
	}
	if v := h.Get(key); string(v) != "b" {
		t.Errorf("the key holds %q", v)
	}
	// The refused update's data did not apply either.
	if !strings.Contains(string(res.Data), `"step":1`) {
		t.Errorf("data %s", res.Data)
	}
}
