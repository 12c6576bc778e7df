package couch

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/url"
	"strings"
)

// RevsDiff is what a target lacks of one document.
type RevsDiff struct {
	Missing []string `json:"missing"`
	// PossibleAncestors are revisions the target has that may be
	// ancestors of the missing ones.
	PossibleAncestors []string `json:"possible_ancestors,omitempty"`
}

// RevsDiff asks which of the given revisions (by document id) the database
// lacks; documents it has every revision of are left out of the answer.
func (c *Client) RevsDiff(ctx context.Context, db string, revs map[string][]string) (map[string]RevsDiff, error) {
	out := map[string]RevsDiff{}
	return out, c.do(ctx, "POST", c.path(db, "_revs_diff"), nil, revs, &out)
}

// DocRev names a revision to fetch.
type DocRev struct {
	ID  string `json:"id"`
	Rev string `json:"rev,omitempty"`
	// AttsSince are revisions the reader has: attachments unchanged since
	// them come as stubs.
	AttsSince []string `json:"atts_since,omitempty"`
}

// Revision is one fetched revision: a document body with its revision
// history (_revisions) and, when asked for, its attachments inline, or
// why it could not be read.
type Revision struct {
	ID, Rev string
	Doc     json.RawMessage
	// Missing: the database has no such revision.
	Missing bool
	// Err is any other per-document error.
	Err string
}

// ErrUnsupported: the server lacks an endpoint (a 404, 405 or 501 on a
// database that exists); the caller falls back to an older one.
var ErrUnsupported = errors.New("couch: endpoint not supported")

// BulkGet fetches revisions with _bulk_get, with their histories
// (revs=true), following each to its latest descendant (latest=true), and
// with attachments inline if attachments is set.
func (c *Client) BulkGet(ctx context.Context, db string, docs []DocRev, attachments bool) ([]Revision, error) {
	if len(docs) == 0 {
		return nil, nil
	}
	q := url.Values{"revs": {"true"}, "latest": {"true"}}
	if attachments {
		q.Set("attachments", "true")
	}
	var r struct {
		Results []struct {
			ID   string `json:"id"`
			Docs []struct {
				OK    json.RawMessage `json:"ok"`
				Error json.RawMessage `json:"error"`
				// pouchdb-server reports a missing revision this way.
				Missing string `json:"missing"`
			} `json:"docs"`
		} `json:"results"`
	}
	err := c.do(ctx, "POST", c.path(db, "_bulk_get"), q, map[string]any{"docs": docs}, &r)
	var e *Error
	if errors.As(err, &e) && (e.Status == http.StatusNotFound && e.Reason != "Database does not exist." && e.Reason != "no_db_file" ||
		e.Status == http.StatusMethodNotAllowed || e.Status == http.StatusNotImplemented) {
		return nil, fmt.Errorf("%w: %v", ErrUnsupported, err)
	}
	if err != nil {
		return nil, err
	}
	var out []Revision
	for _, res := range r.Results {
		for _, d := range res.Docs {
			switch {
			case len(d.OK) > 0:
				var meta struct {
					ID  string `json:"_id"`
					Rev string `json:"_rev"`
				}
				if err := json.Unmarshal(d.OK, &meta); err != nil {
					return nil, fmt.Errorf("couch: _bulk_get of %s: %w", res.ID, err)
				}
				out = append(out, Revision{ID: meta.ID, Rev: meta.Rev, Doc: d.OK})
			case d.Missing != "":
				out = append(out, Revision{ID: res.ID, Rev: d.Missing, Missing: true})
			default:
				var de struct{ ID, Rev, Error, Reason string }
				json.Unmarshal(d.Error, &de)
				rev := Revision{ID: res.ID, Rev: de.Rev, Err: de.Error + ": " + de.Reason}
				rev.Missing = de.Error == "not_found"
				out = append(out, rev)
			}
		}
	}
	return out, nil
}

