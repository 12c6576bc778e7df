package peruser

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
)

// errShape: a security object this plugin does not understand. It is left
// untouched, and the user skipped with a warning.
var errShape = errors.New("unexpected _security shape")

// security is a database's security object, kept whole: fields this
// plugin does not know survive its edits.
type security map[string]json.RawMessage

// parseSecurity reads a security object, checking the two sections the
// plugin edits: absent, or objects whose "names" and "roles" are absent or
// arrays of strings.
func parseSecurity(raw []byte) (security, error) {
	var s security
	if err := json.Unmarshal(raw, &s); err != nil || s == nil {
		return nil, fmt.Errorf("%w: not a JSON object: %.60s", errShape, raw)
	}
	for _, sec := range []string{"admins", "members"} {
		if _, err := s.section(sec); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// section decodes admins or members.
func (s security) section(name string) (map[string]json.RawMessage, error) {
	raw, ok := s[name]
	if !ok || string(raw) == "null" {
		return map[string]json.RawMessage{}, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil || m == nil {
		return nil, fmt.Errorf("%w: %s is %.40s, not an object", errShape, name, raw)
	}
	for _, list := range []string{"names", "roles"} {
		if _, err := stringList(m, list); err != nil {
			return nil, fmt.Errorf("%w: %s.%s: %v", errShape, name, list, err)
		}
	}
	return m, nil
}

func stringList(m map[string]json.RawMessage, key string) ([]string, error) {
	raw, ok := m[key]
	if !ok || string(raw) == "null" {
		return nil, nil
	}
	var l []string
	if err := json.Unmarshal(raw, &l); err != nil {
		return nil, fmt.Errorf("%.40s is not a list of strings", raw)
	}
	return l, nil
}

// edit adds (or removes) name in the names of admins and members,
// keeping every other entry, role and field. It reports whether anything
// changed.
func (s security) edit(name string, add bool) (bool, error) {
	changed := false
	for _, secName := range []string{"admins", "members"} {
		sec, err := s.section(secName)
		if err != nil {
			return false, err
		}
		names, _ := stringList(sec, "names")
		has := slices.Contains(names, name)
		switch {
		case add && !has:
			names = append(names, name)
		case !add && has:
			names = slices.DeleteFunc(names, func(n string) bool { return n == name })
		default:
			continue
		}
		if names == nil {
			names = []string{}
		}
		sec["names"], _ = json.Marshal(names)
		if _, ok := sec["roles"]; !ok {
			sec["roles"] = json.RawMessage("[]")
		}
		s[secName], _ = json.Marshal(sec)
		changed = true
	}
	return changed, nil
}
