package tuple

import (
	"bytes"
	"encoding/hex"
	"errors"
	"math"
	"math/big"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func mustBig(s string) *big.Int {
	b, ok := new(big.Int).SetString(s, 0)
	if !ok {
		panic(s)
	}
	return b
}

func unhex(s string) []byte {
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		panic(err)
	}
	return b
}

var testUUID = UUID{0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff}

// goldenVectors cover every type code. The expected bytes were worked out by
// hand from the FoundationDB tuple layer specification; the fdb-tagged test
// checks them again against the official package.
var goldenVectors = []struct {
	name string
	t    Tuple
	hex  string
}{
	{"empty", Tuple{}, ""},
	{"nil", Tuple{nil}, "00"},
	{"bytes", Tuple{[]byte("foo\x00bar")}, "01 666f6f 00ff 626172 00"},
	{"empty bytes", Tuple{[]byte{}}, "01 00"},
	{"bytes ff", Tuple{[]byte{0xff, 0x00, 0xff}}, "01 ff 00ff ff 00"},
	{"string", Tuple{"FÔO\x00bar"}, "02 46c3944f 00ff 626172 00"},
	{"empty string", Tuple{""}, "02 00"},
	{"nested", Tuple{Tuple{[]byte("foo\x00bar"), nil, Tuple{}}}, "05 01666f6f00ff62617200 00ff 0500 00"},
	{"nested nil only", Tuple{Tuple{nil}}, "05 00ff 00"},
	{"zero", Tuple{0}, "14"},
	{"one", Tuple{1}, "15 01"},
	{"255", Tuple{255}, "15 ff"},
	{"256", Tuple{256}, "16 0100"},
	{"max int64", Tuple{int64(math.MaxInt64)}, "1c 7fffffffffffffff"},
	{"max uint64", Tuple{uint64(math.MaxUint64)}, "1c ffffffffffffffff"},
	{"minus one", Tuple{-1}, "13 fe"},
	{"minus 255", Tuple{-255}, "13 00"},
	{"minus 256", Tuple{-256}, "12 feff"},
	{"minus 5551212", Tuple{-5551212}, "11 ab4b93"},
	{"min int64", Tuple{int64(math.MinInt64)}, "0c 7fffffffffffffff"},
	{"minus max uint64", Tuple{mustBig("-0xffffffffffffffff")}, "0c 0000000000000000"},
	{"2^64", Tuple{mustBig("0x10000000000000000")}, "1d 09 010000000000000000"},
	{"-2^64", Tuple{mustBig("-0x10000000000000000")}, "0b f6 feffffffffffffffff"},
	{"float32 -42", Tuple{float32(-42)}, "20 3dd7ffff"},
	{"float32 0", Tuple{float32(0)}, "20 80000000"},
	{"float32 -0", Tuple{float32(math.Copysign(0, -1))}, "20 7fffffff"},
	{"float64 -42", Tuple{float64(-42)}, "21 3fbaffffffffffff"},
	{"float64 1.5", Tuple{1.5}, "21 bff8000000000000"},
	{"float64 +inf", Tuple{math.Inf(1)}, "21 fff0000000000000"},
	{"false", Tuple{false}, "26"},
	{"true", Tuple{true}, "27"},
	{"uuid", Tuple{testUUID}, "30 00112233445566778899aabbccddeeff"},
	{"versionstamp", Tuple{Versionstamp{TransactionVersion: [10]byte{0, 0, 0, 0, 0, 0, 0, 1, 0, 2}, UserVersion: 3}}, "33 00000000000000010002 0003"},
	{"mixed", Tuple{"couch_jobs", int64(1), "type", 42}, "02 636f7563685f6a6f627300 1501 027479706500 152a"},
}

