package couch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"sync"
	"time"
)

// FeedOptions select a streamed changes feed.
type FeedOptions struct {
	// Since is the sequence to start after; nil starts at the beginning.
	Since json.RawMessage
	// Continuous keeps the feed open, sending changes as they happen
	// (feed=continuous); otherwise the feed ends at the database's
	// current end (feed=normal).
	Continuous bool
	// Heartbeat is the newline interval a continuous feed asks for
	// (default 10 s). The feed fails when nothing, not even a heartbeat,
	// arrives for IdleTimeout (default 3 heartbeats or 30 s, whichever is
	// longer): pouchdb-server ignores heartbeat and sends one every 6 s.
	Heartbeat   time.Duration
	IdleTimeout time.Duration
	// AllRevs lists every leaf revision of a changed document
	// (style=all_docs); otherwise only the winning one (main_only).
	AllRevs bool
	// IncludeDocs adds each change's winning revision's body.
	IncludeDocs bool
	// Filter is a filter function ("ddoc/name") with its query
	// parameters.
	Filter string
	Params map[string]string
	// DocIDs and Selector are the built-in _doc_ids and _selector filters.
	DocIDs   []string
	Selector json.RawMessage
	// Limit bounds the changes sent; 0 is unbounded.
	Limit int
}

// FeedEnd is what a normal feed says at its end.
type FeedEnd struct {
	// LastSeq is the sequence to resume from.
	LastSeq json.RawMessage `json:"last_seq"`
	// Pending is how many changes remain after LastSeq, when the server
	// says (CouchDB 2+ with a limit); -1 if it did not.
	Pending int64 `json:"pending"`
}

// ErrFeedIdle: a continuous feed sent nothing for its idle timeout.
var ErrFeedIdle = errors.New("couch: the changes feed went silent")

// Feed streams a database's changes feed to fn, one change at a time,
// without holding the feed in memory. A normal feed returns its end; a
// continuous one runs until ctx is done, fn fails, or the connection
// fails (then resume from the last change's sequence).
func (c *Client) Feed(ctx context.Context, db string, o FeedOptions, fn func(Change) error) (FeedEnd, error) {
	q := url.Values{}
	if len(o.Since) > 0 {
		q.Set("since", sinceParam(o.Since))
	}
	q.Set("style", "main_only")
	if o.AllRevs {
		q.Set("style", "all_docs")
	}
	if o.IncludeDocs {
		q.Set("include_docs", "true")
	}
	if o.Limit > 0 {
		q.Set("limit", fmt.Sprint(o.Limit))
	}
	idle := o.IdleTimeout
	if o.Continuous {
		q.Set("feed", "continuous")
		hb := o.Heartbeat
		if hb <= 0 {
			hb = 10 * time.Second
		}
		q.Set("heartbeat", fmt.Sprint(hb.Milliseconds()))
		if idle <= 0 {
			idle = max(3*hb, 30*time.Second)
		}
	}
	var body any
	method := "GET"
	switch {
	case o.Filter != "":
		q.Set("filter", o.Filter)
		for k, v := range o.Params {
			if q.Has(k) {
				return FeedEnd{}, fmt.Errorf("couch: changes of %s: the filter parameter %q is a changes feed option", db, k)
			}
			q.Set(k, v)
		}
	case len(o.DocIDs) > 0:
		q.Set("filter", "_doc_ids")
		method, body = "POST", map[string]any{"doc_ids": o.DocIDs}
	case len(o.Selector) > 0:
		q.Set("filter", "_selector")
		method, body = "POST", map[string]any{"selector": o.Selector}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	resp, err := c.send(ctx, method, c.path(db, "_changes"), q, body)
	if err != nil && len(o.Selector) > 0 && errors.Is(err, ErrNotFound) {
		// pouchdb-server has no _selector filter and takes the selector
		// as a query parameter instead.
		q.Del("filter")
		q.Set("selector", string(o.Selector))
		resp, err = c.send(ctx, "GET", c.path(db, "_changes"), q, nil)
	}
	if err != nil {
		return FeedEnd{}, err
	}
	defer resp.Body.Close()
	var r io.Reader = resp.Body
	if idle > 0 {
		w := newWatchdog(idle, func() { cancel(ErrFeedIdle) })
		defer w.stop()
		r = &touchReader{r: resp.Body, w: w}
	}
	dec := json.NewDecoder(r)
	if o.Continuous {
		err = continuousFeed(dec, fn)
	} else {
		var end FeedEnd
		end, err = normalFeed(dec, fn)
		if err == nil {
			return end, nil
		}
	}
	if cause := context.Cause(ctx); cause != nil && !errors.Is(err, cause) && ctx.Err() != nil {
		err = cause
	}
	return FeedEnd{}, fmt.Errorf("couch: changes of %s: %w", db, err)
}

// normalFeed reads {"results": [change, ...], "last_seq": S, "pending": N}
// a change at a time.
func normalFeed(dec *json.Decoder, fn func(Change) error) (FeedEnd, error) {
	end := FeedEnd{Pending: -1}
	if err := expectDelim(dec, '{'); err != nil {
		return end, err
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return end, err
		}
		switch tok {
		case "results":
			if err := expectDelim(dec, '['); err != nil {
				return end, err
			}
			for dec.More() {
				var ch Change
				if err := dec.Decode(&ch); err != nil {
					return end, err
				}
				if err := fn(ch); err != nil {
					return end, err
				}
			}
			if err := expectDelim(dec, ']'); err != nil {
				return end, err
			}
		case "last_seq":
			if err := dec.Decode(&end.LastSeq); err != nil {
				return end, err
			}
		case "pending":
			if err := dec.Decode(&end.Pending); err != nil {
				return end, err
			}
		default:
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return end, err
			}
		}
	}
	if len(end.LastSeq) == 0 {
		return end, errors.New("the feed has no last_seq")
	}
	return end, nil
}

// continuousFeed reads one change per line; heartbeats are blank lines,
// which the decoder skips. A line with last_seq ends the feed.
func continuousFeed(dec *json.Decoder, fn func(Change) error) error {
	for {
		var row struct {
			Change
			LastSeq json.RawMessage `json:"last_seq"`
			Error   string          `json:"error"`
			Reason  string          `json:"reason"`
		}
		if err := dec.Decode(&row); err != nil {
			if errors.Is(err, io.EOF) {
				return io.ErrUnexpectedEOF
			}
			return err
		}
		switch {
		case row.Error != "":
			return fmt.Errorf("%s: %s", row.Error, row.Reason)
		case row.ID == "" && len(row.LastSeq) > 0:
			return fmt.Errorf("the server ended the feed at %s", row.LastSeq)
		}
		if err := fn(row.Change); err != nil {
			return err
		}
	}
}

func expectDelim(dec *json.Decoder, d json.Delim) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if tok != d {
		return fmt.Errorf("want %q, got %v", d, tok)
	}
	return nil
}

// watchdog calls fire when it is not touched for a while.
type watchdog struct {
	mu    sync.Mutex
	t     *time.Timer
	limit time.Duration
}

func newWatchdog(limit time.Duration, fire func()) *watchdog {
	return &watchdog{t: time.AfterFunc(limit, fire), limit: limit}
}

func (w *watchdog) touch() {
	w.mu.Lock()
	w.t.Reset(w.limit)
	w.mu.Unlock()
}

func (w *watchdog) stop() { w.t.Stop() }

// touchReader touches a watchdog whenever bytes arrive.
type touchReader struct {
	r io.Reader
	w *watchdog
}

func (t *touchReader) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	if n > 0 {
		t.w.touch()
	}
	return n, err
}
