package jobs_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/couchjobs/couchjobs/runtime/jobs"
	"github.com/couchjobs/couchjobs/runtime/kv"
	"github.com/couchjobs/couchjobs/runtime/kv/sqlitekv"
	"github.com/couchjobs/couchjobs/runtime/tuple"
)

// A worker's life: register a type, add a job, accept it, update it with
// its own writes in the same transaction, and finish it.
func Example() {
	dir, _ := os.MkdirTemp("", "couchjobs-example")
	defer os.RemoveAll(dir)
	store, err := sqlitekv.Open(filepath.Join(dir, "jobs.db"), sqlitekv.Options{})
	if err != nil {
		panic(err)
	}
	defer store.Close()
	ctx := context.Background()
	j := jobs.New(store, jobs.Options{})
	defer j.Close()

	// A type exists once it has an activity timeout: a running job not
	// updated for that long goes back to the queue (RunMonitors does it).
	if err := j.SetTypeTimeout(ctx, "resize", 30*time.Second); err != nil {
		panic(err)
	}
	if err := j.Add(ctx, jobs.NewJob{Type: "resize", ID: "img-1", Data: json.RawMessage(`{"width":64}`)}); err != nil {
		panic(err)
	}

	accepted, err := j.Accept(ctx, "resize", jobs.AcceptOptions{Wait: true})
	if err != nil {
		panic(err)
	}
	job := accepted[0]

	// The worker's output and the job's progress commit together, and
	// only while the worker still holds the job.
	results := kv.Sub("example", "results")
	_, err = store.Transact(ctx, func(tx kv.Tx) (any, error) {
		tx.Set(results.Pack(tuple.Tuple{job.ID}), []byte("64px"))
		return nil, job.Update(tx, json.RawMessage(`{"width":64,"done":0.5}`))
	})
	if err != nil {
		panic(err) // jobs.ErrWorkerConflict or jobs.ErrCanceled: stop
	}
	if err := j.Finish(ctx, job, json.RawMessage(`{"width":64,"done":1}`)); err != nil {
		panic(err)
	}

	info, _ := j.Get(ctx, "resize", "img-1")
	fmt.Println(info.State, string(info.Data))
	// Output: finished {"width":64,"done":1}
}

// Subscribe follows a job until it finishes.
func ExampleJobs_Subscribe() {
	dir, _ := os.MkdirTemp("", "couchjobs-example")
	defer os.RemoveAll(dir)
	store, _ := sqlitekv.Open(filepath.Join(dir, "jobs.db"), sqlitekv.Options{})
	defer store.Close()
	ctx := context.Background()
	j := jobs.New(store, jobs.Options{})
	defer j.Close()
	j.SetTypeTimeout(ctx, "report", time.Minute)
	j.Add(ctx, jobs.NewJob{Type: "report", ID: "q3"})

	sub, _ := j.Subscribe(ctx, "report", "q3")
	defer sub.Close()
	go func() {
		accepted, _ := j.Accept(ctx, "report", jobs.AcceptOptions{Wait: true})
		j.Finish(ctx, accepted[0], json.RawMessage(`{"rows":12}`))
	}()
	_, ev, _ := j.Wait(ctx, []*jobs.Subscription{sub}, jobs.Finished)
	fmt.Println(ev.State, string(ev.Info.Data))
	// Output: finished {"rows":12}
}
