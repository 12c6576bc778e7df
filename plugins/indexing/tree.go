package indexing

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sort"

	"github.com/google/btree"
	"golang.org/x/sync/errgroup"

	"github.com/couchjobs/couchjobs/sdk"
)

// The reduce tree. Level 0 of a view holds its rows; a row whose key
// hashes to level L (nodeLevel) is also a node of every level 1..L, and a
// node of level L holds the partial (row count and reduction) of every row
// from its key up to the next node of level L. A reduction over any key
// range then reads the nodes of the top levels inside the range and
// descends only at its two edges: about 2 * 16 entries per level, never
// every row. It is a deterministic skip list: the shape depends only on
// the keys, so no rebalancing, and an update touches one node per level.

// entry is one key of a level (the row key, without the level's prefix)
// and its value.
type entry struct{ k, v []byte }

// levelReader reads one level of a view: the entries in [lo, hi) (hi
// nil: to the end), in order.
type levelReader interface {
	scan(ctx context.Context, view, level int, lo, hi []byte) ([]entry, error)
}

// storeReader reads an index through the host.
type storeReader struct {
	host *sdk.Host
	ix   index
}

// scan reads a whole range, page by page.
func (s storeReader) scan(ctx context.Context, view, level int, lo, hi []byte) ([]entry, error) {
	var out []entry
	err := s.each(ctx, view, level, lo, hi, false, 0, func(e entry) (bool, error) {
		out = append(out, e)
		return true, nil
	})
	return out, err
}

// each calls fn with the entries of [lo, hi) in order (reverse:
// descending) until fn says stop, reading page entries at a time (0: the
// host's maximum).
func (s storeReader) each(ctx context.Context, view, level int, lo, hi []byte, reverse bool, page int, fn func(entry) (bool, error)) error {
	prefix := s.ix.level(view, level)
	begin := append(bytes.Clone(prefix), lo...)
	end := strinc(prefix)
	if hi != nil {
		end = append(bytes.Clone(prefix), hi...)
	}
	for bytes.Compare(begin, end) < 0 {
		kvs, err := s.host.Range(ctx, begin, end, page, reverse)
		if err != nil {
			return fmt.Errorf("read the index: %w", err)
		}
		if len(kvs) == 0 {
			return nil
		}
		for _, kv := range kvs {
			if !bytes.HasPrefix(kv.Key, prefix) {
				return errCorrupt
			}
			more, err := fn(entry{k: kv.Key[len(prefix):], v: kv.Value})
			if err != nil || !more {
				return err
			}
		}
		if limit := page; len(kvs) < limit || (limit <= 0 && len(kvs) < maxPage) {
			return nil // the host had no more
		}
		last := kvs[len(kvs)-1].Key
		if reverse {
			end = last
		} else {
			begin = append(bytes.Clone(last), 0)
		}
	}
	return nil
}

// aggregate is the partial of a view's rows in [lo, hi) (hi nil: to the
// end), read from the top level down. The view's row count says which
// levels can hold nodes at all (unknown: all of them).
func aggregate(ctx context.Context, rd levelReader, v view, lo, hi []byte) (partial, error) {
	top := 1
	if v.rows < 0 {
		top = maxLevel
	}
	for n := v.rows >> fanoutBits; n > 0 && top < maxLevel; n >>= fanoutBits {
		top++
	}
	return aggregateLevel(ctx, rd, v, top, lo, hi, false)
}

// aggregateLevel reduces [lo, hi) from level down. hiIsNode says hi is a
// node key of this level or above, so that the span of the last node
// inside the range ends at hi and its partial counts whole. The range is
// then split in two chains that each descend one node per level: the
// head before the first node (whose end is a node), and the tail from
// the last node (whose start is a node); they run at once.
func aggregateLevel(ctx context.Context, rd levelReader, v view, level int, lo, hi []byte, hiIsNode bool) (partial, error) {
	if hi != nil && bytes.Compare(lo, hi) >= 0 {
		return partial{}, nil
	}
	if level == 0 {
		es, err := rd.scan(ctx, v.num, 0, lo, hi)
		if err != nil {
			return partial{}, err
		}
		rows := make([]row, len(es))
		for i, e := range es {
			if rows[i], err = decodeRow(e.k, e.v); err != nil {
				return partial{}, err
			}
		}
		return reduceRows(v.red, rows), nil
	}
	nodes, err := rd.scan(ctx, v.num, level, lo, hi)
	if err != nil {
		return partial{}, err
	}
	if len(nodes) == 0 {
		return aggregateLevel(ctx, rd, v, level-1, lo, hi, hiIsNode)
	}
	whole := nodes[:len(nodes)-1]
	if hiIsNode {
		whole = nodes
	}
	type result struct {
		p   partial
		err error
	}
	headc := make(chan result, 1)
	if !bytes.Equal(lo, nodes[0].k) {
		go func() {
			p, err := aggregateLevel(ctx, rd, v, level-1, lo, nodes[0].k, true)
			headc <- result{p, err}
		}()
	} else {
		headc <- result{}
	}
	var tail partial
	if !hiIsNode {
		tail, err = aggregateLevel(ctx, rd, v, level-1, nodes[len(nodes)-1].k, hi, false)
	}
	head := <-headc
	if err == nil {
		err = head.err
	}
	if err != nil {
		return partial{}, err
	}
	parts := make([]partial, 0, len(nodes)+2)
	parts = appendPartial(parts, head.p)
	for _, n := range whole {
		p, err := decodePartial(n.v)
		if err != nil {
			return partial{}, err
		}
		parts = appendPartial(parts, p)
	}
	parts = appendPartial(parts, tail)
	return rereduceParts(v.red, parts), nil
}

