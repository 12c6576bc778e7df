package indexing_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strings"
	"testing"

	"github.com/couchjobs/couchjobs/plugins/indexing"
	"github.com/couchjobs/couchjobs/plugins/internal/couch"
	"github.com/couchjobs/couchjobs/plugins/internal/couchtest"
	"github.com/couchjobs/couchjobs/sdk/sdktest"
)

var bg = context.Background()

// node runs the plugin on a node with an API on loopback, indexing the
// databases dbs of server s.
type node struct {
	t   testing.TB
	h   *sdktest.Harness
	api *httptest.Server
}

func startNode(t testing.TB, s *couchtest.Server, cfg map[string]any, dbs ...string) *node {
	t.Helper()
	if cfg == nil {
		cfg = map[string]any{}
	}
	cfg["servers"] = []map[string]any{{"name": "local", "url": s.AdminURL()}}
	var list []map[string]any
	for _, db := range dbs {
		list = append(list, map[string]any{"server": "local", "db": db})
	}
	cfg["databases"] = list
	h := sdktest.NewWith(t, indexing.New(), cfg, sdktest.Options{Admins: map[string]string{"alice": "pw"}})
	api := httptest.NewServer(h.Handler())
	t.Cleanup(api.Close)
	return &node{t: t, h: h, api: api}
}

// get sends a request to base+path and decodes the JSON answer.
func get(t testing.TB, method, base, path, body string) (int, any) {
	t.Helper()
	req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("%s %s: not JSON: %s", method, path, b)
	}
	return resp.StatusCode, out
}

