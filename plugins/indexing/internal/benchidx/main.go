// Command benchidx is `make bench-indexing`: couchjobs builds a view of
// 100,000 documents (a simple map function with a _count reduce, and a
// grouped view beside it) from a local pouchdb-server, in real host and
// plugin processes, and answers queries; pouchdb-server builds the same
// views on their first query (PouchDB's map/reduce), the peer. Then both
// answer the same queries: key lookups, 100-row ranges, grouped and full
// reductions, with p50 and p99 latencies.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/couchjobs/couchjobs/plugins/internal/cluster"
	"github.com/couchjobs/couchjobs/plugins/internal/couch"
	"github.com/couchjobs/couchjobs/plugins/internal/couchtest"
)

var ctx = context.Background()

// views are the benchmark's views; PouchDB gets the same functions with
// a comment added, so that it does not reuse an index it built.
func views(comment string) map[string]any {
	return map[string]any{"views": map[string]any{
		"count":   map[string]any{"map": "function(doc) { emit(doc.n, null); }" + comment, "reduce": "_count"},
		"grouped": map[string]any{"map": "function(doc) { emit([doc.n % 100, doc.n], 1); }" + comment, "reduce": "_count"},
	}}
}

func main() {
	docs := flag.Int("docs", 100_000, "documents to index")
	queries := flag.Int("queries", 500, "queries of each kind")
	flag.Parse()
	log.SetFlags(0)
	dir, bin, err := cluster.Workspace(ctx, "benchidx", cluster.Plugin{Name: "indexing", Package: "github.com/couchjobs/couchjobs/plugins/indexing/cmd/couchjobs-indexing"})
	must(err)
	defer os.RemoveAll(dir)
	s, err := couchtest.Launch(filepath.Join(dir, "pouchdb"))
	must(err)
	defer s.Stop()
	c, err := couch.New(s.AdminURL(), couch.Options{})
	must(err)
	must(c.CreateDB(ctx, "db", 0))
	fmt.Fprintf(os.Stderr, "writing %d documents...\n", *docs)
	for start := 0; start < *docs; start += 1000 {
		var batch []json.RawMessage
		for i := start; i < min(*docs, start+1000); i++ {
			batch = append(batch, json.RawMessage(fmt.Sprintf(`{"_id":"doc-%06d","n":%d,"text":"document number %d"}`, i, i, i)))
		}
		bad, err := c.BulkDocs(ctx, "db", batch, true)
		must(err)
		if len(bad) > 0 {
			log.Fatalf("write: %v", bad)
		}
	}

	// The peer: pouchdb-server builds each view on its first query.
	_, err = c.Put(ctx, "db", "_design/pouch", views(" // pouchdb"))
	must(err)
	fmt.Fprintln(os.Stderr, "pouchdb-server builds its views...")
	t0 := time.Now()
	query(s.AdminURL() + "/db/_design/pouch/_view/count?limit=1")
	query(s.AdminURL() + "/db/_design/pouch/_view/grouped?limit=1")
	pouchBuild := time.Since(t0)

	// couchjobs: a host with the plugin, following the database; the
	// build starts when the design document appears, and the first
	// query waits for it (update=true).
	must(os.MkdirAll(filepath.Join(dir, "cluster"), 0o755))
	cl, err := cluster.New(filepath.Join(dir, "cluster"), cluster.Options{Bin: bin, Plugin: "indexing", Workers: 2, ActivityTimeout: 30 * time.Second,
		Config: fmt.Sprintf("[[plugins.indexing.config.servers]]\nname = \"local\"\nurl = %q\n[[plugins.indexing.config.databases]]\nserver = \"local\"\ndb = \"db\"\n", s.AdminURL())})
	must(err)
	defer cl.Close()
	n, err := cl.Start(ctx, "a")
	must(err)
	time.Sleep(2 * time.Second) // the watcher is following the feed
	fmt.Fprintln(os.Stderr, "couchjobs builds its views...")
	t0 = time.Now()
	_, err = c.Put(ctx, "db", "_design/ours", views(""))
	must(err)
	query(n.URL() + "/db/_design/ours/_view/count?limit=1")
	ourBuild := time.Since(t0)

	rate := func(d time.Duration) float64 { return float64(*docs) / d.Seconds() }
	fmt.Printf("build of %d documents (two views, first query):\n", *docs)
	fmt.Printf("  %-28s %8.2f s %9.0f docs/s\n", "couchjobs", ourBuild.Seconds(), rate(ourBuild))
	fmt.Printf("  %-28s %8.2f s %9.0f docs/s\n", "pouchdb-server (PouchDB)", pouchBuild.Seconds(), rate(pouchBuild))
	fmt.Printf("  ratio %.1f×\n\n", pouchBuild.Seconds()/ourBuild.Seconds())

	rng := rand.New(rand.NewPCG(7, 7))
	kinds := []struct {
		name string
		path func() string
	}{
		{"key lookup", func() string { return fmt.Sprintf("/count?reduce=false&key=%d", rng.IntN(*docs)) }},
		{"100-row range", func() string { return fmt.Sprintf("/count?reduce=false&startkey=%d&limit=100", rng.IntN(*docs)) }},
		{"grouped reduce (100 groups)", func() string { return "/grouped?group_level=1" }},
		{"reduce of a key range", func() string {
			a, b := rng.IntN(*docs), rng.IntN(*docs)
			return fmt.Sprintf("/count?startkey=%d&endkey=%d", min(a, b), max(a, b))
		}},
		{"full reduce", func() string { return "/count?reduce=true" }},
	}
	fmt.Printf("query latency, %d queries each (update=false), p50 / p99:\n", *queries)
	fmt.Printf("  %-28s %22s %22s\n", "", "couchjobs", "pouchdb-server")
	for _, k := range kinds {
		paths := make([]string, *queries)
		for i := range paths {
			paths[i] = k.path()
		}
		ours := latencies(n.URL()+"/db/_design/ours/_view", paths, "update=false")
		theirs := latencies(s.AdminURL()+"/db/_design/pouch/_view", paths, "stale=ok")
		fmt.Printf("  %-28s %9.2f / %7.2f ms %9.2f / %7.2f ms\n", k.name, ours[0], ours[1], theirs[0], theirs[1])
	}
}

// latencies runs the queries one after another and returns p50 and p99
// in ms.
func latencies(base string, paths []string, param string) [2]float64 {
	ms := make([]float64, len(paths))
	for i, p := range paths {
		t0 := time.Now()
		query(base + p + "&" + param)
		ms[i] = float64(time.Since(t0).Microseconds()) / 1000
	}
	slices.Sort(ms)
	return [2]float64{ms[len(ms)/2], ms[len(ms)*99/100]}
}

func query(url string) {
	resp, err := http.Get(url)
	must(err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		log.Fatalf("%s: %d %s", url, resp.StatusCode, b)
	}
}

func must(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
