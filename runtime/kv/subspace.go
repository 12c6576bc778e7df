package kv

import (
	"bytes"
	"fmt"

	"github.com/couchjobs/couchjobs/runtime/tuple"
)

// Range is the keys k with Begin <= k < End.
type Range struct {
	Begin, End []byte
}

// KeyRange returns the range holding exactly key.
func KeyRange(key []byte) Range {
	return Range{Begin: key, End: append(append(make([]byte, 0, len(key)+1), key...), 0x00)}
}

// PrefixRange returns the range of every key that starts with prefix,
// including prefix itself.
func PrefixRange(prefix []byte) Range {
	end := strinc(prefix)
	return Range{Begin: append([]byte(nil), prefix...), End: end}
}

// Contains reports whether key lies in r.
func (r Range) Contains(key []byte) bool {
	return bytes.Compare(key, r.Begin) >= 0 && bytes.Compare(key, r.End) < 0
}

// strinc returns the first key after every key that starts with prefix: the
// prefix without trailing 0xFF bytes, with its last byte incremented. An
// all-0xFF prefix has no such key; the end of the keyspace is returned.
func strinc(prefix []byte) []byte {
	p := bytes.TrimRight(prefix, "\xff")
	if len(p) == 0 {
		return []byte{0xFF}
	}
	out := append([]byte(nil), p...)
	out[len(out)-1]++
	return out
}

// Subspace is a key prefix made of a packed tuple, so that each layer, each
// job type and each plugin keeps its keys in a range of its own. Keys in a
// subspace are the prefix followed by a packed tuple.
type Subspace struct {
	prefix []byte
}

// Sub returns the subspace whose prefix is the packed tuple of elems.
func Sub(elems ...tuple.Element) Subspace {
	return Subspace{prefix: tuple.Tuple(elems).Pack()}
}

// SubspaceFromBytes returns the subspace with a raw prefix, for a prefix
// given by configuration.
func SubspaceFromBytes(prefix []byte) Subspace {
	return Subspace{prefix: append([]byte(nil), prefix...)}
}

// Sub returns the subspace of s extended by elems.
func (s Subspace) Sub(elems ...tuple.Element) Subspace {
	return Subspace{prefix: tuple.Tuple(elems).AppendPack(s.bytesCopy(len(elems) * 8))}
}

// Bytes returns the prefix. The caller must not modify it.
func (s Subspace) Bytes() []byte { return s.prefix }

// Pack returns the key of t in s.
func (s Subspace) Pack(t tuple.Tuple) []byte {
	return t.AppendPack(s.bytesCopy(16))
}

// PackWithVersionstamp returns the key of t in s for SetVersionstampedKey;
// t must hold one incomplete versionstamp.
func (s Subspace) PackWithVersionstamp(t tuple.Tuple) ([]byte, error) {
	return t.PackWithVersionstamp(s.prefix)
}

// Unpack decodes a key of s back into its tuple.
func (s Subspace) Unpack(key []byte) (tuple.Tuple, error) {
	if !bytes.HasPrefix(key, s.prefix) {
		return nil, fmt.Errorf("key %s is not in subspace %s", printable(key), printable(s.prefix))
	}
	return tuple.Unpack(key[len(s.prefix):])
}

// Contains reports whether key starts with the prefix.
func (s Subspace) Contains(key []byte) bool { return bytes.HasPrefix(key, s.prefix) }

// Range returns the range of every tuple key in s, excluding the bare prefix.
func (s Subspace) Range() Range {
	b, e := tuple.PrefixRange(s.prefix)
	return Range{Begin: b, End: e}
}

// RangeOf returns the range of keys in s whose tuple starts with t.
func (s Subspace) RangeOf(t tuple.Tuple) Range {
	b, e := tuple.PrefixRange(s.Pack(t))
	return Range{Begin: b, End: e}
}

// bytesCopy returns a copy of the prefix with room for extra more bytes, so
// appending a tuple never aliases the subspace's own prefix.
func (s Subspace) bytesCopy(extra int) []byte {
	return append(make([]byte, 0, len(s.prefix)+extra), s.prefix...)
}
