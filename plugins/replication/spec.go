package replication

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"
)

// Endpoint is one end of a replication: a database URL and how to
// authenticate to its server.
type Endpoint struct {
	// URL is the database's URL without credentials.
	URL      string            `json:"url"`
	User     string            `json:"user,omitempty"`
	Password string            `json:"password,omitempty"`
	Headers  map[string]string `json:"headers,omitempty"`
}

// Redacted is the endpoint as CouchDB shows it: the user with the password
// starred out, no headers.
func (e Endpoint) Redacted() string {
	s := e.URL
	if e.User != "" {
		if scheme, rest, ok := strings.Cut(s, "://"); ok {
			s = scheme + "://" + url.PathEscape(e.User) + ":*****@" + rest
		}
	}
	if !strings.HasSuffix(s, "/") {
		s += "/"
	}
	return s
}

// server and db split the URL into the server's URL and the database's
// name (its last path segment, unescaped).
func (e Endpoint) split() (server, db string, err error) {
	u, err := url.Parse(e.URL)
	if err != nil {
		return "", "", err
	}
	p := strings.TrimSuffix(u.EscapedPath(), "/")
	i := strings.LastIndexByte(p, '/')
	if db, err = url.PathUnescape(p[i+1:]); err != nil {
		return "", "", err
	}
	u.Path, u.RawPath = "", ""
	if i > 0 {
		u.RawPath = p[:i]
		u.Path, _ = url.PathUnescape(p[:i])
	}
	return u.String(), db, nil
}

// Options are a replication's options, with CouchDB's names and defaults.
type Options struct {
	Continuous      bool              `json:"continuous,omitempty"`
	CreateTarget    bool              `json:"create_target,omitempty"`
	DocIDs          []string          `json:"doc_ids,omitempty"`
	Selector        json.RawMessage   `json:"selector,omitempty"`
	Filter          string            `json:"filter,omitempty"`
	QueryParams     map[string]string `json:"query_params,omitempty"`
	SinceSeq        json.RawMessage   `json:"since_seq,omitempty"`
	WinningRevsOnly bool              `json:"winning_revs_only,omitempty"`
	UseCheckpoints  bool              `json:"use_checkpoints"`
	UseBulkGet      bool              `json:"use_bulk_get"`
	// Durations are in milliseconds, as in CouchDB.
	CheckpointInterval int64 `json:"checkpoint_interval"`
	WorkerProcesses    int   `json:"worker_processes"`
	WorkerBatchSize    int   `json:"worker_batch_size"`
	HTTPConnections    int   `json:"http_connections"`
	ConnectionTimeout  int64 `json:"connection_timeout"`
	RetriesPerRequest  int   `json:"retries_per_request"`
}

// Defaults are CouchDB's.
func defaultOptions() Options {
	return Options{
		UseCheckpoints: true, UseBulkGet: true,
		CheckpointInterval: 30000, WorkerProcesses: 4, WorkerBatchSize: 500,
		HTTPConnections: 20, ConnectionTimeout: 30000, RetriesPerRequest: 5,
	}
}

func (o Options) checkpointInterval() time.Duration {
	return time.Duration(o.CheckpointInterval) * time.Millisecond
}

func (o Options) connectionTimeout() time.Duration {
	return time.Duration(o.ConnectionTimeout) * time.Millisecond
}

// Spec is a replication as asked for: its endpoints with credentials and
// its options.
type Spec struct {
	Source  Endpoint `json:"source"`
	Target  Endpoint `json:"target"`
	Options Options  `json:"options"`
}

// View is a spec as anyone may see it: endpoints redacted.
type View struct {
	Source  string  `json:"source"`
	Target  string  `json:"target"`
	Options Options `json:"options"`
}

// View redacts the spec.
func (s *Spec) View() View {
	return View{Source: s.Source.Redacted(), Target: s.Target.Redacted(), Options: s.Options}
}

// ParseError is a replication document or request that cannot run; it
// names the field.
type ParseError struct{ Reason string }

func (e *ParseError) Error() string { return e.Reason }

func badf(format string, args ...any) error {
	return &ParseError{Reason: fmt.Sprintf(format, args...)}
}

