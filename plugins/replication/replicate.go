package replication

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/couchjobs/couchjobs/plugins/internal/couch"
)

// Stats are a replication's counters, with CouchDB's names.
type Stats struct {
	DocsRead              int64           `json:"docs_read"`
	DocsWritten           int64           `json:"docs_written"`
	DocWriteFailures      int64           `json:"doc_write_failures"`
	MissingRevisionsFound int64           `json:"missing_revisions_found"`
	RevisionsChecked      int64           `json:"revisions_checked"`
	ChangesPending        *int64          `json:"changes_pending"`
	SourceSeq             json.RawMessage `json:"source_seq,omitempty"`
	CheckpointedSourceSeq json.RawMessage `json:"checkpointed_source_seq,omitempty"`
}

// counters are the live form of Stats.
type counters struct {
	docsRead, docsWritten, writeFailures, missingFound, revsChecked atomic.Int64
}

// Result is how a one-shot replication ended: CouchDB's answer to a
// _replicate request.
type Result struct {
	OK            bool            `json:"ok"`
	NoChanges     bool            `json:"no_changes,omitempty"`
	SessionID     string          `json:"session_id,omitempty"`
	SourceLastSeq json.RawMessage `json:"source_last_seq,omitempty"`
	RepIDVersion  int             `json:"replication_id_version,omitempty"`
	History       []HistoryEntry  `json:"history,omitempty"`
}

// Replication runs one session of a replication: from the checkpoint both
// ends agree on, through the source's changes (to their end, or for as
// long as the context lasts if continuous), checkpointing as it goes.
type Replication struct {
	Spec *Spec
	Log  hclog.Logger
	// Claim, if set, is called with the replication id before any
	// document moves; an error ends the session (an id collision).
	Claim func(ctx context.Context, repID string) error
	// Progress, if set, is called after each checkpoint and every few
	// seconds with fresh statistics; an error ends the session.
	Progress func(ctx context.Context, repID string, s Stats) error
	// ProgressEvery is how often Progress is called between checkpoints
	// (default 5 s).
	ProgressEvery time.Duration

	src, tgt       *couch.Client
	srcDB, tgtDB   string
	repID, session string
	start          time.Time
	startSeq       json.RawMessage
	stats          counters
	srcCP, tgtCP   *Checkpoint
	bulkGetOff     atomic.Bool
	// fresh: the target was empty when the session began, so every
	// revision is missing from it (see work); a continuous session
	// drops it once past srcEnd.
	fresh atomic.Bool
	// srcEnd is the source's update sequence at the start, as a number
	// (if its sequences have one).
	srcEnd   int64
	srcEndOK bool
	// paged: the source's sequences are plain JSON numbers (pouchdb-server,
	// CouchDB 1.x), so a one-shot session reads its feed in pages (see
	// read).
	paged bool

	mu           sync.Mutex
	sourceSeq    json.RawMessage // the newest change read
	checkpointed json.RawMessage // the newest sequence recorded on both ends
}

func newClient(e Endpoint, o Options) (*couch.Client, string, error) {
	server, db, err := e.split()
	if err != nil {
		return nil, "", err
	}
	headers := map[string]string{}
	for k, v := range e.Headers {
		headers[k] = v
	}
	c, err := couch.New(server, couch.Options{
		Header: headers, Timeout: o.connectionTimeout(), MaxConns: o.HTTPConnections,
		Retries: o.RetriesPerRequest,
	})
	if err != nil {
		return nil, "", err
	}
	if e.User != "" {
		c = c.WithBasicAuth(e.User, e.Password)
	}
	return c, db, nil
}

