package indexing

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/btree"
	"golang.org/x/sync/errgroup"

	"github.com/couchjobs/couchjobs/plugins/indexing/collate"
	"github.com/couchjobs/couchjobs/plugins/indexing/js"
	"github.com/couchjobs/couchjobs/plugins/internal/couch"
	"github.com/couchjobs/couchjobs/sdk"
)

// IndexData is an index job's data.
type IndexData struct {
	Server string `json:"server"`
	DB     string `json:"database"`
	Design Design `json:"design"`
	// ViewSeq is how far the index covers the database's changes.
	ViewSeq json.RawMessage `json:"view_seq,omitempty"`
	// Progress of the current build, as _active_tasks shows it.
	ChangesDone  int64 `json:"changes_done"`
	TotalChanges int64 `json:"total_changes"`
	// DocsIndexed counts documents mapped since the index was created;
	// MapErrors those a map function threw on (skipped, as CouchDB does).
	DocsIndexed  int64  `json:"docs_indexed"`
	MapErrors    int64  `json:"map_errors"`
	LastMapError string `json:"last_map_error,omitempty"`
	// Error is why the index cannot be built: a map function that ran
	// too long or emitted too much. Queries answer with it.
	Error string `json:"error,omitempty"`
	// Started is when the current build began (unix ms).
	Started int64 `json:"started_on,omitempty"`
}

// marker is the index's own record of what it holds, written with every
// batch: queries read it before and after reading rows to know they saw
// one state of the index.
type marker struct {
	Seq   json.RawMessage `json:"seq,omitempty"`
	Batch int64           `json:"batch"`
	// Rows counts each view's rows (total_rows).
	Rows []int64 `json:"rows"`
	// Error is why the index stopped (IndexData.Error), for queries.
	Error string `json:"error,omitempty"`
}

func readMarker(ctx context.Context, h *sdk.Host, ix index) (marker, bool, error) {
	b, err := h.Get(ctx, ix.marker())
	if err != nil || b == nil {
		return marker{}, false, err
	}
	var m marker
	if err := json.Unmarshal(b, &m); err != nil {
		return marker{}, false, fmt.Errorf("%w: marker: %v", errCorrupt, err)
	}
	return m, true, nil
}

// Limits of one store entry (runtime/kv: 10,000-byte keys, 100,000-byte
// values) less room for the subspace prefixes.
const (
	maxRowKey   = 9_000
	maxRowValue = 99_000
	backChunk   = 90_000
)

// errRunaway stops a build: a map function ran too long, emitted too
// much or used too much memory, and every later run would again.
var errRunaway = errors.New("the map function was stopped")

// builder is one run of an index job.
type builder struct {
	p     *plugin
	job   *sdk.Job
	data  IndexData
	c     *couch.Client
	ix    index
	views []view
	maps  []*js.Map
	mark  marker
	// fresh: the index was empty when this run began, so a document not
	// yet seen in this run has no rows to remove.
	fresh bool
	seen  map[string]struct{}
	// cache holds levels 1 and up of every view's tree: the run is the
	// index's only writer, so its copy stays true, and updating a node
	// reads its children from memory.
	cache [][]*btree.BTreeG[entry]
	log   func(msg string, args ...any)
}

func entryLess(a, b entry) bool { return bytes.Compare(a.k, b.k) < 0 }

// docWork is one document of a batch.
type docWork struct {
	id   string
	seq  json.RawMessage // of its last change
	rows []docRows       // per view; nil for a deleted document
	old  [][]byte        // its back-index entries before the batch
	had  bool
}

// change is one document to (re)index.
type change struct {
	id      string
	deleted bool
	doc     json.RawMessage
	seq     json.RawMessage
}

// maxBatchWrites bounds the estimated bytes a batch writes: the store's
// transactions hold 10 MB (FoundationDB's limit, which the embedded store
// keeps too).
const maxBatchWrites = 8 << 20

// errBatchTooLarge: the batch's writes would not fit one transaction.
var errBatchTooLarge = errors.New("the batch's writes are too large for one transaction")

// commitBatch maps a batch of changes (the last change of a document
// wins) and commits it, up to seq.
func (b *builder) commitBatch(ctx context.Context, batch []change, seq json.RawMessage) error {
	last := make(map[string]int, len(batch))
	for i, ch := range batch {
		last[ch.id] = i
	}
	work := make([]*docWork, 0, len(last))
	for i, ch := range batch {
		if last[ch.id] != i {
			continue
		}
		w := &docWork{id: ch.id, seq: ch.seq}
		if !ch.deleted && (!isDesign(ch.id) || b.data.Design.IncludeDesign) && len(ch.doc) > 0 {
			rows, err := b.mapDoc(ch.id, ch.doc)
			if err != nil {
				return err
			}
			w.rows = rows
		}
		work = append(work, w)
	}
	return b.commitSplit(ctx, work, seq, len(batch))
}

