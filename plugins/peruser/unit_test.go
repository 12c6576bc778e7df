package peruser

import (
	"encoding/json"
	"errors"
	"testing"
	"unicode/utf8"
)

func TestDBName(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ user, want string }{
		{"bob", "userdb-626f62"},
		{"Zoë", "userdb-5a6fc3ab"},
		{"日本", "userdb-e697a5e69cac"},
		{"a b+c@d", "userdb-6120622b634064"},
		// Bytes below 0x10 get two digits (CouchDB writes "1" and "23").
		{"\x01\x23", "userdb-0123"},
	} {
		if got := DBName("userdb-", tc.user); got != tc.want {
			t.Errorf("DBName(%q) = %s, want %s", tc.user, got, tc.want)
		}
	}
}

func TestPrefix(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"userdb-", "u", "private/", "a_$()+-/0"} {
		if err := checkPrefix(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "Userdb-", "1db", "_users", "user db", "userdb!", "ü"} {
		if err := checkPrefix(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestSecurityEdit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, in string
		add      bool
		want     string // "": unchanged
	}{
		{"empty", `{}`, true, `{"admins":{"names":["bob"],"roles":[]},"members":{"names":["bob"],"roles":[]}}`},
		{"keeps others", `{"admins":{"names":["ann"],"roles":["ops"]},"members":{"roles":["staff"]},"x":1}`, true,
			`{"admins":{"names":["ann","bob"],"roles":["ops"]},"members":{"names":["bob"],"roles":["staff"]},"x":1}`},
		{"already there", `{"admins":{"names":["bob"]},"members":{"names":["bob"]}}`, true, ""},
		{"remove", `{"admins":{"names":["ann","bob"],"roles":["ops"]},"members":{"names":["bob"],"roles":[]}}`, false,
			`{"admins":{"names":["ann"],"roles":["ops"]},"members":{"names":[],"roles":[]}}`},
		{"remove absent", `{"admins":{"names":["ann"]}}`, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := parseSecurity([]byte(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			changed, err := s.edit("bob", tc.add)
			if err != nil || changed != (tc.want != "") {
				t.Fatalf("changed %v, %v", changed, err)
			}
			if tc.want == "" {
				return
			}
			got, _ := json.Marshal(s)
			var a, b any
			json.Unmarshal(got, &a)
			json.Unmarshal([]byte(tc.want), &b)
			ga, _ := json.Marshal(a)
			gb, _ := json.Marshal(b)
			if string(ga) != string(gb) {
				t.Fatalf("got %s, want %s", ga, gb)
			}
		})
	}
	for _, bad := range []string{`[]`, `"x"`, `{"admins":[]}`, `{"members":{"names":"bob"}}`, `{"admins":{"roles":[1]}}`, `{`} {
		if _, err := parseSecurity([]byte(bad)); !errors.Is(err, errShape) {
			t.Errorf("%s: %v", bad, err)
		}
	}
}

func FuzzSecurity(f *testing.F) {
	f.Add([]byte(`{"admins":{"names":["ann"],"roles":["ops"]},"members":{"roles":["staff"]},"x":1}`), "bob")
	f.Add([]byte(`{}`), "")
	f.Fuzz(func(t *testing.T, raw []byte, name string) {
		if !utf8.ValidString(name) {
			return // names come from JSON documents: always valid UTF-8
		}
		s, err := parseSecurity(raw)
		if err != nil {
			return
		}
		if _, err := s.edit(name, true); err != nil {
			t.Fatal(err)
		}
		// After adding, the name is listed, and the result parses again.
		b, _ := json.Marshal(s)
		s2, err := parseSecurity(b)
		if err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		if changed, _ := s2.edit(name, true); changed {
			t.Fatalf("adding %q twice changed %s", name, b)
		}
		if changed, _ := s2.edit(name, false); !changed {
			t.Fatalf("removing %q from %s changed nothing", name, b)
		}
	})
}
