package shell_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/couchjobs/couchjobs/plugins/shell"
	"github.com/couchjobs/couchjobs/runtime/jobs"
	"github.com/couchjobs/couchjobs/sdk/sdktest"
)

// TestTargets runs a job whose steps belong to different nodes of a
// cluster (in-process nodes over one store), including a node that is
// down when its step comes: the step waits for it.
func TestTargets(t *testing.T) {
	t.Parallel()
	store := filepath.Join(t.TempDir(), "store.db")
	a := sdktest.NewWith(t, shell.New(), nil, sdktest.Options{Node: "a", Store: store})
	sdktest.NewWith(t, shell.New(), nil, sdktest.Options{Node: "b", Groups: []string{"gpu"}, Store: store})
	a.Add(shell.TypeName, "tour", jsonObject(`{"job":[
		{"target":"a","do":"true"},
		{"target":"b","do":"true"},
		{"target":{"group":"gpu"},"do":"true"},
		{"target":["a","c"],"do":"true"},
		{"target":"c","do":"echo $COUCHJOBS_NODE"}]}`))
	// Steps 0 to 3 run; step 4 waits for node c, which is down.
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	for {
		in, err := a.Jobs().Get(ctx, shell.TypeName, "tour")
		if err != nil {
			t.Fatal(err)
		}
		d, _ := shell.ParseDoc(in.Data)
		if in.State == jobs.Pending && d.Step == 4 {
			if in.Placement != "node:c" {
				t.Fatalf("step 4 waits placed %q", in.Placement)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s at step %d", in.State, d.Step)
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	if in, _ := a.Jobs().Get(ctx, shell.TypeName, "tour"); in.State != jobs.Pending {
		t.Fatalf("a step for node c ran without it: %s", in.State)
	}
	c := sdktest.NewWith(t, shell.New(), nil, sdktest.Options{Node: "c", Store: store})
	d, res := waitFinished(t, c, "tour")
	if res.Outcome != sdktest.Completed {
		t.Fatalf("outcome %s: %s", res.Outcome, res.Reason)
	}
	for i, want := range []string{"a", "b", "b", "a", "c"} {
		if got := d.Job[i].Executioner.Node; got != want || d.Job[i].StepStatus != shell.StatusSuccess {
			t.Errorf("step %d ran on %s (%s), want %s", i, got, d.Job[i].StepStatus, want)
		}
	}
	if d.Job[4].Stdout != "c\n" {
		t.Errorf("step 4 printed %q", d.Job[4].Stdout)
	}
	// Steps never overlap: each starts after the one before finished.
	for i := 1; i < len(d.Job); i++ {
		if d.Job[i].StartTime.Before(*d.Job[i-1].FinishTime) {
			t.Errorf("step %d started before step %d finished", i, i-1)
		}
	}
}