func TestGoldenVectors(t *testing.T) {
	t.Parallel()
	for _, tc := range goldenVectors {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			want := unhex(tc.hex)
			got := tc.t.Pack()
			if !bytes.Equal(got, want) {
				t.Fatalf("Pack(%v) = % x, want % x", tc.t, got, want)
			}
			back, err := Unpack(got)
			if err != nil {
				t.Fatalf("Unpack(% x): %v", got, err)
			}
			if Compare(back, tc.t) != 0 {
				t.Fatalf("Unpack(Pack(%v)) = %v", tc.t, back)
			}
		})
	}
}

func TestDecodedTypes(t *testing.T) {
	t.Parallel()
	cases := []struct {
		in   Element
		want Element
	}{
		{0, int64(0)},
		{uint(7), int64(7)},
		{int64(math.MinInt64), int64(math.MinInt64)},
		{uint64(math.MaxInt64) + 1, uint64(math.MaxInt64) + 1},
		{mustBig("5"), int64(5)},
		{mustBig("-0x8000000000000001"), mustBig("-0x8000000000000001")},
		{mustBig("0x10000000000000000"), mustBig("0x10000000000000000")},
		{float32(1.25), float32(1.25)},
		{"s", "s"},
	}
	for _, c := range cases {
		got, err := Unpack(Tuple{c.in}.Pack())
		if err != nil {
			t.Fatal(err)
		}
		switch want := c.want.(type) {
		case *big.Int:
			g, ok := got[0].(*big.Int)
			if !ok || g.Cmp(want) != 0 {
				t.Errorf("decode %v = %T %v, want *big.Int %v", c.in, got[0], got[0], want)
			}
		default:
			if got[0] != c.want {
				t.Errorf("decode %v = %T %v, want %T %v", c.in, got[0], got[0], c.want, c.want)
			}
		}
	}
}

func TestPackWithVersionstamp(t *testing.T) {
	t.Parallel()
	tup := Tuple{"activity", IncompleteVersionstamp(7)}
	got, err := tup.PackWithVersionstamp([]byte("p"))
	if err != nil {
		t.Fatal(err)
	}
	// prefix (1) + string "activity" (10) + code (1) = offset 12.
	want := unhex("70 02 6163746976697479 00 33 ffffffffffffffffffff 0007 0c000000")
	if !bytes.Equal(got, want) {
		t.Fatalf("got % x\nwant % x", got, want)
	}
	if _, err := (Tuple{"x"}).PackWithVersionstamp(nil); !errors.Is(err, ErrNoIncompleteVersionstamp) {
		t.Errorf("no versionstamp: err = %v", err)
	}
	two := Tuple{IncompleteVersionstamp(0), Tuple{IncompleteVersionstamp(1)}}
	if _, err := two.PackWithVersionstamp(nil); !errors.Is(err, ErrManyIncompleteVersionstamps) {
		t.Errorf("two versionstamps: err = %v", err)
	}
	if has, err := two.HasIncompleteVersionstamp(); !has || err == nil {
		t.Errorf("HasIncompleteVersionstamp = %v, %v", has, err)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("Pack of an incomplete versionstamp did not panic")
			}
		}()
		tup.Pack()
	}()
}

func TestPackPanicsOnUnsupportedType(t *testing.T) {
	t.Parallel()
	defer func() {
		if r := recover(); r == nil || !strings.Contains(r.(string), "int32") {
			t.Errorf("recover() = %v, want a panic naming int32", r)
		}
	}()
	Tuple{int32(1)}.Pack()
}

func TestMalformed(t *testing.T) {
	t.Parallel()
	cases := map[string]string{
		"unknown code":         "03",
		"unterminated bytes":   "01 6162",
		"unterminated escape":  "01 00ff",
		"short int":            "16 01",
		"short big int length": "1d",
		"short big int":        "1d 09 01",
		"short neg big int":    "0b f6 fe",
		"short float":          "20 0000",
		"short double":         "21 00",
		"short uuid":           "30 0011",
		"short versionstamp":   "33 00",
		"unterminated nested":  "05 15 01",
		"deep nesting":         strings.Repeat("05", maxNesting+1),
	}
	for name, h := range cases {
		if _, err := Unpack(unhex(h)); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: Unpack(%s) err = %v, want ErrMalformed", name, h, err)
		}
	}
}

