package replication_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/couchjobs/couchjobs/plugins/internal/couchtest"
	"github.com/couchjobs/couchjobs/plugins/replication"
)

// run runs one one-shot session of a replication document.
func run(t testing.TB, doc string) (*replication.Result, replication.Stats) {
	t.Helper()
	spec, err := replication.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	r := &replication.Replication{Spec: spec}
	res, err := r.Run(bg)
	if err != nil {
		t.Fatal(err)
	}
	return res, r.Stats()
}

// TestOneShot replicates documents, conflicts, deletions, attachments and
// design documents, leaves _local documents behind, then resumes from its
// checkpoint for the next changes only; with _bulk_get and with open_revs.
func TestOneShot(t *testing.T) {
	t.Parallel()
	s, c := serve(t, "src")
	fill(t, c, "src", "doc", 1200)
	for i := range 20 {
		conflicted(t, c, "src", fmt.Sprint("conflict-", i))
	}
	rev, err := c.Put(bg, "src", "gone", map[string]any{"x": 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(bg, "src", "gone", rev); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(bg, "src", "_design/app", map[string]any{"views": map[string]any{}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(bg, "src", "_local/private", map[string]any{"x": 1}); err != nil {
		t.Fatal(err)
	}
	extra := 0
	for _, bulkGet := range []bool{true, false} {
		tgt := fmt.Sprint("tgt-bulk-get-", bulkGet)
		doc := fmt.Sprintf(`{"source":%q,"target":%q,"create_target":true,"use_bulk_get":%t,"worker_batch_size":100}`, dbURL(s, "src"), dbURL(s, tgt), bulkGet)
		res, st := run(t, doc)
		if !res.OK || res.NoChanges || len(res.History) != 1 {
			t.Fatalf("result %+v", res)
		}
		n := same(t, c, c, "src", tgt)
		if n != 1200+20*3+2+extra {
			t.Errorf("%d leaf revisions", n)
		}
		if st.DocsWritten != int64(n) || st.DocWriteFailures != 0 || st.MissingRevisionsFound != int64(n) {
			t.Errorf("stats %+v", st)
		}
		if hasLocal(t, c, tgt, "_local/private") {
			t.Error("a _local document was replicated")
		}
		// Only the new changes the second time.
		fill(t, c, "src", "more"+tgt, 10)
		extra += 10
		res, st = run(t, doc)
		if st.RevisionsChecked != 10 || st.DocsWritten != 10 || len(res.History) != 2 {
			t.Errorf("resumed: %+v, history %d", st, len(res.History))
		}
		same(t, c, c, "src", tgt)
		res, _ = run(t, doc)
		if !res.NoChanges {
			t.Errorf("nothing new: %+v", res)
		}
	}
}

// TestFiltered replicates with a filter function and its parameters,
// with doc_ids, and with a selector; each also with worker_batch_size 1,
// which reads pouchdb-server's feed in pages of 10 (fewer than the matches,
// with pages that match nothing).
func TestFiltered(t *testing.T) {
	t.Parallel()
	s, c := serve(t, "src")
	colors := []string{"red", "blue", "green"}
	var docs []json.RawMessage
	var blue, green []string
	for i := range 60 {
		id := fmt.Sprintf("d%02d", i)
		docs = append(docs, json.RawMessage(fmt.Sprintf(`{"_id":%q,"color":%q}`, id, colors[i%3])))
		switch i % 3 {
		case 1:
			blue = append(blue, id)
		case 2:
			green = append(green, id)
		}
	}
	// The last 20 changes match no filter.
	for i := range 20 {
		docs = append(docs, json.RawMessage(fmt.Sprintf(`{"_id":"e%02d","color":"none"}`, i)))
	}
	if _, err := c.BulkDocs(bg, "src", docs, true); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(bg, "src", "_design/f", map[string]any{"filters": map[string]string{
		"color": "function(doc, req) { return doc.color === req.query.color; }",
	}}); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, opts string
		want       []string
	}{
		{"filter", `"filter":"f/color","query_params":{"color":"blue"}`, blue},
		{"doc_ids", `"doc_ids":["d03","d05","d47","nope"]`, []string{"d03", "d05", "d47"}},
		{"selector", `"selector":{"color":"green"}`, green},
	}
	for _, tc := range cases {
		for _, batch := range []int{500, 1} {
			tgt := fmt.Sprint("tgt-", tc.name, "-", batch)
			run(t, fmt.Sprintf(`{"source":%q,"target":%q,"create_target":true,"worker_batch_size":%d,%s}`, dbURL(s, "src"), dbURL(s, tgt), batch, tc.opts))
			got := sortedKeys(leaves(t, c, tgt))
			if !slices.Equal(got, tc.want) {
				t.Errorf("%s, worker_batch_size %d: replicated %v, want %v", tc.name, batch, got, tc.want)
			}
		}
	}
}

// TestOneShotEnds: a one-shot replication of a source written faster than
// it is read ends, having copied at least what the source held when it
// began.
func TestOneShotEnds(t *testing.T) {
	t.Parallel()
	s, c := serve(t, "src")
	fill(t, c, "src", "before", 300)
	ctx, stop := context.WithCancel(bg)
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ctx.Err() == nil; i++ {
			var docs []json.RawMessage
			for j := range 20 {
				docs = append(docs, json.RawMessage(fmt.Sprintf(`{"_id":"during-%d-%d"}`, i, j)))
			}
			if _, err := c.BulkDocs(ctx, "src", docs, true); err != nil && ctx.Err() == nil {
				t.Error(err)
				return
			}
		}
	})
	res, _ := run(t, fmt.Sprintf(`{"source":%q,"target":%q,"create_target":true,"worker_batch_size":1}`, dbURL(s, "src"), dbURL(s, "tgt")))
	stop()
	wg.Wait()
	if !res.OK {
		t.Fatalf("result %+v", res)
	}
	got := leaves(t, c, "tgt")
	for i := range 300 {
		if id := fmt.Sprintf("before-%05d", i); got[id] == nil {
			t.Fatalf("%s was not replicated (%d documents were)", id, len(got))
		}
	}
}

// TestReplicationID: the id hashes what CouchDB hashes, and never a
// password.
func TestReplicationID(t *testing.T) {
	t.Parallel()
	id := func(doc, code string) string {
		s, err := replication.Parse([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		return replication.ReplicationID(s, code)
	}
	base := id(`{"source":"http://u:p@h:5984/a","target":"http://h:5984/b"}`, "")
	cases := []struct {
		doc, code string
		same      bool
	}{
		{`{"source":"http://u:other@h:5984/a/","target":"http://h:5984/b","worker_processes":9}`, "", true},
		{`{"source":{"url":"http://h:5984/a","auth":{"basic":{"username":"u","password":"x"}}},"target":"http://h:5984/b"}`, "", true},
		{`{"source":"http://v:p@h:5984/a","target":"http://h:5984/b"}`, "", false},
		{`{"source":"http://u:p@h:5984/a","target":"http://h:5984/c"}`, "", false},
		{`{"source":"http://u:p@h:5984/a","target":"http://h:5984/b","doc_ids":["x"]}`, "", false},
		{`{"source":"http://u:p@h:5984/a","target":"http://h:5984/b","selector":{"x":1}}`, "", false},
		{`{"source":"http://u:p@h:5984/a","target":"http://h:5984/b","since_seq":5}`, "", false},
		{`{"source":"http://u:p@h:5984/a","target":"http://h:5984/b","winning_revs_only":true}`, "", false},
	}
	for _, c := range cases {
		if got := id(c.doc, c.code); (got == base) != c.same {
			t.Errorf("%s: id %s vs %s, want same=%t", c.doc, got, base, c.same)
		}
	}
	f1 := id(`{"source":"http://h/a","target":"http://h/b","filter":"d/f","query_params":{"x":"1"}}`, "function(){return 1}")
	f2 := id(`{"source":"http://h/a","target":"http://h/b","filter":"d/f","query_params":{"x":"1"}}`, "function(){return 2}")
	f3 := id(`{"source":"http://h/a","target":"http://h/b","filter":"d/f","query_params":{"x":"2"}}`, "function(){return 1}")
	if f1 == f2 || f1 == f3 {
		t.Error("the filter's code and parameters are not in the id")
	}
	c := id(`{"source":"http://h/a","target":"http://h/b","continuous":true,"create_target":true}`, "")
	if !strings.HasSuffix(c, "+continuous+create_target") || len(c) != 32+len("+continuous+create_target") {
		t.Errorf("extensions: %s", c)
	}
}

// TestOptions: winning_revs_only, since_seq and use_checkpoints, and a
// source without _bulk_get (behind a proxy that refuses it), which the
// replicator reads with open_revs instead.
func TestOptions(t *testing.T) {
	t.Parallel()
	s, c := serve(t, "src")
	fill(t, c, "src", "d", 10)
	conflicted(t, c, "src", "conflict")
	info, err := c.DBInfo(bg, "src")
	if err != nil {
		t.Fatal(err)
	}
	fill(t, c, "src", "late", 5)

	var openRevs, bulkGets atomic.Int64
	target, _ := url.Parse(s.URL)
	proxy := httputil.NewSingleHostReverseProxy(target)
	old := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/_bulk_get") {
			bulkGets.Add(1)
			http.Error(w, `{"error":"method_not_allowed","reason":"Only GET,HEAD,PUT allowed"}`, http.StatusMethodNotAllowed)
			return
		}
		if r.URL.Query().Has("open_revs") {
			openRevs.Add(1)
		}
		proxy.ServeHTTP(w, r)
	}))
	defer old.Close()
	oldURL := strings.Replace(old.URL, "http://", "http://"+couchtest.Admin+":"+couchtest.Password+"@", 1) + "/src"

	src := dbURL(s, "src")
	cases := []struct {
		name, doc string
		check     func(leaves map[string]map[string]any, st replication.Stats)
	}{
		{"winning_revs_only", fmt.Sprintf(`{"source":%q,"target":%q,"create_target":true,"winning_revs_only":true}`, src, dbURL(s, "winning")),
			func(l map[string]map[string]any, _ replication.Stats) {
				if len(l["conflict"]) != 1 || len(l) != 16 {
					t.Errorf("winning_revs_only: %d documents, conflict has %d leaves", len(l), len(l["conflict"]))
				}
			}},
		{"since_seq", fmt.Sprintf(`{"source":%q,"target":%q,"create_target":true,"since_seq":%s}`, src, dbURL(s, "since"), info.UpdateSeq),
			func(l map[string]map[string]any, _ replication.Stats) {
				if len(l) != 5 || l["late-00000"] == nil {
					t.Errorf("since_seq: %v", sortedKeys(l))
				}
			}},
		{"no checkpoints", fmt.Sprintf(`{"source":%q,"target":%q,"create_target":true,"use_checkpoints":false}`, src, dbURL(s, "nocp")),
			func(l map[string]map[string]any, _ replication.Stats) {
				if len(l) != 16 {
					t.Errorf("no checkpoints: %d documents", len(l))
				}
			}},
		{"no _bulk_get", fmt.Sprintf(`{"source":%q,"target":%q,"create_target":true}`, oldURL, dbURL(s, "old")),
			func(l map[string]map[string]any, st replication.Stats) {
				if bulkGets.Load() != 1 || openRevs.Load() == 0 {
					t.Errorf("_bulk_get tried %d times, open_revs %d", bulkGets.Load(), openRevs.Load())
				}
				same(t, c, c, "src", "old")
			}},
	}
	for _, tc := range cases {
		res, st := run(t, tc.doc)
		if (tc.name == "no checkpoints") != (len(res.History) == 0) {
			t.Errorf("%s: checkpoint history %+v", tc.name, res.History)
		}
		tgt := tc.doc[strings.LastIndex(tc.doc, "/")+1:]
		tgt = tgt[:strings.IndexByte(tgt, '"')]
		tc.check(leaves(t, c, tgt), st)
	}
}
