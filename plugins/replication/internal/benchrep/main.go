// Command benchrep is `make bench-replication`: the replicator's
// throughput on three workloads, each between two databases of a local
// pouchdb-server, beside PouchDB's own replicator (npm pouchdb,
// PouchDB.replicate, with its defaults) and the target's raw _bulk_docs
// ingest rate (the same documents, histories included, written with
// new_edits=false by worker_processes writers in worker_batch_size
// batches): the ceiling no replicator writing through _bulk_docs can
// pass. Each measurement starts from a fresh target database.
package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/couchjobs/couchjobs/plugins/internal/couch"
	"github.com/couchjobs/couchjobs/plugins/internal/couchtest"
	"github.com/couchjobs/couchjobs/plugins/replication"
)

// PouchDBVersion is the npm pouchdb the replicator is compared with.
const PouchDBVersion = "9.0.0"

var ctx = context.Background()

var (
	extra     *string
	rounds    *int
	withPouch *bool
	pinned    *bool
)

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

type workload struct {
	name string
	docs func(i int) []json.RawMessage // the leaf revisions of document i
	n    int
}

func small(i int) []json.RawMessage {
	return []json.RawMessage{json.RawMessage(fmt.Sprintf(
		`{"_id":"doc-%06d","_rev":"1-%032x","_revisions":{"start":1,"ids":["%032x"]},"n":%d,"text":"small document number %d"}`, i, i, i, i, i))}
}

func conflicted(i int) []json.RawMessage {
	att := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte(fmt.Sprintf("attachment %d ", i)), 64))
	out := make([]json.RawMessage, 3)
	for b := range 3 {
		attachment := ""
		if b == 0 {
			attachment = fmt.Sprintf(`,"_attachments":{"a.txt":{"content_type":"text/plain","data":%q}}`, att)
		}
		// Branch ids end in 1-3, so none equals the root's id (a
		// revision whose id is its parent's confuses pouchdb-server).
		out[b] = json.RawMessage(fmt.Sprintf(
			`{"_id":"doc-%06d","_rev":"2-%031x%d","_revisions":{"start":2,"ids":["%031x%d","%032x"]},"n":%d,"branch":%d%s}`,
			i, i, b+1, i, b+1, i, i, b, attachment))
	}
	return out
}

