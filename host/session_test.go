package host

import (
	"encoding/json"
	"reflect"
	"testing"
)

func TestEditMeta(t *testing.T) {
	t.Parallel()
	cases := []struct{ in, want string }{
		{`{}`, `{"_couchjobs":{"outcome":"completed"}}`},
		{` { } `, `{"_couchjobs":{"outcome":"completed"}}`},
		{`{"a":1}`, `{"a":1,"_couchjobs":{"outcome":"completed"}}`},
		{`{"a":{"b":[1,2]}, "c":"}"}`, `{"a":{"b":[1,2]},"c":"}","_couchjobs":{"outcome":"completed"}}`},
		{`{"a":1,"_couchjobs":{"crashes":2}}`, `{"a":1,"_couchjobs":{"outcome":"completed"}}`},
	}
	for _, c := range cases {
		got, err := withMeta(json.RawMessage(c.in), map[string]any{"outcome": "completed"})
		if err != nil {
			t.Fatal(err)
		}
		var g, w any
		if json.Unmarshal(got, &g) != nil || json.Unmarshal([]byte(c.want), &w) != nil || !reflect.DeepEqual(g, w) {
			t.Errorf("withMeta(%s) = %s, want %s", c.in, got, c.want)
		}
	}
	// Merging keeps the other keys of _couchjobs.
	got, _ := mergeMeta(json.RawMessage(`{"_couchjobs":{"crashes":2}}`), map[string]any{"progress": 0.5})
	var d struct {
		C map[string]any `json:"_couchjobs"`
	}
	json.Unmarshal(got, &d)
	if d.C["crashes"] != 2.0 || d.C["progress"] != 0.5 {
		t.Errorf("mergeMeta = %s", got)
	}
}