// ignored are fields of a _replicator document (or a _replicate request)
// that are not options: CouchDB's own bookkeeping, and fields that the
// runtime has no use for.
var ignored = []string{
	"_id", "_rev", "_revisions", "_deleted", "_attachments", "_conflicts",
	"_replication_id", "_replication_state", "_replication_state_time",
	"_replication_state_reason", "_replication_stats", "owner", "user_ctx",
	"cancel", "replication_id", "id", "proxy", "source_proxy", "target_proxy",
	"create_target_params", "checkpoint_interval_ms",
}

// Parse reads a replication from a _replicator document or a _replicate
// body, as CouchDB does: unknown fields are ignored, a known one of the
// wrong type is an error naming it, and doc_ids, selector and filter
// exclude each other.
func Parse(raw []byte) (*Spec, error) {
	var fields map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&fields); err != nil || fields == nil {
		return nil, badf("the replication must be a JSON object")
	}
	s := &Spec{Options: defaultOptions()}
	var err error
	if s.Source, err = parseEndpoint(fields, "source"); err != nil {
		return nil, err
	}
	if s.Target, err = parseEndpoint(fields, "target"); err != nil {
		return nil, err
	}
	o := &s.Options
	bools := map[string]*bool{
		"continuous": &o.Continuous, "create_target": &o.CreateTarget,
		"winning_revs_only": &o.WinningRevsOnly, "use_checkpoints": &o.UseCheckpoints,
		"use_bulk_get": &o.UseBulkGet,
	}
	ints := map[string]*int{
		"worker_processes": &o.WorkerProcesses, "worker_batch_size": &o.WorkerBatchSize,
		"http_connections": &o.HTTPConnections, "retries_per_request": &o.RetriesPerRequest,
	}
	millis := map[string]*int64{"checkpoint_interval": &o.CheckpointInterval, "connection_timeout": &o.ConnectionTimeout}
	for k, v := range fields {
		switch {
		case k == "source" || k == "target" || slices.Contains(ignored, k):
		case bools[k] != nil:
			if err := json.Unmarshal(v, bools[k]); err != nil {
				return nil, badf("`%s` must be a boolean", k)
			}
		case ints[k] != nil:
			n, err := positive(v)
			if err != nil || n > 1<<20 {
				return nil, badf("`%s` must be a positive integer", k)
			}
			*ints[k] = int(n)
		case millis[k] != nil:
			n, err := positive(v)
			if err != nil {
				return nil, badf("`%s` must be a positive integer (milliseconds)", k)
			}
			*millis[k] = n
		case k == "doc_ids":
			if err := json.Unmarshal(v, &o.DocIDs); err != nil || o.DocIDs == nil {
				return nil, badf("`doc_ids` must be an array of strings")
			}
			if len(o.DocIDs) == 0 {
				o.DocIDs = nil
			}
		case k == "selector":
			var sel map[string]json.RawMessage
			if err := json.Unmarshal(v, &sel); err != nil || sel == nil {
				return nil, badf("`selector` must be a JSON object")
			}
			o.Selector = compact(v)
		case k == "filter":
			if err := json.Unmarshal(v, &o.Filter); err != nil {
				return nil, badf("`filter` must be a string")
			}
		case k == "query_params":
			if o.QueryParams, err = queryParams(v); err != nil {
				return nil, err
			}
		case k == "since_seq":
			o.SinceSeq = compact(v)
		}
	}
	n := 0
	for _, set := range []bool{len(o.DocIDs) > 0, len(o.Selector) > 0, o.Filter != ""} {
		if set {
			n++
		}
	}
	if n > 1 {
		return nil, badf("`doc_ids`, `selector` and `filter` are mutually exclusive")
	}
	if o.Filter != "" {
		if strings.HasPrefix(o.Filter, "_") {
			if o.Filter != "_view" && o.Filter != "_design" {
				return nil, badf("`filter` %q: the built-in filters are given as `doc_ids` and `selector`", o.Filter)
			}
		} else if ddoc, name, ok := strings.Cut(o.Filter, "/"); !ok || ddoc == "" || name == "" {
			return nil, badf("`filter` %q must be `design_doc/filter_name`", o.Filter)
		}
	}
	if o.QueryParams != nil && o.Filter == "" {
		return nil, badf("`query_params` needs a `filter`")
	}
	return s, nil
}

