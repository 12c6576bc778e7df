package indexing_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/couchjobs/couchjobs/plugins/indexing"
	"github.com/couchjobs/couchjobs/plugins/internal/cluster"
	"github.com/couchjobs/couchjobs/plugins/internal/couchtest"
)

// TestKilledNodeFailover kills the plugin process, then its whole host,
// with SIGKILL in the middle of a build. The build resumes from view_seq
// (on the same node, then on another), indexes every document exactly
// once, and the index equals pouchdb-server's, with no duplicate or stale
// rows.
func TestKilledNodeFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and kills host processes; runs in make test-slow")
	}
	srv := couchtest.Start(t)
	c := admin(t, srv)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bin := filepath.Join(dir, "bin")
	if err := cluster.Build(ctx, bin, cluster.Plugin{Name: "indexing", Package: "github.com/couchjobs/couchjobs/plugins/indexing/cmd/couchjobs-indexing"}); err != nil {
		t.Fatal(err)
	}
	cl, err := cluster.New(dir, cluster.Options{Bin: bin, Plugin: "indexing", ActivityTimeout: time.Second, Log: cluster.TestLog(t),
		Config: fmt.Sprintf("batch_docs = 200\n[[plugins.indexing.config.servers]]\nname = \"local\"\nurl = %q\n[[plugins.indexing.config.databases]]\nserver = \"local\"\ndb = \"db\"\n", srv.AdminURL())})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := c.CreateDB(ctx, "db", 0); err != nil {
		t.Fatal(err)
	}
	const docs = 20_000
	for start := 0; start < docs; start += 1000 {
		var batch []string
		for i := start; i < start+1000; i++ {
			batch = append(batch, fmt.Sprintf(`{"_id":"d%05d","n":%d}`, i, i))
		}
		bulk(t, c, "db", true, batch...)
	}
	put(t, c, "db", "_design/test", map[string]any{"views": map[string]any{
		"v": map[string]any{"map": `function(doc) { if (typeof doc.n == "number") { emit(doc.n % 100, 1); emit([doc.n % 7, doc._id], doc.n); } }`, "reduce": "_sum"},
	}})
	var id string
	state := func() indexing.IndexData {
		var d indexing.IndexData
		list, _, err := cl.Jobs.List(ctx, indexing.TypeIndex, jobsListAll)
		if err == nil && len(list) == 1 {
			id = list[0].ID
			json.Unmarshal(list[0].Data, &d)
		}
		return d
	}
	seq := func() int64 {
		var n int64
		json.Unmarshal(state().ViewSeq, &n)
		return n
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(3 * time.Minute); !cond(); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s (view_seq %d)", what, seq())
			}
		}
	}
	a, err := cl.Start(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	waitFor("the first batches", func() bool { return seq() >= docs/5 })
	t.Logf("killing the plugin at view_seq %d", seq())
	if err := a.KillPlugin("indexing"); err != nil {
		t.Fatal(err)
	}
	at := seq()
	waitFor("more batches after the plugin was killed", func() bool { return seq() >= at+docs/5 })
	t.Logf("killing the host at view_seq %d", seq())
	a.Kill()
	b, err := cl.Start(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.WaitFinished(ctx, indexing.TypeIndex, id); err != nil {
		t.Fatal(err)
	}
	// Every change indexed once: a resumed run starts at view_seq, so no
	// batch was counted twice (the design document is a change too).
	if d := state(); d.DocsIndexed != docs+1 || d.Error != "" {
		t.Errorf("docs indexed %d, want %d (error %q)", d.DocsIndexed, docs+1, d.Error)
	}
	for _, query := range []string{"reduce=false", "group=true", "group_level=1", "", "reduce=false&startkey=%5B3%5D&limit=500"} {
		path := "/db/_design/test/_view/v?" + query
		st1, ours := get(t, "GET", b.URL(), path, "")
		st2, theirs := get(t, "GET", srv.AdminURL(), path, "")
		if st1 != 200 || st2 != 200 || !reflect.DeepEqual(ours.(map[string]any)["rows"], theirs.(map[string]any)["rows"]) {
			t.Errorf("%s: %d / %d, the rows differ", path, st1, st2)
		}
	}
}
