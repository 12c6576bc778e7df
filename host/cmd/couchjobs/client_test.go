package main

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/bcrypt"

	"github.com/couchjobs/couchjobs/host"
	"github.com/couchjobs/couchjobs/host/config"
)

// startNode runs a node with the test plugin as plugin "alpha" and returns
// its API URL.
func startNode(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "couchjobs-alpha")
	if out, err := exec.Command("go", "build", "-o", bin, "../../testdata/testplugin").CombinedOutput(); err != nil {
		t.Fatalf("build the test plugin: %v\n%s", err, out)
	}
	hash, _ := bcrypt.GenerateFromPassword([]byte("secret"), bcrypt.MinCost)
	text := fmt.Sprintf("plugin_dir = %q\n[node]\nname = \"cli\"\n[store]\npath = \"s.db\"\n[http]\nlisten = \"127.0.0.1:0\"\nadmins = { admin = %q }\n[plugins.alpha]\n", dir, hash)
	cfg, err := config.Parse(filepath.Join(dir, "runtime.toml"), []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	n, err := host.NewNode(cfg, nil, host.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { n.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	if err := n.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	return "http://" + n.APIAddr()
}

func TestJobCommands(t *testing.T) {
	url := startNode(t)
	ctx := context.Background()
	cli := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := run(ctx, append(args, "-node", url, "-user", "admin", "-password", "secret"), &out)
		return out.String(), err
	}
	must := func(want string, args ...string) string {
		t.Helper()
		out, err := cli(args...)
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		if !strings.Contains(out, want) {
			t.Fatalf("%v: output lacks %q:\n%s", args, want, out)
		}
		return out
	}
	must("added alpha/j1", "jobs", "add", "alpha", "j1", "-data", `{"updates":3,"sleep_ms":1500}`)
	// wait follows the job to the end and shows its progress on the way.
	out := must("finished", "jobs", "wait", "alpha", "j1", "-timeout", "30s")
	if !strings.Contains(out, "100%") {
		t.Errorf("wait showed no progress:\n%s", out)
	}
	must(`"done":true`, "jobs", "get", "alpha", "j1")
	must(`"state": "finished"`, "jobs", "get", "alpha", "j1", "-json")
	must("added alpha/later", "jobs", "add", "-at", "1h", "alpha", "later")
	out = must("ID", "jobs", "ls", "alpha")
	if !strings.Contains(out, "later") || !strings.Contains(out, "pending") {
		t.Errorf("ls:\n%s", out)
	}
	must("cancel alpha/later: ok", "jobs", "cancel", "alpha", "later")
	must("finished (canceled)", "jobs", "ls", "alpha", "-state", "finished")
	must("resubmit alpha/later: ok", "jobs", "resubmit", "alpha", "later", "-at", "2h")
	must("rm alpha/later: ok", "jobs", "rm", "alpha", "later")
	must("running", "plugins", "ls")
	// Shares: set, listed, reset.
	must("group replication-db: 400 shares", "shares", "set", "replication-db", "400")
	if out := must("GROUP", "shares", "ls"); !strings.Contains(out, "replication-db") || !strings.Contains(out, "400") {
		t.Errorf("shares ls:\n%s", out)
	}
	must("default shares", "shares", "reset", "replication-db")
	// A failed job makes wait fail, saying why.
	must("added", "jobs", "add", "alpha", "bad", "-data", `{"fail":"no input"}`)
	if _, err := cli("jobs", "wait", "alpha", "bad", "-timeout", "30s"); err == nil || !strings.Contains(err.Error(), "failed: no input") {
		t.Errorf("wait on a failed job: %v", err)
	}
	// Clear errors.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"jobs", "get", "alpha", "nope"}, "not_found"},
		{[]string{"jobs", "add", "alpha"}, "want TYPE ID"},
		{[]string{"jobs", "add", "alpha", "x", "-data", "{"}, "-data is not valid JSON"},
		{[]string{"jobs", "add", "alpha", "x", "-at", "tomorrow"}, "RFC 3339"},
		{[]string{"jobs", "frob"}, "unknown command"},
		{[]string{"shares", "set", "g", "lots"}, "not a number of shares"},
		{[]string{"shares", "set", "g", "0"}, "shares 0: want 1 to 1000"},
		{[]string{"shares", "set", "g"}, "want GROUP SHARES"},
	} {
		if _, err := cli(c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want %q", c.args, err, c.want)
		}
	}
	var out2 bytes.Buffer
	err := run(ctx, []string{"jobs", "add", "alpha", "y", "-node", url}, &out2)
	if err == nil || !strings.Contains(err.Error(), "COUCHJOBS_USER") {
		t.Errorf("unauthenticated add: %v", err)
	}
}

func TestPasswd(t *testing.T) {
	var out bytes.Buffer
	if err := passwdCommand(nil, strings.NewReader("hunter2\n"), &out); err != nil {
		t.Fatal(err)
	}
	hash := strings.TrimSpace(out.String())
	if bcrypt.CompareHashAndPassword([]byte(hash), []byte("hunter2")) != nil {
		t.Fatalf("hash %q does not match", hash)
	}
	if err := passwdCommand(nil, strings.NewReader("\n"), &out); err == nil {
		t.Fatal("an empty password was hashed")
	}
}
