// Command testplugin is the plugin the host's tests run. Built as
// couchjobs-NAME, it is plugin NAME with one job type, NAME; some names
// make it misbehave at launch, as the tests need: "stdout" prints before
// the handshake, "hang" never starts, "cookie" has the wrong magic cookie,
// "version" speaks protocol version 99, "crashy" panics outside any job,
// "slowbeat" has a one-minute activity timeout (rare heartbeats).
//
// A job's data says what its run does: {"sleep_ms": N, "updates": N,
// "write": "key", "fail": "reason", "crash": "reason", "panic": "text",
// "exit_once": "marker", "ignore_stop": true}.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	goplugin "github.com/hashicorp/go-plugin"

	"github.com/couchjobs/couchjobs/sdk"
)

type spec struct {
	SleepMS    int    `json:"sleep_ms"`
	Updates    int    `json:"updates"`
	Write      string `json:"write"`
	Fail       string `json:"fail"`
	Crash      string `json:"crash"`
	Panic      string `json:"panic"`
	ExitOnce   string `json:"exit_once"`
	IgnoreStop bool   `json:"ignore_stop"`
	BigUpdate  int    `json:"big_update"`
	Manage     bool   `json:"manage"`
	MoveTo     string `json:"move_to"`
	StopFile   string `json:"stop_file"`
	Forever    bool   `json:"forever"`
}

// manage exercises every host service: it adds a child job of its own
// type, follows it to the end, reads the child's writes back by range,
// removes the child, and reports what it saw.
func manage(ctx context.Context, job *sdk.Job) error {
	h := job.Host()
	child := "child-of-" + job.ID
	if err := h.AddJob(ctx, sdk.NewJob{Type: job.Type, ID: child, Data: map[string]any{"updates": 2, "write": "w"}}); err != nil {
		return fmt.Errorf("add child: %w", err)
	}
	var states []string
	if err := h.Subscribe(ctx, job.Type, child, func(in sdk.JobInfo) error {
		if len(states) == 0 || states[len(states)-1] != in.State {
			states = append(states, in.State)
		}
		return nil
	}); err != nil {
		return fmt.Errorf("subscribe: %w", err)
	}
	info, err := h.GetJob(ctx, job.Type, child)
	if err != nil {
		return fmt.Errorf("get child: %w", err)
	}
	kvs, err := h.Range(ctx, []byte("w/"+child+"/"), []byte("w/"+child+"0"), 0, false)
	if err != nil {
		return fmt.Errorf("range: %w", err)
	}
	if err := h.RemoveJob(ctx, job.Type, child); err != nil {
		return fmt.Errorf("remove child: %w", err)
	}
	_, gone := h.GetJob(ctx, job.Type, child)
	foreign := h.AddJob(ctx, sdk.NewJob{Type: "someone-elses", ID: "x"})
	return job.SetResult(map[string]any{
		"states": states, "child_state": info.State, "child_writes": len(kvs),
		"gone": errors.Is(gone, sdk.ErrNotFound), "foreign_refused": foreign != nil && strings.Contains(foreign.Error(), "does not own"),
	})
}