// commitSplit commits mapped documents, in halves while they are too
// large for one transaction. A first half commits up to its last
// document's sequence: a document whose earlier change it skipped has its
// last change in the second half, after that sequence, so a run resumed
// between the halves still sees it.
func (b *builder) commitSplit(ctx context.Context, work []*docWork, seq json.RawMessage, changes int) error {
	err := b.commit(ctx, work, seq, changes)
	if !errors.Is(err, errBatchTooLarge) || len(work) < 2 {
		return err
	}
	mid := len(work) / 2
	first := changes * mid / len(work)
	if err := b.commitSplit(ctx, work[:mid], work[mid-1].seq, first); err != nil {
		return err
	}
	return b.commitSplit(ctx, work[mid:], seq, changes-first)
}

// build runs an index job: it indexes the database's changes from the
// index's view_seq to the current end of the feed, batch by batch, then
// completes. A query that wants newer rows re-adds the job.
func (p *plugin) build(ctx context.Context, job *sdk.Job) error {
	b := &builder{p: p, job: job}
	if err := job.Decode(&b.data); err != nil {
		return sdk.Fail(err)
	}
	log := p.log.With("type", job.Type, "id", job.ID)
	b.log = log.Warn
	d := b.data
	if d.Error != "" {
		return sdk.Failf("%s", d.Error)
	}
	if b.c = p.cfg.clients[d.Server]; b.c == nil {
		return sdk.Failf("server %q is not in plugins.indexing.config.servers", d.Server)
	}
	if d.Design.Sig == "" {
		return sdk.Failf("the job's design document has no views")
	}
	var err error
	if b.views, err = d.Design.views(p.cfg.limits); err != nil {
		return sdk.Fail(err)
	}
	for _, v := range b.views {
		m, err := js.CompileMap(v.def.Map, p.cfg.limits, func(msg string) {
			log.Info("map function log", "view", v.name, "message", msg)
		})
		if err != nil {
			return sdk.Failf("view %s: %v", v.name, err)
		}
		b.maps = append(b.maps, m)
	}
	b.ix = newIndex(d.Server, d.DB, d.Design.Sig)
	mark, found, err := readMarker(ctx, p.host, b.ix)
	if err != nil {
		return err
	}
	if found {
		// The marker is the truth of what the index holds, even if the
		// job was re-added with older data.
		b.mark, b.data.ViewSeq = mark, mark.Seq
	} else {
		b.fresh, b.seen = true, map[string]struct{}{}
	}
	for len(b.mark.Rows) < len(b.views) {
		b.mark.Rows = append(b.mark.Rows, 0)
	}
	if err := b.loadCache(ctx); err != nil {
		return err
	}
	b.data.ChangesDone, b.data.Started = 0, time.Now().UnixMilli()
	b.data.TotalChanges = b.pending(ctx)
	log.Info("building", "database", d.DB, "since", string(b.data.ViewSeq), "changes", b.data.TotalChanges)

	var batch []change
	var batchBytes int
	started := time.Now()
	lastSeq := b.data.ViewSeq
	flush := func() error {
		err := b.commitBatch(ctx, batch, lastSeq)
		batch, batchBytes, started = batch[:0], 0, time.Now()
		return err
	}
	end, err := b.c.Feed(ctx, d.DB, couch.FeedOptions{Since: b.data.ViewSeq, IncludeDocs: true}, func(ch couch.Change) error {
		batch = append(batch, change{id: ch.ID, deleted: ch.Deleted, doc: ch.Doc, seq: ch.Seq})
		batchBytes += len(ch.Doc)
		lastSeq = ch.Seq
		if len(batch) >= p.cfg.BatchDocs || batchBytes >= p.cfg.batchBytes || time.Since(started) >= p.cfg.batchTime {
			return flush()
		}
		return nil
	})
	if err == nil && len(end.LastSeq) > 0 {
		lastSeq = end.LastSeq
	}
	if err == nil && (len(batch) > 0 || !bytes.Equal(lastSeq, b.data.ViewSeq)) {
		err = flush()
	}
	switch {
	case errors.Is(err, errRunaway):
		// Record the error where queries look, then fail: every later
		// run would stop the same way.
		b.data.Error, b.mark.Error = err.Error(), err.Error()
		mb, _ := json.Marshal(b.mark)
		if uerr := b.job.Update(ctx, sdk.Update{Data: b.data, Writes: []sdk.Write{sdk.Set(b.ix.marker(), mb)}}); uerr != nil {
			return uerr
		}
		log.Error("index stopped", "error", err)
		return sdk.Fail(err)
	case err != nil:
		if _, stopped := sdk.Stopped(ctx); !stopped {
			log.Warn("build failed", "error", err)
		}
		return err
	}
	log.Info("index up to date", "view_seq", string(b.data.ViewSeq), "changes", b.data.ChangesDone)
	return b.job.SetResult(b.data)
}

