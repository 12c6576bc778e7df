package peruser_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/couchjobs/couchjobs/plugins/internal/cluster"
	"github.com/couchjobs/couchjobs/plugins/internal/couch"
	"github.com/couchjobs/couchjobs/plugins/internal/couchtest"
	"github.com/couchjobs/couchjobs/plugins/peruser"
)

// TestKilledNodeFailover kills the plugin process, then the whole host,
// with SIGKILL while users are being provisioned. Another node takes the
// watcher over from its checkpoint; in the end every user has exactly one
// correct database, and a foreign database is untouched.
func TestKilledNodeFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and kills host processes; runs in make test-slow")
	}
	srv := couchtest.Start(t)
	c, _ := couch.New(srv.AdminURL(), couch.Options{})
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin := filepath.Join(dir, "bin")
	if err := cluster.Build(ctx, bin, cluster.Plugin{Name: "peruser", Package: "github.com/couchjobs/couchjobs/plugins/peruser/cmd/couchjobs-peruser"}); err != nil {
		t.Fatal(err)
	}
	cl, err := cluster.New(dir, cluster.Options{Bin: bin, Plugin: "peruser", ActivityTimeout: time.Second, Log: cluster.TestLog(t),
		Config: fmt.Sprintf("feed_timeout = \"2s\"\n[[plugins.peruser.config.servers]]\nname = \"local\"\nurl = %q\n", srv.AdminURL())})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	foreign := peruser.DBName("userdb-", "foreign")
	c.CreateDB(ctx, foreign, 0)
	c.PutSecurity(ctx, foreign, map[string]any{"admins": map[string]any{"names": []string{"root"}}, "note": "not ours"})
	a, err := cl.Start(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	const users = 150
	provisioned := func() int {
		dbs, _ := c.AllDBs(ctx)
		n := 0
		for _, db := range dbs {
			if strings.HasPrefix(db, "userdb-") && db != foreign {
				n++
			}
		}
		return n
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(90 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s (%d provisioned)", what, provisioned())
			}
		}
	}
	done := make(chan error, 1)
	go func() {
		for i := range users {
			name := fmt.Sprintf("user-%03d", i)
			if _, err := c.Put(ctx, "_users", "org.couchdb.user:"+name, map[string]any{"name": name, "type": "user", "roles": []string{}, "password": "pw"}); err != nil {
				done <- err
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
		done <- nil
	}()
	waitFor("the first users", func() bool { return provisioned() >= 20 })
	if err := a.KillPlugin("peruser"); err != nil {
		t.Fatal(err)
	}
	waitFor("more users after the plugin was killed", func() bool { return provisioned() >= 60 })
	a.Kill()
	if _, err := cl.Start(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	waitFor("every user", func() bool { return provisioned() == users })
	for i := range users {
		name := fmt.Sprintf("user-%03d", i)
		raw, err := c.Security(ctx, peruser.DBName("userdb-", name))
		if err != nil {
			t.Fatal(err)
		}
		for _, section := range []string{`"admins"`, `"members"`} {
			if strings.Count(string(raw), `"`+name+`"`) != 2 || !strings.Contains(string(raw), section) {
				t.Fatalf("%s's _security: %s", name, raw)
			}
		}
	}
	if raw, _ := c.Security(ctx, foreign); !strings.Contains(string(raw), `"not ours"`) || strings.Contains(string(raw), "user-") {
		t.Fatalf("the foreign database's _security changed: %s", raw)
	}
}