// appendPartial skips empty partials: a reduction of no rows is not a
// value to rereduce.
func appendPartial(parts []partial, p partial) []partial {
	if p.count == 0 && p.err == "" {
		return parts
	}
	return append(parts, p)
}

// updateTree brings levels 1 and up of a view's tree in line with a
// batch's row changes (changed: row key → whether it exists after the
// batch; pending: the batch's rows, nil for removed ones), in the cache
// and as writes.
func (b *builder) updateTree(ctx context.Context, v int, changed map[string]bool, pending map[string][]byte) ([]sdk.Write, error) {
	var writes []sdk.Write
	sortedPending := make([]string, 0, len(pending))
	for k := range pending {
		sortedPending = append(sortedPending, k)
	}
	slices.Sort(sortedPending)
	for level := 1; level <= maxLevel && len(changed) > 0; level++ {
		t := b.cache[v][level]
		next := map[string]bool{}
		// Nodes that appear or go at this level.
		for k, exists := range changed {
			if nodeLevel([]byte(k)) < level {
				continue
			}
			e := entry{k: []byte(k)}
			if exists {
				if _, ok := t.Get(e); !ok {
					t.ReplaceOrInsert(e)
				}
				continue
			}
			if _, ok := t.Delete(e); ok {
				writes = append(writes, sdk.Clear(append(b.ix.level(v, level), k...)))
				next[k] = false
			}
		}
		// Nodes whose span holds a change: the one covering each changed
		// key, and the one before a node that appeared or went.
		affected := map[string]struct{}{}
		for k := range changed {
			if n, ok := floor(t, []byte(k), true); ok {
				affected[string(n.k)] = struct{}{}
			}
			if nodeLevel([]byte(k)) >= level {
				if n, ok := floor(t, []byte(k), false); ok {
					affected[string(n.k)] = struct{}{}
				}
			}
		}
		keys := make([]string, 0, len(affected))
		for k := range affected {
			keys = append(keys, k)
		}
		parts := make([]partial, len(keys))
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(8)
		for i, k := range keys {
			lo := []byte(k)
			var hi []byte
			if n, ok := after(t, lo); ok {
				hi = n.k
			}
			if level > 1 {
				children, err := b.cachedRange(v, level-1, lo, hi)
				if err != nil {
					return nil, err
				}
				parts[i] = rereduceParts(b.views[v].red, children)
				continue
			}
			g.Go(func() error {
				rows, err := b.rowsWithPending(gctx, v, lo, hi, pending, sortedPending)
				if err != nil {
					return err
				}
				parts[i] = reduceRows(b.views[v].red, rows)
				return nil
			})
		}
		if err := g.Wait(); err != nil {
			return nil, err
		}
		for i, k := range keys {
			val := encodePartial(parts[i])
			t.ReplaceOrInsert(entry{k: []byte(k), v: val})
			writes = append(writes, sdk.Set(append(b.ix.level(v, level), k...), val))
			next[k] = true
		}
		changed = next
	}
	return writes, nil
}

// floor is the greatest node at or before k (inclusive) or before k.
func floor(t *btree.BTreeG[entry], k []byte, inclusive bool) (entry, bool) {
	var out entry
	found := false
	t.DescendLessOrEqual(entry{k: k}, func(e entry) bool {
		if !inclusive && bytes.Equal(e.k, k) {
			return true
		}
		out, found = e, true
		return false
	})
	return out, found
}

// after is the first node after k.
func after(t *btree.BTreeG[entry], k []byte) (entry, bool) {
	var out entry
	found := false
	t.AscendGreaterOrEqual(entry{k: k}, func(e entry) bool {
		if bytes.Equal(e.k, k) {
			return true
		}
		out, found = e, true
		return false
	})
	return out, found
}

// cachedRange decodes the cached nodes of a level in [lo, hi).
func (b *builder) cachedRange(v, level int, lo, hi []byte) ([]partial, error) {
	var out []partial
	var err error
	b.cache[v][level].AscendGreaterOrEqual(entry{k: lo}, func(e entry) bool {
		if hi != nil && bytes.Compare(e.k, hi) >= 0 {
			return false
		}
		var p partial
		if p, err = decodePartial(e.v); err != nil {
			return false
		}
		out = appendPartial(out, p)
		return true
	})
	return out, err
}

// rowsWithPending reads a view's rows in [lo, hi) as they are after the
// batch: the stored rows with the batch's changes laid over them.
func (b *builder) rowsWithPending(ctx context.Context, v int, lo, hi []byte, pending map[string][]byte, sorted []string) ([]row, error) {
	stored, err := storeReader{host: b.p.host, ix: b.ix}.scan(ctx, v, 0, lo, hi)
	if err != nil {
		return nil, err
	}
	// Merge the stored rows with the batch's, in key order.
	i := sort.SearchStrings(sorted, string(lo))
	var out []row
	add := func(k, val []byte) error {
		r, err := decodeRow(k, val)
		if err != nil {
			return err
		}
		out = append(out, r)
		return nil
	}
	for _, e := range stored {
		for ; i < len(sorted) && sorted[i] < string(e.k); i++ {
			if val := pending[sorted[i]]; val != nil {
				if err := add([]byte(sorted[i]), val); err != nil {
					return nil, err
				}
			}
		}
		if i < len(sorted) && sorted[i] == string(e.k) {
			if val := pending[sorted[i]]; val != nil {
				if err := add(e.k, val); err != nil {
					return nil, err
				}
			}
			i++
			continue
		}
		if err := add(e.k, e.v); err != nil {
			return nil, err
		}
	}
	for ; i < len(sorted) && (hi == nil || sorted[i] < string(hi)); i++ {
		if val := pending[sorted[i]]; val != nil {
			if err := add([]byte(sorted[i]), val); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}
