package collate_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/couchjobs/couchjobs/plugins/indexing/collate"
)

// ordered follows CouchDB's documented collation example (the "Collation
// Specification" of its views documentation), with numbers of every kind,
// punctuation in the Unicode Collation Algorithm's root order (ICU's),
// strings whose order is not their bytes' order ("a" < "B", "é" < "f"),
// and nesting.
var ordered = []string{
	`null`, `false`, `true`,
	`-1e300`, `-1`, `-0.5`, `0`, `1`, `2`, `3.5`, `4`, `1e300`,
	`"_"`, `"-"`, `","`, `";"`, `":"`, `"!"`, `"?"`, `"."`, `"'"`, `"\""`, `"("`, `")"`,
	`"["`, `"]"`, `"{"`, `"}"`, `"@"`, `"*"`, `"/"`, `"\\"`, `"&"`, `"#"`, `"%"`, `"` + "`" + `"`, `"^"`,
	`"+"`, `"<"`, `"="`, `">"`, `"|"`, `"~"`, `"$"`,
	`"0"`, `"1"`, `"9"`, `"a"`, `"A"`, `"aa"`, `"b"`, `"B"`, `"ba"`, `"bb"`, `"é"`, `"f"`, `"z"`, `"Z"`,
	`[]`, `["a"]`, `["b"]`, `["b","c"]`, `["b","c","a"]`, `["b","d"]`, `["b","d","e"]`, `[["a"]]`,
	`{}`, `{"a":1}`, `{"a":2}`, `{"b":1}`, `{"b":2}`, `{"b":2,"a":1}`, `{"b":2,"c":2}`,
}

func TestOrder(t *testing.T) {
	t.Parallel()
	keys := make([][]byte, len(ordered))
	for i, s := range ordered {
		k, err := collate.Key([]byte(s))
		if err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		keys[i] = k
	}
	for i := range keys {
		for j := range keys {
			want := 0
			if i < j {
				want = -1
			} else if i > j {
				want = 1
			}
			if got := bytes.Compare(keys[i], keys[j]); got != want {
				t.Errorf("compare(%s, %s) = %d, want %d", ordered[i], ordered[j], got, want)
			}
		}
	}
}

func TestEqual(t *testing.T) {
	t.Parallel()
	for _, pair := range [][2]string{{`3`, `3.0`}, {`0`, `-0`}, {`1e2`, `100`}, {` "a" `, `"a"`}, {`[1, 2]`, `[1,2]`}} {
		a, _ := collate.Key([]byte(pair[0]))
		b, _ := collate.Key([]byte(pair[1]))
		if !bytes.Equal(a, b) {
			t.Errorf("%s and %s collate apart", pair[0], pair[1])
		}
	}
}

func TestInvalid(t *testing.T) {
	t.Parallel()
	for _, s := range []string{``, `{`, `[1,]`, `1 2`, `nul`, `"a`} {
		if _, err := collate.Key([]byte(s)); !errors.Is(err, collate.ErrInvalid) {
			t.Errorf("%q: %v", s, err)
		}
	}
}

// FuzzKey: every JSON value has a key, and the key of a value with a
// suffix appended (inside an array) sorts after the value's own array.
func FuzzKey(f *testing.F) {
	for _, s := range ordered {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		k, err := collate.Key([]byte(s))
		if err != nil {
			return
		}
		a, err1 := collate.Key([]byte("[" + s + "]"))
		b, err2 := collate.Key([]byte("[" + s + ",null]"))
		if err1 != nil || err2 != nil || bytes.Compare(a, b) >= 0 || len(k) == 0 {
			t.Fatalf("%q: [v] %x, [v,null] %x", s, a, b)
		}
	})
}
