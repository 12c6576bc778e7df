package indexing

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"

	"github.com/axiomhq/hyperloglog"

	"github.com/couchjobs/couchjobs/plugins/indexing/collate"
	"github.com/couchjobs/couchjobs/plugins/indexing/js"
)

// row is one row of a view.
type row struct {
	rk    []byte // the row's key within its view's level 0
	docID string
	key   json.RawMessage
	value json.RawMessage
}

// encodeRow is a row's stored value: the document id, the key, the value.
func encodeRow(docID string, key, value []byte) []byte {
	b := make([]byte, 0, 4+len(docID)+len(key)+len(value))
	b = binary.AppendUvarint(b, uint64(len(docID)))
	b = append(b, docID...)
	b = binary.AppendUvarint(b, uint64(len(key)))
	b = append(b, key...)
	return append(b, value...)
}

var errCorrupt = errors.New("indexing: corrupt index entry")

func decodeRow(rk, b []byte) (row, error) {
	n, w := binary.Uvarint(b)
	if w <= 0 || uint64(len(b)-w) < n {
		return row{}, errCorrupt
	}
	id := string(b[w : w+int(n)])
	b = b[w+int(n):]
	n, w = binary.Uvarint(b)
	if w <= 0 || uint64(len(b)-w) < n {
		return row{}, errCorrupt
	}
	return row{rk: rk, docID: id, key: b[w : w+int(n)], value: b[w+int(n):]}, nil
}

// partial is what a tree node holds: the number of rows below it and
// their reduction (or the error computing it).
type partial struct {
	count uint64
	value json.RawMessage
	err   string
}

func encodePartial(p partial) []byte {
	b := binary.AppendUvarint(nil, p.count)
	if p.err != "" {
		return append(append(b, 'E'), p.err...)
	}
	return append(append(b, 'J'), p.value...)
}

func decodePartial(b []byte) (partial, error) {
	n, w := binary.Uvarint(b)
	if w <= 0 || len(b) == w {
		return partial{}, errCorrupt
	}
	p := partial{count: n}
	switch b[w] {
	case 'E':
		p.err = string(b[w+1:])
	case 'J':
		p.value = b[w+1:]
	default:
		return partial{}, errCorrupt
	}
	return p, nil
}

// reducer is a view's reduce function. A nil reducer (a map-only view)
// still counts rows, for total_rows and offset.
type reducer interface {
	// reduce reduces rows; rereduce reduces earlier results.
	reduce(rows []row) (json.RawMessage, error)
	rereduce(parts []json.RawMessage) (json.RawMessage, error)
	// final turns a result into the value a query returns.
	final(v json.RawMessage) (json.RawMessage, error)
}

// reduceRows makes the partial of rows.
func reduceRows(r reducer, rows []row) partial {
	p := partial{count: uint64(len(rows))}
	if r == nil {
		return p
	}
	v, err := r.reduce(rows)
	if err != nil {
		p.err = err.Error()
	} else {
		p.value = v
	}
	return p
}

// rereduceParts combines partials.
func rereduceParts(r reducer, parts []partial) partial {
	var p partial
	vals := make([]json.RawMessage, 0, len(parts))
	for _, q := range parts {
		p.count += q.count
		if q.err != "" && p.err == "" {
			p.err = q.err
		}
		vals = append(vals, q.value)
	}
	if r == nil || p.err != "" || len(vals) == 0 {
		return p
	}
	if len(vals) == 1 {
		p.value = vals[0]
		return p
	}
	v, err := r.rereduce(vals)
	if err != nil {
		p.err = err.Error()
	} else {
		p.value = v
	}
	return p
}

// newReducer returns the reducer of a view's reduce source.
func newReducer(src string, limits js.Limits) (reducer, error) {
	src = strings.TrimSpace(src)
	switch src {
	case "":
		return nil, nil
	case "_count":
		return countReducer{}, nil
	case "_sum":
		return sumReducer{}, nil
	case "_stats":
		return statsReducer{}, nil
	case "_approx_count_distinct":
		return hllReducer{}, nil
	}
	if strings.HasPrefix(src, "_") {
		return nil, fmt.Errorf("unknown built-in reduce function %q (want _count, _sum, _stats or _approx_count_distinct)", src)
	}
	if _, err := js.CompileReduce(src, limits, nil); err != nil {
		return nil, err
	}
	r := &jsReducer{}
	r.pool.New = func() any {
		f, err := js.CompileReduce(src, limits, nil)
		if err != nil {
			panic(err) // it compiled above
		}
		return f
	}
	return r, nil
}

// errReduce is a built-in reduce function's error, as CouchDB names it.
type errReduce struct{ msg string }

func (e *errReduce) Error() string { return e.msg }

func decodeNumber(v json.RawMessage) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(v))
	dec.UseNumber()
	var x any
	err := dec.Decode(&x)
	return x, err
}

// countReducer is _count.
type countReducer struct{}

