package indexing

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/couchjobs/couchjobs/plugins/indexing/collate"
	"github.com/couchjobs/couchjobs/plugins/internal/couch"
	"github.com/couchjobs/couchjobs/sdk"
)

func (p *plugin) routes() []sdk.Route {
	h := http.HandlerFunc(p.serveView)
	return []sdk.Route{
		{Pattern: "GET /{db}/_design/{ddoc}/_view/{view}", Handler: h},
		{Pattern: "POST /{db}/_design/{ddoc}/_view/{view}", Handler: h},
		{Pattern: "GET /_active_tasks", Handler: http.HandlerFunc(p.activeTasks)},
	}
}

// httpError is an answer in CouchDB's error shape.
type httpError struct {
	status        int
	error, reason string
}

func (e *httpError) Error() string { return e.error + ": " + e.reason }

func badQuery(format string, args ...any) error {
	return &httpError{http.StatusBadRequest, "query_parse_error", fmt.Sprintf(format, args...)}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, err error) {
	var he *httpError
	if !errors.As(err, &he) {
		he = &httpError{http.StatusInternalServerError, "internal_error", err.Error()}
	}
	writeJSON(w, he.status, map[string]string{"error": he.error, "reason": he.reason})
}

// viewQuery is a query's parameters.
type viewQuery struct {
	key, startKey, endKey  json.RawMessage
	keys                   []json.RawMessage
	hasKeys                bool
	startDocID, endDocID   *string
	inclusiveEnd           bool
	descending             bool
	limit, skip            int
	includeDocs, updateSeq bool
	reduce                 *bool
	group                  bool
	groupLevel             int // -1: not set
	update                 string
}

// parseQuery reads the query string and, for POST, the body's fields
// (the same names, as JSON values).
func parseQuery(r *http.Request) (*viewQuery, error) {
	params := map[string]string{}
	for k, v := range r.URL.Query() {
		params[k] = v[len(v)-1]
	}
	if r.Method == http.MethodPost {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return nil, badQuery("read the body: %v", err)
		}
		if len(bytes.TrimSpace(body)) > 0 {
			var fields map[string]json.RawMessage
			if err := json.Unmarshal(body, &fields); err != nil {
				return nil, &httpError{http.StatusBadRequest, "bad_request", "the body must be a JSON object: " + err.Error()}
			}
			for k, v := range fields {
				s := string(v)
				if k == "update" || k == "stale" || strings.HasSuffix(k, "docid") || strings.HasSuffix(k, "doc_id") {
					var str string
					if json.Unmarshal(v, &str) == nil {
						s = str
					}
				}
				params[k] = s
			}
		}
	}
	q := &viewQuery{inclusiveEnd: true, limit: -1, groupLevel: -1, update: "true"}
	jsonParam := func(name, s string) (json.RawMessage, error) {
		if !json.Valid([]byte(s)) {
			return nil, badQuery("%s: %q is not JSON (strings need quotes)", name, s)
		}
		return json.RawMessage(s), nil
	}
	boolParam := func(name, s string) (bool, error) {
		switch s {
		case "true":
			return true, nil
		case "false":
			return false, nil
		}
		return false, badQuery("%s: %q: want true or false", name, s)
	}
	intParam := func(name, s string) (int, error) {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return 0, badQuery("%s: %q: want a non-negative integer", name, s)
		}
		return n, nil
	}
	var err error
	for name, s := range params {
		switch name {
		case "key":
			q.key, err = jsonParam(name, s)
		case "keys":
			q.hasKeys = true
			if err = json.Unmarshal([]byte(s), &q.keys); err != nil {
				err = badQuery("keys: %.60q is not a JSON array", s)
			}
		case "startkey", "start_key":
			q.startKey, err = jsonParam(name, s)
		case "endkey", "end_key":
			q.endKey, err = jsonParam(name, s)
		case "startkey_docid", "start_key_doc_id":
			q.startDocID = &s
		case "endkey_docid", "end_key_doc_id":
			q.endDocID = &s
		case "inclusive_end":
			q.inclusiveEnd, err = boolParam(name, s)
		case "descending":
			q.descending, err = boolParam(name, s)
		case "limit":
			q.limit, err = intParam(name, s)
		case "skip":
			q.skip, err = intParam(name, s)
		case "include_docs":
			q.includeDocs, err = boolParam(name, s)
		case "update_seq":
			q.updateSeq, err = boolParam(name, s)
		case "reduce":
			var b bool
			b, err = boolParam(name, s)
			q.reduce = &b
		case "group":
			q.group, err = boolParam(name, s)
		case "group_level":
			q.groupLevel, err = intParam(name, s)
		case "update":
			if s != "true" && s != "false" && s != "lazy" {
				err = badQuery("update: %q: want true, false or lazy", s)
			}
			q.update = s
		case "stale":
			switch s {
			case "ok":
				q.update = "false"
			case "update_after":
				q.update = "lazy"
			default:
				err = badQuery("stale: %q: want ok or update_after", s)
			}
		case "conflicts", "attachments", "att_encoding_info", "sorted", "stable", "local_seq":
			// Accepted and without effect here, as for most CouchDB views.
		default:
			err = badQuery("unknown parameter %q", name)
		}
		if err != nil {
			return nil, err
		}
	}
	if q.hasKeys && (q.key != nil || q.startKey != nil || q.endKey != nil) {
		return nil, badQuery("keys is incompatible with key, startkey and endkey")
	}
	if q.key != nil {
		q.startKey, q.endKey = q.key, q.key
	}
	return q, nil
}

