package shell_test

import (
	"context"
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/couchjobs/couchjobs/plugins/internal/cluster"
	"github.com/couchjobs/couchjobs/plugins/shell"
	"github.com/couchjobs/couchjobs/plugins/shell/internal/shelltest"
	"github.com/couchjobs/couchjobs/runtime/jobs"
)

// TestKilledNodeOnLost kills a node with SIGKILL while it runs one step
// under each on_lost policy, and checks what the surviving node does with
// each: runs the step again, runs alt_do, or fails the job. The killed
// node's commands die with it.
func TestKilledNodeOnLost(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and kills host processes; runs in make test-slow")
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := cluster.Build(ctx, filepath.Join(dir, "bin"), shelltest.Plugin); err != nil {
		t.Fatal(err)
	}
	c, err := cluster.New(dir, cluster.Options{Bin: filepath.Join(dir, "bin"), Plugin: "shell", Workers: 3, ActivityTimeout: time.Second, Log: cluster.TestLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	a, err := c.Start(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	// On node a the step hangs (in a child of the shell, which must die
	// with the node); anywhere else it finishes at once.
	step := func(policy, file string) string {
		return fmt.Sprintf(`{"job":[{"do":"echo $COUCHJOBS_NODE >> %[1]s; if [ $COUCHJOBS_NODE = a ]; then sleep 61; echo late >> %[1]s; fi",
			"alt_do":"echo alt-$COUCHJOBS_NODE >> %[1]s","on_lost":%[2]q,"continue_on_alt_success":true},
			{"do":"echo next >> %[1]s"}]}`, file, policy)
	}
	policies := []string{shell.OnLostRetry, shell.OnLostAltDo, shell.OnLostFail}
	for _, p := range policies {
		if err := shelltest.Add(ctx, c, p, jsonObject(step(p, filepath.Join(dir, p)))); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range policies {
		for {
			d, _, err := shelltest.Doc(ctx, c, p)
			if err != nil {
				t.Fatal(err)
			}
			if b, _ := os.ReadFile(filepath.Join(dir, p)); d.Job[0].StepStatus == shell.StatusRunning && string(b) == "a\n" {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if _, err := c.Start(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	a.Kill()
	if err := c.WaitFinished(ctx, shell.TypeName, policies...); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		policy, status, step0, ran string
	}{
		{shell.OnLostRetry, shell.JobSuccess, shell.StatusSuccess, "a\nb\nnext\n"},
		{shell.OnLostAltDo, shell.JobSuccess, shell.StatusAltSuccess, "a\nalt-b\nnext\n"},
		{shell.OnLostFail, shell.JobFailed, shell.StatusLost, "a\n"},
	} {
		d, state, _ := shelltest.Doc(ctx, c, tc.policy)
		st := d.Job[0]
		b, _ := os.ReadFile(filepath.Join(dir, tc.policy))
		if state != jobs.Finished || *d.JobStatus != tc.status || st.StepStatus != tc.step0 || st.Lost != 1 || string(b) != tc.ran {
			t.Errorf("on_lost %s: %s %v, step %+v, ran %q", tc.policy, state, *d.JobStatus, st.State, b)
		}
		if tc.policy != shell.OnLostFail && st.Executioner.Node != "b" {
			t.Errorf("on_lost %s: step finished by %s", tc.policy, st.Executioner.Node)
		}
	}
	// The killed node's `sleep 61` died with it: nothing writes "late".
	if out, _ := output("pgrep", "-f", "sleep 61"); strings.TrimSpace(out) != "" {
		t.Errorf("commands of the killed node still run: %s", out)
	}
}

func output(name string, args ...string) (string, error) {
	out, err := osexec.Command(name, args...).Output()
	return string(out), err
}
