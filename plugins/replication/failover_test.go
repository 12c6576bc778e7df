package replication_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/couchjobs/couchjobs/plugins/internal/cluster"
	"github.com/couchjobs/couchjobs/plugins/internal/couchtest"
	"github.com/couchjobs/couchjobs/plugins/replication"
)

// TestKilledNodeFailover kills the plugin process, then its whole host,
// with SIGKILL in the middle of a replication. The job resumes from its
// checkpoint (on the same node after the plugin dies, on another after
// the host dies), and in the end the target holds every revision.
func TestKilledNodeFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and kills host processes; runs in make test-slow")
	}
	srv := couchtest.Start(t)
	c := admin(t, srv)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	bin := filepath.Join(dir, "bin")
	if err := cluster.Build(ctx, bin, cluster.Plugin{Name: "replication", Package: "github.com/couchjobs/couchjobs/plugins/replication/cmd/couchjobs-replication"}); err != nil {
		t.Fatal(err)
	}
	cl, err := cluster.New(dir, cluster.Options{Bin: bin, Plugin: "replication", ActivityTimeout: time.Second, Log: cluster.TestLog(t),
		Config: fmt.Sprintf("scan_interval = \"200ms\"\n[[plugins.replication.config.servers]]\nname = \"local\"\nurl = %q\n", srv.AdminURL())})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for _, db := range []string{"src", "_replicator"} {
		if err := c.CreateDB(ctx, db, 0); err != nil {
			t.Fatal(err)
		}
	}
	const docs = 20_000
	fill(t, c, "src", "d", docs)
	for i := range 20 {
		conflicted(t, c, "src", fmt.Sprint("conflict-", i))
	}
	if _, err := c.Put(ctx, "_replicator", "big", map[string]any{
		"source": dbURL(srv, "src"), "target": dbURL(srv, "tgt"), "create_target": true,
		"checkpoint_interval": 300, "worker_batch_size": 200,
	}); err != nil {
		t.Fatal(err)
	}
	written := func() int64 {
		info, err := c.DBInfo(ctx, "tgt")
		if err != nil {
			return 0
		}
		return info.DocCount
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(2 * time.Minute); !cond(); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s (%d written)", what, written())
			}
		}
	}
	t.Log("starting node a")
	a, err := cl.Start(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	t.Log("node a started")
	waitFor("the first documents", func() bool { return written() >= docs/5 })
	t0 := time.Now()
	t.Logf("killing the plugin at %d written", written())
	if err := a.KillPlugin("replication"); err != nil {
		t.Fatal(err)
	}
	at := written()
	waitFor("more documents after the plugin was killed", func() bool { return written() >= at+docs/5 })
	t.Logf("killing the host at %d written, %v later", written(), time.Since(t0))
	a.Kill()
	if _, err := cl.Start(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		State string `json:"_replication_state"`
	}
	waitFor("completion", func() bool { return c.Get(ctx, "_replicator", "big", &doc) == nil && doc.State != "" })
	t.Logf("completed %v after the plugin was killed", time.Since(t0))
	if doc.State != "completed" {
		t.Fatalf("state %s", doc.State)
	}
	if n := same(t, c, c, "src", "tgt"); n != docs+60 {
		t.Fatalf("%d revisions", n)
	}
	// The session that finished (on node b) resumed from a checkpoint,
	// as did every session after the first that recorded one. (A run cut
	// short before its first checkpoint leaves no entry.)
	body, _ := json.Marshal(map[string]any{"source": dbURL(srv, "src"), "target": dbURL(srv, "tgt"), "create_target": true})
	spec, err := replication.Parse(body)
	if err != nil {
		t.Fatal(err)
	}
	base, _, _ := strings.Cut(replication.ReplicationID(spec, ""), "+")
	var cp replication.Checkpoint
	if err := c.Get(ctx, "tgt", "_local/"+base, &cp); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d sessions", len(cp.History))
	if len(cp.History) < 2 {
		t.Fatalf("%d sessions in the checkpoint history: %+v", len(cp.History), cp.History)
	}
	for _, h := range cp.History[:len(cp.History)-1] {
		if string(h.StartLastSeq) == "0" {
			t.Errorf("session %s started from the beginning", h.SessionID)
		}
	}
}
