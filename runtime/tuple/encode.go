package tuple

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/big"
)

// encoder appends encoded elements to buf. vsPos is the offset of the one
// incomplete versionstamp, or -1.
type encoder struct {
	buf   []byte
	vsPos int
}

func (e *encoder) tuple(t Tuple, nested bool) {
	if nested {
		e.buf = append(e.buf, codeNested)
	}
	for i, el := range t {
		e.element(i, el, nested)
	}
	if nested {
		e.buf = append(e.buf, 0x00)
	}
}

func (e *encoder) element(i int, el Element, nested bool) {
	switch el := el.(type) {
	case nil:
		e.buf = append(e.buf, codeNil)
		if nested {
			e.buf = append(e.buf, nilEscape)
		}
	case Tuple:
		e.tuple(el, true)
	case []byte:
		e.bytes(codeBytes, el)
	case string:
		e.string(el)
	case int:
		e.int(int64(el))
	case int64:
		e.int(el)
	case uint:
		e.uint(uint64(el))
	case uint64:
		e.uint(el)
	case *big.Int:
		e.bigInt(el)
	case big.Int:
		e.bigInt(&el)
	case float32:
		e.buf = append(e.buf, codeFloat)
		e.buf = binary.BigEndian.AppendUint32(e.buf, float32Key(el))
	case float64:
		e.buf = append(e.buf, codeDouble)
		e.buf = binary.BigEndian.AppendUint64(e.buf, float64Key(el))
	case bool:
		if el {
			e.buf = append(e.buf, codeTrue)
		} else {
			e.buf = append(e.buf, codeFalse)
		}
	case UUID:
		e.buf = append(e.buf, codeUUID)
		e.buf = append(e.buf, el[:]...)
	case Versionstamp:
		e.buf = append(e.buf, codeVersionstamp)
		if !el.Complete() {
			e.vsPos = len(e.buf)
		}
		e.buf = append(e.buf, el.TransactionVersion[:]...)
		e.buf = binary.BigEndian.AppendUint16(e.buf, el.UserVersion)
	default:
		panic(fmt.Sprintf("tuple: unencodable element at index %d (%v, type %T)", i, el, el))
	}
}

// bytes writes a byte string with every 0x00 escaped as 0x00 0xFF and a 0x00
// terminator, which keeps prefixes sorting first.
func (e *encoder) bytes(code byte, b []byte) {
	e.buf = append(e.buf, code)
	for {
		i := bytes.IndexByte(b, 0x00)
		if i < 0 {
			break
		}
		e.buf = append(e.buf, b[:i+1]...)
		e.buf = append(e.buf, nilEscape)
		b = b[i+1:]
	}
	e.buf = append(e.buf, b...)
	e.buf = append(e.buf, 0x00)
}

// string is bytes without converting the string to a slice first.
func (e *encoder) string(s string) {
	e.buf = append(e.buf, codeString)
	for {
		i := indexZero(s)
		if i < 0 {
			break
		}
		e.buf = append(e.buf, s[:i+1]...)
		e.buf = append(e.buf, nilEscape)
		s = s[i+1:]
	}
	e.buf = append(e.buf, s...)
	e.buf = append(e.buf, 0x00)
}

func indexZero(s string) int {
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return i
		}
	}
	return -1
}

// Integers are written as a sign and a magnitude: the type code says the sign
// and the byte length, and negative magnitudes are complemented so that
// larger magnitudes sort first.

func (e *encoder) uint(u uint64) {
	n := byteLen(u)
	e.buf = append(e.buf, byte(codeIntZero+n))
	e.buf = appendLow(e.buf, u, n)
}

func (e *encoder) int(i int64) {
	if i >= 0 {
		e.uint(uint64(i))
		return
	}
	m := uint64(-(i + 1)) + 1 // the magnitude, without overflow at MinInt64
	n := byteLen(m)
	e.buf = append(e.buf, byte(codeIntZero-n))
	e.buf = appendLow(e.buf, ^m, n)
}

func (e *encoder) bigInt(b *big.Int) {
	if b.IsInt64() {
		e.int(b.Int64())
		return
	}
	if b.IsUint64() {
		e.uint(b.Uint64())
		return
	}
	mag := b.Bytes() // big-endian magnitude, no leading zeros
	n := len(mag)
	if n > maxBigIntBytes {
		panic(fmt.Sprintf("tuple: integer magnitude of %d bytes exceeds %d", n, maxBigIntBytes))
	}
	if b.Sign() > 0 {
		if n <= 8 {
			e.buf = append(e.buf, byte(codeIntZero+n))
		} else {
			e.buf = append(e.buf, codePosIntBig, byte(n))
		}
		e.buf = append(e.buf, mag...)
		return
	}
	if n <= 8 {
		e.buf = append(e.buf, byte(codeIntZero-n))
	} else {
		e.buf = append(e.buf, codeNegIntBig, byte(n)^0xFF)
	}
	for _, c := range mag {
		e.buf = append(e.buf, ^c)
	}
}

// byteLen returns the number of bytes needed to hold u; zero needs none.
func byteLen(u uint64) int {
	n := 0
	for u != 0 {
		n++
		u >>= 8
	}
	return n
}

// appendLow appends the low n bytes of u, big-endian.
func appendLow(dst []byte, u uint64, n int) []byte {
	for i := n - 1; i >= 0; i-- {
		dst = append(dst, byte(u>>(8*i)))
	}
	return dst
}

// float32Key maps a float32 to an unsigned integer whose order is the IEEE
// 754 total order: negative numbers have every bit flipped, positive numbers
// only the sign bit.
func float32Key(f float32) uint32 {
	u := math.Float32bits(f)
	if u&(1<<31) != 0 {
		return ^u
	}
	return u | 1<<31
}

func float32FromKey(u uint32) float32 {
	if u&(1<<31) != 0 {
		return math.Float32frombits(u &^ (1 << 31))
	}
	return math.Float32frombits(^u)
}

// float64Key is float32Key for float64.
func float64Key(f float64) uint64 {
	u := math.Float64bits(f)
	if u&(1<<63) != 0 {
		return ^u
	}
	return u | 1<<63
}

func float64FromKey(u uint64) float64 {
	if u&(1<<63) != 0 {
		return math.Float64frombits(u &^ (1 << 63))
	}
	return math.Float64frombits(^u)
}
