//go:build fdb

package tuple

import (
	"bytes"
	"math/big"
	"testing"

	"github.com/apple/foundationdb/bindings/go/src/fdb"
	official "github.com/apple/foundationdb/bindings/go/src/fdb/tuple"
)

// toOfficial converts a tuple to the official package's types.
func toOfficial(t Tuple) official.Tuple {
	out := make(official.Tuple, len(t))
	for i, el := range t {
		switch el := el.(type) {
		case Tuple:
			out[i] = toOfficial(el)
		case UUID:
			out[i] = official.UUID(el)
		case Versionstamp:
			out[i] = official.Versionstamp{TransactionVersion: el.TransactionVersion, UserVersion: el.UserVersion}
		case big.Int:
			out[i] = &el
		default:
			out[i] = el
		}
	}
	return out
}

// TestSameBytesAsOfficial packs the golden vectors and generated tuples with
// both packages and requires identical bytes, and decodes the official
// bytes with this package.
func TestSameBytesAsOfficial(t *testing.T) {
	fdb.MustAPIVersion(730) // PackWithVersionstamp reads the API version
	check := func(tup Tuple) {
		t.Helper()
		want := toOfficial(tup).Pack()
		if got := tup.Pack(); !bytes.Equal(got, want) {
			t.Fatalf("Pack(%v) = % x, official % x", tup, got, want)
		}
		back, err := Unpack(want)
		if err != nil || Compare(back, tup) != 0 {
			t.Fatalf("Unpack(official % x) = %v, %v", want, back, err)
		}
	}
	for _, tc := range goldenVectors {
		check(tc.t)
	}
	g := newGen(t)
	for range 20000 {
		check(g.tuple(0))
	}
	withVS := Tuple{"a", IncompleteVersionstamp(3), 1}
	got, err := withVS.PackWithVersionstamp([]byte{0x15})
	if err != nil {
		t.Fatal(err)
	}
	want, err := toOfficial(withVS).PackWithVersionstamp([]byte{0x15})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("PackWithVersionstamp = % x, official % x", got, want)
	}
}
