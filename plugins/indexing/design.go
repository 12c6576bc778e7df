package indexing

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/couchjobs/couchjobs/plugins/indexing/js"
)

// ViewDef is one view of a design document.
type ViewDef struct {
	Map    string `json:"map"`
	Reduce string `json:"reduce,omitempty"`
}

// Design is what the plugin keeps of a design document: its views, the
// index signature, or why it cannot be indexed.
type Design struct {
	ID       string             `json:"id"`
	Rev      string             `json:"rev,omitempty"`
	Language string             `json:"language"`
	Views    map[string]ViewDef `json:"views,omitempty"`
	// IncludeDesign indexes design documents too (options.include_design).
	IncludeDesign bool `json:"include_design,omitempty"`
	// Sig is the index signature: a hash of everything that shapes the
	// index. Design documents with the same views share an index.
	Sig string `json:"sig,omitempty"`
	// Error says why the document has no index.
	Error string `json:"error,omitempty"`
}

// maxViews bounds a design document's views: a view is one byte of the
// tree's keys.
const maxViews = 256

// parseDesign reads a design document. A document CouchDB would refuse
// to index comes back with Error set (and no signature); a document with
// no views has neither.
func parseDesign(id string, raw []byte, limits js.Limits) Design {
	d := Design{ID: id, Language: "javascript"}
	var doc struct {
		Rev      string                     `json:"_rev"`
		Language *string                    `json:"language"`
		Views    map[string]json.RawMessage `json:"views"`
		Options  map[string]json.RawMessage `json:"options"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		d.Error = "the design document's fields have the wrong types: " + err.Error()
		return d
	}
	d.Rev = doc.Rev
	if doc.Language != nil {
		d.Language = *doc.Language
	}
	if len(doc.Views) == 0 {
		return d
	}
	if d.Language != "javascript" {
		d.Error = fmt.Sprintf("language %q is not supported (only javascript)", d.Language)
		return d
	}
	if v, ok := doc.Options["include_design"]; ok && string(v) == "true" {
		d.IncludeDesign = true
	}
	if v, ok := doc.Options["collation"]; ok && string(v) == `"raw"` {
		d.Error = `options.collation "raw" is not supported`
		return d
	}
	d.Views = map[string]ViewDef{}
	for name, rawView := range doc.Views {
		var v struct {
			Map    *string         `json:"map"`
			Reduce json.RawMessage `json:"reduce"`
		}
		if err := json.Unmarshal(rawView, &v); err != nil || v.Map == nil {
			if name == "lib" {
				continue // CommonJS modules, not a view
			}
			d.Error = fmt.Sprintf("view %q must have a map function (a string)", name)
			return d
		}
		def := ViewDef{Map: *v.Map}
		if len(v.Reduce) > 0 && string(v.Reduce) != "null" {
			if err := json.Unmarshal(v.Reduce, &def.Reduce); err != nil {
				d.Error = fmt.Sprintf("view %q: reduce must be a string", name)
				return d
			}
		}
		if _, err := js.CompileMap(def.Map, limits, nil); err != nil {
			d.Error = fmt.Sprintf("view %q: map: %v", name, err)
			return d
		}
		if _, err := newReducer(def.Reduce, limits); err != nil {
			d.Error = fmt.Sprintf("view %q: reduce: %v", name, err)
			return d
		}
		d.Views[name] = def
	}
	if len(d.Views) > maxViews {
		d.Error = fmt.Sprintf("%d views: at most %d per design document", len(d.Views), maxViews)
		return d
	}
	if len(d.Views) > 0 {
		d.Sig = signature(d)
	}
	return d
}

// signature hashes what shapes the index (encoding/json orders map keys).
func signature(d Design) string {
	b, _ := json.Marshal(struct {
		Language      string             `json:"language"`
		Views         map[string]ViewDef `json:"views"`
		IncludeDesign bool               `json:"include_design"`
	}{d.Language, d.Views, d.IncludeDesign})
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:16])
}

// viewNames are the views in the order that numbers them in the tree.
func (d Design) viewNames() []string {
	names := make([]string, 0, len(d.Views))
	for n := range d.Views {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// view is one view ready to build or query.
type view struct {
	name string
	num  int
	def  ViewDef
	red  reducer
	// rows is the view's row count when a query reads it (-1: unknown).
	rows int64
}

// views compiles the reducers of a valid design.
func (d Design) views(limits js.Limits) ([]view, error) {
	names := d.viewNames()
	out := make([]view, len(names))
	for i, n := range names {
		r, err := newReducer(d.Views[n].Reduce, limits)
		if err != nil {
			return nil, fmt.Errorf("view %q: %w", n, err)
		}
		out[i] = view{name: n, num: i, def: d.Views[n], red: r, rows: -1}
	}
	return out, nil
}

func isDesign(id string) bool { return strings.HasPrefix(id, "_design/") }