// span is a range of row keys [lo, hi) (nil: unbounded), read in order
// or in reverse.
type span struct{ lo, hi []byte }

// spans turns the key parameters into ranges, in the order rows come.
func (q *viewQuery) spans() ([]span, error) {
	if q.hasKeys {
		out := make([]span, len(q.keys))
		for i, k := range q.keys {
			ck, err := collate.Key(k)
			if err != nil {
				return nil, badQuery("keys: %v", err)
			}
			out[i] = span{ck, strinc(ck)}
		}
		return out, nil
	}
	var sk, ek []byte
	var err error
	if q.startKey != nil {
		if sk, err = collate.Key(q.startKey); err != nil {
			return nil, badQuery("startkey: %v", err)
		}
	}
	if q.endKey != nil {
		if ek, err = collate.Key(q.endKey); err != nil {
			return nil, badQuery("endkey: %v", err)
		}
	}
	if sk != nil && ek != nil {
		c := bytes.Compare(sk, ek)
		if (!q.descending && c > 0) || (q.descending && c < 0) {
			return nil, badQuery("no rows can match your key range, reverse your startkey and endkey or set descending=%v", !q.descending)
		}
	}
	withID := func(ck []byte, id *string) []byte {
		if id == nil {
			return ck
		}
		return part(bytes.Clone(ck), *id)
	}
	var s span
	if !q.descending {
		if sk != nil {
			s.lo = withID(sk, q.startDocID)
		}
		if ek != nil {
			s.hi = withID(ek, q.endDocID)
			if q.inclusiveEnd {
				s.hi = strinc(s.hi)
			}
		}
	} else {
		if sk != nil {
			s.hi = strinc(withID(sk, q.startDocID))
		}
		if ek != nil {
			s.lo = withID(ek, q.endDocID)
			if !q.inclusiveEnd {
				s.lo = strinc(s.lo)
			}
		}
	}
	return []span{s}, nil
}