// OpenRevs fetches revisions of one document the way replicators did
// before _bulk_get: GET ?open_revs=[...]&revs=true&latest=true. It takes
// the answer as JSON or as CouchDB's multipart/mixed (attachments in
// their own parts).
func (c *Client) OpenRevs(ctx context.Context, db, id string, revs []string, attachments bool, attsSince []string) ([]Revision, error) {
	rb, _ := json.Marshal(revs)
	q := url.Values{"open_revs": {string(rb)}, "revs": {"true"}, "latest": {"true"}}
	if attachments {
		q.Set("attachments", "true")
	}
	if len(attsSince) > 0 {
		b, _ := json.Marshal(attsSince)
		q.Set("atts_since", string(b))
	}
	resp, err := c.send(ctx, "GET", c.docPath(db, id), q, nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	mt, params, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if mt == "multipart/mixed" {
		out, err := readOpenRevsMultipart(multipart.NewReader(resp.Body, params["boundary"]), id)
		if err != nil {
			return nil, fmt.Errorf("couch: open_revs of %s: %w", id, err)
		}
		return out, nil
	}
	var rows []json.RawMessage
	if err := json.NewDecoder(resp.Body).Decode(&rows); err != nil {
		return nil, fmt.Errorf("couch: open_revs of %s: %w", id, err)
	}
	out := make([]Revision, 0, len(rows))
	for _, row := range rows {
		r, err := openRevsRow(row, id)
		if err != nil {
			return nil, fmt.Errorf("couch: open_revs of %s: %w", id, err)
		}
		out = append(out, r)
	}
	return out, nil
}

// openRevsRow reads {"ok": doc} or {"missing": rev}.
func openRevsRow(row json.RawMessage, id string) (Revision, error) {
	var r struct {
		OK      json.RawMessage `json:"ok"`
		Missing string          `json:"missing"`
	}
	if err := json.Unmarshal(row, &r); err != nil {
		return Revision{}, err
	}
	if r.Missing != "" || len(r.OK) == 0 {
		return Revision{ID: id, Rev: r.Missing, Missing: true}, nil
	}
	return docRevision(r.OK)
}

func docRevision(doc json.RawMessage) (Revision, error) {
	var meta struct {
		ID  string `json:"_id"`
		Rev string `json:"_rev"`
	}
	if err := json.Unmarshal(doc, &meta); err != nil {
		return Revision{}, err
	}
	return Revision{ID: meta.ID, Rev: meta.Rev, Doc: doc}, nil
}

// readOpenRevsMultipart reads CouchDB's multipart open_revs answer: one
// part per revision, either a JSON document (or {"missing": rev}), or a
// multipart/related part holding the document and then its attachments,
// which the document marks "follows".
func readOpenRevsMultipart(mr *multipart.Reader, id string) ([]Revision, error) {
	var out []Revision
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		mt, params, _ := mime.ParseMediaType(part.Header.Get("Content-Type"))
		var rev Revision
		if mt == "multipart/related" {
			rev, err = readRelated(multipart.NewReader(part, params["boundary"]))
		} else {
			var body []byte
			if body, err = io.ReadAll(part); err == nil {
				// A part is a document, or {"missing": rev} (flagged
				// error="true").
				var m struct {
					Missing string `json:"missing"`
				}
				if json.Unmarshal(body, &m) == nil && m.Missing != "" || params["error"] == "true" {
					rev = Revision{ID: id, Rev: m.Missing, Missing: true}
				} else {
					rev, err = docRevision(body)
				}
			}
		}
		if err != nil {
			return nil, err
		}
		out = append(out, rev)
	}
}

// readRelated reads a document and its attachment parts, and returns the
// document with the attachments inline.
func readRelated(mr *multipart.Reader) (Revision, error) {
	part, err := mr.NextPart()
	if err != nil {
		return Revision{}, fmt.Errorf("multipart/related without a document: %w", err)
	}
	var doc map[string]json.RawMessage
	if err := json.NewDecoder(part).Decode(&doc); err != nil {
		return Revision{}, err
	}
	var atts map[string]map[string]any
	if raw, ok := doc["_attachments"]; ok {
		if err := json.Unmarshal(raw, &atts); err != nil {
			return Revision{}, fmt.Errorf("_attachments: %w", err)
		}
	}
	for {
		p, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return Revision{}, err
		}
		name := p.FileName()
		if name == "" {
			_, params, _ := mime.ParseMediaType(p.Header.Get("Content-Disposition"))
			name = params["filename"]
		}
		a, ok := atts[name]
		if !ok {
			return Revision{}, fmt.Errorf("attachment part %q is not in the document", name)
		}
		data, err := io.ReadAll(p)
		if err != nil {
			return Revision{}, err
		}
		delete(a, "follows")
		if enc, _ := a["encoding"].(string); enc != "" {
			// Sent as stored (att_encoding_info): inline data is the
			// content itself, so decode it, and let the target encode it
			// again as it likes.
			if enc != "gzip" {
				return Revision{}, fmt.Errorf("attachment %q: unknown encoding %q", name, enc)
			}
			zr, err := gzip.NewReader(bytes.NewReader(data))
			if err != nil {
				return Revision{}, fmt.Errorf("attachment %q: %w", name, err)
			}
			if data, err = io.ReadAll(zr); err != nil {
				return Revision{}, fmt.Errorf("attachment %q: %w", name, err)
			}
			delete(a, "encoding")
			delete(a, "encoded_length")
		}
		a["data"] = base64.StdEncoding.EncodeToString(data)
		delete(a, "length")
	}
	for name, a := range atts {
		if a["follows"] == true {
			return Revision{}, fmt.Errorf("attachment %q has no part", name)
		}
	}
	if atts != nil {
		b, err := json.Marshal(atts)
		if err != nil {
			return Revision{}, err
		}
		doc["_attachments"] = b
	}
	b, err := json.Marshal(doc)
	if err != nil {
		return Revision{}, err
	}
	return docRevision(b)
}

// DocError is a document a bulk write refused.
type DocError struct {
	ID     string `json:"id"`
	Rev    string `json:"rev"`
	Error  string `json:"error"`
	Reason string `json:"reason"`
}

// BulkDocs writes documents (JSON objects) with _bulk_docs. With newEdits
// false it stores them as the revisions they are, histories included, as
// replication does. It returns the documents the database refused.
func (c *Client) BulkDocs(ctx context.Context, db string, docs []json.RawMessage, newEdits bool) ([]DocError, error) {
	var b bytes.Buffer
	b.Grow(64 + len(docs)*256)
	fmt.Fprintf(&b, `{"new_edits":%t,"docs":[`, newEdits)
	for i, d := range docs {
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(d)
	}
	b.WriteString("]}")
	var rows []struct {
		DocError
		OK bool `json:"ok"`
	}
	if err := c.do(ctx, "POST", c.path(db, "_bulk_docs"), nil, json.RawMessage(b.Bytes()), &rows); err != nil {
		return nil, err
	}
	var bad []DocError
	for _, r := range rows {
		if r.Error != "" {
			bad = append(bad, r.DocError)
		}
	}
	return bad, nil
}

// IsLocal reports whether a document id is a _local document's, which
// replication never copies.
func IsLocal(id string) bool { return strings.HasPrefix(id, "_local/") }
