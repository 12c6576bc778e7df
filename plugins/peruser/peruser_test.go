package peruser_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/couchjobs/couchjobs/plugins/internal/couch"
	"github.com/couchjobs/couchjobs/plugins/internal/couchtest"
	"github.com/couchjobs/couchjobs/plugins/peruser"
	"github.com/couchjobs/couchjobs/sdk/sdktest"
)

var ctx = context.Background()

// env is a server and a node running the plugin against it.
type env struct {
	t    *testing.T
	auth string // the authentication database
	srv  *couchtest.Server
	c    *couch.Client
	h    *sdktest.Harness
}

func start(t *testing.T, cfg map[string]any) *env {
	t.Helper()
	srv := couchtest.Start(t)
	c, err := couch.New(srv.AdminURL(), couch.Options{})
	if err != nil {
		t.Fatal(err)
	}
	conf := map[string]any{"servers": []map[string]any{{"name": "local", "url": srv.AdminURL()}}, "reconcile_interval": "1h", "feed_timeout": "2s"}
	for k, v := range cfg {
		conf[k] = v
	}
	auth, _ := conf["authentication_db"].(string)
	if auth == "" {
		auth = "_users"
	} else if err := c.CreateDB(ctx, auth, 0); err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, auth: auth, srv: srv, c: c, h: sdktest.New(t, peruser.New(), conf)}
	// The watcher follows the feed from where it stood when it started:
	// wait for it to have started (its first reconciliation recorded), so
	// that every change the test makes comes after.
	e.eventually("the watcher to start", func() bool {
		st := e.state()
		return st.ReconciledAt != nil && len(st.Since) > 0
	})
	return e
}

// state reads the watcher job's data; zero before the job exists.
func (e *env) state() peruser.State {
	e.t.Helper()
	var st peruser.State
	info, err := e.h.Jobs().Get(ctx, peruser.TypeName, "local")
	if err == nil {
		if err := json.Unmarshal(info.Data, &st); err != nil {
			e.t.Fatalf("watcher data %s: %v", info.Data, err)
		}
	}
	return st
}

func (e *env) putUser(name string, roles ...string) {
	e.t.Helper()
	if roles == nil {
		roles = []string{}
	}
	doc := map[string]any{"name": name, "type": "user", "roles": roles, "password": "pw"}
	var cur struct {
		Rev string `json:"_rev"`
	}
	if err := e.c.Get(ctx, e.auth, "org.couchdb.user:"+name, &cur); err == nil {
		doc["_rev"] = cur.Rev
	}
	if _, err := e.c.Put(ctx, e.auth, "org.couchdb.user:"+name, doc); err != nil {
		e.t.Fatalf("put user %q: %v", name, err)
	}
}

func (e *env) deleteUser(name string) {
	e.t.Helper()
	var cur struct {
		Rev string `json:"_rev"`
	}
	if err := e.c.Get(ctx, e.auth, "org.couchdb.user:"+name, &cur); err != nil {
		e.t.Fatal(err)
	}
	if err := e.c.Delete(ctx, e.auth, "org.couchdb.user:"+name, cur.Rev); err != nil {
		e.t.Fatal(err)
	}
}

type section struct {
	Names []string `json:"names"`
	Roles []string `json:"roles"`
}

type secObj struct {
	Admins  section `json:"admins"`
	Members section `json:"members"`
}

func (e *env) security(db string) (secObj, bool) {
	raw, err := e.c.Security(ctx, db)
	if err != nil {
		return secObj{}, false
	}
	var s secObj
	json.Unmarshal(raw, &s)
	return s, true
}

// provisioned reports whether a user's database exists with the user in
// its admins and members.
func (e *env) provisioned(name string) bool {
	db := peruser.DBName("userdb-", name)
	if ok, _ := e.c.DBExists(ctx, db); !ok {
		return false
	}
	s, _ := e.security(db)
	return slices.Contains(s.Admins.Names, name) && slices.Contains(s.Members.Names, name)
}