func newSessionID() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// Run runs the session. A one-shot replication returns its result when it
// has copied every change; a continuous one returns ctx's error when ctx
// ends (after a last checkpoint). Any other error is a crash.
func (r *Replication) Run(ctx context.Context) (*Result, error) {
	if r.Log == nil {
		r.Log = hclog.NewNullLogger()
	}
	o := r.Spec.Options
	var err error
	if r.src, r.srcDB, err = newClient(r.Spec.Source, o); err != nil {
		return nil, fmt.Errorf("source: %w", err)
	}
	if r.tgt, r.tgtDB, err = newClient(r.Spec.Target, o); err != nil {
		return nil, fmt.Errorf("target: %w", err)
	}
	r.session, r.start = newSessionID(), time.Now()
	if err := r.prepare(ctx); err != nil {
		return nil, err
	}
	if r.Claim != nil {
		if err := r.Claim(ctx, r.repID); err != nil {
			return nil, err
		}
	}
	r.Log = r.Log.With("rep_id", r.repID)
	r.Log.Info("replication starting", "source", r.Spec.Source.Redacted(), "target", r.Spec.Target.Redacted(), "since", string(r.startSeq), "continuous", o.Continuous)
	return r.loop(ctx)
}

// prepare checks both databases (creating the target if asked to),
// computes the replication id and finds the checkpoint to resume from.
func (r *Replication) prepare(ctx context.Context) error {
	srcInfo, err := r.src.DBInfo(ctx, r.srcDB)
	if err != nil {
		if errors.Is(err, couch.ErrNotFound) {
			return fmt.Errorf("the source database %s does not exist", r.Spec.Source.Redacted())
		}
		return fmt.Errorf("source %s: %w", r.Spec.Source.Redacted(), err)
	}
	r.srcEnd, r.srcEndOK = seqNumber(srcInfo.UpdateSeq)
	u := bytes.TrimSpace(srcInfo.UpdateSeq)
	r.paged = r.srcEndOK && len(u) > 0 && u[0] >= '0' && u[0] <= '9'
	info, err := r.tgt.DBInfo(ctx, r.tgtDB)
	if err != nil && !errors.Is(err, couch.ErrNotFound) {
		return fmt.Errorf("target %s: %w", r.Spec.Target.Redacted(), err)
	}
	seq, _ := seqNumber(info.UpdateSeq)
	r.fresh.Store(err == nil && info.DocCount == 0 && info.DocDelCount == 0 && seq == 0)
	if errors.Is(err, couch.ErrNotFound) {
		r.fresh.Store(true)
		if !r.Spec.Options.CreateTarget {
			return fmt.Errorf("the target database %s does not exist (set create_target to create it)", r.Spec.Target.Redacted())
		}
		if err := r.tgt.CreateDB(ctx, r.tgtDB, 0); err != nil && !errors.Is(err, couch.ErrExists) {
			return fmt.Errorf("create the target %s: %w", r.Spec.Target.Redacted(), err)
		}
	}
	code, err := filterCode(ctx, r.src, r.srcDB, r.Spec.Options.Filter)
	if err != nil {
		return err
	}
	r.repID = ReplicationID(r.Spec, code)
	r.startSeq = r.Spec.Options.SinceSeq
	if !r.Spec.Options.UseCheckpoints {
		return nil
	}
	base := baseID(r.repID)
	if r.srcCP, err = readCheckpoint(ctx, r.src, r.srcDB, base); err != nil {
		return fmt.Errorf("source: %w", err)
	}
	if r.tgtCP, err = readCheckpoint(ctx, r.tgt, r.tgtDB, base); err != nil {
		return fmt.Errorf("target: %w", err)
	}
	if seq := startSeq(r.srcCP, r.tgtCP); seq != nil {
		r.startSeq = seq
	}
	r.checkpointed = r.startSeq
	return nil
}

// batch is a run of consecutive changes, handled by one worker.
type batch struct {
	n       int
	changes []couch.Change
	lastSeq json.RawMessage
}

