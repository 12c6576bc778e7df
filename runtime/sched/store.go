package sched

import (
	"context"
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/couchjobs/couchjobs/runtime/kv"
	"github.com/couchjobs/couchjobs/runtime/tuple"
)

// Store keeps the cluster's fair-share state in the store:
//
//	("sched", "shares", group)       = (shares)
//	("sched", "usage", group, node)  = (usage_seconds, running, written_ms)
//
// Each node writes only its own usage records, once per interval, so
// nodes never conflict; readers sum a group's records, decaying each by
// its age, which is the same sum the nodes would reach decaying in step.
type Store struct {
	store  kv.Store
	sub    kv.Subspace
	params Params
	now    func() time.Time
}

// NewStore returns the fair-share state over s. now is the clock (nil:
// time.Now).
func NewStore(s kv.Store, p Params, now func() time.Time) *Store {
	if now == nil {
		now = time.Now
	}
	return &Store{store: s, sub: kv.Sub("sched"), params: p, now: now}
}

func (s *Store) sharesKey(group string) []byte { return s.sub.Pack(tuple.Tuple{"shares", group}) }

// SetShares sets a group's shares cluster-wide, clamped to 1..1000, and
// returns the value stored.
func (s *Store) SetShares(ctx context.Context, group string, shares int) (int, error) {
	if group == "" {
		return 0, fmt.Errorf("set shares: the group name is empty")
	}
	v := ClampShares(shares)
	_, err := s.store.Transact(ctx, func(tx kv.Tx) (any, error) {
		tx.Set(s.sharesKey(group), tuple.Tuple{int64(v)}.Pack())
		return nil, nil
	})
	if err != nil {
		return 0, fmt.Errorf("set shares of %s: %w", group, err)
	}
	return v, nil
}

// ResetShares gives a group the default shares again.
func (s *Store) ResetShares(ctx context.Context, group string) error {
	_, err := s.store.Transact(ctx, func(tx kv.Tx) (any, error) {
		tx.Clear(s.sharesKey(group))
		return nil, nil
	})
	return err
}

// SeedShares sets the shares of the groups that have none set: the
// runtime.toml seed, which never overrides a value set at run time.
func (s *Store) SeedShares(ctx context.Context, seed map[string]int) error {
	if len(seed) == 0 {
		return nil
	}
	_, err := s.store.Transact(ctx, func(tx kv.Tx) (any, error) {
		for g, v := range seed {
			cur, err := tx.Get(s.sharesKey(g))
			if err != nil {
				return nil, err
			}
			if cur == nil {
				tx.Set(s.sharesKey(g), tuple.Tuple{int64(ClampShares(v))}.Pack())
			}
		}
		return nil, nil
	})
	return err
}

// Report is one node's usage record for a group.
type Report struct {
	// Usage is the node's decayed charges for the group, in seconds.
	Usage float64
	// Running counts the group's jobs running on the node.
	Running int
}

// staleIntervals: a record not rewritten for this many intervals is from
// a node that stopped; its running jobs no longer count, and once its
// decayed usage is negligible the next report clears it.
const staleIntervals = 3

// Publish writes a node's usage records, replacing its previous ones, and
// clears records that dead nodes left behind once they no longer matter.
func (s *Store) Publish(ctx context.Context, node string, reports map[string]Report) error {
	now := s.now()
	_, err := s.store.Transact(ctx, func(tx kv.Tx) (any, error) {
		kvs, err := tx.Snapshot().GetRange(s.sub.RangeOf(tuple.Tuple{"usage"}), kv.RangeOptions{})
		if err != nil {
			return nil, err
		}
		for _, e := range kvs {
			t, err := s.sub.Unpack(e.Key)
			if err != nil || len(t) != 3 {
				continue
			}
			n, _ := t[2].(string)
			r, written, ok := decodeReport(e.Value)
			if n == node || !ok || s.decayed(r.Usage, written, now) < 1e-9 && now.Sub(written) > staleIntervals*s.params.Interval {
				tx.Clear(e.Key)
			}
		}
		for g, r := range reports {
			if r.Usage < 1e-9 && r.Running == 0 {
				continue
			}
			tx.Set(s.sub.Pack(tuple.Tuple{"usage", g, node}), tuple.Tuple{r.Usage, int64(r.Running), now.UnixMilli()}.Pack())
		}
		return nil, nil
	})
	if err != nil {
		return fmt.Errorf("publish usage of node %s: %w", node, err)
	}
	return nil
}

func decodeReport(b []byte) (Report, time.Time, bool) {
	t, err := tuple.Unpack(b)
	if err != nil || len(t) != 3 {
		return Report{}, time.Time{}, false
	}
	u, ok1 := t[0].(float64)
	n, ok2 := t[1].(int64)
	ms, ok3 := t[2].(int64)
	return Report{Usage: u, Running: int(n)}, time.UnixMilli(ms), ok1 && ok2 && ok3
}

// decayed is usage written at written, decayed to now.
func (s *Store) decayed(usage float64, written, now time.Time) float64 {
	age := max(now.Sub(written), 0)
	return usage * math.Pow(s.params.UsageCoeff, age.Seconds()/s.params.Interval.Seconds())
}

// Groups returns every group with shares set or usage recorded, by name.
func (s *Store) Groups(ctx context.Context) (map[string]*Group, error) {
	v, err := s.store.ReadTransact(ctx, func(tx kv.ReadTx) (any, error) {
		return s.GroupsTx(tx)
	})
	if err != nil {
		return nil, err
	}
	return v.(map[string]*Group), nil
}

// GroupsTx is Groups inside the caller's transaction (a snapshot read).
func (s *Store) GroupsTx(tx kv.ReadTx) (map[string]*Group, error) {
	now := s.now()
	snap := tx.Snapshot()
	groups := map[string]*Group{}
	get := func(name string) *Group {
		g := groups[name]
		if g == nil {
			g = &Group{Name: name, Shares: DefaultShares}
			groups[name] = g
		}
		return g
	}
	shares, err := snap.GetRange(s.sub.RangeOf(tuple.Tuple{"shares"}), kv.RangeOptions{})
	if err != nil {
		return nil, err
	}
	for _, e := range shares {
		t, err1 := s.sub.Unpack(e.Key)
		v, err2 := tuple.Unpack(e.Value)
		if err1 != nil || err2 != nil || len(t) != 2 || len(v) != 1 {
			return nil, fmt.Errorf("malformed shares entry %x", e.Key)
		}
		name, _ := t[1].(string)
		n, _ := v[0].(int64)
		get(name).Shares = ClampShares(int(n))
	}
	usage, err := snap.GetRange(s.sub.RangeOf(tuple.Tuple{"usage"}), kv.RangeOptions{})
	if err != nil {
		return nil, err
	}
	for _, e := range usage {
		t, err := s.sub.Unpack(e.Key)
		r, written, ok := decodeReport(e.Value)
		if err != nil || len(t) != 3 || !ok {
			return nil, fmt.Errorf("malformed usage entry %x", e.Key)
		}
		name, _ := t[1].(string)
		g := get(name)
		g.Usage += s.decayed(r.Usage, written, now)
		if now.Sub(written) <= staleIntervals*s.params.Interval {
			g.Running += r.Running
		}
	}
	return groups, nil
}

// Sorted returns groups ordered by name.
func Sorted(groups map[string]*Group) []*Group {
	out := make([]*Group, 0, len(groups))
	for _, g := range groups {
		out = append(out, g)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
