package tuple

import (
	"bytes"
	"cmp"
	"fmt"
	"math/big"
)

// Compare orders two tuples by their elements, and returns -1, 0 or +1. It is
// defined on values, not bytes, and the encoding is built so that
// bytes.Compare(a.Pack(), b.Pack()) == Compare(a, b). Elements of different
// kinds order as: nil, byte strings, strings, nested tuples, integers,
// float32, float64, false, true, UUIDs, versionstamps. Integers compare by
// value whatever their Go type; floats by the IEEE 754 total order
// (-NaN < -Inf < ... < -0 < +0 < ... < +Inf < NaN). A tuple that is a prefix of
// another sorts first. Compare panics on elements Pack would reject.
func Compare(a, b Tuple) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		if c := compareElements(a[i], b[i]); c != 0 {
			return c
		}
	}
	return cmp.Compare(len(a), len(b))
}

// kind is the rank of an element's kind in the tuple order; it is the type
// code, with every integer code folded into one.
func kind(el Element) int {
	switch el := el.(type) {
	case nil:
		return codeNil
	case []byte:
		return codeBytes
	case string:
		return codeString
	case Tuple:
		return codeNested
	case int, int64, uint, uint64, *big.Int, big.Int:
		return codeIntZero
	case float32:
		return codeFloat
	case float64:
		return codeDouble
	case bool:
		if el {
			return codeTrue
		}
		return codeFalse
	case UUID:
		return codeUUID
	case Versionstamp:
		return codeVersionstamp
	}
	panic(fmt.Sprintf("tuple: cannot compare element of type %T", el))
}

func compareElements(a, b Element) int {
	ka, kb := kind(a), kind(b)
	if ka != kb {
		return cmp.Compare(ka, kb)
	}
	switch a := a.(type) {
	case []byte:
		return bytes.Compare(a, b.([]byte))
	case string:
		return cmp.Compare(a, b.(string)) // Go compares strings bytewise
	case Tuple:
		return Compare(a, b.(Tuple))
	case float32:
		return cmp.Compare(float32Key(a), float32Key(b.(float32)))
	case float64:
		return cmp.Compare(float64Key(a), float64Key(b.(float64)))
	case UUID:
		bu := b.(UUID)
		return bytes.Compare(a[:], bu[:])
	case Versionstamp:
		return bytes.Compare(a.Bytes(), b.(Versionstamp).Bytes())
	case nil, bool:
		return 0 // the kind already decided
	}
	return toBig(a).Cmp(toBig(b))
}

// toBig widens any supported integer to *big.Int.
func toBig(el Element) *big.Int {
	switch el := el.(type) {
	case int:
		return big.NewInt(int64(el))
	case int64:
		return big.NewInt(el)
	case uint:
		return new(big.Int).SetUint64(uint64(el))
	case uint64:
		return new(big.Int).SetUint64(el)
	case *big.Int:
		return el
	case big.Int:
		return &el
	}
	panic(fmt.Sprintf("tuple: %T is not an integer", el))
}