// loop runs the pipeline: a reader follows the changes feed, a batcher
// cuts it into worker_batch_size batches, worker_processes workers each
// diff, fetch and write a batch, and this goroutine records, in feed
// order, how far every change has been written, checkpointing that.
func (r *Replication) loop(ctx context.Context) (*Result, error) {
	o := r.Spec.Options
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	changes := make(chan couch.Change, 2*o.WorkerBatchSize)
	batches := make(chan *batch, o.WorkerProcesses)
	done := make(chan *batch, o.WorkerProcesses)
	var endSeq json.RawMessage // a one-shot feed's end, set before changes closes
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(changes)
		end, err := r.read(ctx, changes)
		if err != nil {
			cancel(err)
			return
		}
		endSeq = end
	})
	wg.Go(func() {
		defer close(batches)
		r.cut(ctx, changes, batches)
	})
	var workers sync.WaitGroup
	for range o.WorkerProcesses {
		workers.Go(func() {
			for b := range batches {
				if err := r.work(ctx, b); err != nil {
					cancel(err)
					return
				}
				select {
				case done <- b:
				case <-ctx.Done():
					return
				}
			}
		})
	}
	wg.Go(func() { workers.Wait(); close(done) })
	defer wg.Wait()

	finished := map[int]*batch{}
	next := 0
	var safe json.RawMessage // every change up to here is written
	every := r.ProgressEvery
	if every <= 0 {
		every = 5 * time.Second
	}
	every = max(min(every, o.checkpointInterval()), 100*time.Millisecond)
	progress := time.NewTicker(every)
	defer progress.Stop()
	lastCP := time.Now()
	for {
		select {
		case b, ok := <-done:
			if !ok {
				if err := context.Cause(ctx); err != nil {
					return r.stop(ctx, safe, err)
				}
				// Every change to the feed's end is written.
				if !seqEqual(r.sourceSeqNow(), endSeq) && endSeq != nil {
					r.setSourceSeq(endSeq)
				}
				if err := r.checkpoint(ctx, endSeq); err != nil {
					return nil, err
				}
				if err := r.report(ctx); err != nil {
					return nil, err
				}
				return r.result(endSeq), nil
			}
			finished[b.n] = b
			for finished[next] != nil {
				safe = finished[next].lastSeq
				delete(finished, next)
				next++
			}
		case <-progress.C:
			if time.Since(lastCP) >= o.checkpointInterval() {
				if err := r.checkpoint(ctx, safe); err != nil {
					if ctx.Err() != nil {
						err = context.Cause(ctx) // stopped mid-write
					}
					return r.stop(ctx, safe, err)
				}
				lastCP = time.Now()
			}
			if err := r.report(ctx); err != nil {
				if ctx.Err() != nil {
					err = context.Cause(ctx)
				}
				return r.stop(ctx, safe, err)
			}
		case <-ctx.Done():
			return r.stop(ctx, safe, context.Cause(ctx))
		}
	}
}