// serveView answers GET and POST /{db}/_design/{ddoc}/_view/{view}.
func (p *plugin) serveView(w http.ResponseWriter, r *http.Request) {
	out, err := p.queryView(r)
	if err != nil && r.Context().Err() == nil && (errors.Is(err, context.DeadlineExceeded) || status.Code(err) == codes.DeadlineExceeded) {
		err = &httpError{http.StatusGatewayTimeout, "timeout", fmt.Sprintf("no answer within query_timeout (%v): the index is still being built", p.cfg.query)}
	}
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func (p *plugin) queryView(r *http.Request) (any, error) {
	if p.cfg == nil {
		return nil, &httpError{http.StatusServiceUnavailable, "unavailable", "the indexing plugin is not configured"}
	}
	db, ok := p.cfg.byName[r.PathValue("db")]
	if !ok {
		return nil, &httpError{http.StatusNotFound, "not_found", fmt.Sprintf("database %q is not indexed here (plugins.indexing.config.databases)", r.PathValue("db"))}
	}
	q, err := parseQuery(r)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(r.Context(), p.cfg.query)
	defer cancel()
	design, err := p.design(ctx, db, "_design/"+r.PathValue("ddoc"), q.update != "false")
	if err != nil {
		return nil, err
	}
	vs, err := design.views(p.cfg.limits)
	if err != nil {
		return nil, err
	}
	i := slices.IndexFunc(vs, func(v view) bool { return v.name == r.PathValue("view") })
	if i < 0 {
		return nil, &httpError{http.StatusNotFound, "not_found", "missing_named_view"}
	}
	v := vs[i]
	reduce := v.red != nil
	if q.reduce != nil {
		if *q.reduce && v.red == nil {
			return nil, badQuery("reduce is invalid for map-only views")
		}
		reduce = *q.reduce
	}
	grouping := q.group || q.groupLevel >= 0
	switch {
	case grouping && v.red == nil:
		return nil, badQuery("invalid use of grouping on a map view")
	case grouping && !reduce:
		return nil, badQuery("group and group_level are invalid when reduce=false")
	case reduce && q.includeDocs:
		return nil, badQuery("include_docs is invalid for reduce")
	case reduce && q.hasKeys && !grouping:
		return nil, badQuery("multi-key fetches for reduce views must use group=true")
	}
	spans, err := q.spans()
	if err != nil {
		return nil, err
	}
	ix := newIndex(db.Server, db.DB, design.Sig)
	if err := p.freshen(ctx, db, design, ix, q.update); err != nil {
		return nil, err
	}
	// Read the rows between two reads of the marker: if a batch
	// committed meanwhile, read again, so that the answer is one state
	// of the index.
	var out map[string]any
	for attempt := 0; ; attempt++ {
		before, _, err := readMarker(ctx, p.host, ix)
		if err != nil {
			return nil, err
		}
		rd := storeReader{host: p.host, ix: ix}
		v.rows = -1
		if v.num < len(before.Rows) {
			v.rows = before.Rows[v.num]
		}
		if reduce {
			out, err = reduceQuery(ctx, rd, v, q, spans)
		} else {
			out, err = mapQuery(ctx, rd, v, q, spans, before)
		}
		if err != nil {
			return nil, err
		}
		after, _, err := readMarker(ctx, p.host, ix)
		if err != nil {
			return nil, err
		}
		if after.Batch == before.Batch || attempt == 3 {
			if q.updateSeq {
				out["update_seq"] = after.Seq
			}
			break
		}
	}
	if q.includeDocs {
		if err := includeDocs(ctx, p.cfg.clients[db.Server], db.DB, out["rows"].([]map[string]any)); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// mapQuery reads rows.
func mapQuery(ctx context.Context, rd storeReader, v view, q *viewQuery, spans []span, m marker) (map[string]any, error) {
	// CouchDB's offset, the rows before the range, is a count from the
	// tree; it is read while the rows are.
	type count struct {
		n   uint64
		err error
	}
	offset := make(chan count, 1)
	go func() {
		counter := view{num: v.num, rows: v.rows}
		var p partial
		var err error
		switch {
		case q.hasKeys:
		case !q.descending && spans[0].lo != nil:
			p, err = aggregate(ctx, rd, counter, nil, spans[0].lo)
		case q.descending && spans[0].hi != nil:
			p, err = aggregate(ctx, rd, counter, spans[0].hi, nil)
		}
		offset <- count{p.count, err}
	}()
	rows := []map[string]any{}
	skip := q.skip
	var err error
	for _, s := range spans {
		if q.limit >= 0 && len(rows) >= q.limit {
			break
		}
		page := 0
		if q.limit >= 0 {
			page = min(skip+q.limit-len(rows)+1, maxPage)
		}
		err = rd.each(ctx, v.num, 0, s.lo, s.hi, q.descending, page, func(e entry) (bool, error) {
			if skip > 0 {
				skip--
				return true, nil
			}
			r, err := decodeRow(e.k, e.v)
			if err != nil {
				return false, err
			}
			rows = append(rows, map[string]any{"id": r.docID, "key": r.key, "value": r.value})
			return q.limit < 0 || len(rows) < q.limit, nil
		})
		if err != nil {
			break
		}
	}
	before := <-offset
	if err == nil {
		err = before.err
	}
	if err != nil {
		return nil, err
	}
	var total int64
	if v.num < len(m.Rows) {
		total = m.Rows[v.num]
	}
	out := map[string]any{"total_rows": total, "rows": rows}
	if !q.hasKeys {
		out["offset"] = min(int64(before.n)+int64(q.skip), total)
	}
	return out, nil
}

// reduceQuery reduces, whole or by group.
func reduceQuery(ctx context.Context, rd storeReader, v view, q *viewQuery, spans []span) (map[string]any, error) {
	rows := []map[string]any{}
	emit := func(key json.RawMessage, p partial) error {
		if p.count == 0 {
			return nil
		}
		if p.err != "" {
			return &httpError{http.StatusInternalServerError, "reduce_error", p.err}
		}
		val, err := v.red.final(p.value)
		if err != nil {
			return &httpError{http.StatusInternalServerError, "reduce_error", err.Error()}
		}
		rows = append(rows, map[string]any{"key": key, "value": val})
		return nil
	}
	level := q.groupLevel
	if q.group && level < 0 {
		level = exactGroup
	}
	if level < 0 || level == 0 {
		p, err := aggregate(ctx, rd, v, spans[0].lo, spans[0].hi)
		if err != nil {
			return nil, err
		}
		if q.skip == 0 && q.limit != 0 {
			if err := emit(json.RawMessage("null"), p); err != nil {
				return nil, err
			}
		}
		return map[string]any{"rows": rows}, nil
	}
	skip := q.skip
	for _, s := range spans {
		err := eachGroup(ctx, rd, v, s, q.descending, level, func(key json.RawMessage, p partial) (bool, error) {
			if p.count == 0 {
				return true, nil
			}
			if skip > 0 {
				skip--
				return true, nil
			}
			if err := emit(key, p); err != nil {
				return false, err
			}
			return q.limit < 0 || len(rows) < q.limit, nil
		})
		if err != nil {
			return nil, err
		}
		if q.limit >= 0 && len(rows) >= q.limit {
			break
		}
	}
	return map[string]any{"rows": rows}, nil
}

// exactGroup is group=true: every distinct key is a group.
const exactGroup = 1 << 30

// groupOf is a row's group at a level: the prefix of the row keys in the
// group, read from the row key without decoding it.
func groupOf(rk []byte, level int) ([]byte, error) {
	n := level
	if level == exactGroup {
		n = -1
	}
	value, elems, err := collate.Prefix(rk, n)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errCorrupt, err)
	}
	if elems >= 0 {
		return rk[:elems], nil // without the array's end: longer arrays too
	}
	return rk[:value], nil
}

// groupKey is the key a group's row shows: the row's key, or an array
// key's first elements.
func groupKey(key json.RawMessage, level int) json.RawMessage {
	if level == exactGroup {
		return key
	}
	var elems []json.RawMessage
	if t := bytes.TrimSpace(key); len(t) > 0 && t[0] == '[' && json.Unmarshal(key, &elems) == nil && len(elems) > level {
		gk, _ := json.Marshal(elems[:level])
		return gk
	}
	return key
}

// maxPage is the most entries the host returns per read.
const maxPage = 10_000

// eachGroup reads pages of minGroupPage to maxGroupPage rows; a group
// that runs past a page is reduced through the tree instead.
const (
	minGroupPage = 256
	maxGroupPage = 2000
)

// eachGroup calls fn with each group's key and partial, in order.
//
// Rows are read in pages, which grow while groups fit in them. A group
// that fills a page is reduced through the tree instead (about 2 × depth
// reads, whatever its size) and the scan seeks past it; the next page is
// then sized from that group's row count, so a run of large groups costs
// a short read and a descent each. Tree reductions run concurrently (a
// few at a time) while the scan goes on; fn still sees groups in order.
func eachGroup(ctx context.Context, rd storeReader, v view, s span, reverse bool, level int, fn func(json.RawMessage, partial) (bool, error)) error {
	type group struct {
		key  json.RawMessage
		p    partial
		err  error
		done chan struct{}
	}
	var queue []*group
	ctx, cancel := context.WithCancel(ctx)
	defer func() {
		// Stop the reductions still running, and wait for them.
		cancel()
		for _, g := range queue {
			<-g.done
		}
	}()
	sem := make(chan struct{}, treeReductions)
	// deliver hands finished groups to fn in order; with wait, it waits
	// for all of them.
	deliver := func(wait bool) (bool, error) {
		for len(queue) > 0 {
			g := queue[0]
			if !wait && len(queue) < 2*treeReductions {
				select {
				case <-g.done:
				default:
					return true, nil
				}
			}
			<-g.done
			queue = queue[1:]
			if g.err != nil {
				return false, g.err
			}
			if more, err := fn(g.key, g.p); err != nil || !more {
				return false, err
			}
		}
		return true, nil
	}
	ready := func(key json.RawMessage, p partial) {
		g := &group{key: key, p: p, done: make(chan struct{})}
		close(g.done)
		queue = append(queue, g)
	}
	lo, hi := s.lo, s.hi
	size := minGroupPage
	for {
		if more, err := deliver(false); err != nil || !more {
			return err
		}
		var page []row
		err := rd.each(ctx, v.num, 0, lo, hi, reverse, size, func(e entry) (bool, error) {
			r, err := decodeRow(e.k, e.v)
			page = append(page, r)
			return len(page) < size, err
		})
		if err != nil {
			return err
		}
		if len(page) == 0 {
			break
		}
		full := len(page) == size
		size = min(size*2, maxGroupPage)
		for i := 0; i < len(page); {
			gp, err := groupOf(page[i].rk, level)
			if err != nil {
				return err
			}
			gk := groupKey(page[i].key, level)
			j := i + 1
			for ; j < len(page); j++ {
				if !bytes.HasPrefix(page[j].rk, gp) {
					break
				}
			}
			if j < len(page) || !full {
				ready(gk, reduceRows(v.red, page[i:j]))
				i = j
				continue
			}
			if i > 0 {
				// The group may go on past the page: read it whole with
				// the next (larger) page.
				if reverse {
					hi = append(bytes.Clone(page[i].rk), 0)
				} else {
					lo = page[i].rk
				}
				break
			}
			// The group fills the page and may go on: reduce it through
			// the tree, and go on after it.
			glo, ghi := gp, strinc(gp)
			if lo != nil && bytes.Compare(glo, lo) < 0 {
				glo = lo
			}
			if hi != nil && bytes.Compare(ghi, hi) > 0 {
				ghi = hi
			}
			g := &group{key: gk, done: make(chan struct{})}
			queue = append(queue, g)
			sem <- struct{}{}
			go func() {
				defer func() { <-sem; close(g.done) }()
				g.p, g.err = aggregate(ctx, rd, v, glo, ghi)
			}()
			if reverse {
				hi = glo
			} else {
				lo = ghi
			}
			// The next group may be as large: read only a few rows.
			size = afterTreePage
			break
		}
		if !full || (hi != nil && lo != nil && bytes.Compare(lo, hi) >= 0) {
			break
		}
	}
	_, err := deliver(true)
	return err
}

// afterTreePage is the page read after a group reduced through the tree.
const afterTreePage = 16

// treeReductions is how many groups eachGroup reduces through the tree at
// once.
const treeReductions = 8

// includeDocs adds each row's document: the one it came from, or the one
// its value links to with {"_id": ...}, as CouchDB does.
func includeDocs(ctx context.Context, c *couch.Client, db string, rows []map[string]any) error {
	ids := make([]string, len(rows))
	for i, r := range rows {
		ids[i] = r["id"].(string)
		var link struct {
			ID string `json:"_id"`
		}
		if val, ok := r["value"].(json.RawMessage); ok && json.Unmarshal(val, &link) == nil && link.ID != "" {
			ids[i] = link.ID
		}
	}
	uniq := slices.Clone(ids)
	slices.Sort(uniq)
	docs, err := c.DocsByID(ctx, db, slices.Compact(uniq))
	if err != nil {
		return fmt.Errorf("include_docs: %w", err)
	}
	for i, r := range rows {
		if d := docs[ids[i]]; d != nil {
			r["doc"] = d
		} else {
			r["doc"] = nil
		}
	}
	return nil
}

// designCache keeps parsed design documents by revision: parsing
// compiles every function.
type designCache struct {
	mu sync.Mutex
	m  map[string]Design
}

func (c *designCache) get(key string) (Design, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	d, ok := c.m[key]
	return d, ok
}

func (c *designCache) put(key string, d Design) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) > 1000 {
		c.m = map[string]Design{}
	}
	c.m[key] = d
}

