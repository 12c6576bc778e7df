package replication

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"

	"github.com/couchjobs/couchjobs/plugins/internal/couch"
)

// idVersion names the inputs and hash of replication ids. A change to
// either must change it, so that old checkpoints are not misread.
const idVersion = "couchjobs-rep-1"

// endpointID is what identifies an endpoint in a replication id: the URL
// and the user, never the password, nor headers that carry credentials.
func endpointID(e Endpoint) any {
	var headers [][2]string
	for k, v := range e.Headers {
		if isAuthHeader(k) {
			continue
		}
		headers = append(headers, [2]string{strings.ToLower(k), v})
	}
	sort.Slice(headers, func(i, j int) bool { return headers[i][0] < headers[j][0] })
	return []any{e.URL + "/", e.User, headers}
}

func isAuthHeader(k string) bool {
	k = http.CanonicalHeaderKey(k)
	return k == "Authorization" || k == "Cookie" || k == "Proxy-Authorization"
}

// ReplicationID is the id of a replication, as CouchDB computes it: a hash
// of its endpoints without passwords, its filter (with the filter
// function's code, so that editing the filter starts a new replication)
// and parameters, doc_ids, selector, winning_revs_only and since_seq;
// then "+continuous" and "+create_target" when set. The base (before the
// first "+") names the checkpoint documents.
func ReplicationID(s *Spec, filterCode string) string {
	o := s.Options
	params := make([][2]string, 0, len(o.QueryParams))
	for k, v := range o.QueryParams {
		params = append(params, [2]string{k, v})
	}
	sort.Slice(params, func(i, j int) bool { return params[i][0] < params[j][0] })
	in := []any{
		idVersion, endpointID(s.Source), endpointID(s.Target),
		o.Filter, filterCode, params, o.DocIDs, o.Selector, o.WinningRevsOnly, o.SinceSeq,
	}
	b, err := json.Marshal(in)
	if err != nil {
		panic(err) // every input marshals
	}
	sum := md5.Sum(b)
	id := hex.EncodeToString(sum[:])
	if o.Continuous {
		id += "+continuous"
	}
	if o.CreateTarget {
		id += "+create_target"
	}
	return id
}

// baseID is a replication id without its extensions.
func baseID(repID string) string {
	base, _, _ := strings.Cut(repID, "+")
	return base
}

// filterCode reads a filter function's source from the source database's
// design document: its code is part of the replication id.
func filterCode(ctx context.Context, c *couch.Client, db, filter string) (string, error) {
	ddoc, name, ok := strings.Cut(filter, "/")
	if !ok || strings.HasPrefix(filter, "_") {
		return "", nil // a built-in filter
	}
	var doc struct {
		Filters map[string]json.RawMessage `json:"filters"`
	}
	if err := c.Get(ctx, db, "_design/"+ddoc, &doc); err != nil {
		if errors.Is(err, couch.ErrNotFound) {
			return "", fmt.Errorf("filter %s: the source has no design document _design/%s", filter, ddoc)
		}
		return "", fmt.Errorf("filter %s: %w", filter, err)
	}
	code, ok := doc.Filters[name]
	if !ok {
		return "", fmt.Errorf("filter %s: _design/%s has no filter %q", filter, ddoc, name)
	}
	var s string
	if json.Unmarshal(code, &s) != nil {
		s = string(code)
	}
	return s, nil
}
