package tuple

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/big"
)

// maxNesting bounds the depth of nested tuples a decoder follows, so that
// hostile input cannot exhaust the stack.
const maxNesting = 1000

// decoder reads elements from buf starting at pos.
type decoder struct {
	buf   []byte
	pos   int
	depth int
}

func (d *decoder) errorf(format string, args ...any) error {
	return fmt.Errorf("%w at byte %d: %s", ErrMalformed, d.pos, fmt.Sprintf(format, args...))
}

// need returns the next n bytes, or an error when the input is shorter.
func (d *decoder) need(n int, what string) ([]byte, error) {
	if len(d.buf)-d.pos < n {
		return nil, d.errorf("%s needs %d bytes, %d left", what, n, len(d.buf)-d.pos)
	}
	b := d.buf[d.pos : d.pos+n]
	d.pos += n
	return b, nil
}

func (d *decoder) tuple(nested bool) (Tuple, error) {
	if nested {
		d.depth++
		if d.depth > maxNesting {
			return nil, d.errorf("tuples nested deeper than %d", maxNesting)
		}
		defer func() { d.depth-- }()
	}
	t := Tuple{}
	for d.pos < len(d.buf) {
		code := d.buf[d.pos]
		if code == codeNil && nested {
			// Inside a nested tuple 0x00 0xFF is a nil element and a lone
			// 0x00 ends the tuple.
			if d.pos+1 < len(d.buf) && d.buf[d.pos+1] == nilEscape {
				d.pos += 2
				t = append(t, nil)
				continue
			}
			d.pos++
			return t, nil
		}
		el, err := d.element()
		if err != nil {
			return nil, err
		}
		t = append(t, el)
	}
	if nested {
		return nil, d.errorf("nested tuple not terminated")
	}
	return t, nil
}

func (d *decoder) element() (Element, error) {
	code := d.buf[d.pos]
	d.pos++
	switch {
	case code == codeNil:
		return nil, nil
	case code == codeBytes:
		return d.bytes()
	case code == codeString:
		b, err := d.bytes()
		return string(b), err
	case code == codeNested:
		return d.tuple(true)
	case code >= codeNegIntBig && code <= codePosIntBig:
		return d.integer(code)
	case code == codeFloat:
		b, err := d.need(4, "float32")
		if err != nil {
			return nil, err
		}
		return float32FromKey(binary.BigEndian.Uint32(b)), nil
	case code == codeDouble:
		b, err := d.need(8, "float64")
		if err != nil {
			return nil, err
		}
		return float64FromKey(binary.BigEndian.Uint64(b)), nil
	case code == codeFalse:
		return false, nil
	case code == codeTrue:
		return true, nil
	case code == codeUUID:
		b, err := d.need(16, "UUID")
		if err != nil {
			return nil, err
		}
		return UUID(b), nil
	case code == codeVersionstamp:
		b, err := d.need(12, "versionstamp")
		if err != nil {
			return nil, err
		}
		return Versionstamp{TransactionVersion: [10]byte(b[:10]), UserVersion: binary.BigEndian.Uint16(b[10:])}, nil
	}
	d.pos--
	return nil, d.errorf("unknown type code 0x%02x", code)
}

// bytes reads an escaped, 0x00-terminated byte string.
func (d *decoder) bytes() ([]byte, error) {
	rest := d.buf[d.pos:]
	end := bytes.IndexByte(rest, 0x00)
	// Fast path: no escaped zero inside.
	if end >= 0 && (end+1 == len(rest) || rest[end+1] != nilEscape) {
		d.pos += end + 1
		return append([]byte{}, rest[:end]...), nil
	}
	var out []byte
	for {
		i := bytes.IndexByte(rest, 0x00)
		if i < 0 {
			d.pos = len(d.buf)
			return nil, d.errorf("byte string not terminated")
		}
		out = append(out, rest[:i]...)
		if i+1 < len(rest) && rest[i+1] == nilEscape {
			out = append(out, 0x00)
			rest = rest[i+2:]
			continue
		}
		d.pos = len(d.buf) - len(rest) + i + 1
		return out, nil
	}
}

// integer decodes the integer codes 0x0b..0x1d into int64, uint64 or
// *big.Int, choosing the type exactly as the official bindings do.
func (d *decoder) integer(code byte) (Element, error) {
	switch {
	case code == codeIntZero:
		return int64(0), nil
	case code > codeIntZero && code < codePosIntBig:
		b, err := d.need(int(code-codeIntZero), "integer")
		if err != nil {
			return nil, err
		}
		u := readUint(b)
		if u <= math.MaxInt64 {
			return int64(u), nil
		}
		return u, nil
	case code < codeIntZero && code > codeNegIntBig:
		b, err := d.need(int(codeIntZero-code), "integer")
		if err != nil {
			return nil, err
		}
		m := ^readUint(b) & lowMask(len(b)) // the magnitude
		if m <= 1<<63 {
			return -int64(m-1) - 1, nil
		}
		return new(big.Int).Neg(new(big.Int).SetUint64(m)), nil
	}
	nb, err := d.need(1, "integer length")
	if err != nil {
		return nil, err
	}
	n := int(nb[0])
	if code == codeNegIntBig {
		n ^= 0xFF
	}
	b, err := d.need(n, "integer")
	if err != nil {
		return nil, err
	}
	if code == codePosIntBig {
		return new(big.Int).SetBytes(b), nil
	}
	mag := make([]byte, n)
	for i, c := range b {
		mag[i] = ^c
	}
	v := new(big.Int).Neg(new(big.Int).SetBytes(mag))
	if v.Cmp(bigMinInt64) == 0 {
		return v.Int64(), nil
	}
	return v, nil
}

func readUint(b []byte) uint64 {
	var u uint64
	for _, c := range b {
		u = u<<8 | uint64(c)
	}
	return u
}

// lowMask has the low n bytes set.
func lowMask(n int) uint64 {
	if n >= 8 {
		return math.MaxUint64
	}
	return 1<<(8*n) - 1
}