// design finds a design document: from the source when the query wants
// a fresh index (the watcher may not have seen a new revision yet),
// otherwise from the watcher's record.
func (p *plugin) design(ctx context.Context, db Database, id string, fromSource bool) (Design, error) {
	missing := &httpError{http.StatusNotFound, "not_found", "missing"}
	if !fromSource {
		d, err := p.readDesign(ctx, db.Server, db.DB, id)
		if err != nil {
			return Design{}, err
		}
		if d != nil {
			return checkDesign(*d)
		}
	}
	var raw json.RawMessage
	err := p.cfg.clients[db.Server].Get(ctx, db.DB, id, &raw)
	if errors.Is(err, couch.ErrNotFound) {
		return Design{}, missing
	}
	if err != nil {
		return Design{}, fmt.Errorf("read %s: %w", id, err)
	}
	var meta struct {
		Rev string `json:"_rev"`
	}
	json.Unmarshal(raw, &meta)
	key := db.Server + "\x00" + db.DB + "\x00" + id + "\x00" + meta.Rev
	d, ok := p.designs.get(key)
	if !ok {
		d = parseDesign(id, raw, p.cfg.limits)
		p.designs.put(key, d)
	}
	return checkDesign(d)
}

func checkDesign(d Design) (Design, error) {
	if d.Error != "" {
		return d, &httpError{http.StatusBadRequest, "invalid_design_doc", d.Error}
	}
	if d.Sig == "" {
		return d, &httpError{http.StatusNotFound, "not_found", "missing_named_view"}
	}
	return d, nil
}

