package main

import (
	"os/exec"
	"reflect"
	"strings"
	"testing"
)

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
