package indexing

import (
	"bytes"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/couchjobs/couchjobs/plugins/indexing/js"
)

// FuzzQuery: any query string or body is an error or a query whose key
// ranges are well formed; nothing panics.
func FuzzQuery(f *testing.F) {
	for _, s := range []string{"", "key=%22a%22", "keys=%5B1%2C2%5D", "startkey=1&endkey=0", "descending=true&startkey=1&endkey=0&inclusive_end=false",
		"group_level=2&limit=3&skip=1", "stale=ok", "startkey=%5B%5D&startkey_docid=x&endkey=%7B%7D&endkey_docid=y"} {
		f.Add(s, `{"keys":["a"]}`)
	}
	f.Fuzz(func(t *testing.T, query, body string) {
		for _, method := range []string{"GET", "POST"} {
			r := httptest.NewRequest(method, "/db/_design/d/_view/v?"+url.PathEscape(query), strings.NewReader(body))
			r.URL.RawQuery = query
			q, err := parseQuery(r)
			if err != nil {
				continue
			}
			spans, err := q.spans()
			if err != nil {
				continue
			}
			for _, s := range spans {
				if s.lo != nil && s.hi != nil && bytes.Compare(s.lo, s.hi) > 0 && !q.hasKeys {
					// An empty range is fine; an inverted one must have
					// been refused unless docids make it empty.
					if q.startDocID == nil && q.endDocID == nil && q.inclusiveEnd {
						t.Errorf("%q: inverted range %x > %x", query, s.lo, s.hi)
					}
				}
			}
		}
	})
}

// FuzzDesign: any design document parses to a design or an error.
func FuzzDesign(f *testing.F) {
	f.Add(`{"views":{"v":{"map":"function(doc){emit(doc._id,1)}","reduce":"_count"}}}`)
	f.Add(`{"language":"erlang","views":{"v":{"map":"fun(_) -> ok end."}}}`)
	f.Add(`{"views":{"lib":{"x":"y"},"v":{"map":1}}}`)
	f.Add(`{"views":{"v":{"map":"function(doc){}","reduce":"_bogus"}},"options":{"include_design":true}}`)
	f.Fuzz(func(t *testing.T, doc string) {
		d := parseDesign("_design/x", []byte(doc), js.Limits{})
		if d.Error == "" && len(d.Views) > 0 && d.Sig == "" {
			t.Errorf("%q: views without a signature", doc)
		}
		if d.Error != "" && d.Sig != "" {
			t.Errorf("%q: an error and a signature", doc)
		}
	})
}

// FuzzEntries: the decoders of stored entries refuse what they did not
// write, without panicking, and read back what they wrote.
func FuzzEntries(f *testing.F) {
	f.Add([]byte("\x03abc\x01\x311"), "id", []byte(`"k"`), []byte(`{"v":1}`))
	f.Fuzz(func(t *testing.T, raw []byte, id string, key, value []byte) {
		decodeRow(nil, raw)
		decodePartial(raw)
		decodeBack(raw)
		readPart(raw)
		r, err := decodeRow(nil, encodeRow(id, key, value))
		if err != nil || r.docID != id || !bytes.Equal(r.key, key) || !bytes.Equal(r.value, value) {
			t.Errorf("row round trip: %+v %v", r, err)
		}
		if got, rest, err := readPart(part(nil, id)); err != nil || got != id || len(rest) != 0 {
			t.Errorf("part round trip: %q %q %v", got, rest, err)
		}
		back, err := decodeBack(bytes.Join(encodeBack([][]byte{append([]byte{1}, id...), {2, 3}}), nil))
		if err != nil || len(back) != 2 {
			t.Errorf("back round trip: %q %v", back, err)
		}
	})
}