func (countReducer) reduce(rows []row) (json.RawMessage, error) {
	return json.RawMessage(fmt.Sprint(len(rows))), nil
}

func (countReducer) rereduce(parts []json.RawMessage) (json.RawMessage, error) {
	var n float64
	for _, p := range parts {
		var x float64
		if err := json.Unmarshal(p, &x); err != nil {
			return nil, err
		}
		n += x
	}
	return json.Marshal(n)
}

func (countReducer) final(v json.RawMessage) (json.RawMessage, error) { return v, nil }

// sumReducer is _sum: numbers, arrays of numbers (added element by
// element) and objects of them (added key by key).
type sumReducer struct{}

func (sumReducer) reduce(rows []row) (json.RawMessage, error) {
	var acc any
	for _, r := range rows {
		v, err := decodeNumber(r.value)
		if err != nil {
			return nil, err
		}
		if acc, err = addSum(acc, v); err != nil {
			return nil, err
		}
	}
	return marshalSum(acc)
}

func (s sumReducer) rereduce(parts []json.RawMessage) (json.RawMessage, error) {
	var acc any
	for _, p := range parts {
		v, err := decodeNumber(p)
		if err != nil {
			return nil, err
		}
		if acc, err = addSum(acc, v); err != nil {
			return nil, err
		}
	}
	return marshalSum(acc)
}

func (sumReducer) final(v json.RawMessage) (json.RawMessage, error) { return v, nil }

func marshalSum(v any) (json.RawMessage, error) {
	if v == nil {
		v = 0
	}
	return json.Marshal(v)
}

var errSum = &errReduce{"the _sum function requires that map values be numbers, arrays of numbers, or objects of them"}

// addSum adds b to a (nil: nothing yet).
func addSum(a, b any) (any, error) {
	switch bv := b.(type) {
	case json.Number:
		f, err := bv.Float64()
		if err != nil {
			return nil, errSum
		}
		switch av := a.(type) {
		case nil:
			return f, nil
		case float64:
			return av + f, nil
		case []any:
			// CouchDB adds a number to an array's first element.
			return addSum(av, []any{bv})
		}
	case []any:
		switch av := a.(type) {
		case nil:
			return addSum([]any{}, bv)
		case float64:
			return addSum([]any{json.Number(fmt.Sprint(av))}, bv)
		case []any:
			out := make([]any, max(len(av), len(bv)))
			for i := range out {
				var x, y any
				if i < len(av) {
					x = av[i]
				}
				if i < len(bv) {
					var err error
					if y, err = addSum(nil, bv[i]); err != nil {
						return nil, err
					}
				}
				if x == nil {
					out[i] = y
					continue
				}
				if y == nil {
					out[i] = x
					continue
				}
				s, err := addSum(x, asNumber(y))
				if err != nil {
					return nil, err
				}
				out[i] = s
			}
			return out, nil
		}
	case map[string]any:
		av, ok := a.(map[string]any)
		if a != nil && !ok {
			return nil, errSum
		}
		out := make(map[string]any, len(av)+len(bv))
		for k, v := range av {
			out[k] = v
		}
		for k, v := range bv {
			s, err := addSum(out[k], v)
			if err != nil {
				return nil, err
			}
			out[k] = s
		}
		return out, nil
	}
	return nil, errSum
}

// asNumber turns a sum back into the decoded form addSum takes.
func asNumber(v any) any {
	switch x := v.(type) {
	case float64:
		return json.Number(fmt.Sprint(x))
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = asNumber(e)
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = asNumber(e)
		}
		return out
	}
	return v
}

