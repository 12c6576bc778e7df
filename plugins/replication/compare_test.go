package replication_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/couchjobs/couchjobs/plugins/internal/couch"
	"github.com/couchjobs/couchjobs/plugins/internal/couchtest"
)

var bg = context.Background()

// admin returns an admin client of a test server.
func admin(t testing.TB, s *couchtest.Server) *couch.Client {
	t.Helper()
	c, err := couch.New(s.AdminURL(), couch.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// serve starts a pouchdb-server for the test, creates the databases dbs
// on it, and returns it with an admin client.
func serve(t testing.TB, dbs ...string) (*couchtest.Server, *couch.Client) {
	t.Helper()
	s := couchtest.Start(t)
	c := admin(t, s)
	for _, db := range dbs {
		if err := c.CreateDB(bg, db, 0); err != nil {
			t.Fatal(err)
		}
	}
	return s, c
}

// dbURL is a database's URL with the admin's credentials.
func dbURL(s *couchtest.Server, db string) string { return s.AdminURL() + "/" + db }

// leaves reads every leaf revision of every document of a database
// (deleted ones and conflicts included), with its history and
// attachments, by id and revision.
func leaves(t testing.TB, c *couch.Client, db string) map[string]map[string]any {
	t.Helper()
	ids := map[string][]string{}
	if _, err := c.Feed(bg, db, couch.FeedOptions{AllRevs: true}, func(ch couch.Change) error {
		for _, r := range ch.Changes {
			ids[ch.ID] = append(ids[ch.ID], r.Rev)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var req []couch.DocRev
	for id, revs := range ids {
		for _, rev := range revs {
			req = append(req, couch.DocRev{ID: id, Rev: rev})
		}
	}
	got, err := c.BulkGet(bg, db, req, true)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]any{}
	for _, r := range got {
		if r.Missing || r.Err != "" {
			t.Fatalf("%s %s: a leaf is missing: %s", r.ID, r.Rev, r.Err)
		}
		var doc map[string]any
		if err := json.Unmarshal(r.Doc, &doc); err != nil {
			t.Fatal(err)
		}
		if out[r.ID] == nil {
			out[r.ID] = map[string]any{}
		}
		out[r.ID][r.Rev] = doc
	}
	return out
}

// same fails unless two databases hold the same documents, revision for
// revision, and no _local document moved.
func same(t testing.TB, src, tgt *couch.Client, srcDB, tgtDB string) int {
	t.Helper()
	a, b := leaves(t, src, srcDB), leaves(t, tgt, tgtDB)
	if len(a) != len(b) {
		t.Fatalf("source has %d documents, target %d", len(a), len(b))
	}
	n := 0
	for id, revs := range a {
		if !reflect.DeepEqual(revs, b[id]) {
			t.Fatalf("document %s differs:\nsource %v\ntarget %v", id, revs, b[id])
		}
		n += len(revs)
	}
	return n
}

// conflicted writes a document with a conflict (two branches from one
// parent), an attachment, and a deleted branch.
func conflicted(t testing.TB, c *couch.Client, db, id string) {
	t.Helper()
	att := base64.StdEncoding.EncodeToString([]byte("attachment of " + id))
	docs := []string{
		fmt.Sprintf(`{"_id":%q,"_rev":"2-aaa","_revisions":{"start":2,"ids":["aaa","root"]},"v":"a","_attachments":{"a.txt":{"content_type":"text/plain","data":%q}}}`, id, att),
		fmt.Sprintf(`{"_id":%q,"_rev":"2-bbb","_revisions":{"start":2,"ids":["bbb","root"]},"v":"b"}`, id),
		fmt.Sprintf(`{"_id":%q,"_rev":"3-ccc","_revisions":{"start":3,"ids":["ccc","ddd","root"]},"_deleted":true}`, id),
	}
	raw := make([]json.RawMessage, len(docs))
	for i, d := range docs {
		raw[i] = json.RawMessage(d)
	}
	bad, err := c.BulkDocs(bg, db, raw, false)
	if err != nil || len(bad) > 0 {
		t.Fatalf("write %s: %v %v", id, bad, err)
	}
}

// fill writes n small documents named prefix-NNNNN.
func fill(t testing.TB, c *couch.Client, db, prefix string, n int) {
	t.Helper()
	for start := 0; start < n; start += 1000 {
		var docs []json.RawMessage
		for i := start; i < min(n, start+1000); i++ {
			docs = append(docs, json.RawMessage(fmt.Sprintf(`{"_id":"%s-%05d","n":%d,"text":"document number %d"}`, prefix, i, i, i)))
		}
		bad, err := c.BulkDocs(bg, db, docs, true)
		if err != nil || len(bad) > 0 {
			t.Fatalf("fill: %v %v", bad, err)
		}
	}
}

func sortedKeys(m map[string]map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func hasLocal(t testing.TB, c *couch.Client, db, id string) bool {
	t.Helper()
	var v map[string]any
	err := c.Get(bg, db, id, &v)
	if err != nil && !strings.Contains(err.Error(), "404") {
		t.Fatal(err)
	}
	return err == nil
}
