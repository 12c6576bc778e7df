// Package tuple encodes and decodes FoundationDB tuples.
//
// The encoding is byte-for-byte the one of the official FoundationDB bindings
// (github.com/apple/foundationdb/bindings/go/src/fdb/tuple), so keys written by
// couchjobs can be read by any FoundationDB layer and vice versa. This package
// exists because the official one imports the cgo fdb package, which the
// default (embedded store) build must not need.
//
// The defining property of the encoding is that the byte order of packed
// tuples equals the tuple order defined by [Compare]. Every key in the store is
// a packed tuple, so range reads over tuple prefixes return elements in their
// natural order (integers numerically, strings by UTF-8 bytes, and so on).
//
// Supported element types, as in the official bindings: nil, []byte, string,
// int, int64, uint, uint64, *big.Int, big.Int, float32, float64, bool, [UUID],
// [Versionstamp] and nested [Tuple]. Decoding yields int64 for integers that fit
// in it, uint64 for larger ones that fit in 64 bits, and *big.Int beyond.
package tuple

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
)

// Element is one value in a tuple. See the package documentation for the
// types it may hold.
type Element = any

// Tuple is an ordered list of elements that packs into an order-preserving
// byte string.
type Tuple []Element

// UUID is a 16-byte universally unique identifier, encoded with its own type
// code so that it sorts apart from byte strings.
type UUID [16]byte

// String formats the UUID in its canonical 8-4-4-4-12 hexadecimal form.
func (u UUID) String() string {
	var b [36]byte
	hex.Encode(b[0:8], u[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], u[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], u[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], u[8:10])
	b[23] = '-'
	hex.Encode(b[24:], u[10:])
	return string(b[:])
}

// Versionstamp is a 12-byte value: the 10-byte commit version of a
// transaction followed by a 2-byte user version that orders several
// versionstamps written by one transaction.
type Versionstamp struct {
	// TransactionVersion is set by the store at commit. All 0xFF bytes mark
	// an incomplete versionstamp, to be filled in at commit.
	TransactionVersion [10]byte
	// UserVersion orders versionstamps within one transaction.
	UserVersion uint16
}

// incompleteVersion marks a versionstamp whose transaction version the store
// fills in at commit.
var incompleteVersion = [10]byte{0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF}

// IncompleteVersionstamp returns a versionstamp to be completed by the store
// when the transaction that writes it commits. Pack it with
// [Tuple.PackWithVersionstamp].
func IncompleteVersionstamp(userVersion uint16) Versionstamp {
	return Versionstamp{TransactionVersion: incompleteVersion, UserVersion: userVersion}
}

// Complete reports whether the store has filled in the transaction version.
func (v Versionstamp) Complete() bool { return v.TransactionVersion != incompleteVersion }

// Bytes returns the 12-byte encoding: transaction version, then the user
// version big-endian.
func (v Versionstamp) Bytes() []byte {
	b := make([]byte, 12)
	copy(b, v.TransactionVersion[:])
	binary.BigEndian.PutUint16(b[10:], v.UserVersion)
	return b
}

// String formats the versionstamp as hexadecimal transaction version and the
// decimal user version.
func (v Versionstamp) String() string {
	return fmt.Sprintf("Versionstamp(%x, %d)", v.TransactionVersion, v.UserVersion)
}

// Type codes of the encoding. They also give the order between elements of
// different kinds.
const (
	codeNil          = 0x00
	codeBytes        = 0x01
	codeString       = 0x02
	codeNested       = 0x05
	codeNegIntBig    = 0x0b // negative integer longer than 8 bytes
	codeIntZero      = 0x14 // 0x0c..0x13 negative, 0x15..0x1c positive, by byte length
	codePosIntBig    = 0x1d // positive integer longer than 8 bytes
	codeFloat        = 0x20
	codeDouble       = 0x21
	codeFalse        = 0x26
	codeTrue         = 0x27
	codeUUID         = 0x30
	codeVersionstamp = 0x33

	// nilEscape follows a 0x00 byte inside byte strings and nested tuples,
	// so that 0x00 alone can terminate them.
	nilEscape = 0xFF
	// maxBigIntBytes is the largest integer magnitude the length byte can
	// describe.
	maxBigIntBytes = 255
)

// Errors returned by decoding and versionstamp packing. Decoding errors wrap
// [ErrMalformed], so callers can tell bad input from other failures.
var (
	// ErrMalformed reports bytes that are not a valid packed tuple.
	ErrMalformed = errors.New("tuple: malformed encoding")
	// ErrNoIncompleteVersionstamp reports a PackWithVersionstamp call on a
	// tuple without an incomplete versionstamp.
	ErrNoIncompleteVersionstamp = errors.New("tuple: no incomplete versionstamp to pack")
	// ErrManyIncompleteVersionstamps reports a tuple with more than one
	// incomplete versionstamp: the store fills in exactly one position.
	ErrManyIncompleteVersionstamps = errors.New("tuple: more than one incomplete versionstamp")
)

