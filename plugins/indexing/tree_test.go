package indexing_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/url"
	"testing"
)

// TestReduceTree builds an index large enough for several tree levels,
// then updates and deletes documents in rounds; after each round every
// reduction over a key range must equal the sum of the rows in it, and the
// grouped reductions must equal pouchdb-server's.
func TestReduceTree(t *testing.T) {
	t.Parallel()
	s, c := serverWithDB(t)
	const docs = 2000
	var batch []string
	for i := range docs {
		batch = append(batch, fmt.Sprintf(`{"_id":"d%05d","a":%d,"b":%d}`, i, i%7, i%13))
	}
	bulk(t, c, "db", true, batch...)
	put(t, c, "db", "_design/test", map[string]any{"views": map[string]any{
		"count": map[string]any{"map": `function(doc) { emit([doc.a, doc.b], doc.b); emit([doc.a], 1); }`, "reduce": "_count"},
		"sum":   map[string]any{"map": `function(doc) { emit([doc.a, doc.b], doc.b); }`, "reduce": "_sum"},
	}})
	n := startNode(t, s, map[string]any{"batch_docs": 500}, "db")
	rng := rand.New(rand.NewPCG(1, 2))
	q := url.QueryEscape
	for round := range 3 {
		if round > 0 {
			// Update a tenth of the documents, delete a tenth.
			var changes []string
			picked := map[string]bool{}
			for range docs / 10 {
				id := fmt.Sprintf("d%05d", rng.IntN(docs))
				if picked[id] {
					continue
				}
				picked[id] = true
				var doc map[string]any
				if err := c.Get(bg, "db", id, &doc); err != nil {
					continue // deleted before
				}
				if rng.IntN(2) == 0 {
					doc["_deleted"] = true
				} else {
					doc["a"], doc["b"] = rng.IntN(9), rng.IntN(15)
				}
				b, _ := json.Marshal(doc)
				changes = append(changes, string(b))
			}
			bulk(t, c, "db", true, changes...)
		}
		for range 8 {
			lo := fmt.Sprintf(`[%d,%d]`, rng.IntN(9), rng.IntN(15))
			hi := fmt.Sprintf(`[%d,%d]`, rng.IntN(9), rng.IntN(15))
			if lo > hi {
				lo, hi = hi, lo
			}
			rng := "startkey=" + q(lo) + "&endkey=" + q(hi)
			_, red := get(t, "GET", n.api.URL, "/db/_design/test/_view/sum?"+rng, "")
			_, rows := get(t, "GET", n.api.URL, "/db/_design/test/_view/sum?reduce=false&"+rng, "")
			want := 0.0
			for _, r := range rows.(map[string]any)["rows"].([]any) {
				want += r.(map[string]any)["value"].(float64)
			}
			got := 0.0
			if rs := red.(map[string]any)["rows"].([]any); len(rs) == 1 {
				got = rs[0].(map[string]any)["value"].(float64)
			}
			if got != want {
				t.Errorf("round %d, %s: reduce %v, rows sum to %v", round, rng, got, want)
			}
		}
		for _, query := range []string{"", "group_level=1", "group=true", "group_level=1&descending=true", "startkey=" + q(`[2]`) + "&endkey=" + q(`[5,3]`) + "&group_level=1"} {
			compare(t, n, s, "db", "count", query, false)
		}
		compare(t, n, s, "db", "sum", "group_level=1", false)
		compare(t, n, s, "db", "sum", "", false)
	}
}
