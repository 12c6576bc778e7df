package indexing

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"hash/fnv"
	"math/bits"
)

// Keys of the plugin's subspace. Strings are escaped (0x00 as 0x00 0xFF)
// and end with 0x00 0x00, so a sequence of them orders and splits
// unambiguously and a prefix of parts is a key range.
//
//	D <server> <db> <ddoc id>           design document record (JSON)
//	S <server> <db> <signature>         signature state: "live" or "dead:<unix ms>"
//	I <index id> m                      marker: the index's view_seq and row counts
//	I <index id> b <doc id> <chunk>     back-index: the rows a document emitted
//	I <index id> v <view> <level> <row> reduce tree; level 0 holds the rows
//
// A row key is the collation key of the emitted key, the document id and
// an emit counter (a document may emit one key twice). The index id is a
// hash of (server, db, signature), so that an index's keys stay short.

const (
	tagDDoc  = 'D'
	tagSig   = 'S'
	tagIndex = 'I'
)

// part appends an escaped string.
func part(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			dst = append(dst, 0x00, 0xFF)
			continue
		}
		dst = append(dst, s[i])
	}
	return append(dst, 0x00, 0x00)
}

// readPart splits an escaped string off the front of b.
func readPart(b []byte) (string, []byte, error) {
	var out []byte
	for i := 0; i < len(b); i++ {
		if b[i] != 0 {
			continue
		}
		if i+1 >= len(b) {
			break
		}
		out = append(out, b[:i]...)
		if b[i+1] == 0x00 {
			return string(out), b[i+2:], nil
		}
		out = append(out, 0)
		b = b[i+2:]
		i = -1
	}
	return "", nil, errors.New("indexing: truncated key part")
}

// strinc is the first key after every key with prefix p.
func strinc(p []byte) []byte {
	out := bytes.Clone(p)
	for i := len(out) - 1; i >= 0; i-- {
		if out[i] != 0xFF {
			out[i]++
			return out[:i+1]
		}
	}
	return append(out, 0xFF) // all 0xFF: nothing we store comes after
}

func ddocPrefix(server, db string) []byte {
	return part(part([]byte{tagDDoc}, server), db)
}

func ddocKey(server, db, ddoc string) []byte { return part(ddocPrefix(server, db), ddoc) }

func sigKey(server, db, sig string) []byte {
	return part(part(part([]byte{tagSig}, server), db), sig)
}

// index is one index's key space.
type index struct{ prefix []byte }

func newIndex(server, db, sig string) index {
	h := sha256.Sum256(part(part(part(nil, server), db), sig))
	return index{prefix: append([]byte{tagIndex}, h[:16]...)}
}

func (ix index) key(tag byte, rest ...byte) []byte {
	k := make([]byte, 0, len(ix.prefix)+1+len(rest))
	return append(append(append(k, ix.prefix...), tag), rest...)
}

func (ix index) marker() []byte { return ix.key('m') }

func (ix index) backPrefix(docID string) []byte { return part(ix.key('b'), docID) }

func (ix index) back(docID string, chunk int) []byte {
	return binary.BigEndian.AppendUint16(ix.backPrefix(docID), uint16(chunk))
}

// level is the key space of one level of a view's tree.
func (ix index) level(view, level int) []byte { return ix.key('v', byte(view), byte(level)) }

// all is the index's whole key range.
func (ix index) all() (begin, end []byte) { return ix.prefix, strinc(ix.prefix) }

// rowKey is the key of a row within its view: collation key, doc id,
// emit counter.
func rowKey(collated []byte, docID string, dup int) []byte {
	k := part(collated, docID)
	return binary.BigEndian.AppendUint16(k, uint16(dup))
}

// Tree levels: a row is a node of level L when the hash of its key has
// L*fanoutBits trailing zero bits, so a node of level L stands for about
// 2^fanoutBits nodes of level L-1.
const (
	fanoutBits = 4
	maxLevel   = 7
)

func nodeLevel(rk []byte) int {
	h := fnv.New64a()
	h.Write(rk)
	l := bits.TrailingZeros64(h.Sum64()) / fanoutBits
	return min(l, maxLevel)
}
