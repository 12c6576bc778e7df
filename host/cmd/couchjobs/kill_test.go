package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/couchjobs/couchjobs/host"
	"github.com/couchjobs/couchjobs/host/config"
	"github.com/couchjobs/couchjobs/host/internal/proc"
	"github.com/couchjobs/couchjobs/runtime/jobs"
)

// TestKilledHost runs a node as a separate couchjobs process, kills it with
// SIGKILL while its plugin runs a job, and checks that the plugin process
// dies with it and that another node sharing the store finishes the job
// once its activity timeout has passed.
func TestKilledHost(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the couchjobs binary; runs in make test-slow")
	}
	dir := t.TempDir()
	for _, b := range []struct{ out, pkg string }{
		{filepath.Join(dir, "couchjobs"), "."},
		{filepath.Join(dir, "plugins", "couchjobs-alpha"), "../../testdata/testplugin"},
	} {
		if out, err := exec.Command("go", "build", "-o", b.out, b.pkg).CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", b.pkg, err, out)
		}
	}
	store := filepath.Join(dir, "s.db")
	conf := func(name string) string {
		path := filepath.Join(dir, name+".toml")
		text := fmt.Sprintf("plugin_dir = \"plugins\"\n[node]\nname = %q\n[store]\npath = %q\n[http]\nlisten = \"off\"\n[plugins.alpha]\n", name, store)
		os.WriteFile(path, []byte(text), 0o644)
		return path
	}
	victim := exec.Command(filepath.Join(dir, "couchjobs"), "run", "-config", conf("victim"))
	victim.Stderr = os.Stderr
	if err := victim.Start(); err != nil {
		t.Fatal(err)
	}
	defer victim.Process.Kill()

	// Add a long job through the store and wait for the victim to run it.
	cfg, err := config.Load(conf("observer"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := host.OpenStore(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	j := jobs.New(s, jobs.Options{})
	defer j.Close()
	ctx := context.Background()
	waitFor := func(what string, d time.Duration, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(d)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitFor("the victim to register the type", 30*time.Second, func() bool {
		_, err := j.TypeTimeout(ctx, "alpha")
		return err == nil
	})
	if err := j.Add(ctx, jobs.NewJob{Type: "alpha", ID: "orphan", Data: json.RawMessage(`{"sleep_ms":1500}`)}); err != nil {
		t.Fatal(err)
	}
	waitFor("the victim to run the job", 30*time.Second, func() bool {
		in, err := j.Get(ctx, "alpha", "orphan")
		return err == nil && in.State == jobs.Running
	})
	plugin := proc.Child(victim.Process.Pid, "couchjobs-alpha")
	if plugin < 0 {
		t.Fatal("found no plugin process under the victim")
	}
	killed := time.Now()
	victim.Process.Signal(syscall.SIGKILL)
	victim.Wait()
	waitFor("the orphaned plugin process to exit", 10*time.Second, func() bool {
		return syscall.Kill(plugin, 0) != nil
	})

	// A second node takes the job once its activity timeout (2s) passed.
	rescuer := exec.Command(filepath.Join(dir, "couchjobs"), "run", "-config", conf("rescuer"))
	rescuer.Stderr = os.Stderr
	if err := rescuer.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { rescuer.Process.Signal(syscall.SIGTERM); rescuer.Wait() }()
	waitFor("the rescuer to finish the job", 60*time.Second, func() bool {
		in, err := j.Get(ctx, "alpha", "orphan")
		return err == nil && in.State == jobs.Finished
	})
	t.Logf("finished elsewhere %v after the kill (activity timeout 2s)", time.Since(killed))
}
