package indexing_test

import (
	"encoding/json"
	"fmt"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/couchjobs/couchjobs/plugins/indexing"
	"github.com/couchjobs/couchjobs/plugins/internal/couch"
	"github.com/couchjobs/couchjobs/runtime/jobs"
)

// eventually polls cond for up to 30 s.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ids lists the document ids of a view's rows.
func ids(t testing.TB, n *node, path string) []string {
	t.Helper()
	st, out := get(t, "GET", n.api.URL, path, "")
	if st != 200 {
		t.Fatalf("%s: %d %v", path, st, out)
	}
	var list []string
	for _, r := range out.(map[string]any)["rows"].([]any) {
		list = append(list, r.(map[string]any)["id"].(string))
	}
	return list
}

func bulk(t testing.TB, c *couch.Client, db string, newEdits bool, docs ...string) {
	t.Helper()
	raw := make([]json.RawMessage, len(docs))
	for i, d := range docs {
		raw[i] = json.RawMessage(d)
	}
	if bad, err := c.BulkDocs(bg, db, raw, newEdits); err != nil || len(bad) > 0 {
		t.Fatalf("bulk: %v %v", bad, err)
	}
}

// TestIncremental changes, deletes and conflicts documents under a built
// index, in each update mode, and compares with pouchdb-server.
func TestIncremental(t *testing.T) {
	t.Parallel()
	s, c := serverWithDB(t)
	fillViews(t, c, "db", 30)
	put(t, c, "db", "_design/test", designDoc)
	n := startNode(t, s, nil, "db")
	all := "/db/_design/test/_view/keys"
	compare(t, n, s, "db", "keys", "", true)
	// The query asked for another run of the build; let it end, so that
	// nothing builds until a query asks.
	idle(t, n)

	// update=false answers from the index as it is; lazy too, and starts
	// a build; true waits for it.
	var doc map[string]any
	if err := c.Get(bg, "db", "doc001", &doc); err != nil {
		t.Fatal(err)
	}
	doc["k"] = "changed"
	put(t, c, "db", "doc001", doc)
	if err := c.Get(bg, "db", "doc002", &doc); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(bg, "db", "doc002", doc["_rev"].(string)); err != nil {
		t.Fatal(err)
	}
	put(t, c, "db", "new", map[string]any{"k": "new", "type": "red", "n": 100, "tags": []string{"x"}})
	// A conflicted document is indexed by its winner (the higher
	// revision), a deleted branch not at all.
	bulk(t, c, "db", false,
		`{"_id":"conflict","_rev":"2-aaa","_revisions":{"start":2,"ids":["aaa","root"]},"k":"loser","type":"blue","n":1}`,
		`{"_id":"conflict","_rev":"2-bbb","_revisions":{"start":2,"ids":["bbb","root"]},"k":"winner","type":"blue","n":2}`,
		`{"_id":"conflict","_rev":"3-ccc","_revisions":{"start":3,"ids":["ccc","ddd","root"]},"_deleted":true,"k":"deleted"}`)
	stale := ids(t, n, all+"?update=false")
	if len(stale) != 30 || !contains(stale, "doc002") || contains(stale, "new") {
		t.Fatalf("update=false saw the changes: %v", stale)
	}
	if lazy := ids(t, n, all+"?update=lazy"); !reflect.DeepEqual(lazy, stale) {
		t.Errorf("update=lazy did not answer at once: %v", lazy)
	}
	eventually(t, "the lazy build", func() bool { return contains(ids(t, n, all+"?update=false"), "new") })
	for _, v := range []string{"keys", "tags", "sum", "stats", "js"} {
		compare(t, n, s, "db", v, "", v == "keys")
		compare(t, n, s, "db", v, "reduce=false", false)
	}
	got := ids(t, n, all+"?key="+url.QueryEscape(`"winner"`))
	if !reflect.DeepEqual(got, []string{"conflict"}) || len(ids(t, n, all+"?key="+url.QueryEscape(`"loser"`))) != 0 {
		t.Errorf("conflict: %v", got)
	}
	// update=true (the default) waits for the change just made.
	put(t, c, "db", "newer", map[string]any{"k": "newer"})
	if got := ids(t, n, all+"?key="+url.QueryEscape(`"newer"`)); !reflect.DeepEqual(got, []string{"newer"}) {
		t.Errorf("update=true missed a change: %v", got)
	}
	compare(t, n, s, "db", "tags", "group_level=2", false)

	// A map function that throws on a document skips it, and counts it.
	put(t, c, "db", "_design/throws", map[string]any{"views": map[string]any{"v": map[string]any{
		"map": `function(doc) { if (doc.k === "abc") throw new Error("no abc"); emit(doc._id, null); }`}}})
	got = ids(t, n, "/db/_design/throws/_view/v")
	if len(got) == 0 || contains(got, "doc010") || !contains(got, "doc011") {
		t.Errorf("throwing map: %v", got)
	}

	// Unicode: ICU's order, not the bytes' (pouchdb-server orders by code
	// unit, so this is checked against CouchDB's documented order).
	order := []string{"a", "A", "aa", "b", "B", "ba", "bb", "e", "é", "f", "ﬀ", "g"}
	for i, k := range []int{5, 0, 11, 3, 9, 1, 7, 2, 10, 4, 6, 8} {
		put(t, c, "db", fmt.Sprintf("u%02d", i), map[string]any{"u": order[k]})
	}
	put(t, c, "db", "_design/unicode", map[string]any{"views": map[string]any{"v": map[string]any{
		"map": `function(doc) { if (doc.u) emit(doc.u, null); }`}}})
	st, out := get(t, "GET", n.api.URL, "/db/_design/unicode/_view/v", "")
	var keys []string
	for _, r := range out.(map[string]any)["rows"].([]any) {
		keys = append(keys, r.(map[string]any)["key"].(string))
	}
	if st != 200 || !reflect.DeepEqual(keys, order) {
		t.Errorf("unicode order: %d %q; want %q", st, keys, order)
	}
}

