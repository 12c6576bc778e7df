package couch_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/couchjobs/couchjobs/plugins/internal/couch"
	"github.com/couchjobs/couchjobs/plugins/internal/couchtest"
)

var ctx = context.Background()

func TestAgainstPouchDBServer(t *testing.T) {
	t.Parallel()
	s := couchtest.Start(t)
	c, err := couch.New(s.AdminURL(), couch.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(c.URL(), couchtest.Password) {
		t.Fatalf("URL() shows the password: %s", c.URL())
	}
	if info, err := c.Server(ctx); err != nil || info.Version == "" {
		t.Fatalf("server: %+v, %v", info, err)
	}
	// Databases, including a name that needs escaping. (pouchdb-server
	// drops a "/" in a database name; CouchDB keeps it, see TestRequests.)
	for _, db := range []string{"plain", "b_c$d(e)+f-g"} {
		if err := c.CreateDB(ctx, db, 1); err != nil {
			t.Fatalf("create %s: %v", db, err)
		}
		if err := c.CreateDB(ctx, db, 1); !errors.Is(err, couch.ErrExists) {
			t.Fatalf("create %s again: %v", db, err)
		}
		if ok, err := c.DBExists(ctx, db); !ok || err != nil {
			t.Fatalf("exists %s: %v %v", db, ok, err)
		}
	}
	dbs, err := c.AllDBs(ctx)
	if err != nil || !slices.Contains(dbs, "b_c$d(e)+f-g") || !slices.Contains(dbs, "_users") {
		t.Fatalf("all dbs %v, %v", dbs, err)
	}
	if err := c.DeleteDB(ctx, "plain"); err != nil {
		t.Fatal(err)
	}
	if ok, err := c.DBExists(ctx, "plain"); ok || err != nil {
		t.Fatalf("deleted db exists: %v %v", ok, err)
	}
	// CouchDB answers 404; pouchdb-server answers ok.
	if err := c.DeleteDB(ctx, "plain"); err != nil && !errors.Is(err, couch.ErrNotFound) {
		t.Fatalf("delete a missing db: %v", err)
	}
	// Documents and security objects.
	rev, err := c.Put(ctx, "b_c$d(e)+f-g", "doc:1", map[string]any{"x": 1})
	if err != nil || rev == "" {
		t.Fatalf("put: %q %v", rev, err)
	}
	var doc struct {
		X   int    `json:"x"`
		Rev string `json:"_rev"`
	}
	if err := c.Get(ctx, "b_c$d(e)+f-g", "doc:1", &doc); err != nil || doc.X != 1 || doc.Rev != rev {
		t.Fatalf("get: %+v %v", doc, err)
	}
	if _, err := c.Put(ctx, "b_c$d(e)+f-g", "doc:1", map[string]any{"x": 2}); !errors.Is(err, couch.ErrConflict) {
		t.Fatalf("put without the rev: %v", err)
	}
	if err := c.Get(ctx, "b_c$d(e)+f-g", "nope", &doc); !errors.Is(err, couch.ErrNotFound) {
		t.Fatalf("get a missing doc: %v", err)
	}
	c.Put(ctx, "b_c$d(e)+f-g", "doc:2", map[string]any{"x": 2})
	rows, err := c.AllDocs(ctx, "b_c$d(e)+f-g", "doc:", "doc:\uffff", true)
	if err != nil || len(rows) != 2 || rows[1].ID != "doc:2" || !strings.Contains(string(rows[1].Doc), `"x":2`) {
		t.Fatalf("all docs %+v, %v", rows, err)
	}
	sec := map[string]any{"admins": map[string]any{"names": []string{"bob"}, "roles": []string{}}, "members": map[string]any{"names": []string{"bob"}, "roles": []string{"staff"}}}
	if err := c.PutSecurity(ctx, "b_c$d(e)+f-g", sec); err != nil {
		t.Fatal(err)
	}
	raw, err := c.Security(ctx, "b_c$d(e)+f-g")
	if err != nil || !strings.Contains(string(raw), `"staff"`) {
		t.Fatalf("security %s, %v", raw, err)
	}
	// Wrong credentials.
	bad := c.WithBasicAuth("admin", "wrong")
	if _, err := bad.AllDBs(ctx); !errors.Is(err, couch.ErrUnauthorized) {
		t.Fatalf("wrong password: %v", err)
	}
}

func TestChanges(t *testing.T) {
	t.Parallel()
	s := couchtest.Start(t)
	c, _ := couch.New(s.AdminURL(), couch.Options{})
	c.CreateDB(ctx, "feed", 0)
	c.Put(ctx, "feed", "a", map[string]any{"n": 1})
	rev, _ := c.Put(ctx, "feed", "b", map[string]any{"n": 2})
	c.Delete(ctx, "feed", "b", rev)
	ch, err := c.Changes(ctx, "feed", couch.ChangesOptions{IncludeDocs: true})
	if err != nil || len(ch.Results) != 2 || len(ch.LastSeq) == 0 {
		t.Fatalf("changes %+v, %v", ch, err)
	}
	if r := ch.Results[1]; r.ID != "b" || !r.Deleted {
		t.Fatalf("deleted doc's change %+v", r)
	}
	if !strings.Contains(string(ch.Results[0].Doc), `"n":1`) {
		t.Fatalf("doc %s", ch.Results[0].Doc)
	}
	// A longpoll from the last sequence returns with the next change.
	got := make(chan *couch.Changes, 1)
	go func() {
		next, err := c.Changes(ctx, "feed", couch.ChangesOptions{Since: ch.LastSeq, Wait: true})
		if err != nil {
			t.Error(err)
		}
		got <- next
	}()
	time.Sleep(300 * time.Millisecond)
	c.Put(ctx, "feed", "c", map[string]any{})
	select {
	case next := <-got:
		if next == nil || len(next.Results) != 1 || next.Results[0].ID != "c" {
			t.Fatalf("longpoll returned %+v", next)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the longpoll did not return with the new change")
	}
	// A canceled longpoll returns at once.
	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := c.Changes(cctx, "feed", couch.ChangesOptions{Since: json.RawMessage(`"now"`), Wait: true}); err == nil || time.Since(start) > 5*time.Second {
		t.Fatalf("canceled longpoll: %v after %v", err, time.Since(start))
	}
}

// The client never asks for gzip (pouchdb-server would buffer feeds), and
// sends the URL's credentials and the configured headers.
func TestRequests(t *testing.T) {
	t.Parallel()
	var seen http.Header
	var path string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen, path = r.Header.Clone(), r.URL.EscapedPath()
		w.Write([]byte(`{}`))
	}))
	defer srv.Close()
	c, err := couch.New(strings.Replace(srv.URL, "http://", "http://u:p@", 1)+"/prefix/", couch.Options{Header: map[string]string{"X-Auth-CouchDB-UserName": "u"}})
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	if err := c.Get(ctx, "db/x", "_design/app", &out); err != nil {
		t.Fatal(err)
	}
	if path != "/prefix/db%2Fx/_design/app" {
		t.Errorf("path %s", path)
	}
	if seen.Get("Accept-Encoding") != "" || seen.Get("X-Auth-Couchdb-Username") != "u" || !strings.HasPrefix(seen.Get("Authorization"), "Basic ") {
		t.Errorf("headers %v", seen)
	}
	for _, bad := range []string{"ftp://x", "http://", "::"} {
		if _, err := couch.New(bad, couch.Options{}); err == nil {
			t.Errorf("New(%q) accepted", bad)
		}
	}
}