// Pack returns the encoding of t. It panics if t holds a value of an
// unsupported type, an integer whose magnitude exceeds 255 bytes, or an
// incomplete versionstamp (use [Tuple.PackWithVersionstamp]): those are
// programming errors, as in the official bindings.
func (t Tuple) Pack() []byte { return t.AppendPack(nil) }

// AppendPack appends the encoding of t to dst and returns the extended
// slice. It panics in the same cases as [Tuple.Pack]. Hot paths use it to
// build keys under a prefix without extra allocations.
func (t Tuple) AppendPack(dst []byte) []byte {
	e := encoder{buf: dst, vsPos: -1}
	e.tuple(t, false)
	if e.vsPos >= 0 {
		panic("tuple: incomplete versionstamp in Pack; use PackWithVersionstamp")
	}
	return e.buf
}

// PackWithVersionstamp returns prefix followed by the encoding of t, which must
// hold exactly one incomplete versionstamp, and then the 4-byte little-endian
// offset of that versionstamp, as the store's SetVersionstampedKey and
// SetVersionstampedValue expect (FoundationDB API version 520 and later).
func (t Tuple) PackWithVersionstamp(prefix []byte) ([]byte, error) {
	switch n := t.countIncomplete(); {
	case n == 0:
		return nil, ErrNoIncompleteVersionstamp
	case n > 1:
		return nil, ErrManyIncompleteVersionstamps
	}
	e := encoder{buf: append([]byte(nil), prefix...), vsPos: -1}
	e.tuple(t, false)
	return binary.LittleEndian.AppendUint32(e.buf, uint32(e.vsPos)), nil
}

// HasIncompleteVersionstamp reports whether t holds an incomplete
// versionstamp, and an error if it holds more than one.
func (t Tuple) HasIncompleteVersionstamp() (bool, error) {
	n := t.countIncomplete()
	if n > 1 {
		return true, ErrManyIncompleteVersionstamps
	}
	return n == 1, nil
}

func (t Tuple) countIncomplete() int {
	n := 0
	for _, el := range t {
		switch el := el.(type) {
		case Versionstamp:
			if !el.Complete() {
				n++
			}
		case Tuple:
			n += el.countIncomplete()
		}
	}
	return n
}

// String formats the tuple the way the official bindings do, for logs and
// test failures.
func (t Tuple) String() string {
	var sb strings.Builder
	t.format(&sb)
	return sb.String()
}

func (t Tuple) format(sb *strings.Builder) {
	sb.WriteByte('(')
	for i, el := range t {
		if i > 0 {
			sb.WriteString(", ")
		}
		switch el := el.(type) {
		case nil:
			sb.WriteString("<nil>")
		case string:
			sb.WriteString(strconv.Quote(el))
		case []byte:
			sb.WriteString(Printable(el))
		case UUID:
			sb.WriteString(el.String())
		case Tuple:
			el.format(sb)
		default:
			fmt.Fprintf(sb, "%v", el)
		}
	}
	sb.WriteByte(')')
}

// Printable renders a byte string with printable ASCII kept and every other
// byte as \xNN, the convention of FoundationDB's tools. Logs use it for keys.
func Printable(b []byte) string {
	var sb strings.Builder
	for _, c := range b {
		if c >= 32 && c < 127 && c != '\\' {
			sb.WriteByte(c)
		} else {
			fmt.Fprintf(&sb, "\\x%02x", c)
		}
	}
	return sb.String()
}

// Unpack decodes a packed tuple. Malformed input gives an error wrapping
// [ErrMalformed], never a panic.
func Unpack(b []byte) (Tuple, error) {
	d := decoder{buf: b}
	t, err := d.tuple(false)
	if err != nil {
		return nil, err
	}
	return t, nil
}

// PrefixRange returns the range [begin, end) holding every key that starts
// with prefix and is longer than it. It is the range of all tuples that
// extend a packed tuple prefix.
func PrefixRange(prefix []byte) (begin, end []byte) {
	begin = append(append(make([]byte, 0, len(prefix)+1), prefix...), 0x00)
	end = append(append(make([]byte, 0, len(prefix)+1), prefix...), 0xFF)
	return begin, end
}

// bigMinInt64 is the one value the big-integer codes decode to int64, as in
// the official bindings.
var bigMinInt64 = big.NewInt(math.MinInt64)
