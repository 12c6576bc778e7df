package replication

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/couchjobs/couchjobs/plugins/internal/couch"
)

// maxHistory bounds a checkpoint document's history, as CouchDB does.
const maxHistory = 50

// Checkpoint is the document a replication keeps in _local/<base id> on
// both its source and its target (CouchDB's replication log).
type Checkpoint struct {
	Rev           string          `json:"_rev,omitempty"`
	SessionID     string          `json:"session_id"`
	SourceLastSeq json.RawMessage `json:"source_last_seq"`
	// ReplicationIDVersion is CouchDB's field; couchjobs ids are version
	// 4-shaped (no server UUID).
	ReplicationIDVersion int            `json:"replication_id_version"`
	History              []HistoryEntry `json:"history"`
}

// HistoryEntry is one session's record in a checkpoint's history.
type HistoryEntry struct {
	SessionID        string          `json:"session_id"`
	StartTime        string          `json:"start_time"`
	EndTime          string          `json:"end_time"`
	StartLastSeq     json.RawMessage `json:"start_last_seq"`
	EndLastSeq       json.RawMessage `json:"end_last_seq"`
	RecordedSeq      json.RawMessage `json:"recorded_seq"`
	MissingChecked   int64           `json:"missing_checked"`
	MissingFound     int64           `json:"missing_found"`
	DocsRead         int64           `json:"docs_read"`
	DocsWritten      int64           `json:"docs_written"`
	DocWriteFailures int64           `json:"doc_write_failures"`
}

// httpTime is CouchDB's time format in replication logs.
func httpTime(t time.Time) string { return t.UTC().Format(time.RFC1123) }

// readCheckpoint reads a replication's checkpoint on one end; nil if there
// is none.
func readCheckpoint(ctx context.Context, c *couch.Client, db, base string) (*Checkpoint, error) {
	var cp Checkpoint
	err := c.Get(ctx, db, "_local/"+base, &cp)
	if errors.Is(err, couch.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the checkpoint: %w", err)
	}
	return &cp, nil
}

// startSeq is where a replication resumes: the sequence both ends'
// checkpoints agree on. The same session on both ends agrees on its last
// sequence; otherwise the newest session the two histories share agrees
// on the sequence it recorded; else there is no agreement (nil), and the
// replication starts from the beginning.
func startSeq(src, tgt *Checkpoint) json.RawMessage {
	if src == nil || tgt == nil {
		return nil
	}
	if src.SessionID != "" && src.SessionID == tgt.SessionID {
		return src.SourceLastSeq
	}
	inTarget := map[string]bool{}
	for _, h := range tgt.History {
		inTarget[h.SessionID] = true
	}
	for _, h := range src.History {
		if inTarget[h.SessionID] {
			return h.RecordedSeq
		}
	}
	return nil
}

// writeCheckpoint records a session's progress on one end, keeping the
// document's revision for the next write.
func writeCheckpoint(ctx context.Context, c *couch.Client, db, base string, cp *Checkpoint) error {
	rev, err := c.Put(ctx, db, "_local/"+base, cp)
	if errors.Is(err, couch.ErrConflict) {
		// Someone else wrote it (an earlier run on another node, cut off
		// mid-write): take its revision and write ours over it.
		var cur Checkpoint
		if gerr := c.Get(ctx, db, "_local/"+base, &cur); gerr != nil {
			return fmt.Errorf("write the checkpoint: %w", err)
		}
		cp.Rev = cur.Rev
		rev, err = c.Put(ctx, db, "_local/"+base, cp)
	}
	if err != nil {
		return fmt.Errorf("write the checkpoint: %w", err)
	}
	cp.Rev = rev
	return nil
}

// withEntry returns the history with the session's entry first,
// replacing an older entry of the same session, bounded.
func withEntry(history []HistoryEntry, e HistoryEntry) []HistoryEntry {
	out := []HistoryEntry{e}
	for _, h := range history {
		if h.SessionID != e.SessionID && len(out) < maxHistory {
			out = append(out, h)
		}
	}
	return out
}

// seqEqual compares two opaque sequences as JSON texts.
func seqEqual(a, b json.RawMessage) bool { return bytes.Equal(compact(a), compact(b)) }
