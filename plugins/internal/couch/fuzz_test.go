package couch

import (
	"bytes"
	"encoding/json"
	"mime/multipart"
	"strings"
	"testing"
)

// The decoders of what a server sends must refuse garbage with an error,
// never panic or loop.

func FuzzFeeds(f *testing.F) {
	f.Add([]byte(`{"results":[{"seq":1,"id":"a","changes":[{"rev":"1-x"}]}],"last_seq":1,"pending":0}`))
	f.Add([]byte(`{"results":[],"last_seq":"5-g1AAAA"}`))
	f.Add([]byte("{\"seq\":1,\"id\":\"a\",\"changes\":[]}\n\n{\"last_seq\":1}\n"))
	f.Add([]byte(`{"error":"x","reason":"y"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		n := 0
		end, err := normalFeed(json.NewDecoder(bytes.NewReader(b)), func(Change) error { n++; return nil })
		if err == nil && len(end.LastSeq) == 0 {
			t.Fatalf("a feed without last_seq passed: %q", b)
		}
		if err := continuousFeed(json.NewDecoder(bytes.NewReader(b)), func(Change) error { return nil }); err == nil {
			t.Fatalf("a continuous feed ended without an error: %q", b)
		}
	})
}

func FuzzOpenRevsMultipart(f *testing.F) {
	f.Add("--b\r\nContent-Type: application/json\r\n\r\n{\"_id\":\"d\",\"_rev\":\"1-a\"}\r\n--b--\r\n")
	f.Add("--b\r\nContent-Type: multipart/related; boundary=\"i\"\r\n\r\n--i\r\nContent-Type: application/json\r\n\r\n" +
		`{"_id":"d","_rev":"1-a","_attachments":{"f":{"follows":true}}}` + "\r\n--i\r\nContent-Disposition: attachment; filename=\"f\"\r\n\r\nxyz\r\n--i--\r\n\r\n--b--\r\n")
	f.Add("--b\r\nContent-Type: application/json; error=\"true\"\r\n\r\n{\"missing\":\"2-b\"}\r\n--b--\r\n")
	f.Fuzz(func(t *testing.T, body string) {
		revs, err := readOpenRevsMultipart(multipart.NewReader(strings.NewReader(body), "b"), "d")
		if err != nil {
			return
		}
		for _, r := range revs {
			if !r.Missing && !json.Valid(r.Doc) {
				t.Fatalf("a revision that is not JSON: %q", r.Doc)
			}
		}
	})
}
