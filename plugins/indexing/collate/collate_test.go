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

func TestPrefix(t *testing.T) {
	t.Parallel()
	cases := []struct {
		key         string
		n           int
		valueOf     string // the first value alone
		elemsOf     string // an array of the first n elements, "" for none
		trailingLen int
	}{
		{`null`, 1, `null`, "", 0},
		{`"a\u0000b"`, 0, `"a\u0000b"`, "", 0},
		{`[1, "x", [null, {"a": true}], 2]`, 2, `[1, "x", [null, {"a": true}], 2]`, `[1, "x"]`, 0},
		{`[1, "x"]`, 2, `[1, "x"]`, `[1, "x"]`, 0},
		{`[1]`, 2, `[1]`, "", 0},
		{`{"a": [1, 2], "b": "c"}`, 1, `{"a": [1, 2], "b": "c"}`, "", 0},
		{`[[1], {}]`, 1, `[[1], {}]`, `[[1]]`, 0},
	}
	for _, c := range cases {
		k := must(t, c.key)
		withID := append(append([]byte{}, k...), "doc\x00\x00"...)
		value, elems, err := collate.Prefix(withID, c.n)
		if err != nil || value != len(k) {
			t.Errorf("%s: value %d %v; want %d", c.key, value, err, len(k))
		}
		if c.elemsOf == "" {
			if elems != -1 {
				t.Errorf("%s, %d: elems %d; want none", c.key, c.n, elems)
			}
			continue
		}
		want := must(t, c.elemsOf)
		if elems != len(want)-1 || string(withID[:elems]) != string(want[:len(want)-1]) {
			t.Errorf("%s, %d: elems %d; want %d", c.key, c.n, elems, len(want)-1)
		}
	}
	if _, _, err := collate.Prefix([]byte{0x06, 'a', 0}, 0); err == nil {
		t.Error("a cut string passed")
	}
}

func must(t *testing.T, s string) []byte {
	t.Helper()
	k, err := collate.Key([]byte(s))
	if err != nil {
		t.Fatalf("%s: %v", s, err)
	}
	return k
}