// freshen applies the update mode: true waits until the index covers the
// database's current update sequence, lazy starts a build and answers at
// once, false answers from what the index holds.
func (p *plugin) freshen(ctx context.Context, db Database, d Design, ix index, mode string) error {
	id := indexID(db.Server, db.DB, d.Sig)
	job := sdk.NewJob{Type: TypeIndex, ID: id, Data: IndexData{Server: db.Server, DB: db.DB, Design: d}, Group: db.Server + "/" + db.DB}
	m, found, err := readMarker(ctx, p.host, ix)
	if err != nil {
		return err
	}
	if m.Error != "" {
		return &httpError{http.StatusInternalServerError, "index_error", m.Error}
	}
	c := p.cfg.clients[db.Server]
	switch mode {
	case "false":
		if !found {
			// Never built: make sure a build comes (the watcher may not
			// have seen the design document yet).
			return ensureJob(ctx, p.host, job)
		}
		return nil
	case "lazy":
		if fresh, err := upToDate(ctx, c, db.DB, m.Seq, nil); err != nil || fresh {
			return err
		}
		return trigger(ctx, p.host, job)
	}
	dbInfo, err := c.DBInfo(ctx, db.DB)
	if err != nil {
		return fmt.Errorf("read %s: %w", db.DB, err)
	}
	for {
		if fresh, err := upToDate(ctx, c, db.DB, m.Seq, dbInfo.UpdateSeq); err != nil || fresh {
			return err
		}
		// Start a build (or ask the running one for another run), and
		// wait for it to move.
		if err := trigger(ctx, p.host, job); err != nil {
			return err
		}
		// Wait until the build commits a batch (its view_seq moves) or
		// ends.
		errMoved := errors.New("moved")
		var first json.RawMessage
		seen := false
		err = p.host.Subscribe(ctx, TypeIndex, id, func(info sdk.JobInfo) error {
			if err := indexError(info); err != nil {
				return err
			}
			var data IndexData
			json.Unmarshal(info.Data, &data)
			if info.State == "not_found" || (seen && (info.State == "finished" || !bytes.Equal(data.ViewSeq, first))) {
				return errMoved
			}
			if !seen {
				first, seen = data.ViewSeq, true
			}
			return nil
		})
		if err != nil && !errors.Is(err, errMoved) {
			return err
		}
		if m, _, err = readMarker(ctx, p.host, ix); err != nil {
			return err
		}
	}
}