// stop ends a session early: it records what is safely written, with a
// context of its own (the session's is done), and returns why it stopped.
func (r *Replication) stop(ctx context.Context, safe json.RawMessage, cause error) (*Result, error) {
	if cause == nil {
		cause = ctx.Err()
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := r.checkpoint(cctx, safe); err != nil {
		r.Log.Warn("last checkpoint failed", "error", err)
	}
	return nil, cause
}

// read follows the changes feed into out. A one-shot feed returns its end
// sequence; a continuous one reconnects from the last change read when
// its connection fails, retries_per_request times in a row at most.
//
// A one-shot session whose source numbers its sequences reads the feed in
// pages of 10 × worker_batch_size changes: pouchdb-server builds a whole
// normal feed in memory before it sends a byte, so one feed of 100,000
// changes would keep the target idle for seconds. The pages end at an
// empty one, or at the first change past the source's sequence at the
// start (a one-shot replication copies what the source held when it
// began, and a source written faster than it is read would otherwise
// keep it going). CouchDB 2+ streams its feeds and has opaque sequences:
// one feed.
func (r *Replication) read(ctx context.Context, out chan<- couch.Change) (json.RawMessage, error) {
	o := r.Spec.Options
	fo := couch.FeedOptions{
		Since: r.startSeq, Continuous: o.Continuous, AllRevs: !o.WinningRevsOnly,
		IncludeDocs: r.fresh.Load(),
		Filter:      o.Filter, Params: o.QueryParams, DocIDs: o.DocIDs, Selector: o.Selector,
		IdleTimeout: max(o.connectionTimeout(), 30*time.Second),
	}
	if r.paged && !o.Continuous {
		fo.Limit = 10 * o.WorkerBatchSize
	}
	failures := 0
	wait := 250 * time.Millisecond
	for {
		n := 0
		end, err := r.src.Feed(ctx, r.srcDB, fo, func(ch couch.Change) error {
			failures, wait = 0, 250*time.Millisecond
			fo.Since = ch.Seq
			n++
			if couch.IsLocal(ch.ID) {
				return nil
			}
			select {
			case out <- ch:
				return nil
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		})
		if err == nil && fo.Limit > 0 && n > 0 {
			// The next page starts after the last change received, not
			// at the page's last_seq, which a server may put further.
			if at, ok := seqNumber(fo.Since); !ok || at < r.srcEnd {
				continue
			}
			return fo.Since, nil
		}
		if err == nil {
			return end.LastSeq, nil
		}
		if ctx.Err() != nil || !o.Continuous || failures >= o.RetriesPerRequest {
			return nil, fmt.Errorf("read the source's changes: %w", err)
		}
		failures++
		r.Log.Warn("changes feed failed; reconnecting", "error", err, "since", string(fo.Since), "attempt", failures)
		select {
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		case <-time.After(wait):
		}
		wait *= 2
	}
}

// linger is how long the batcher waits for more changes before it sends
// a batch that is not full: long enough to gather a burst, short enough
// that a continuous replication delivers a lone change at once.
const linger = 5 * time.Millisecond

// cut cuts the changes into batches.
func (r *Replication) cut(ctx context.Context, in <-chan couch.Change, out chan<- *batch) {
	size := r.Spec.Options.WorkerBatchSize
	n := 0
	send := func(b *batch) bool {
		b.n = n
		n++
		b.lastSeq = b.changes[len(b.changes)-1].Seq
		r.setSourceSeq(b.lastSeq)
		if r.fresh.Load() && r.Spec.Options.Continuous {
			// Past the source's end at the start, changes are new ones,
			// which the target may have from elsewhere (a replication
			// the other way): they go through _revs_diff.
			if at, ok := seqNumber(b.lastSeq); !ok || !r.srcEndOK || at >= r.srcEnd {
				r.fresh.Store(false)
				r.Log.Debug("caught up with the source; changes go through _revs_diff", "seq", string(b.lastSeq))
			}
		}
		select {
		case out <- b:
			return true
		case <-ctx.Done():
			return false
		}
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		ch, ok := <-in
		if !ok {
			return
		}
		b := &batch{changes: make([]couch.Change, 0, size)}
		b.changes = append(b.changes, ch)
		timer.Reset(linger)
	fill:
		for len(b.changes) < size {
			select {
			case ch, ok := <-in:
				if !ok {
					send(b)
					return
				}
				b.changes = append(b.changes, ch)
			case <-timer.C:
				break fill
			}
		}
		if !send(b) {
			return
		}
	}
}

// work copies what the target lacks of a batch's changes.
//
// A session that began on an empty target (an initial replication, the
// heavy case) knows every revision is missing there: it skips _revs_diff,
// and takes first-generation documents without attachments from the
// changes feed itself (include_docs), whose history is the revision alone,
// fetching only the others. Writing with new_edits=false is idempotent, so
// a revision someone else wrote to the target meanwhile is merely written
// twice. Otherwise the batch goes through _revs_diff and the fetch.
func (r *Replication) work(ctx context.Context, b *batch) error {
	revs := make(map[string][]string, len(b.changes))
	checked := 0
	var docs []json.RawMessage
	fresh := r.fresh.Load()
	for _, ch := range b.changes {
		if fresh {
			if doc, ok := firstGeneration(ch); ok {
				docs = append(docs, doc)
				checked++
				continue
			}
		}
		for _, c := range ch.Changes {
			revs[ch.ID] = append(revs[ch.ID], c.Rev)
			checked++
		}
	}
	r.stats.revsChecked.Add(int64(checked))
	if len(docs) > 0 {
		r.stats.missingFound.Add(int64(len(docs)))
	}
	if len(revs) > 0 {
		var diff map[string]couch.RevsDiff
		if fresh {
			diff = make(map[string]couch.RevsDiff, len(revs))
			for id, rs := range revs {
				diff[id] = couch.RevsDiff{Missing: rs}
			}
		} else {
			var err error
			if diff, err = r.tgt.RevsDiff(ctx, r.tgtDB, revs); err != nil {
				return fmt.Errorf("target: _revs_diff: %w", err)
			}
		}
		if len(diff) > 0 {
			fetched, err := r.fetch(ctx, diff)
			if err != nil {
				return err
			}
			docs = append(docs, fetched...)
		}
	}
	if len(docs) == 0 {
		return nil
	}
	r.stats.docsRead.Add(int64(len(docs)))
	bad, err := r.tgt.BulkDocs(ctx, r.tgtDB, docs, false)
	if err != nil {
		return fmt.Errorf("target: _bulk_docs: %w", err)
	}
	for _, d := range bad {
		r.Log.Warn("the target refused a document", "doc_id", d.ID, "rev", d.Rev, "error", d.Error, "reason", d.Reason)
	}
	r.stats.writeFailures.Add(int64(len(bad)))
	r.stats.docsWritten.Add(int64(len(docs) - len(bad)))
	return nil
}

// firstGeneration returns a change's document ready to write, with its
// history, when the change is a document's first revision, the feed
// included that very revision, and it has no attachments (the feed gives
// attachment stubs, not data).
func firstGeneration(ch couch.Change) (json.RawMessage, bool) {
	if len(ch.Changes) != 1 || len(ch.Doc) == 0 || ch.Deleted {
		return nil, false
	}
	rev := ch.Changes[0].Rev
	hash, ok := strings.CutPrefix(rev, "1-")
	if !ok || strings.ContainsAny(hash, `"\`) || bytes.Contains(ch.Doc, []byte(`"_attachments"`)) {
		return nil, false
	}
	var meta struct {
		Rev string `json:"_rev"`
	}
	if json.Unmarshal(ch.Doc, &meta) != nil || meta.Rev != rev {
		return nil, false
	}
	doc := bytes.TrimRight(ch.Doc, " \t\r\n")
	if len(doc) < 2 || doc[len(doc)-1] != '}' {
		return nil, false
	}
	out := make([]byte, 0, len(doc)+len(hash)+40)
	out = append(out, doc[:len(doc)-1]...)
	out = append(out, `,"_revisions":{"start":1,"ids":["`...)
	out = append(out, hash...)
	out = append(out, `"]}}`...)
	return out, true
}

// fetch reads the missing revisions from the source, with their histories
// and attachments: with _bulk_get, or one document at a time with
// open_revs where the source has no _bulk_get (or use_bulk_get is off).
func (r *Replication) fetch(ctx context.Context, diff map[string]couch.RevsDiff) ([]json.RawMessage, error) {
	missing := 0
	for _, d := range diff {
		missing += len(d.Missing)
	}
	r.stats.missingFound.Add(int64(missing))
	var revs []couch.Revision
	if r.Spec.Options.UseBulkGet && !r.bulkGetOff.Load() {
		req := make([]couch.DocRev, 0, missing)
		for id, d := range diff {
			for _, rev := range d.Missing {
				req = append(req, couch.DocRev{ID: id, Rev: rev})
			}
		}
		var err error
		revs, err = r.src.BulkGet(ctx, r.srcDB, req, true)
		if errors.Is(err, couch.ErrUnsupported) {
			r.Log.Info("the source has no _bulk_get; fetching with open_revs", "error", err)
			r.bulkGetOff.Store(true)
			revs = nil
		} else if err != nil {
			return nil, fmt.Errorf("source: _bulk_get: %w", err)
		}
	}
	if revs == nil {
		for id, d := range diff {
			got, err := r.src.OpenRevs(ctx, r.srcDB, id, d.Missing, true, nil)
			if err != nil {
				return nil, fmt.Errorf("source: open_revs of %s: %w", id, err)
			}
			revs = append(revs, got...)
		}
	}
	docs := make([]json.RawMessage, 0, len(revs))
	for _, rev := range revs {
		switch {
		case rev.Missing:
			// Gone since the changes feed listed it (compacted or
			// purged); its successor comes with a later change.
			r.Log.Debug("a revision went missing", "doc_id", rev.ID, "rev", rev.Rev)
		case rev.Err != "":
			return nil, fmt.Errorf("source: read %s %s: %s", rev.ID, rev.Rev, rev.Err)
		default:
			docs = append(docs, rev.Doc)
		}
	}
	return docs, nil
}

func (r *Replication) setSourceSeq(seq json.RawMessage) {
	r.mu.Lock()
	r.sourceSeq = seq
	r.mu.Unlock()
}

func (r *Replication) sourceSeqNow() json.RawMessage {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sourceSeq
}

// checkpoint records on both ends that every change up to seq is written.
func (r *Replication) checkpoint(ctx context.Context, seq json.RawMessage) error {
	if seq == nil || !r.Spec.Options.UseCheckpoints {
		return nil
	}
	r.mu.Lock()
	same := seqEqual(seq, r.checkpointed) && r.srcCP != nil && r.srcCP.SessionID == r.session
	r.mu.Unlock()
	if same {
		return nil
	}
	entry := HistoryEntry{
		SessionID: r.session, StartTime: httpTime(r.start), EndTime: httpTime(time.Now()),
		StartLastSeq: orZero(r.startSeq), EndLastSeq: seq, RecordedSeq: seq,
		MissingChecked: r.stats.revsChecked.Load(), MissingFound: r.stats.missingFound.Load(),
		DocsRead: r.stats.docsRead.Load(), DocsWritten: r.stats.docsWritten.Load(),
		DocWriteFailures: r.stats.writeFailures.Load(),
	}
	base := baseID(r.repID)
	for _, end := range []struct {
		c   *couch.Client
		db  string
		cp  **Checkpoint
		who string
	}{{r.src, r.srcDB, &r.srcCP, "source"}, {r.tgt, r.tgtDB, &r.tgtCP, "target"}} {
		cp := &Checkpoint{}
		if *end.cp != nil {
			cp.Rev, cp.History = (*end.cp).Rev, (*end.cp).History
		}
		cp.SessionID, cp.SourceLastSeq, cp.ReplicationIDVersion = r.session, seq, 4
		cp.History = withEntry(cp.History, entry)
		if err := writeCheckpoint(ctx, end.c, end.db, base, cp); err != nil {
			return fmt.Errorf("%s: %w", end.who, err)
		}
		*end.cp = cp
	}
	r.mu.Lock()
	r.checkpointed = seq
	r.mu.Unlock()
	return nil
}

func orZero(seq json.RawMessage) json.RawMessage {
	if seq == nil {
		return json.RawMessage("0")
	}
	return seq
}

// Stats returns the session's statistics.
func (r *Replication) Stats() Stats {
	r.mu.Lock()
	s := Stats{SourceSeq: r.sourceSeq, CheckpointedSourceSeq: r.checkpointed}
	r.mu.Unlock()
	s.DocsRead, s.DocsWritten = r.stats.docsRead.Load(), r.stats.docsWritten.Load()
	s.DocWriteFailures = r.stats.writeFailures.Load()
	s.MissingRevisionsFound, s.RevisionsChecked = r.stats.missingFound.Load(), r.stats.revsChecked.Load()
	return s
}

// report sends fresh statistics to Progress, with the changes pending
// estimated from the source's update sequence (numeric, or the number
// CouchDB's opaque sequences start with).
func (r *Replication) report(ctx context.Context) error {
	if r.Progress == nil {
		return nil
	}
	s := r.Stats()
	if info, err := r.src.DBInfo(ctx, r.srcDB); err == nil {
		seq := s.SourceSeq
		if seq == nil {
			seq = r.startSeq
		}
		if top, ok := seqNumber(info.UpdateSeq); ok {
			at, _ := seqNumber(seq)
			p := max(top-at, 0)
			s.ChangesPending = &p
		}
	}
	return r.Progress(ctx, r.repID, s)
}

// seqNumber reads a sequence's number: a JSON number, or the leading
// integer of a string ("12-g1AAAA..."); 0 for none.
func seqNumber(seq json.RawMessage) (int64, bool) {
	if len(seq) == 0 {
		return 0, true
	}
	var s string
	if json.Unmarshal(seq, &s) != nil {
		s = string(seq)
	}
	s, _, _ = strings.Cut(s, "-")
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}

// result is a finished one-shot session's answer, as CouchDB gives it.
func (r *Replication) result(endSeq json.RawMessage) *Result {
	if r.stats.revsChecked.Load() == 0 {
		return &Result{OK: true, NoChanges: true, SourceLastSeq: endSeq}
	}
	res := &Result{OK: true, SessionID: r.session, SourceLastSeq: endSeq, RepIDVersion: 4}
	if r.srcCP != nil {
		res.History = r.srcCP.History
	}
	return res
}