func run(ctx context.Context, job *sdk.Job) error {
	var s spec
	if err := job.Decode(&s); err != nil {
		return sdk.Fail(err)
	}
	if s.Manage {
		return manage(ctx, job)
	}
	if s.BigUpdate > 0 {
		err := job.Update(ctx, sdk.Update{Data: map[string]string{"blob": strings.Repeat("x", s.BigUpdate)}})
		if err == nil {
			return errors.New("the host took an update over the value limit")
		}
		return sdk.Fail(err)
	}
	if s.ExitOnce != "" {
		seen, err := job.Host().Get(ctx, []byte(s.ExitOnce))
		if err != nil {
			return err
		}
		if seen == nil {
			if err := job.Update(ctx, sdk.Update{Writes: []sdk.Write{sdk.Set([]byte(s.ExitOnce), []byte("1"))}}); err != nil {
				return err
			}
			os.Exit(7) // the plugin dies mid-job
		}
	}
	for i := range s.Updates {
		u := sdk.Update{Data: map[string]any{"step": i + 1}, Fraction: float64(i+1) / float64(s.Updates)}
		if s.Write != "" {
			u.Writes = []sdk.Write{sdk.Set([]byte(fmt.Sprintf("%s/%s/%d", s.Write, job.ID, i)), []byte(job.ID))}
		}
		if err := job.Update(ctx, u); err != nil {
			return err
		}
	}
	if s.StopFile != "" {
		// Records why the host stopped the run, when it does.
		defer func() {
			if reason, ok := sdk.Stopped(ctx); ok {
				os.WriteFile(s.StopFile, []byte(reason), 0o644)
			}
		}()
	}
	if s.Forever {
		// A continuous job: it runs until the host stops it.
		<-ctx.Done()
		return context.Cause(ctx)
	}
	if s.SleepMS > 0 {
		t := time.NewTimer(time.Duration(s.SleepMS) * time.Millisecond)
		defer t.Stop()
		if s.IgnoreStop {
			<-t.C
		} else {
			select {
			case <-t.C:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	switch {
	case s.MoveTo != "":
		// Hands the job to another placement, as a multi-node job does.
		return sdk.ResubmitTo(time.Time{}, sdk.Placement(s.MoveTo))
	case s.Panic != "":
		panic(s.Panic)
	case s.Fail != "":
		return sdk.Fail(errors.New(s.Fail))
	case s.Crash != "":
		return errors.New(s.Crash)
	}
	return job.SetResult(map[string]any{"done": true, "id": job.ID})
}

// admit is the Admit hook of the types that have one.
var admit func(context.Context, *sdk.Admission) error

func main() {
	name := strings.TrimPrefix(filepath.Base(os.Args[0]), "couchjobs-")
	// "slowbeat" has a long activity timeout, so heartbeats are rare.
	timeout := 2 * time.Second
	if name == "slowbeat" {
		timeout = time.Minute
	}
	if name == "gatekeeper" {
		// "gatekeeper" checks its jobs at add time: it refuses those with
		// "refuse" and places those with "place".
		admit = func(_ context.Context, a *sdk.Admission) error {
			var d struct{ Refuse, Place string }
			if err := json.Unmarshal(a.Data, &d); err != nil {
				return err
			}
			if d.Refuse != "" {
				return errors.New(d.Refuse)
			}
			if d.Place != "" {
				a.Placement = sdk.Placement(d.Place)
			}
			return nil
		}
	}
	p := &sdk.Plugin{
		Name:    name,
		Version: "0.0.1-test",
		// "continuous" declares a continuous type, which may be preempted.
		Types: []sdk.Type{{Name: name, ActivityTimeout: timeout, Worker: sdk.WorkerFunc(run), Admit: admit, Continuous: name == "continuous"}},
		Configure: func(_ context.Context, c *sdk.Config) error {
			var cfg struct {
				Reject string `json:"reject"`
			}
			if err := c.Decode(&cfg); err != nil {
				return err
			}
			if cfg.Reject != "" {
				return sdk.ConfigErrors{{Key: "reject", Message: cfg.Reject}}
			}
			return nil
		},
	}
	switch name {
	case "stdout":
		fmt.Println("hello from a plugin that prints before its handshake")
	case "hang":
		select {}
	case "cookie":
		sdk.Handshake.MagicCookieValue = "not-the-couchjobs-cookie"
	case "version", "v1":
		// A protocol version no host speaks, or version 1 (a plugin built
		// with an older SDK).
		version := 99
		if name == "v1" {
			version = 1
		}
		goplugin.Serve(&goplugin.ServeConfig{
			HandshakeConfig:  sdk.Handshake,
			VersionedPlugins: map[int]goplugin.PluginSet{version: {sdk.PluginKey: &sdk.GRPCPlugin{Impl: p}}},
			GRPCServer:       goplugin.DefaultGRPCServer,
		})
		return
	case "crashy":
		go func() {
			time.Sleep(300 * time.Millisecond)
			panic("crashy plugin: a bug outside any job")
		}()
	}
	sdk.Serve(p)
}