// pending estimates the changes still to index, for progress.
func (b *builder) pending(ctx context.Context) int64 {
	if b.fresh {
		if info, err := b.c.DBInfo(ctx, b.data.DB); err == nil {
			return info.DocCount + info.DocDelCount
		}
	}
	ch, err := b.c.Changes(ctx, b.data.DB, couch.ChangesOptions{Since: b.data.ViewSeq, Limit: 1})
	if err != nil {
		return 0
	}
	return ch.Pending + int64(len(ch.Results))
}

// loadCache reads levels 1 and up of every view.
func (b *builder) loadCache(ctx context.Context) error {
	rd := storeReader{host: b.p.host, ix: b.ix}
	b.cache = make([][]*btree.BTreeG[entry], len(b.views))
	for v := range b.views {
		b.cache[v] = make([]*btree.BTreeG[entry], maxLevel+1)
		for l := 1; l <= maxLevel; l++ {
			t := btree.NewG(32, entryLess)
			if !b.fresh {
				es, err := rd.scan(ctx, v, l, nil, nil)
				if err != nil {
					return err
				}
				for _, e := range es {
					t.ReplaceOrInsert(e)
				}
			}
			b.cache[v][l] = t
		}
	}
	return nil
}

// docRows are the rows one document emits in one view.
type docRows struct {
	rks  [][]byte
	vals [][]byte
}