func TestString(t *testing.T) {
	t.Parallel()
	got := Tuple{"a", []byte{0, 'b'}, nil, 3, Tuple{true}}.String()
	want := `("a", \x00b, <nil>, 3, (true))`
	if got != want {
		t.Errorf("String() = %s, want %s", got, want)
	}
	if got := testUUID.String(); got != "00112233-4455-6677-8899-aabbccddeeff" {
		t.Errorf("UUID.String() = %s", got)
	}
}

func TestPrefixRange(t *testing.T) {
	t.Parallel()
	prefix := Tuple{"jobs"}.Pack()
	begin, end := PrefixRange(prefix)
	inside := []Tuple{{"jobs", nil}, {"jobs", 1}, {"jobs", "z", Tuple{}}, {"jobs", Versionstamp{}}}
	for _, in := range inside {
		k := in.Pack()
		if bytes.Compare(k, begin) < 0 || bytes.Compare(k, end) >= 0 {
			t.Errorf("%v outside the prefix range", in)
		}
	}
	for _, out := range []Tuple{{"jobs"}, {"jobr", 1}, {"jobs\x00"}} {
		k := out.Pack()
		if bytes.Compare(k, begin) >= 0 && bytes.Compare(k, end) < 0 {
			t.Errorf("%v inside the prefix range", out)
		}
	}
}

// gen draws elements biased towards the boundaries where encodings change
// length or sign, so that generated pairs often differ only there.
type gen struct{ r *rand.Rand }

var edgeInts = []Element{
	0, 1, -1, 255, 256, -255, -256, 65535, -65536, int64(math.MaxInt64), int64(math.MinInt64),
	int64(math.MinInt64 + 1), uint64(math.MaxUint64), uint64(math.MaxInt64) + 1,
	mustBig("0x10000000000000000"), mustBig("-0x10000000000000000"), mustBig("-0xffffffffffffffff"),
	mustBig("0x" + strings.Repeat("ff", 255)), mustBig("-0x" + strings.Repeat("ff", 255)),
	mustBig("0x1" + strings.Repeat("00", 20)), mustBig("-0x1" + strings.Repeat("00", 20)),
}

var edgeFloats = []float64{0, math.Copysign(0, -1), 1, -1, math.Inf(1), math.Inf(-1), math.NaN(),
	-math.NaN(), math.SmallestNonzeroFloat64, -math.SmallestNonzeroFloat64, math.MaxFloat64, 1.5, -1.5}

func (g gen) bytes() []byte {
	alphabet := []byte{0x00, 0x01, 'a', 'b', 0xfe, 0xff}
	b := make([]byte, g.r.IntN(4))
	for i := range b {
		b[i] = alphabet[g.r.IntN(len(alphabet))]
	}
	return b
}

func (g gen) element(depth int) Element {
	switch g.r.IntN(12) {
	case 0:
		return nil
	case 1:
		return g.bytes()
	case 2:
		return string(g.bytes()) + []string{"", "é", "\u00ff", "日本"}[g.r.IntN(4)]
	case 3:
		if depth > 2 {
			return nil
		}
		return g.tuple(depth + 1)
	case 4:
		return edgeInts[g.r.IntN(len(edgeInts))]
	case 5:
		n := g.r.Int64()
		if g.r.IntN(2) == 0 {
			n = -n
		}
		return n >> g.r.IntN(64)
	case 6:
		return float32(edgeFloats[g.r.IntN(len(edgeFloats))])
	case 7:
		if g.r.IntN(2) == 0 {
			return edgeFloats[g.r.IntN(len(edgeFloats))]
		}
		return g.r.NormFloat64()
	case 8:
		return g.r.IntN(2) == 0
	case 9:
		var u UUID
		u[g.r.IntN(16)] = byte(g.r.IntN(3))
		return u
	case 10:
		var v Versionstamp
		v.TransactionVersion[9] = byte(g.r.IntN(3))
		v.UserVersion = uint16(g.r.IntN(3))
		return v
	default:
		return new(big.Int).Lsh(big.NewInt(int64(g.r.IntN(3))-1), uint(g.r.IntN(200)))
	}
}

