package sdktest_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/couchjobs/couchjobs/sdk"
	"github.com/couchjobs/couchjobs/sdk/sdktest"
)

func plugin() *sdk.Plugin {
	return &sdk.Plugin{
		Name: "probe",
		Types: []sdk.Type{{Name: "probe", ActivityTimeout: time.Second, Worker: sdk.WorkerFunc(func(ctx context.Context, job *sdk.Job) error {
			var in struct{ Do string }
			if err := job.Decode(&in); err != nil {
				return sdk.Fail(err)
			}
			switch in.Do {
			case "fail":
				return sdk.Failf("asked to fail")
			case "crash":
				return errors.New("asked to crash")
			case "panic":
				panic("asked to panic")
			case "later":
				return sdk.Resubmit(time.Now().Add(time.Hour))
			}
			if err := job.Update(ctx, sdk.Update{Writes: []sdk.Write{sdk.Set([]byte("seen/"+job.ID), []byte("yes"))}}); err != nil {
				return err
			}
			return job.SetResult(map[string]string{"did": in.Do})
		})}},
	}
}

func TestOutcomes(t *testing.T) {
	h := sdktest.New(t, plugin(), nil)
	cases := []struct {
		do, outcome, reason string
	}{
		{"work", sdktest.Completed, ""},
		{"fail", sdktest.Failed, "asked to fail"},
		{"crash", sdktest.Crashed, "asked to crash"},
		{"panic", sdktest.Crashed, "panic: asked to panic"},
		{"later", sdktest.Resubmitted, ""},
	}
	for _, c := range cases {
		res := h.Run("probe", c.do, map[string]string{"do": c.do})
		if res.Outcome != c.outcome || !strings.Contains(res.Reason, c.reason) {
			t.Errorf("%s: outcome %q reason %q, want %q containing %q", c.do, res.Outcome, res.Reason, c.outcome, c.reason)
		}
	}
	var out struct{ Did string }
	if res := h.Run("probe", "again", map[string]string{"do": "work"}); res.Decode(&out) != nil || out.Did != "work" {
		t.Fatalf("result data %s", res.Data)
	}
	if string(h.Get([]byte("seen/again"))) != "yes" {
		t.Fatal("the job's write is not in the plugin's subspace")
	}
	if h.Get([]byte("seen/fail")) != nil {
		t.Fatal("a failed job wrote")
	}
}