func admin(t testing.TB, s *couchtest.Server) *couch.Client {
	t.Helper()
	c, err := couch.New(s.AdminURL(), couch.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// serverWithDB starts a pouchdb-server with an empty database "db".
func serverWithDB(t testing.TB) (*couchtest.Server, *couch.Client) {
	t.Helper()
	s := couchtest.Start(t)
	c := admin(t, s)
	if err := c.CreateDB(bg, "db", 0); err != nil {
		t.Fatal(err)
	}
	return s, c
}

func put(t testing.TB, c *couch.Client, db, id string, doc any) string {
	t.Helper()
	rev, err := c.Put(bg, db, id, doc)
	if err != nil {
		t.Fatalf("put %s: %v", id, err)
	}
	return rev
}

// designDoc is the test design document: many emits per document, keys
// of every type, and every reduce function.
var designDoc = map[string]any{
	"language": "javascript",
	"views": map[string]any{
		"keys": map[string]any{"map": `function(doc) { if (doc.k !== undefined) emit(doc.k, doc.v === undefined ? null : doc.v); }`},
		"tags": map[string]any{
			"map":    `function(doc) { (doc.tags || []).forEach(function(t, i) { emit([doc.type, t, i], 1); emit([doc.type, t, i], 2); }); }`,
			"reduce": "_count",
		},
		"sum":   map[string]any{"map": `function(doc) { if (typeof doc.n == "number") emit(doc.type, doc.n); }`, "reduce": "_sum"},
		"stats": map[string]any{"map": `function(doc) { if (typeof doc.n == "number") emit([doc.type, doc.n], doc.n); }`, "reduce": "_stats"},
		"js": map[string]any{
			"map":    `function(doc) { if (typeof doc.n == "number") emit(doc.type, doc.n); }`,
			"reduce": `function(keys, values, rereduce) { var m = -Infinity; for (var i = 0; i < values.length; i++) m = Math.max(m, values[i]); return m; }`,
		},
		"distinct": map[string]any{"map": `function(doc) { if (doc.type) emit(doc.type, null); }`, "reduce": "_approx_count_distinct"},
	},
}

// fillViews writes documents with keys of every type.
func fillViews(t testing.TB, c *couch.Client, db string, n int) {
	t.Helper()
	keys := []any{nil, false, true, -3, 0, 1.5, 2, 1e9, "", "a", "abc", "b", "ba", "z9",
		[]any{}, []any{1}, []any{1, "a"}, []any{"a", []any{nil, true}}, map[string]any{}, map[string]any{"a": 1}, map[string]any{"a": 1, "b": []any{2}}}
	types := []string{"red", "green", "blue"}
	for i := 0; i < n; i++ {
		doc := map[string]any{
			"k": keys[i%len(keys)], "v": map[string]any{"i": i},
			"type": types[i%3], "n": i % 7, "tags": []string{"x", "y", "z"}[:i%4],
		}
		put(t, c, db, fmt.Sprintf("doc%03d", i), doc)
	}
}

// compare queries a view on the node and on pouchdb-server and wants the
// same rows, in the same order.
func compare(t *testing.T, n *node, s *couchtest.Server, db, view, query string, meta bool) {
	t.Helper()
	path := fmt.Sprintf("/%s/_design/test/_view/%s?%s", db, view, query)
	st1, ours := get(t, "GET", n.api.URL, path, "")
	st2, theirs := get(t, "GET", s.AdminURL(), path, "")
	if st1 != st2 {
		t.Errorf("%s: status %d, pouchdb-server %d: %v / %v", path, st1, st2, ours, theirs)
		return
	}
	if st1 != 200 {
		return
	}
	o, p := ours.(map[string]any), theirs.(map[string]any)
	if !reflect.DeepEqual(o["rows"], p["rows"]) {
		t.Errorf("%s:\n ours   %v\n theirs %v", path, o["rows"], p["rows"])
	}
	// pouchdb-server's offset counts only skip; ours is CouchDB's (see
	// TestOffsetsAndDocIDs).
	if meta && !reflect.DeepEqual(o["total_rows"], p["total_rows"]) {
		t.Errorf("%s: total_rows %v; pouchdb-server %v", path, o["total_rows"], p["total_rows"])
	}
}

func TestViews(t *testing.T) {
	t.Parallel()
	s, c := serverWithDB(t)
	fillViews(t, c, "db", 60)
	put(t, c, "db", "_design/test", designDoc)
	n := startNode(t, s, nil, "db")

	q := url.QueryEscape
	mapQueries := []string{
		"", "descending=true", "limit=5", "skip=3&limit=4", "descending=true&skip=2&limit=3",
		"key=" + q(`"abc"`), "key=" + q(`[1,"a"]`), "key=" + q(`{"a":1}`), "key=null", "key=false", "key=" + q(`"none"`),
		"startkey=" + q(`"a"`) + "&endkey=" + q(`"b"`),
		"startkey=" + q(`"a"`) + "&endkey=" + q(`"b"`) + "&inclusive_end=false",
		"startkey=" + q(`"b"`) + "&endkey=" + q(`"a"`) + "&descending=true",
		"startkey=" + q(`"b"`) + "&endkey=" + q(`"a"`) + "&descending=true&inclusive_end=false",
		"start_key=1&end_key=" + q(`[]`), "startkey=" + q(`[]`), "endkey=2",
		"keys=" + q(`["b",null,[1],"none",2]`),
		"include_docs=true&limit=3&skip=10",
		"startkey=" + q(`"b"`) + "&endkey=" + q(`"a"`),
		"limit=x",
	}
	for _, query := range mapQueries {
		compare(t, n, s, "db", "keys", query, !strings.Contains(query, "keys="))
	}
	reduceQueries := map[string][]string{
		"tags": {"", "group=true", "group_level=1", "group_level=2", "group_level=2&descending=true", "group_level=1&limit=2", "group_level=2&skip=1&limit=3",
			"reduce=false&limit=7", "startkey=" + q(`["green"]`) + "&endkey=" + q(`["red"]`), "group=true&startkey=" + q(`["green","y"]`),
			"group=true&keys=" + q(`[["red","x",0],["blue","y",1]]`), "group_level=1&keys=" + q(`[["red","x",0]]`)},
		"sum":   {"", "group=true", "key=" + q(`"red"`), "group=true&descending=true"},
		"stats": {"", "group_level=1", "startkey=" + q(`["green",2]`) + "&endkey=" + q(`["red",3]`)},
		"js":    {"", "group=true"},
	}
	for v, queries := range reduceQueries {
		for _, query := range queries {
			compare(t, n, s, "db", v, query, false)
		}
	}

	// _approx_count_distinct is CouchDB's own: exact at this size.
	_, out := get(t, "GET", n.api.URL, "/db/_design/test/_view/distinct", "")
	if rows := out.(map[string]any)["rows"].([]any); len(rows) != 1 || rows[0].(map[string]any)["value"] != 3.0 {
		t.Errorf("approx_count_distinct: %v", out)
	}
	// Errors CouchDB gives too.
	for _, c := range []struct{ path, want string }{
		{"/db/_design/test/_view/keys?reduce=true", "query_parse_error"},
		{"/db/_design/test/_view/tags?include_docs=true", "query_parse_error"},
		{"/db/_design/test/_view/tags?keys=" + q(`[1]`), "query_parse_error"},
		{"/db/_design/test/_view/nope", "not_found"},
		{"/db/_design/nope/_view/x", "not_found"},
		{"/other/_design/test/_view/keys", "not_found"},
		{"/db/_design/test/_view/keys?frobnicate=1", "query_parse_error"},
		// pouchdb-server takes these; CouchDB refuses them.
		{"/db/_design/test/_view/keys?descending=maybe", "query_parse_error"},
		{"/db/_design/test/_view/keys?key=abc", "query_parse_error"},
	} {
		st, out := get(t, "GET", n.api.URL, c.path, "")
		if st < 400 || out.(map[string]any)["error"] != c.want {
			t.Errorf("%s: %d %v; want %s", c.path, st, out, c.want)
		}
	}
	offsetsAndDocIDs(t, n)

	// POST with keys in the body.
	st, out := get(t, "POST", n.api.URL, "/db/_design/test/_view/keys", `{"keys":["b","a"],"limit":2}`)
	st2, theirs := get(t, "POST", s.AdminURL(), "/db/_design/test/_view/keys", `{"keys":["b","a"],"limit":2}`)
	if st != 200 || st2 != 200 || !reflect.DeepEqual(out.(map[string]any)["rows"], theirs.(map[string]any)["rows"]) {
		t.Errorf("POST keys: %d %v / %d %v", st, out, st2, theirs)
	}
}

// offsetsAndDocIDs checks what pouchdb-server does not implement
// (startkey_docid, endkey_docid, CouchDB's offset) against positions in
// the whole view.
func offsetsAndDocIDs(t *testing.T, n *node) {
	t.Helper()
	type row struct {
		ID  string
		Key any
	}
	type result struct {
		Offset int
		Rows   []row
	}
	query := func(query string) result {
		var r result
		st, out := get(t, "GET", n.api.URL, "/db/_design/test/_view/keys?"+query, "")
		b, _ := json.Marshal(out)
		if st != 200 || json.Unmarshal(b, &r) != nil {
			t.Fatalf("%s: %d %v", query, st, out)
		}
		return r
	}
	all := query("").Rows
	at := func(id string) int {
		for i, r := range all {
			if r.ID == id {
				return i
			}
		}
		t.Fatalf("no row of %s", id)
		return -1
	}
	rev := func(rs []row) []row {
		out := make([]row, len(rs))
		for i, r := range rs {
			out[len(rs)-1-i] = r
		}
		return out
	}
	q := url.QueryEscape
	abc31 := at("doc031") // rows with key "abc": doc010, doc031, doc052
	cases := []struct {
		query  string
		offset int
		rows   []row
	}{
		{"startkey=" + q(`"abc"`) + "&startkey_docid=doc031&limit=3", abc31, all[abc31 : abc31+3]},
		{"endkey=" + q(`"abc"`) + "&endkey_docid=doc031", 0, all[:abc31+1]},
		{"endkey=" + q(`"abc"`) + "&endkey_docid=doc031&inclusive_end=false", 0, all[:abc31]},
		{"startkey=" + q(`"abc"`) + "&startkey_docid=doc031&descending=true&limit=4", len(all) - 1 - abc31, rev(all[abc31-3 : abc31+1])},
		{"startkey=" + q(`"abc"`) + "&endkey=" + q(`"abc"`) + "&startkey_docid=doc031&endkey_docid=doc031", abc31, all[abc31 : abc31+1]},
		{"startkey=" + q(`"b"`) + "&skip=2&limit=2", at("doc011") + 2, all[at("doc011")+2 : at("doc011")+4]},
		{"descending=true&skip=5&limit=1", 5, all[len(all)-6 : len(all)-5]},
	}
	for _, c := range cases {
		got := query(c.query)
		if got.Offset != c.offset || !reflect.DeepEqual(got.Rows, c.rows) {
			t.Errorf("%s: offset %d rows %v; want %d %v", c.query, got.Offset, got.Rows, c.offset, c.rows)
		}
	}
}
