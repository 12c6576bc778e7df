// Package couch is a focused client for the CouchDB HTTP API endpoints
// the plugins use, written against CouchDB's documentation and checked
// against pouchdb-server. It is plain net/http on purpose: kivik, the Go
// CouchDB client, gzips request bodies, rejects open_revs=["all"], always
// POSTs _changes and panics on a failed feed's metadata (measured here,
// see docs/ARCHITECTURE.md), and the plugins need a handful of endpoints
// with exact control over each.
//
// Responses are never requested gzipped: pouchdb-server then buffers
// continuous feeds until they end.
package couch

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Client talks to one CouchDB server.
type Client struct {
	base       *url.URL // without credentials
	user, pass string
	header     http.Header
	http       *http.Client
	retries    int
	retryWait  time.Duration
}

// Options shape a client.
type Options struct {
	// Header is sent with every request (for proxy or cookie auth).
	Header map[string]string
	// Timeout bounds a request that is not a feed; default 30 s
	// (CouchDB's connection_timeout).
	Timeout time.Duration
	// Transport replaces the default one (tests).
	Transport http.RoundTripper
	// MaxConns bounds the connections to the server (CouchDB's
	// http_connections); 0 is unbounded.
	MaxConns int
	// Retries is how many times a request that failed for a transient
	// reason (no connection, a 5xx or 429 answer) is sent again, after
	// RetryWait (default 250 ms) doubled each time, as CouchDB's
	// retries_per_request. Every request the client sends is idempotent.
	Retries   int
	RetryWait time.Duration
}

// New returns a client for the server at rawURL. Credentials in the URL's
// userinfo are sent as basic auth and kept out of URL().
func New(rawURL string, o Options) (*Client, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("couch: server URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("couch: server URL %q: want http(s)://host[:port][/path]", redact(u))
	}
	c := &Client{header: http.Header{}, retries: o.Retries, retryWait: o.RetryWait}
	if c.retryWait == 0 {
		c.retryWait = 250 * time.Millisecond
	}
	if u.User != nil {
		c.user = u.User.Username()
		c.pass, _ = u.User.Password()
		u.User = nil
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	u.RawQuery, u.Fragment = "", ""
	c.base = u
	for k, v := range o.Header {
		c.header.Set(k, v)
	}
	if o.Timeout == 0 {
		o.Timeout = 30 * time.Second
	}
	tr := o.Transport
	if tr == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.DisableCompression = true
		t.ResponseHeaderTimeout = o.Timeout
		t.MaxConnsPerHost = o.MaxConns
		t.MaxIdleConnsPerHost = max(o.MaxConns, 4)
		tr = t
	}
	c.http = &http.Client{Transport: tr}
	return c, nil
}

// WithBasicAuth returns a copy of the client that authenticates as user.
func (c *Client) WithBasicAuth(user, pass string) *Client {
	cp := *c
	cp.user, cp.pass = user, pass
	return &cp
}

// URL is the server's URL without credentials, for logs and job data.
func (c *Client) URL() string { return c.base.String() }

func redact(u *url.URL) string {
	cp := *u
	if cp.User != nil {
		cp.User = url.UserPassword(cp.User.Username(), "*****")
	}
	return cp.String()
}

// Error is an error response: CouchDB's {"error", "reason"} with the
// HTTP status.
type Error struct {
	Method, Path string
	Status       int
	Name, Reason string
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s %s: %d %s: %s", e.Method, e.Path, e.Status, e.Name, e.Reason)
}

// Conditions callers act on; match with errors.Is.
var (
	ErrNotFound     = errors.New("couch: not found")
	ErrConflict     = errors.New("couch: conflict")
	ErrExists       = errors.New("couch: already exists")
	ErrUnauthorized = errors.New("couch: unauthorized")
)

// Is matches an error response against the sentinel errors by status.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrNotFound:
		return e.Status == http.StatusNotFound
	case ErrConflict:
		return e.Status == http.StatusConflict
	case ErrExists:
		return e.Status == http.StatusPreconditionFailed || e.Name == "file_exists"
	case ErrUnauthorized:
		return e.Status == http.StatusUnauthorized || e.Status == http.StatusForbidden
	}
	return false
}

// path joins escaped path segments under the base.
func (c *Client) path(segments ...string) string {
	var b strings.Builder
	b.WriteString(c.base.Path)
	for _, s := range segments {
		b.WriteByte('/')
		b.WriteString(url.PathEscape(s))
	}
	if len(segments) == 0 {
		b.WriteByte('/')
	}
	return b.String()
}