// stats is one _stats result.
type stats struct {
	Sum    float64 `json:"sum"`
	Count  float64 `json:"count"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	Sumsqr float64 `json:"sumsqr"`
}

func (s stats) add(o stats) stats {
	if s.Count == 0 {
		return o
	}
	if o.Count == 0 {
		return s
	}
	return stats{s.Sum + o.Sum, s.Count + o.Count, math.Min(s.Min, o.Min), math.Max(s.Max, o.Max), s.Sumsqr + o.Sumsqr}
}

// statsReducer is _stats: of numbers, arrays of numbers (element by
// element), or precomputed stats objects.
type statsReducer struct{}

var errStats = &errReduce{"the _stats function requires that map values be numbers or arrays of numbers"}

// statsOf reads one value: a number, a stats object or an array of
// either.
func statsOf(raw json.RawMessage) (one stats, many []stats, err error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return stats{}, nil, errStats
	}
	switch raw[0] {
	case '[':
		var elems []json.RawMessage
		if err := json.Unmarshal(raw, &elems); err != nil {
			return stats{}, nil, errStats
		}
		many = make([]stats, len(elems))
		for i, e := range elems {
			s, sub, err := statsOf(e)
			if err != nil || sub != nil {
				return stats{}, nil, errStats
			}
			many[i] = s
		}
		return stats{}, many, nil
	case '{':
		var s struct{ Sum, Count, Min, Max, Sumsqr *float64 }
		if err := json.Unmarshal(raw, &s); err != nil || s.Sum == nil || s.Count == nil || s.Min == nil || s.Max == nil {
			return stats{}, nil, &errReduce{"user _stats input missing required field sum, count, min or max"}
		}
		one = stats{Sum: *s.Sum, Count: *s.Count, Min: *s.Min, Max: *s.Max}
		if s.Sumsqr != nil {
			one.Sumsqr = *s.Sumsqr
		}
		return one, nil, nil
	}
	var f float64
	if err := json.Unmarshal(raw, &f); err != nil {
		return stats{}, nil, errStats
	}
	return stats{f, 1, f, f, f * f}, nil, nil
}

func (statsReducer) combine(vals []json.RawMessage) (json.RawMessage, error) {
	var one stats
	var many []stats
	for _, v := range vals {
		s, arr, err := statsOf(v)
		if err != nil {
			return nil, err
		}
		if (arr != nil) != (many != nil) && (one.Count > 0 || many != nil) {
			return nil, errStats
		}
		if arr == nil {
			one = one.add(s)
			continue
		}
		if many == nil {
			many = make([]stats, len(arr))
		}
		if len(arr) != len(many) {
			return nil, &errReduce{"the _stats function requires arrays of one length"}
		}
		for i := range arr {
			many[i] = many[i].add(arr[i])
		}
	}
	if many != nil {
		return json.Marshal(many)
	}
	return json.Marshal(one)
}

func (s statsReducer) reduce(rows []row) (json.RawMessage, error) {
	vals := make([]json.RawMessage, len(rows))
	for i, r := range rows {
		vals[i] = r.value
	}
	return s.combine(vals)
}

func (s statsReducer) rereduce(parts []json.RawMessage) (json.RawMessage, error) {
	return s.combine(parts)
}

func (statsReducer) final(v json.RawMessage) (json.RawMessage, error) { return v, nil }

// hllReducer is _approx_count_distinct: a HyperLogLog sketch of the
// rows' keys (by collation, so 1 and 1.0 are one key), stored as base64.
type hllReducer struct{}

func (hllReducer) sketch(v json.RawMessage) (*hyperloglog.Sketch, error) {
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		return nil, errCorrupt
	}
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, errCorrupt
	}
	sk := hyperloglog.New14()
	if err := sk.UnmarshalBinary(b); err != nil {
		return nil, fmt.Errorf("%w: %v", errCorrupt, err)
	}
	return sk, nil
}

func (hllReducer) encode(sk *hyperloglog.Sketch) (json.RawMessage, error) {
	b, err := sk.MarshalBinary()
	if err != nil {
		return nil, err
	}
	return json.Marshal(base64.StdEncoding.EncodeToString(b))
}

func (h hllReducer) reduce(rows []row) (json.RawMessage, error) {
	sk := hyperloglog.New14()
	for _, r := range rows {
		k, err := collate.Key(r.key)
		if err != nil {
			return nil, err
		}
		sk.Insert(k)
	}
	return h.encode(sk)
}

func (h hllReducer) rereduce(parts []json.RawMessage) (json.RawMessage, error) {
	sk := hyperloglog.New14()
	for _, p := range parts {
		o, err := h.sketch(p)
		if err != nil {
			return nil, err
		}
		if err := sk.Merge(o); err != nil {
			return nil, err
		}
	}
	return h.encode(sk)
}

func (h hllReducer) final(v json.RawMessage) (json.RawMessage, error) {
	sk, err := h.sketch(v)
	if err != nil {
		return nil, err
	}
	return json.Marshal(sk.Estimate())
}

// jsReducer runs a JavaScript reduce function; compiled functions are
// pooled because one is not safe for concurrent use.
type jsReducer struct{ pool sync.Pool }

func (j *jsReducer) call(keys, values []byte, rereduce bool) (json.RawMessage, error) {
	f := j.pool.Get().(*js.Reduce)
	defer j.pool.Put(f)
	return f.Run(keys, values, rereduce)
}

func (j *jsReducer) reduce(rows []row) (json.RawMessage, error) {
	keys := []byte{'['}
	vals := []byte{'['}
	for i, r := range rows {
		if i > 0 {
			keys, vals = append(keys, ','), append(vals, ',')
		}
		id, _ := json.Marshal(r.docID)
		keys = append(append(append(append(append(keys, '['), r.key...), ','), id...), ']')
		vals = append(vals, r.value...)
	}
	return j.call(append(keys, ']'), append(vals, ']'), false)
}

func (j *jsReducer) rereduce(parts []json.RawMessage) (json.RawMessage, error) {
	vals, err := json.Marshal(parts)
	if err != nil {
		return nil, err
	}
	return j.call(nil, vals, true)
}

func (j *jsReducer) final(v json.RawMessage) (json.RawMessage, error) { return v, nil }