func positive(v json.RawMessage) (int64, error) {
	var n json.Number
	if err := json.Unmarshal(v, &n); err != nil {
		return 0, err
	}
	i, err := n.Int64()
	if err != nil || i < 1 {
		return 0, fmt.Errorf("not a positive integer")
	}
	return i, nil
}

func compact(v json.RawMessage) json.RawMessage {
	var b bytes.Buffer
	if json.Compact(&b, v) != nil {
		return v
	}
	return b.Bytes()
}

// queryParams reads a filter's parameters: an object whose values are
// strings (numbers and booleans are taken as their text, as a query
// string carries them).
func queryParams(v json.RawMessage) (map[string]string, error) {
	var m map[string]any
	if err := json.Unmarshal(v, &m); err != nil || m == nil {
		return nil, badf("`query_params` must be a JSON object")
	}
	out := make(map[string]string, len(m))
	for k, x := range m {
		switch x := x.(type) {
		case string:
			out[k] = x
		case float64, bool:
			out[k] = fmt.Sprint(x)
		default:
			return nil, badf("`query_params.%s` must be a string", k)
		}
	}
	return out, nil
}

// parseEndpoint reads "source" or "target": a URL string, or an object
// with url, headers and auth.basic. Credentials in the URL, in auth.basic
// or in an Authorization header are all kept out of Endpoint.URL.
func parseEndpoint(fields map[string]json.RawMessage, name string) (Endpoint, error) {
	raw, ok := fields[name]
	if !ok || string(raw) == "null" {
		return Endpoint{}, badf("`%s` is missing", name)
	}
	var e Endpoint
	var rawURL string
	if json.Unmarshal(raw, &rawURL) != nil {
		var obj struct {
			URL     *string           `json:"url"`
			Headers map[string]string `json:"headers"`
			Auth    *struct {
				Basic *struct {
					Username string `json:"username"`
					Password string `json:"password"`
				} `json:"basic"`
			} `json:"auth"`
		}
		if err := json.Unmarshal(raw, &obj); err != nil {
			return Endpoint{}, badf("`%s` must be a URL or an object with `url`: %v", name, err)
		}
		if obj.URL == nil {
			return Endpoint{}, badf("`%s.url` is missing", name)
		}
		rawURL = *obj.URL
		e.Headers = obj.Headers
		if obj.Auth != nil && obj.Auth.Basic != nil {
			e.User, e.Password = obj.Auth.Basic.Username, obj.Auth.Basic.Password
		}
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return Endpoint{}, badf("`%s`: bad URL: %v", name, redactErr(err))
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		if u.Scheme == "" && !strings.Contains(rawURL, "/") {
			return Endpoint{}, badf("`%s` %q: local database names are not supported; give the database's full URL", name, rawURL)
		}
		return Endpoint{}, badf("`%s`: %q is not an http(s) database URL", name, redactURL(u))
	}
	if u.User != nil && e.User == "" {
		e.User = u.User.Username()
		e.Password, _ = u.User.Password()
	}
	u.User, u.Fragment = nil, ""
	if u.RawQuery != "" {
		return Endpoint{}, badf("`%s`: a database URL takes no query string", name)
	}
	if strings.Trim(u.EscapedPath(), "/") == "" {
		return Endpoint{}, badf("`%s`: %q names no database", name, u.String())
	}
	e.URL = strings.TrimSuffix(u.String(), "/")
	if _, _, err := e.split(); err != nil {
		return Endpoint{}, badf("`%s`: %v", name, err)
	}
	return e, nil
}

func redactURL(u *url.URL) string {
	cp := *u
	if cp.User != nil {
		cp.User = url.UserPassword(cp.User.Username(), "*****")
	}
	return cp.String()
}

// redactErr keeps a URL's password out of a url.Parse error.
func redactErr(err error) string {
	var ue *url.Error
	if e, ok := err.(*url.Error); ok {
		ue = e
		return ue.Op + ": " + ue.Err.Error()
	}
	return err.Error()
}