// docPath is the path of a document: design and local documents keep
// their slash, as CouchDB expects.
func (c *Client) docPath(db, id string) string {
	for _, p := range []string{"_design/", "_local/"} {
		if strings.HasPrefix(id, p) {
			return c.path(db) + "/" + p[:len(p)-1] + "/" + url.PathEscape(id[len(p):])
		}
	}
	return c.path(db, id)
}

// request builds a request; body is JSON-encoded unless it is a
// json.RawMessage or nil.
func (c *Client) request(ctx context.Context, method, path string, q url.Values, body any) (*http.Request, error) {
	var r io.Reader
	if body != nil {
		b, ok := body.(json.RawMessage)
		if !ok {
			var err error
			if b, err = json.Marshal(body); err != nil {
				return nil, fmt.Errorf("couch: %s %s: encode the body: %w", method, path, err)
			}
		}
		r = bytes.NewReader(b)
	}
	u := *c.base
	u.Path = path
	u.RawPath = path
	if p, err := url.PathUnescape(path); err == nil {
		u.Path = p
	}
	u.RawQuery = q.Encode()
	req, err := http.NewRequestWithContext(ctx, method, u.String(), r)
	if err != nil {
		return nil, err
	}
	for k, v := range c.header {
		req.Header[k] = v
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.user != "" {
		req.SetBasicAuth(c.user, c.pass)
	}
	return req, nil
}

// do sends a request and decodes a JSON answer into out (unless nil).
func (c *Client) do(ctx context.Context, method, path string, q url.Values, body, out any) error {
	resp, err := c.send(ctx, method, path, q, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil || method == http.MethodHead {
		io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("couch: %s %s: decode the answer: %w", method, path, err)
	}
	return nil
}

// send sends a request, retrying transient failures, and returns a
// successful response for the caller to read and close.
func (c *Client) send(ctx context.Context, method, path string, q url.Values, body any) (*http.Response, error) {
	if body != nil {
		if _, raw := body.(json.RawMessage); !raw {
			b, err := json.Marshal(body)
			if err != nil {
				return nil, fmt.Errorf("couch: %s %s: encode the body: %w", method, path, err)
			}
			body = json.RawMessage(b)
		}
	}
	wait := c.retryWait
	for attempt := 0; ; attempt++ {
		req, err := c.request(ctx, method, path, q, body)
		if err != nil {
			return nil, err
		}
		resp, err := c.http.Do(req)
		if err != nil {
			err = fmt.Errorf("couch: %s %s%s: %w", method, c.base.Host, path, err)
		} else if err = checkResponse(method, path, resp); err != nil {
			resp.Body.Close()
		} else {
			return resp, nil
		}
		if attempt >= c.retries || !transient(err) || ctx.Err() != nil {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(wait):
		}
		wait *= 2
	}
}

// transient reports whether a failed request may succeed if sent again.
func transient(err error) bool {
	var e *Error
	if errors.As(err, &e) {
		return e.Status >= 500 || e.Status == http.StatusTooManyRequests || e.Status == http.StatusRequestTimeout
	}
	return true // no answer: the connection failed or timed out
}

// checkResponse turns an error status into an *Error.
func checkResponse(method, path string, resp *http.Response) error {
	if resp.StatusCode < 300 {
		return nil
	}
	e := &Error{Method: method, Path: path, Status: resp.StatusCode}
	var body struct{ Error, Reason string }
	if method != http.MethodHead && json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(&body) == nil {
		e.Name, e.Reason = body.Error, body.Reason
	}
	if e.Name == "" {
		e.Name = strings.ToLower(strings.ReplaceAll(http.StatusText(resp.StatusCode), " ", "_"))
	}
	return e
}

// ServerInfo is the server's welcome.
type ServerInfo struct {
	Version string `json:"version"`
	UUID    string `json:"uuid"`
	// CouchDB is "Welcome" on CouchDB; pouchdb-server answers
	// "express-pouchdb" instead.
	CouchDB string `json:"couchdb"`
}

// Server returns the server's welcome: a cheap liveness check.
func (c *Client) Server(ctx context.Context) (ServerInfo, error) {
	var s ServerInfo
	return s, c.do(ctx, "GET", c.path(), nil, nil, &s)
}

// AllDBs lists the server's databases.
func (c *Client) AllDBs(ctx context.Context) ([]string, error) {
	var dbs []string
	return dbs, c.do(ctx, "GET", c.path("_all_dbs"), nil, nil, &dbs)
}

// DBExists reports whether a database exists.
func (c *Client) DBExists(ctx context.Context, db string) (bool, error) {
	err := c.do(ctx, "HEAD", c.path(db), nil, nil, nil)
	if errors.Is(err, ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

// CreateDB creates a database; q, if positive, is its shard count (a
// server that does not shard ignores it). An existing database is
// ErrExists.
func (c *Client) CreateDB(ctx context.Context, db string, q int) error {
	v := url.Values{}
	if q > 0 {
		v.Set("q", fmt.Sprint(q))
	}
	return c.do(ctx, "PUT", c.path(db), v, nil, &struct{}{})
}

// DeleteDB deletes a database; a missing one is ErrNotFound.
func (c *Client) DeleteDB(ctx context.Context, db string) error {
	return c.do(ctx, "DELETE", c.path(db), nil, nil, &struct{}{})
}

// Get reads a document into out.
func (c *Client) Get(ctx context.Context, db, id string, out any) error {
	return c.do(ctx, "GET", c.docPath(db, id), nil, nil, out)
}

// Put writes a document and returns its new revision.
func (c *Client) Put(ctx context.Context, db, id string, doc any) (string, error) {
	var r struct{ Rev string }
	err := c.do(ctx, "PUT", c.docPath(db, id), nil, doc, &r)
	return r.Rev, err
}

// Delete deletes a document revision.
func (c *Client) Delete(ctx context.Context, db, id, rev string) error {
	return c.do(ctx, "DELETE", c.docPath(db, id), url.Values{"rev": {rev}}, nil, &struct{}{})
}

// Security reads a database's security object, as the server sent it.
func (c *Client) Security(ctx context.Context, db string) (json.RawMessage, error) {
	var raw json.RawMessage
	return raw, c.do(ctx, "GET", c.path(db, "_security"), nil, nil, &raw)
}

// PutSecurity replaces a database's security object.
func (c *Client) PutSecurity(ctx context.Context, db string, sec any) error {
	return c.do(ctx, "PUT", c.path(db, "_security"), nil, sec, &struct{}{})
}

// Row is a row of _all_docs.
type Row struct {
	ID    string `json:"id"`
	Value struct {
		Rev     string `json:"rev"`
		Deleted bool   `json:"deleted,omitempty"`
	} `json:"value"`
	Doc json.RawMessage `json:"doc,omitempty"`
}

// AllDocs lists a database's documents with ids in [start, end] (empty:
// unbounded), with their bodies if includeDocs.
func (c *Client) AllDocs(ctx context.Context, db, start, end string, includeDocs bool) ([]Row, error) {
	q := url.Values{}
	if start != "" {
		b, _ := json.Marshal(start)
		q.Set("startkey", string(b))
	}
	if end != "" {
		b, _ := json.Marshal(end)
		q.Set("endkey", string(b))
	}
	if includeDocs {
		q.Set("include_docs", "true")
	}
	var r struct{ Rows []Row }
	return r.Rows, c.do(ctx, "GET", c.path(db, "_all_docs"), q, nil, &r)
}

// DBInfo is what a server says of a database.
type DBInfo struct {
	Name string `json:"db_name"`
	// UpdateSeq is the sequence of the database's last change (opaque).
	UpdateSeq json.RawMessage `json:"update_seq"`
	DocCount  int64           `json:"doc_count"`
	// DocDelCount counts deleted documents.
	DocDelCount int64 `json:"doc_del_count"`
}

// DBInfo reads a database's information.
func (c *Client) DBInfo(ctx context.Context, db string) (DBInfo, error) {
	var i DBInfo
	return i, c.do(ctx, "GET", c.path(db), nil, nil, &i)
}

// DocsByID reads the current bodies of documents by id (POST _all_docs
// with keys): a missing or deleted document maps to nil.
func (c *Client) DocsByID(ctx context.Context, db string, ids []string) (map[string]json.RawMessage, error) {
	out := make(map[string]json.RawMessage, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	var r struct{ Rows []Row }
	q := url.Values{"include_docs": {"true"}}
	if err := c.do(ctx, "POST", c.path(db, "_all_docs"), q, map[string]any{"keys": ids}, &r); err != nil {
		return nil, err
	}
	for _, row := range r.Rows {
		if len(row.Doc) == 0 || string(row.Doc) == "null" {
			out[row.ID] = nil
			continue
		}
		out[row.ID] = row.Doc
	}
	return out, nil
}