func main() {
	only := flag.String("only", "", "run only this workload")
	withPouch = flag.Bool("pouchdb", true, "measure PouchDB too")
	rounds = flag.Int("rounds", 3, "measurements of each contender; the median counts")
	pinned = flag.Bool("pin", runtime.NumCPU() >= 2, "give the second server a CPU of its own while it is measured")
	extra = flag.String("options", "", `more replication options, as JSON fields: ,"worker_processes":1`)
	flag.Parse()
	log.SetFlags(0)
	workloads := []workload{
		{"10,000 small docs", small, 10_000},
		{"100,000 small docs", small, 100_000},
		{"1,000 docs × 3 conflicting revisions + attachment", conflicted, 1_000},
	}
	dir, err := os.MkdirTemp("", "benchrep")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	pouch, err := couchtest.InstallPackage("pouchdb", PouchDBVersion)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%-50s %12s %12s %12s %9s %9s\n", "workload", "couchjobs", "PouchDB", "_bulk_docs", "vs Pouch", "vs ceil")
	var reads, twoServers []string
	defer func() {
		// What the server spends reading the source, beside the ceiling:
		// the server serves one request at a time, so a replicator can
		// reach at most write/(write+read) of the ceiling.
		fmt.Println()
		for _, r := range reads {
			fmt.Println(r)
		}
		where := "a second server"
		if *pinned {
			where += ", alone on a CPU"
		}
		fmt.Printf("\nthe target on %s:\n%-50s %12s %12s %9s\n", where, "workload", "couchjobs", "_bulk_docs", "vs ceil")
		for _, r := range twoServers {
			fmt.Println(r)
		}
	}()
	for _, w := range workloads {
		if *only != "" && *only != w.name {
			continue
		}
		// A server per workload, so that one's garbage does not slow the
		// next.
		s, err := couchtest.Launch(filepath.Join(dir, fmt.Sprint(len(w.name))))
		if err != nil {
			log.Fatal(err)
		}
		c, err := couch.New(s.AdminURL(), couch.Options{})
		if err != nil {
			log.Fatal(err)
		}
		revs := 0
		var all []json.RawMessage
		for i := range w.n {
			d := w.docs(i)
			all = append(all, d...)
			revs += len(d)
		}
		must(c.CreateDB(ctx, "source", 0))
		ingest(c, "source", all, 4)
		check(c, "source", revs)
		// A second server, for the same measurements when the target is
		// not the source's server: there the reads do not take the
		// writes' server time.
		s2, err := couchtest.Launch(filepath.Join(dir, fmt.Sprint(len(w.name), "-2")))
		if err != nil {
			log.Fatal(err)
		}
		c2, err := couch.New(s2.AdminURL(), couch.Options{})
		must(err)
		// Each contender runs rounds times, in a rotating order, into a
		// fresh database deleted afterwards; the median counts. The
		// ceiling is the faster of one writer and worker_processes (4)
		// writers: pouchdb-server serves one request at a time.
		// With -pin, the second server's contenders run with that
		// server alone on the last CPU, and the first server and this
		// process on the others, so that the target's writes have a core
		// to themselves; the others run unpinned.
		type contender struct {
			c      *couch.Client
			second bool
			run    func(db string)
		}
		contenders := []contender{
			{c, false, func(db string) { must(c.CreateDB(ctx, db, 0)); ingest(c, db, all, 1) }},
			{c, false, func(db string) { must(c.CreateDB(ctx, db, 0)); ingest(c, db, all, 4) }},
			{c, false, func(db string) { replicate(s.AdminURL()+"/source", s.AdminURL()+"/"+db) }},
			{c2, true, func(db string) { must(c2.CreateDB(ctx, db, 0)); ingest(c2, db, all, 1) }},
			{c2, true, func(db string) { must(c2.CreateDB(ctx, db, 0)); ingest(c2, db, all, 4) }},
			{c2, true, func(db string) { replicate(s.AdminURL()+"/source", s2.AdminURL()+"/"+db) }},
			{c, false, func(db string) { pouchReplicate(pouch, s, "source", db) }},
		}
		if !*withPouch {
			contenders = contenders[:6]
		}
		rates := make([][]float64, len(contenders))
		for round := range *rounds {
			for k := range contenders {
				i := (k + round) % len(contenders)
				db := fmt.Sprint("target-", i, "-", round)
				if *pinned {
					pin(contenders[i].second, s, s2)
				}
				rates[i] = append(rates[i], measure(revs, func() { contenders[i].run(db) }))
				check(contenders[i].c, db, revs)
				must(contenders[i].c.DeleteDB(ctx, db))
			}
		}
		if *pinned {
			pin(false, s, s2)
		}
		s2.Stop()
		ceil := max(median(rates[0]), median(rates[1]))
		ceil2 := max(median(rates[3]), median(rates[4]))
		ours, ours2, peer := median(rates[2]), median(rates[5]), 0.0
		if *withPouch {
			peer = median(rates[6])
		}
		twoServers = append(twoServers, fmt.Sprintf("%-50s %10.0f/s %10.0f/s %8.0f%%", w.name, ours2, ceil2, 100*ours2/ceil2))
		fmt.Printf("%-50s %10.0f/s %10.0f/s %10.0f/s %8.2f× %8.0f%%\n", w.name, ours, peer, ceil, ours/peer, 100*ours/ceil)
		reads = append(reads, readCosts(c, w.name, revs, ceil))
		s.Stop()
	}
}

// readCosts times, one request at a time, the reads a session on an
// empty target needs: the changes feed with documents, and _bulk_get of
// the revisions the feed cannot give (every revision of a document with
// conflicts or attachments).
func readCosts(c *couch.Client, name string, revs int, ceil float64) string {
	var need []couch.DocRev
	start := time.Now()
	_, err := c.Feed(ctx, "source", couch.FeedOptions{AllRevs: true, IncludeDocs: true}, func(ch couch.Change) error {
		if len(ch.Changes) > 1 || bytes.Contains(ch.Doc, []byte(`"_attachments"`)) {
			for _, r := range ch.Changes {
				need = append(need, couch.DocRev{ID: ch.ID, Rev: r.Rev})
			}
		}
		return nil
	})
	must(err)
	feed := time.Since(start)
	start = time.Now()
	for i := 0; i < len(need); i += 500 {
		_, err := c.BulkGet(ctx, "source", need[i:min(i+500, len(need))], true)
		must(err)
	}
	get := time.Since(start)
	write := time.Duration(float64(revs) / ceil * float64(time.Second))
	return fmt.Sprintf("%-50s reads: feed with docs %v, _bulk_get of %d revisions %v; writes at the ceiling %v; bound %.0f%% of the ceiling",
		name, feed.Round(time.Millisecond), len(need), get.Round(time.Millisecond), write.Round(time.Millisecond),
		100*write.Seconds()/(write+feed+get).Seconds())
}