// commit indexes a batch of changes and commits its writes with the job
// update that advances view_seq to seq.
func (b *builder) commit(ctx context.Context, work []*docWork, seq json.RawMessage, changes int) error {
	// Nothing has changed yet: a batch too large for one transaction can
	// still be split.
	size := 0
	for _, w := range work {
		size += 1 << 10
		for _, dr := range w.rows {
			for i, rk := range dr.rks {
				size += 2*len(rk) + len(dr.vals[i])
			}
		}
	}
	if size > maxBatchWrites {
		if len(work) > 1 {
			return fmt.Errorf("%w: about %d bytes for %d documents", errBatchTooLarge, size, len(work))
		}
		// One document alone is too large: it is skipped, as a map error.
		for v := range b.views {
			b.mapError(v, work[0].id, fmt.Errorf("its rows, about %d bytes, do not fit one transaction", size))
		}
		work[0].rows = nil
	}
	// Each document's old rows, from the back-index.
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	for _, w := range work {
		if b.fresh {
			if _, ok := b.seen[w.id]; !ok {
				continue
			}
		}
		g.Go(func() error {
			kvs, err := b.p.host.Range(gctx, b.ix.backPrefix(w.id), strinc(b.ix.backPrefix(w.id)), 0, false)
			if err != nil {
				return fmt.Errorf("read the back-index of %q: %w", w.id, err)
			}
			var all []byte
			for _, kv := range kvs {
				all = append(all, kv.Value...)
			}
			w.had = len(kvs) > 0
			w.old, err = decodeBack(all)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}

	var writes []sdk.Write
	pending := make([]map[string][]byte, len(b.views)) // level 0 changes: nil = removed
	changed := make([]map[string]bool, len(b.views))   // level 0 keys changed: exists after?
	for v := range b.views {
		pending[v], changed[v] = map[string][]byte{}, map[string]bool{}
	}
	for _, w := range work {
		for _, o := range w.old {
			v, rk := int(o[0]), o[1:]
			if v >= len(b.views) {
				return fmt.Errorf("%w: back-index of %q names view %d", errCorrupt, w.id, v)
			}
			b.mark.Rows[v]--
			pending[v][string(rk)] = nil
			changed[v][string(rk)] = false
		}
		var back [][]byte
		for v, dr := range w.rows {
			b.mark.Rows[v] += int64(len(dr.rks))
			for i, rk := range dr.rks {
				pending[v][string(rk)] = dr.vals[i]
				changed[v][string(rk)] = true
				back = append(back, append([]byte{byte(v)}, rk...))
			}
		}
		if w.had {
			writes = append(writes, sdk.ClearRange(b.ix.backPrefix(w.id), strinc(b.ix.backPrefix(w.id))))
		}
		for i, chunk := range encodeBack(back) {
			writes = append(writes, sdk.Set(b.ix.back(w.id, i), chunk))
		}
		if b.fresh {
			b.seen[w.id] = struct{}{}
		}
	}
	// Rows, then the trees, view by view.
	for v := range b.views {
		for k, val := range pending[v] {
			key := append(b.ix.level(v, 0), k...)
			if val == nil {
				writes = append(writes, sdk.Clear(key))
				continue
			}
			writes = append(writes, sdk.Set(key, val))
		}
		tw, err := b.updateTree(ctx, v, changed[v], pending[v])
		if err != nil {
			return err
		}
		writes = append(writes, tw...)
	}
	b.mark.Seq, b.mark.Batch = seq, b.mark.Batch+1
	mb, _ := json.Marshal(b.mark)
	writes = append(writes, sdk.Set(b.ix.marker(), mb))
	b.data.ViewSeq = seq
	b.data.ChangesDone += int64(changes)
	b.data.DocsIndexed += int64(len(work))
	if b.data.TotalChanges < b.data.ChangesDone {
		b.data.TotalChanges = b.data.ChangesDone
	}
	frac := -1.0
	if b.data.TotalChanges > 0 {
		frac = float64(b.data.ChangesDone) / float64(b.data.TotalChanges)
	}
	err := b.job.Update(ctx, sdk.Update{Data: b.data, Writes: writes, Fraction: frac,
		Message: fmt.Sprintf("%d of %d changes", b.data.ChangesDone, b.data.TotalChanges)})
	if err != nil {
		return fmt.Errorf("commit a batch of %d documents: %w", len(work), err)
	}
	return nil
}

// mapDoc runs every view's map function on a document. A function that
// throws skips the document in that view (logged, counted); one that runs
// too long, emits too much or uses too much memory stops the build.
func (b *builder) mapDoc(id string, doc []byte) ([]docRows, error) {
	out := make([]docRows, len(b.views))
	for v, m := range b.maps {
		rows, err := m.Run(doc)
		switch {
		case errors.Is(err, js.ErrTimeout), errors.Is(err, js.ErrTooLarge), errors.Is(err, js.ErrTooMuchMemory):
			return nil, fmt.Errorf("%w: view %s on document %q: %v", errRunaway, b.views[v].name, id, err)
		case err != nil:
			b.mapError(v, id, err)
			continue
		}
		dr := docRows{rks: make([][]byte, 0, len(rows)), vals: make([][]byte, 0, len(rows))}
		dups := map[string]int{}
		ok := true
		for _, r := range rows {
			ck, err := collate.Key(r.Key)
			if err != nil {
				b.mapError(v, id, err)
				ok = false
				break
			}
			n := dups[string(ck)]
			dups[string(ck)] = n + 1
			rk := rowKey(ck, id, n)
			val := encodeRow(id, r.Key, r.Value)
			if len(rk) > maxRowKey || len(val) > maxRowValue {
				b.mapError(v, id, fmt.Errorf("a row of %d key bytes and %d value bytes is over the store's limits (%d, %d)", len(rk), len(val), maxRowKey, maxRowValue))
				ok = false
				break
			}
			dr.rks, dr.vals = append(dr.rks, rk), append(dr.vals, val)
		}
		if ok {
			out[v] = dr
		}
	}
	return out, nil
}

func (b *builder) mapError(v int, id string, err error) {
	b.data.MapErrors++
	b.data.LastMapError = fmt.Sprintf("view %s, document %q: %v", b.views[v].name, id, err)
	b.log("map function failed on a document; skipped", "view", b.views[v].name, "doc", id, "error", err)
}

// encodeBack packs a document's back-index entries (view byte + row key)
// into values of at most backChunk bytes.
func encodeBack(entries [][]byte) [][]byte {
	var chunks [][]byte
	var cur []byte
	for _, e := range entries {
		if len(cur) > 0 && len(cur)+len(e)+4 > backChunk {
			chunks, cur = append(chunks, cur), nil
		}
		cur = binary.AppendUvarint(cur, uint64(len(e)))
		cur = append(cur, e...)
	}
	if len(cur) > 0 {
		chunks = append(chunks, cur)
	}
	return chunks
}

func decodeBack(b []byte) ([][]byte, error) {
	var out [][]byte
	for len(b) > 0 {
		n, w := binary.Uvarint(b)
		if w <= 0 || n == 0 || uint64(len(b)-w) < n {
			return nil, fmt.Errorf("%w: back-index", errCorrupt)
		}
		out = append(out, b[w:w+int(n)])
		b = b[w+int(n):]
	}
	return out, nil
}
