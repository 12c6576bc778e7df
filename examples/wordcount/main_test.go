package main

import (
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"reflect"
	"strings"
	"testing"

	"github.com/couchjobs/couchjobs/sdk"
	"github.com/couchjobs/couchjobs/sdk/sdktest"
)

// TestCountJob runs the job type for real, in-process, with sdktest: a
// store, the host's dispatch and the plugin protocol, no child process.
func TestCountJob(t *testing.T) {
	h := sdktest.New(t, newPlugin(), map[string]any{"chunk_words": 2})
	res := h.Run("wordcount", "doc1", Input{Text: "the cat and the hat", Top: 1})
	if res.Outcome != sdktest.Completed {
		t.Fatalf("outcome %s: %s", res.Outcome, res.Reason)
	}
	var got Result
	if err := res.Decode(&got); err != nil {
		t.Fatal(err)
	}
	if want := (Result{Words: 5, Distinct: 4, Top: []WordCount{{"the", 2}}}); !reflect.DeepEqual(got, want) {
		t.Fatalf("result %+v, want %+v", got, want)
	}
	if c := string(h.Get([]byte("doc1/the"))); c != "2" {
		t.Fatalf("stored count of \"the\" = %q", c)
	}
	// Bad input fails for good, with the reason.
	if res := h.Run("wordcount", "bad", map[string]any{"text": 42}); res.Outcome != sdktest.Failed || !strings.Contains(res.Reason, "decode") {
		t.Fatalf("bad input: %+v", res)
	}
}

func TestConfigErrors(t *testing.T) {
	err := configure(context.Background(), &sdk.Config{JSON: json.RawMessage(`{"max_bytes":0,"chunk_words":-1}`)})
	var ces sdk.ConfigErrors
	if !errors.As(err, &ces) || len(ces) != 2 || ces[0].Key != "max_bytes" || ces[1].Key != "chunk_words" {
		t.Fatalf("configure: %v", err)
	}
	// A misspelt key is an error that names it.
	err = configure(context.Background(), &sdk.Config{JSON: json.RawMessage(`{"max_byte":10}`)})
	if err == nil || !strings.Contains(err.Error(), `unknown field "max_byte"`) {
		t.Fatalf("a misspelt key: %v", err)
	}
}

func TestSummarize(t *testing.T) {
	words := Words("To be, or not to be: that is the question. Isn't it? To BE!")
	counts := map[string]int{}
	for _, w := range words {
		counts[w]++
	}
	got := Summarize(counts, 3)
	want := Result{Words: 14, Distinct: 10, Top: []WordCount{{"be", 3}, {"to", 3}, {"is", 1}}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
}

// TestImportsOnlyTheSDK proves that a job type needs nothing from the
// runtime's internals: the plugin's dependencies reach no couchjobs
// package but the SDK and its protocol.
func TestImportsOnlyTheSDK(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if strings.HasPrefix(pkg, "github.com/couchjobs/couchjobs/") &&
			!strings.HasPrefix(pkg, "github.com/couchjobs/couchjobs/sdk") &&
			pkg != "github.com/couchjobs/couchjobs/examples/wordcount" {
			t.Errorf("the example plugin depends on %s", pkg)
		}
	}
}