// idle waits until no index job is pending or running.
func idle(t testing.TB, n *node) {
	t.Helper()
	eventually(t, "the builds to end", func() bool {
		list, _, err := n.h.Jobs().List(bg, indexing.TypeIndex, jobs.ListOptions{})
		if err != nil {
			return false
		}
		for _, j := range list {
			if j.State != jobs.Finished {
				return false
			}
		}
		return true
	})
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestDesignChanges changes a design document in the middle of a build,
// then removes it: queries follow the document, and the old indexes are
// deleted once the query timeout has passed.
func TestDesignChanges(t *testing.T) {
	t.Parallel()
	s, c := serverWithDB(t)
	var docs []string
	for i := range 3000 {
		docs = append(docs, fmt.Sprintf(`{"_id":"d%05d","n":%d}`, i, i))
	}
	bulk(t, c, "db", true, docs...)
	n := startNode(t, s, map[string]any{"batch_docs": 100, "query_timeout": "2s"}, "db")
	v1 := map[string]any{"views": map[string]any{"v": map[string]any{"map": `function(doc) { emit(doc.n, 1); }`, "reduce": "_sum"}}}
	rev := put(t, c, "db", "_design/d", v1)
	// The watcher starts a build; change the document while it runs.
	var info indexing.IndexData
	eventually(t, "the first build to start", func() bool {
		list, _, err := n.h.Jobs().List(bg, indexing.TypeIndex, jobs.ListOptions{})
		if err != nil || len(list) == 0 {
			return false
		}
		json.Unmarshal(list[0].Data, &info)
		return info.ChangesDone > 0
	})
	if info.ChangesDone >= 3000 {
		t.Logf("the first build ended before the change (%d changes)", info.ChangesDone)
	}
	v1["_rev"] = rev
	v1["views"] = map[string]any{"v": map[string]any{"map": `function(doc) { emit(doc.n % 10, 2); }`, "reduce": "_sum"}}
	rev = put(t, c, "db", "_design/d", v1)
	// A query waits for the new index up to the (short) query timeout;
	// on a loaded machine it may take a few.
	want := `{"rows":[{"key":0,"value":600},{"key":1,"value":600}]}`
	var last string
	eventually(t, "a query of the new index", func() bool {
		st, out := get(t, "GET", n.api.URL, "/db/_design/d/_view/v?group=true&limit=2", "")
		b, _ := json.Marshal(out)
		last = fmt.Sprint(st, " ", string(b))
		if st != 200 && st != 504 {
			t.Fatalf("after the change: %s", last)
		}
		return st == 200
	})
	if last != "200 "+want {
		t.Errorf("after the change: %s; want %s", last, want)
	}
	old := info.Design.Sig
	eventually(t, "the old index to be deleted", func() bool {
		_, err := n.h.Jobs().Get(bg, indexing.TypeIndex, "local:db:"+old)
		return err != nil && n.h.Get(indexing.MarkerKey("local", "db", old)) == nil
	})
	// Removing the design document removes its index.
	_, out := get(t, "GET", n.api.URL, "/db/_design/d/_view/v", "")
	if b, _ := json.Marshal(out); !strings.Contains(string(b), `"value":6000`) {
		t.Errorf("reduce: %s", b)
	}
	var cur map[string]any
	c.Get(bg, "db", "_design/d", &cur)
	sig := ""
	eventually(t, "the new index's record", func() bool {
		list, _, _ := n.h.Jobs().List(bg, indexing.TypeIndex, jobs.ListOptions{})
		for _, j := range list {
			var d indexing.IndexData
			json.Unmarshal(j.Data, &d)
			if d.Design.Rev == rev {
				sig = d.Design.Sig
			}
		}
		return sig != ""
	})
	if err := c.Delete(bg, "db", "_design/d", rev); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the removed document's index to be deleted", func() bool {
		return n.h.Get(indexing.MarkerKey("local", "db", sig)) == nil
	})
	if st, out := get(t, "GET", n.api.URL, "/db/_design/d/_view/v", ""); st != 404 {
		t.Errorf("removed: %d %v", st, out)
	}
}