// indexError is the error of an index that cannot be built.
func indexError(info sdk.JobInfo) error {
	var data IndexData
	if json.Unmarshal(info.Data, &data) == nil && data.Error != "" {
		return &httpError{http.StatusInternalServerError, "index_error", data.Error}
	}
	return nil
}

// upToDate reports whether an index at viewSeq covers the database up to
// target (nil: its current end). Sequences are opaque; numbers and
// CouchDB's "N-..." strings compare by N, anything else asks the
// database for a change after viewSeq.
func upToDate(ctx context.Context, c *couch.Client, db string, viewSeq, target json.RawMessage) (bool, error) {
	if len(viewSeq) == 0 {
		viewSeq = nil
	}
	if viewSeq != nil && target != nil {
		if a, ok := seqNumber(viewSeq); ok {
			if b, ok := seqNumber(target); ok {
				return a >= b, nil
			}
		}
	}
	ch, err := c.Changes(ctx, db, couch.ChangesOptions{Since: viewSeq, Limit: 1})
	if err != nil {
		return false, fmt.Errorf("read the changes of %s: %w", db, err)
	}
	return len(ch.Results) == 0, nil
}

func seqNumber(seq json.RawMessage) (int64, bool) {
	var n int64
	if json.Unmarshal(seq, &n) == nil {
		return n, true
	}
	var s string
	if json.Unmarshal(seq, &s) != nil {
		return 0, false
	}
	head, _, _ := strings.Cut(s, "-")
	n, err := strconv.ParseInt(head, 10, 64)
	return n, err == nil
}

// activeTasks lists the index builds running now, as CouchDB's
// _active_tasks shows them.
func (p *plugin) activeTasks(w http.ResponseWriter, r *http.Request) {
	tasks := []map[string]any{}
	after := ""
	for {
		jobs, next, err := p.host.ListJobs(r.Context(), TypeIndex, after, 100, "running")
		if err != nil {
			writeErr(w, err)
			return
		}
		for _, j := range jobs {
			var d IndexData
			if json.Unmarshal(j.Data, &d) != nil {
				continue
			}
			progress := 0
			if d.TotalChanges > 0 {
				progress = int(100 * d.ChangesDone / d.TotalChanges)
			}
			tasks = append(tasks, map[string]any{
				"type": "indexer", "database": d.DB, "design_document": d.Design.ID,
				"signature": d.Design.Sig, "changes_done": d.ChangesDone, "total_changes": d.TotalChanges,
				"progress": progress, "view_seq": d.ViewSeq, "started_on": d.Started / 1000, "updated_on": j.Updated.Unix(),
			})
		}
		if next == "" {
			break
		}
		after = next
	}
	writeJSON(w, http.StatusOK, tasks)
}