func (e *env) eventually(what string, cond func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

var names = []string{"bob", "Zoë", "日本語", "a b+c@d.e", "o'neil-\"quoted\""}

func TestUsersGetDatabases(t *testing.T) {
	t.Parallel()
	e := start(t, nil)
	// A database made before the user, with its own _security entries.
	pre := peruser.DBName("userdb-", "carol")
	e.c.CreateDB(ctx, pre, 0)
	e.c.PutSecurity(ctx, pre, map[string]any{
		"admins":  map[string]any{"names": []string{"auditor"}, "roles": []string{"ops"}},
		"members": map[string]any{"names": []string{}, "roles": []string{"staff"}},
		"custom":  true,
	})
	for _, n := range append(names, "carol") {
		e.putUser(n)
	}
	for _, n := range append(names, "carol") {
		e.eventually("a database for "+n, func() bool { return e.provisioned(n) })
	}
	s, _ := e.security(pre)
	raw, _ := e.c.Security(ctx, pre)
	if !slices.Contains(s.Admins.Names, "auditor") || !slices.Contains(s.Admins.Roles, "ops") || !slices.Contains(s.Members.Roles, "staff") || !strings.Contains(string(raw), `"custom":true`) {
		t.Fatalf("existing _security entries lost: %s", raw)
	}
	// Updating a user changes nothing; no database is made twice.
	e.putUser("bob", "editor")
	time.Sleep(500 * time.Millisecond)
	if !e.provisioned("bob") {
		t.Fatal("an update unprovisioned bob")
	}
	// Deleting a user without delete_dbs takes it out of _security only.
	e.deleteUser("carol")
	e.eventually("carol out of her database's _security", func() bool {
		s, _ := e.security(pre)
		return !slices.Contains(s.Admins.Names, "carol") && !slices.Contains(s.Members.Names, "carol")
	})
	if ok, _ := e.c.DBExists(ctx, pre); !ok {
		t.Fatal("delete_dbs is off, yet the database was deleted")
	}
	if s, _ := e.security(pre); !slices.Contains(s.Admins.Names, "auditor") {
		t.Fatalf("other entries went with carol: %+v", s)
	}
	// A _security of an odd shape is left alone, without stopping the
	// feed.
	odd := peruser.DBName("userdb-", "dave")
	e.c.CreateDB(ctx, odd, 0)
	e.c.PutSecurity(ctx, odd, map[string]any{"admins": "everyone"})
	e.putUser("dave")
	e.putUser("erin")
	e.eventually("erin's database after the odd documents", func() bool { return e.provisioned("erin") })
	if raw, _ := e.c.Security(ctx, odd); !strings.Contains(string(raw), `"everyone"`) {
		t.Fatalf("an odd _security was overwritten: %s", raw)
	}
	info, err := e.h.Jobs().Get(ctx, peruser.TypeName, "local")
	if err != nil {
		t.Fatal(err)
	}
	if st := e.state(); st.Skipped < 1 || st.Provisioned < int64(len(names)+2) || len(st.Since) == 0 || strings.Contains(string(info.Data), couchtest.Password) {
		t.Fatalf("watcher state %s", info.Data)
	}
}

// With delete_dbs, a deleted user's database goes, and nothing else. The
// authentication database here is a plain one (CouchDB's authentication_db
// setting), which accepts documents that are not users: they are skipped.
func TestDeleteDBs(t *testing.T) {
	t.Parallel()
	e := start(t, map[string]any{"delete_dbs": true, "authentication_db": "people"})
	e.c.Put(ctx, "people", "not-a-user", map[string]any{"x": 1})
	e.c.Put(ctx, "people", "org.couchdb.user:mallory", map[string]any{"name": "mallory", "type": "admin"})
	e.c.Put(ctx, "people", "org.couchdb.user:eve", map[string]any{"name": "trent", "type": "user"})
	e.putUser("frank")
	e.putUser("grace")
	foreign := "userdb-not-ours"
	e.c.CreateDB(ctx, foreign, 0)
	e.eventually("frank's database", func() bool { return e.provisioned("frank") })
	e.deleteUser("frank")
	// Wait for the watcher to count the removal before looking at the
	// database: pouchdb-server answers GET /{db} by checking that the
	// database exists and then opening it, and a DELETE that runs between
	// the two makes the open create the database again.
	e.eventually("the watcher to remove frank", func() bool { return e.state().Removed == 1 })
	if ok, _ := e.c.DBExists(ctx, peruser.DBName("userdb-", "frank")); ok {
		t.Error("frank's database was not deleted")
	}
	for _, db := range []string{foreign, peruser.DBName("userdb-", "grace")} {
		if ok, _ := e.c.DBExists(ctx, db); !ok {
			t.Errorf("%s was deleted", db)
		}
	}
	for _, n := range []string{"mallory", "eve", "trent"} {
		if ok, _ := e.c.DBExists(ctx, peruser.DBName("userdb-", n)); ok {
			t.Errorf("a database for %s, who is no user", n)
		}
	}
	if st := e.state(); st.Skipped < 3 || st.Removed != 1 {
		t.Fatalf("watcher state %+v", st)
	}
}

// A database deleted behind the plugin's back comes back at the next
// reconciliation.
func TestReconcileRepairs(t *testing.T) {
	t.Parallel()
	e := start(t, map[string]any{"reconcile_interval": "1s"})
	e.putUser("heidi")
	e.eventually("heidi's database", func() bool { return e.provisioned("heidi") })
	db := peruser.DBName("userdb-", "heidi")
	if err := e.c.DeleteDB(ctx, db); err != nil {
		t.Fatal(err)
	}
	e.eventually("heidi's database repaired", func() bool { return e.provisioned("heidi") })
}

// A server that stops answering makes the watcher crash and back off,
// never spin; when it answers again, the watcher catches up.
func TestServerDownAndBack(t *testing.T) {
	t.Parallel()
	e := start(t, nil)
	e.putUser("ivan")
	e.eventually("ivan's database", func() bool { return e.provisioned("ivan") })
	e.srv.Pause()
	e.eventually("the watcher to crash", func() bool {
		info, err := e.h.Jobs().Get(ctx, peruser.TypeName, "local")
		return err == nil && strings.Contains(string(info.Data), `"outcome":"crashed"`)
	})
	e.srv.Resume()
	e.putUser("judy")
	e.eventually("judy's database after the server came back", func() bool { return e.provisioned("judy") })
}

func TestConfigRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg  map[string]any
		want string
	}{
		{map[string]any{}, "servers: no server"},
		{map[string]any{"servers": []map[string]any{{"name": "a", "url": "http://h"}}}, "servers.0: no admin credentials"},
		{map[string]any{"servers": []map[string]any{{"name": "a b", "url": "http://u:p@h"}}}, "servers.0.name"},
		{map[string]any{"servers": []map[string]any{{"name": "a", "url": "ftp://u:p@h"}}}, "servers.0.url"},
		{map[string]any{"servers": []map[string]any{{"name": "a", "url": "http://u:p@h"}}, "database_prefix": "User-"}, "database_prefix: \"User-\" is not a valid"},
		{map[string]any{"servers": []map[string]any{{"name": "a", "url": "http://u:p@h"}}, "q": -1}, "q: -1"},
		{map[string]any{"servers": []map[string]any{{"name": "a", "url": "http://u:p@h"}}, "dbprefix": "x"}, `unknown field "dbprefix"`},
	} {
		b, _ := json.Marshal(tc.cfg)
		err := peruser.New().Configure(ctx, (&sdkConfig{JSON: b}).c())
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.cfg, err, tc.want)
		}
	}
}