// TestRunaway: a map function that never returns, emits without end or
// allocates without end stops its index with an error that queries show;
// other design documents go on.
func TestRunaway(t *testing.T) {
	t.Parallel()
	s, c := serverWithDB(t)
	put(t, c, "db", "a", map[string]any{"n": 1})
	put(t, c, "db", "_design/loop", map[string]any{"views": map[string]any{"v": map[string]any{"map": `function(doc) { while (true) {} }`}}})
	put(t, c, "db", "_design/big", map[string]any{"views": map[string]any{"v": map[string]any{"map": `function(doc) { var s = new Array(10000).join("x"); for (;;) emit(1, s); }`}}})
	put(t, c, "db", "_design/hog", map[string]any{"views": map[string]any{"v": map[string]any{"map": `function(doc) { var s = "x"; for (;;) s += s; }`}}})
	put(t, c, "db", "_design/ok", map[string]any{"views": map[string]any{"v": map[string]any{"map": `function(doc) { emit(doc.n, null); }`}}})
	// The time limit leaves the other two ample time to pass theirs on a
	// loaded machine.
	n := startNode(t, s, map[string]any{"map_timeout": "3s", "max_emit_bytes": 100000, "max_map_memory": 32 << 20}, "db")
	for path, want := range map[string]string{"/db/_design/loop/_view/v": "ran too long", "/db/_design/big/_view/v": "emitted too much", "/db/_design/hog/_view/v": "used too much memory"} {
		st, out := get(t, "GET", n.api.URL, path, "")
		if b, _ := json.Marshal(out); st != 500 || !strings.Contains(string(b), "index_error") || !strings.Contains(string(b), want) {
			t.Errorf("%s: %d %s", path, st, b)
		}
	}
	if got := ids(t, n, "/db/_design/ok/_view/v"); !reflect.DeepEqual(got, []string{"a"}) {
		t.Errorf("ok: %v", got)
	}
}

var jobsListAll = jobs.ListOptions{}

// TestLargeBatches: a batch whose rows would not fit one store
// transaction commits in parts, and a document whose rows alone would not
// is skipped as a map error.
func TestLargeBatches(t *testing.T) {
	t.Parallel()
	s, c := serverWithDB(t)
	var docs []string
	for i := range 400 {
		docs = append(docs, fmt.Sprintf(`{"_id":"d%03d","rows":3,"size":10000}`, i))
	}
	docs = append(docs, `{"_id":"huge","rows":200,"size":50000}`)
	bulk(t, c, "db", true, docs...)
	put(t, c, "db", "_design/big", map[string]any{"views": map[string]any{"v": map[string]any{
		"map":    `function(doc) { var pad = new Array(doc.size).join("x"); for (var i = 0; i < doc.rows; i++) emit([doc._id, i], pad); }`,
		"reduce": "_count"}}})
	n := startNode(t, s, map[string]any{"batch_docs": 1000, "batch_bytes": 1 << 30, "batch_time": "1m", "max_emit_bytes": 64 << 20, "map_timeout": "2m", "query_timeout": "5m"}, "db")
	st, out := get(t, "GET", n.api.URL, "/db/_design/big/_view/v", "")
	if b, _ := json.Marshal(out); st != 200 || string(b) != `{"rows":[{"key":null,"value":1200}]}` {
		t.Fatalf("count: %d %s", st, b)
	}
	list, _, err := n.h.Jobs().List(bg, indexing.TypeIndex, jobs.ListOptions{})
	if err != nil || len(list) != 1 {
		t.Fatal(list, err)
	}
	var d indexing.IndexData
	json.Unmarshal(list[0].Data, &d)
	if d.MapErrors != 1 || !strings.Contains(d.LastMapError, `"huge"`) {
		t.Errorf("map errors %d: %s", d.MapErrors, d.LastMapError)
	}
}

// TestActiveTasks: a running build shows in _active_tasks with its
// progress, as CouchDB's indexer tasks do.
func TestActiveTasks(t *testing.T) {
	t.Parallel()
	s, c := serverWithDB(t)
	var docs []string
	for i := range 1000 {
		docs = append(docs, fmt.Sprintf(`{"_id":"d%04d"}`, i))
	}
	bulk(t, c, "db", true, docs...)
	// A slow map function (5 ms a document) keeps the build running.
	put(t, c, "db", "_design/slow", map[string]any{"views": map[string]any{"v": map[string]any{
		"map": `function(doc) { var t = Date.now(); while (Date.now() - t < 5) {} emit(doc._id, null); }`}}})
	n := startNode(t, s, map[string]any{"batch_docs": 50}, "db")
	var task map[string]any
	eventually(t, "an indexer task with progress", func() bool {
		_, out := get(t, "GET", n.api.URL, "/_active_tasks", "")
		for _, x := range out.([]any) {
			if m := x.(map[string]any); m["type"] == "indexer" && m["changes_done"].(float64) > 0 {
				task = m
				return true
			}
		}
		return false
	})
	if task["database"] != "db" || task["design_document"] != "_design/slow" || task["total_changes"].(float64) < 1000 || task["progress"].(float64) >= 100 {
		t.Errorf("task: %v", task)
	}
}
