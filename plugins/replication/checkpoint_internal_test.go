package replication

import (
	"encoding/json"
	"testing"

	"github.com/couchjobs/couchjobs/plugins/internal/couch"
)

// TestStartSeq: a session resumes from what both ends' checkpoints agree
// on, and from the beginning when they agree on nothing.
func TestStartSeq(t *testing.T) {
	t.Parallel()
	h := func(session, seq string) HistoryEntry {
		return HistoryEntry{SessionID: session, RecordedSeq: json.RawMessage(seq)}
	}
	cp := func(session, last string, hist ...HistoryEntry) *Checkpoint {
		return &Checkpoint{SessionID: session, SourceLastSeq: json.RawMessage(last), History: hist}
	}
	cases := []struct {
		name     string
		src, tgt *Checkpoint
		want     string
	}{
		{"none", nil, nil, ""},
		{"source only", cp("s1", "9", h("s1", "9")), nil, ""},
		{"same session", cp("s2", `"12-g1"`, h("s2", `"12-g1"`), h("s1", "5")), cp("s2", `"12-g1"`, h("s2", `"12-g1"`)), `"12-g1"`},
		// The target's write of s3 was lost: both know s2.
		{"target behind", cp("s3", "30", h("s3", "30"), h("s2", "20"), h("s1", "10")), cp("s2", "20", h("s2", "20"), h("s1", "10")), "20"},
		// The source's write of s3 was lost.
		{"source behind", cp("s2", "20", h("s2", "20"), h("s1", "10")), cp("s3", "30", h("s3", "30"), h("s2", "20")), "20"},
		{"nothing shared", cp("a", "5", h("a", "5")), cp("b", "7", h("b", "7")), ""},
	}
	for _, c := range cases {
		if got := string(startSeq(c.src, c.tgt)); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}

// TestFirstGeneration: only a document's first revision, as the feed
// gave it and without attachments, is taken from the feed.
func TestFirstGeneration(t *testing.T) {
	t.Parallel()
	change := func(doc string, revs ...string) (ch couch.Change) {
		ch.Doc = json.RawMessage(doc)
		for _, r := range revs {
			ch.Changes = append(ch.Changes, struct {
				Rev string `json:"rev"`
			}{r})
		}
		return ch
	}
	doc, ok := firstGeneration(change(`{"_id":"a","_rev":"1-x","v":1}`, "1-x"))
	if !ok || string(doc) != `{"_id":"a","_rev":"1-x","v":1,"_revisions":{"start":1,"ids":["x"]}}` {
		t.Errorf("first revision: %s %t", doc, ok)
	}
	for name, ch := range map[string]couch.Change{
		"second revision": change(`{"_id":"a","_rev":"2-y"}`, "2-y"),
		"conflicts":       change(`{"_id":"a","_rev":"1-x"}`, "1-x", "1-y"),
		"another winner":  change(`{"_id":"a","_rev":"1-y"}`, "1-x"),
		"attachments":     change(`{"_id":"a","_rev":"1-x","_attachments":{"f":{"stub":true}}}`, "1-x"),
		"no document":     change(``, "1-x"),
	} {
		if doc, ok := firstGeneration(ch); ok {
			t.Errorf("%s: taken from the feed: %s", name, doc)
		}
	}
}
