package couch

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"time"
)

// Change is one row of a changes feed.
type Change struct {
	// Seq is the change's sequence: opaque JSON (a number on
	// pouchdb-server and CouchDB 1.x, a string on CouchDB 2+), to be
	// passed back as is.
	Seq     json.RawMessage `json:"seq"`
	ID      string          `json:"id"`
	Deleted bool            `json:"deleted,omitempty"`
	Changes []struct {
		Rev string `json:"rev"`
	} `json:"changes"`
	// Doc is the document, with IncludeDocs.
	Doc json.RawMessage `json:"doc,omitempty"`
}

// Changes is a batch of a changes feed.
type Changes struct {
	Results []Change        `json:"results"`
	LastSeq json.RawMessage `json:"last_seq"`
	Pending int64           `json:"pending,omitempty"`
}

// ChangesOptions select a batch.
type ChangesOptions struct {
	// Since is the sequence to start after; nil starts at the beginning.
	Since json.RawMessage
	// IncludeDocs adds each change's document.
	IncludeDocs bool
	// Limit bounds the batch; 0 means the server's default (all).
	Limit int
	// Wait makes a longpoll request: it returns once there is a change
	// after Since, or after Timeout (the server may ignore it;
	// pouchdb-server does). Heartbeats keep the connection open.
	Wait      bool
	Timeout   time.Duration
	Heartbeat time.Duration
}

// Changes reads a batch of a database's changes feed (normal or, with
// Wait, longpoll).
func (c *Client) Changes(ctx context.Context, db string, o ChangesOptions) (*Changes, error) {
	q := url.Values{}
	if len(o.Since) > 0 {
		q.Set("since", sinceParam(o.Since))
	}
	if o.IncludeDocs {
		q.Set("include_docs", "true")
	}
	if o.Limit > 0 {
		q.Set("limit", fmt.Sprint(o.Limit))
	}
	if o.Wait {
		q.Set("feed", "longpoll")
		if o.Timeout > 0 {
			q.Set("timeout", fmt.Sprint(o.Timeout.Milliseconds()))
		}
		hb := o.Heartbeat
		if hb == 0 {
			hb = 10 * time.Second
		}
		q.Set("heartbeat", fmt.Sprint(hb.Milliseconds()))
	}
	req, err := c.request(ctx, "GET", c.path(db, "_changes"), q, nil)
	if err != nil {
		return nil, err
	}
	// Only ctx bounds how long the feed waits for a change; the
	// transport's timeout covers the response header, which a server sends
	// before waiting.
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("couch: changes of %s: %w", db, err)
	}
	defer resp.Body.Close()
	if err := checkResponse("GET", req.URL.Path, resp); err != nil {
		return nil, err
	}
	var ch Changes
	// Heartbeats are newlines before the JSON body, which the decoder
	// skips as whitespace.
	if err := json.NewDecoder(resp.Body).Decode(&ch); err != nil {
		return nil, fmt.Errorf("couch: changes of %s: decode: %w", db, err)
	}
	return &ch, nil
}

// sinceParam renders a sequence for the since parameter: a JSON string's
// contents, anything else as its JSON text.
func sinceParam(seq json.RawMessage) string {
	var s string
	if json.Unmarshal(seq, &s) == nil {
		return s
	}
	return string(seq)
}
