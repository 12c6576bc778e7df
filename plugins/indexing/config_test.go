package indexing_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/couchjobs/couchjobs/plugins/indexing"
	"github.com/couchjobs/couchjobs/sdk"
)

// TestConfigRefused: every bad setting is refused with its key named.
func TestConfigRefused(t *testing.T) {
	t.Parallel()
	server := []map[string]any{{"name": "a", "url": "http://u:p@h"}}
	db := []map[string]any{{"server": "a", "db": "db"}}
	for _, tc := range []struct {
		cfg  map[string]any
		want string
	}{
		{map[string]any{"servers": []map[string]any{{"name": "a", "url": "http://h"}}}, "servers.0: no admin credentials"},
		{map[string]any{"servers": server, "databases": []map[string]any{{"server": "b", "db": "db"}}}, `databases.0.server: "b" is not in servers`},
		{map[string]any{"servers": server, "databases": []map[string]any{{"server": "a", "db": "Bad"}}}, `databases.0.db: "Bad" is not a database name`},
		{map[string]any{"servers": server, "databases": []map[string]any{{"server": "a", "db": "x"}, {"server": "a", "db": "y", "name": "x"}}}, `databases.1.name: "x" is used twice`},
		{map[string]any{"servers": server, "databases": db, "batch_docs": -1}, "batch_docs: -1: want a positive number"},
		{map[string]any{"servers": server, "databases": db, "batch_bytes": -5}, "batch_bytes: -5"},
		{map[string]any{"servers": server, "databases": db, "max_emit_bytes": -1}, "max_emit_bytes: -1"},
		{map[string]any{"servers": server, "databases": db, "max_map_memory": -1}, "max_map_memory: -1"},
		{map[string]any{"servers": server, "databases": db, "map_timeout": "soon"}, "map_timeout"},
		{map[string]any{"servers": server, "databases": db, "batch_time": "-1s"}, "batch_time"},
		{map[string]any{"servers": server, "databases": db, "query_timeout": 5}, "query_timeout"},
		{map[string]any{"servers": server, "databases": db, "max_memory": 1}, `unknown field "max_memory"`},
	} {
		b, _ := json.Marshal(tc.cfg)
		err := indexing.New().Configure(t.Context(), &sdk.Config{JSON: b, Node: "n"})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", b, err, tc.want)
		}
	}
	b, _ := json.Marshal(map[string]any{"servers": server, "databases": db, "max_map_memory": 1 << 20})
	if err := indexing.New().Configure(t.Context(), &sdk.Config{JSON: b, Node: "n"}); err != nil {
		t.Errorf("a good config: %v", err)
	}
}