// TestOpenRevsMultipart reads CouchDB 3.x's multipart/mixed answer to
// open_revs (pouchdb-server never sends one): a plain JSON part, a
// multipart/related part whose attachment follows the document (one
// gzip-encoded, as att_encoding_info sends it), and a missing revision.
func TestOpenRevsMultipart(t *testing.T) {
	t.Parallel()
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte("zipped text"))
	zw.Close()
	body := "--outer\r\nContent-Type: application/json\r\n\r\n" +
		`{"_id":"d","_rev":"2-b","_revisions":{"start":2,"ids":["b","a"]},"x":1}` +
		"\r\n--outer\r\nContent-Type: multipart/related; boundary=\"inner\"\r\n\r\n" +
		"--inner\r\nContent-Type: application/json\r\n\r\n" +
		`{"_id":"d","_rev":"2-c","_revisions":{"start":2,"ids":["c","a"]},"_attachments":{"f.txt":{"content_type":"text/plain","revpos":2,"digest":"md5-x","length":5,"follows":true},"z.txt":{"content_type":"text/plain","revpos":2,"encoding":"gzip","encoded_length":` + fmt.Sprint(gz.Len()) + `,"length":11,"follows":true}}}` +
		"\r\n--inner\r\nContent-Disposition: attachment; filename=\"f.txt\"\r\n\r\nhello" +
		"\r\n--inner\r\nContent-Disposition: attachment; filename=\"z.txt\"\r\n\r\n" + gz.String() +
		"\r\n--inner--\r\n" +
		"\r\n--outer\r\nContent-Type: application/json; error=\"true\"\r\n\r\n" + `{"missing":"3-z"}` +
		"\r\n--outer--\r\n"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("open_revs") != `["2-b","2-c","3-z"]` || r.URL.Query().Get("latest") != "true" {
			http.Error(w, "bad query "+r.URL.RawQuery, 400)
			return
		}
		w.Header().Set("Content-Type", `multipart/mixed; boundary="outer"`)
		io.WriteString(w, body)
	}))
	defer srv.Close()
	c, _ := couch.New(srv.URL, couch.Options{})
	revs, err := c.OpenRevs(ctx, "db", "d", []string{"2-b", "2-c", "3-z"}, true, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(revs) != 3 || revs[0].Rev != "2-b" || revs[1].Rev != "2-c" || !revs[2].Missing || revs[2].Rev != "3-z" {
		t.Fatalf("revisions %+v", revs)
	}
	var doc struct {
		Atts map[string]struct {
			Data     []byte `json:"data"`
			Follows  bool   `json:"follows"`
			Encoding string `json:"encoding"`
		} `json:"_attachments"`
	}
	if err := json.Unmarshal(revs[1].Doc, &doc); err != nil {
		t.Fatal(err)
	}
	if a := doc.Atts["f.txt"]; string(a.Data) != "hello" || a.Follows {
		t.Errorf("f.txt: %+v", a)
	}
	if a := doc.Atts["z.txt"]; string(a.Data) != "zipped text" || a.Encoding != "" {
		t.Errorf("z.txt: %+v", a)
	}
}
