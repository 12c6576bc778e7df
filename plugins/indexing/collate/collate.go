// Package collate is CouchDB's view collation as byte strings: Key turns a
// JSON value into bytes whose order (bytes.Compare) is the order CouchDB
// gives view keys, so that an ordered key-value store returns view rows in
// CouchDB's order from a plain range read.
//
// The order: null < false < true < numbers (by value) < strings (by the
// Unicode Collation Algorithm with the root locale, as CouchDB's ICU
// collator orders them: "a" < "A" < "aa" < "b") < arrays (element by
// element, a prefix first) < objects (pair by pair, key then value, fewer
// pairs first). Strings the collation finds equal are ordered by their
// bytes, so distinct values never share a key.
package collate

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"

	"golang.org/x/text/collate"
	"golang.org/x/text/language"
)

// Type tags, in collation order. End closes an array or object: it sorts
// before any element, so that a prefix sorts first.
const (
	tagEnd    = 0x01
	tagNull   = 0x02
	tagFalse  = 0x03
	tagTrue   = 0x04
	tagNumber = 0x05
	tagString = 0x06
	tagArray  = 0x07
	tagObject = 0x08
)

// collators are UCA collators for the root locale; a collator is not safe
// for concurrent use.
var collators = sync.Pool{New: func() any { return collate.New(language.Und) }}

// ErrInvalid: the input is not one JSON value.
var ErrInvalid = errors.New("collate: invalid JSON")

// Key returns the collation key of a JSON text.
func Key(raw []byte) ([]byte, error) {
	return AppendKey(nil, raw)
}

// AppendKey appends the collation key of a JSON text to dst.
func AppendKey(dst, raw []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	v, err := readValue(dec)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: more than one value", ErrInvalid)
	}
	c := collators.Get().(*collate.Collator)
	defer collators.Put(c)
	var buf collate.Buffer
	return appendValue(dst, v, c, &buf)
}

// pair is an object member. Objects keep their members' order, which
// CouchDB's collation follows (encoding/json's maps would lose it).
type pair struct {
	key string
	val any
}

// readValue reads one value: arrays as []any, objects as []pair.
func readValue(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '[':
			arr := []any{}
			for dec.More() {
				v, err := readValue(dec)
				if err != nil {
					return nil, err
				}
				arr = append(arr, v)
			}
			_, err := dec.Token()
			return arr, err
		case '{':
			obj := []pair{}
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return nil, err
				}
				v, err := readValue(dec)
				if err != nil {
					return nil, err
				}
				obj = append(obj, pair{key: k.(string), val: v})
			}
			_, err := dec.Token()
			return obj, err
		}
	}
	return tok, nil
}

func appendValue(dst []byte, v any, c *collate.Collator, buf *collate.Buffer) ([]byte, error) {
	switch v := v.(type) {
	case nil:
		return append(dst, tagNull), nil
	case bool:
		if v {
			return append(dst, tagTrue), nil
		}
		return append(dst, tagFalse), nil
	case json.Number:
		f, err := v.Float64()
		if err != nil && !math.IsInf(f, 0) {
			return nil, fmt.Errorf("%w: number %s", ErrInvalid, v)
		}
		return appendNumber(append(dst, tagNumber), f), nil
	case string:
		return appendString(append(dst, tagString), v, c, buf), nil
	case []any:
		dst = append(dst, tagArray)
		for _, e := range v {
			var err error
			if dst, err = appendValue(dst, e, c, buf); err != nil {
				return nil, err
			}
		}
		return append(dst, tagEnd), nil
	case []pair:
		dst = append(dst, tagObject)
		for _, p := range v {
			dst = appendString(append(dst, tagString), p.key, c, buf)
			var err error
			if dst, err = appendValue(dst, p.val, c, buf); err != nil {
				return nil, err
			}
		}
		return append(dst, tagEnd), nil
	}
	return nil, fmt.Errorf("%w: unexpected %T", ErrInvalid, v)
}

// appendNumber appends a float64 so that byte order is numeric order:
// the sign bit flipped for positives, every bit for negatives. -0 and 0
// are one number.
func appendNumber(dst []byte, f float64) []byte {
	if f == 0 {
		f = 0
	}
	b := math.Float64bits(f)
	if b>>63 == 1 {
		b = ^b
	} else {
		b |= 1 << 63
	}
	return binary.BigEndian.AppendUint64(dst, b)
}

// appendString appends a string's UCA sort key, then its bytes (the tie
// break), each escaped (0x00 as 0x00 0xFF) and ended by 0x00 0x00, which
// sorts before any continuation.
func appendString(dst []byte, s string, c *collate.Collator, buf *collate.Buffer) []byte {
	buf.Reset()
	dst = appendEscaped(dst, c.KeyFromString(buf, s))
	return appendEscaped(dst, []byte(s))
}

func appendEscaped(dst, b []byte) []byte {
	for {
		i := bytes.IndexByte(b, 0)
		if i < 0 {
			break
		}
		dst = append(append(dst, b[:i]...), 0x00, 0xFF)
		b = b[i+1:]
	}
	return append(append(dst, b...), 0x00, 0x00)
}

// Prefix returns the length of the start of key (a collation key, perhaps
// followed by other bytes) that holds its first value; and, when that
// value is an array of at least n elements, the length of the part that
// holds the array's tag and first n elements (a prefix shared by every
// array that starts with those elements), else -1. View queries group
// rows by it without decoding their keys.
func Prefix(key []byte, n int) (value, elems int, err error) {
	elems = -1
	if len(key) > 0 && key[0] == tagArray {
		pos := 1
		for i := 0; ; i++ {
			if i == n {
				elems = pos
			}
			if pos >= len(key) {
				return 0, 0, ErrInvalid
			}
			if key[pos] == tagEnd {
				return pos + 1, elems, nil
			}
			l, err := skip(key[pos:])
			if err != nil {
				return 0, 0, err
			}
			pos += l
		}
	}
	value, err = skip(key)
	return value, elems, err
}

// skip returns the length of the encoded value at the start of b.
func skip(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, ErrInvalid
	}
	switch b[0] {
	case tagNull, tagFalse, tagTrue:
		return 1, nil
	case tagNumber:
		if len(b) < 9 {
			return 0, ErrInvalid
		}
		return 9, nil
	case tagString:
		pos := 1
		for range 2 { // the sort key, then the raw bytes
			l, err := skipEscaped(b[pos:])
			if err != nil {
				return 0, err
			}
			pos += l
		}
		return pos, nil
	case tagArray, tagObject:
		pos := 1
		for {
			if pos >= len(b) {
				return 0, ErrInvalid
			}
			if b[pos] == tagEnd {
				return pos + 1, nil
			}
			l, err := skip(b[pos:])
			if err != nil {
				return 0, err
			}
			pos += l
		}
	}
	return 0, ErrInvalid
}

// skipEscaped returns the length of an escaped byte string with its end.
func skipEscaped(b []byte) (int, error) {
	for i := 0; i+1 < len(b); i++ {
		if b[i] == 0 {
			if b[i+1] == 0 {
				return i + 2, nil
			}
			i++ // an escaped 0x00
		}
	}
	return 0, ErrInvalid
}