// pin sets the CPUs of the two servers and of this process (every
// thread, with taskset): apart, the second server alone on the last CPU
// and the rest on the others; otherwise all on every CPU.
func pin(apart bool, first, second *couchtest.Server) {
	n := runtime.NumCPU()
	all := fmt.Sprintf("0-%d", n-1)
	rest, last := all, all
	if apart {
		rest, last = fmt.Sprintf("0-%d", n-2), strconv.Itoa(n-1)
	}
	for pid, cpus := range map[int]string{os.Getpid(): rest, first.Pid(): rest, second.Pid(): last} {
		if out, err := exec.Command("taskset", "-a", "-p", "-c", cpus, strconv.Itoa(pid)).CombinedOutput(); err != nil {
			log.Fatalf("taskset (run with -pin=false where it is missing): %v\n%s", err, out)
		}
	}
}

// measure returns revisions per second of fn.
func measure(revs int, fn func()) float64 {
	start := time.Now()
	fn()
	return float64(revs) / time.Since(start).Seconds()
}

// ingest writes revisions with new_edits=false in batches of about 500,
// never splitting a document's revisions between two batches:
// pouchdb-server loses a revision now and then when two concurrent
// requests add revisions to one document (measured here: 2,999 of 3,000
// leaves), which no replicator does, since each sends a document's
// missing revisions in one batch.
func ingest(c *couch.Client, db string, docs []json.RawMessage, writers int) {
	batches := make(chan []json.RawMessage)
	var wg sync.WaitGroup
	for range writers {
		wg.Go(func() {
			for b := range batches {
				bad, err := c.BulkDocs(ctx, db, b, false)
				if err != nil || len(bad) > 0 {
					log.Fatalf("ingest: %v %v", bad, err)
				}
			}
		})
	}
	for i := 0; i < len(docs); {
		end := min(i+500, len(docs))
		for end < len(docs) && docID(docs[end]) == docID(docs[end-1]) {
			end++
		}
		batches <- docs[i:end]
		i = end
	}
	close(batches)
	wg.Wait()
}

func docID(doc json.RawMessage) string {
	var d struct {
		ID string `json:"_id"`
	}
	json.Unmarshal(doc, &d)
	return d.ID
}

func replicate(src, tgt string) {
	spec, err := replication.Parse(fmt.Appendf(nil, `{"source":%q,"target":%q,"create_target":true%s}`, src, tgt, *extra))
	must(err)
	_, err = (&replication.Replication{Spec: spec}).Run(ctx)
	must(err)
}

const pouchScript = `
const PouchDB = require(process.argv[1] + '/node_modules/pouchdb');
PouchDB.replicate(process.argv[2], process.argv[3])
  .on('complete', info => { if (!info.ok) { console.error(JSON.stringify(info)); process.exit(1); } })
  .on('error', err => { console.error(err); process.exit(1); });
`

func pouchReplicate(dir string, s *couchtest.Server, src, tgt string) {
	c, _ := couch.New(s.AdminURL(), couch.Options{})
	must(c.CreateDB(ctx, tgt, 0))
	cmd := exec.Command("node", "-e", pouchScript, dir, s.AdminURL()+"/"+src, s.AdminURL()+"/"+tgt)
	if out, err := cmd.CombinedOutput(); err != nil {
		log.Fatalf("PouchDB.replicate: %v\n%s", err, out)
	}
}

// check counts the target's leaf revisions.
func check(c *couch.Client, db string, want int) {
	n := 0
	_, err := c.Feed(ctx, db, couch.FeedOptions{AllRevs: true}, func(ch couch.Change) error {
		n += len(ch.Changes)
		return nil
	})
	must(err)
	if n != want {
		log.Fatalf("%s has %d leaf revisions, want %d", db, n, want)
	}
}

func must(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