func (g gen) tuple(depth int) Tuple {
	t := make(Tuple, g.r.IntN(4))
	for i := range t {
		t[i] = g.element(depth)
	}
	return t
}

func newGen(t *testing.T) gen {
	seed := uint64(rand.Int64())
	t.Logf("seed %d", seed)
	return gen{rand.New(rand.NewPCG(seed, 0))}
}

func TestRoundTripGenerated(t *testing.T) {
	t.Parallel()
	g := newGen(t)
	for range 20000 {
		tup := g.tuple(0)
		packed := tup.Pack()
		back, err := Unpack(packed)
		if err != nil {
			t.Fatalf("Unpack(Pack(%v)): %v", tup, err)
		}
		if Compare(back, tup) != 0 {
			t.Fatalf("round trip of %v gave %v", tup, back)
		}
		if !bytes.Equal(back.Pack(), packed) {
			t.Fatalf("repacking %v changed its bytes", tup)
		}
	}
}

func TestByteOrderIsTupleOrder(t *testing.T) {
	t.Parallel()
	g := newGen(t)
	sign := func(n int) int { return max(-1, min(1, n)) }
	for range 50000 {
		a, b := g.tuple(0), g.tuple(0)
		if g.r.IntN(2) == 0 { // share a prefix, so that later elements decide
			b = append(slices.Clone(a[:g.r.IntN(len(a)+1)]), b...)
		}
		want := Compare(a, b)
		if got := sign(bytes.Compare(a.Pack(), b.Pack())); got != want {
			t.Fatalf("bytes order %d, tuple order %d for\n a=%v\n b=%v", got, want, a, b)
		}
	}
}

func TestSortedTuplesPackSorted(t *testing.T) {
	t.Parallel()
	g := newGen(t)
	ts := make([]Tuple, 2000)
	for i := range ts {
		ts[i] = g.tuple(0)
	}
	slices.SortFunc(ts, Compare)
	for i := 1; i < len(ts); i++ {
		if bytes.Compare(ts[i-1].Pack(), ts[i].Pack()) > 0 {
			t.Fatalf("%v sorts before %v but packs after it", ts[i-1], ts[i])
		}
	}
}

func FuzzUnpack(f *testing.F) {
	for _, tc := range goldenVectors {
		f.Add(unhex(tc.hex))
	}
	f.Add([]byte{0x05, 0x05, 0x00, 0xff, 0x00})
	f.Add([]byte{0x0b, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) {
		tup, err := Unpack(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		// Whatever decodes must survive a re-encode and decode unchanged,
		// even when the input was not canonical.
		e := encoder{vsPos: -1}
		e.tuple(tup, false)
		again, err := Unpack(e.buf)
		if err != nil {
			t.Fatalf("re-encoded %v does not decode: %v", tup, err)
		}
		if Compare(tup, again) != 0 {
			t.Fatalf("re-encoding changed %v to %v", tup, again)
		}
	})
}

func BenchmarkPack(b *testing.B) {
	tup := Tuple{"couch_jobs", 1, "replication", "db1/doc-000123"}
	buf := make([]byte, 0, 64)
	b.ReportAllocs()
	for b.Loop() {
		buf = tup.AppendPack(buf[:0])
	}
}

func BenchmarkUnpack(b *testing.B) {
	packed := Tuple{"couch_jobs", 1, "replication", "db1/doc-000123"}.Pack()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Unpack(packed); err != nil {
			b.Fatal(err)
		}
	}
}
