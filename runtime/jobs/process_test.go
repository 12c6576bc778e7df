package jobs

import (
	"bufio"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/couchjobs/couchjobs/runtime/kv"
	"github.com/couchjobs/couchjobs/runtime/kv/sqlitekv"
	"github.com/couchjobs/couchjobs/runtime/tuple"
)

// childEnv carries a helper process's role: "worker PATH NAME GOROUTINES",
// "lifecycles PATH N" or "hang PATH".
const childEnv = "COUCHJOBS_JOBS_CHILD"

func TestMain(m *testing.M) {
	if role := os.Getenv(childEnv); role != "" {
		if err := runChild(strings.Fields(role)); err != nil {
			fmt.Fprintln(os.Stderr, "jobs helper:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// runs is where workers record each accept, so that a double run shows.
var runs = kv.Sub("jobtest", "runs")

func runChild(args []string) error {
	s, err := sqlitekv.Open(args[1], sqlitekv.Options{})
	if err != nil {
		return err
	}
	defer s.Close()
	j := New(s, Options{})
	defer j.Close()
	switch args[0] {
	case "worker":
		name := args[2]
		n, _ := strconv.Atoi(args[3])
		errs := make(chan error, n)
		for g := range n {
			go func() { errs <- work(j, fmt.Sprintf("%s/%d", name, g)) }()
		}
		for range n {
			if err := <-errs; err != nil {
				return err
			}
		}
		return nil
	case "lifecycles":
		n, _ := strconv.Atoi(args[2])
		for i := range n {
			if err := lifecycle(j, fmt.Sprintf("other-%d", i)); err != nil {
				return err
			}
		}
		return nil
	case "hang":
		jobs, err := j.Accept(context.Background(), typ, AcceptOptions{Wait: true})
		if err != nil {
			return err
		}
		fmt.Printf("%s %s\n", jobs[0].ID, hex.EncodeToString(jobs[0].Lock[:]))
		select {} // a worker that stopped: killed by the test
	}
	return fmt.Errorf("unknown role %q", args[0])
}

// work accepts and finishes jobs until the queue is empty, recording every
// accept under its lock.
func work(j *Jobs, name string) error {
	for {
		jobs, err := j.Accept(ctx, typ, AcceptOptions{})
		if errors.Is(err, ErrNoJobs) {
			return nil
		}
		if err != nil {
			return err
		}
		job := jobs[0]
		if _, err := j.store.Transact(ctx, func(tx kv.Tx) (any, error) {
			tx.Set(runs.Pack(tuple.Tuple{job.ID, job.Lock}), []byte(name))
			return nil, nil
		}); err != nil {
			return err
		}
		if err := j.Finish(ctx, job, json.RawMessage(`{"by":"`+name+`"}`)); err != nil {
			return fmt.Errorf("finish %s: %w", job.ID, err)
		}
	}
}

func startChild(t testing.TB, role string) (*exec.Cmd, *bufio.Scanner) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+role)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd, bufio.NewScanner(out)
}

// helper starts a helper process whose output is not read.
func helper(t testing.TB, role string) *exec.Cmd {
	cmd, _ := startChild(t, role)
	return cmd
}

// TestManyProcessesRunEachJobOnce has 8 goroutines in each of 3 processes
// take 10,000 jobs from one store file (2,000 with -short): every job must
// be accepted exactly once and finished once.
func TestManyProcessesRunEachJobOnce(t *testing.T) {
	t.Parallel()
	n := 10_000
	if testing.Short() {
		n = 2_000
	}
	s, path := newStore(t)
	j := onStore(t, s, Options{})
	for start := 0; start < n; start += 1000 {
		batch := make([]NewJob, 0, 1000)
		for i := start; i < min(n, start+1000); i++ {
			batch = append(batch, NewJob{Type: typ, ID: fmt.Sprintf("job-%05d", i)})
		}
		if err := j.AddMany(ctx, batch); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for p := range 3 {
		cmd, _ := startChild(t, fmt.Sprintf("worker %s p%d 8", path, p))
		wg.Go(func() {
			if err := cmd.Wait(); err != nil {
				t.Errorf("worker process %d: %v", p, err)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	v, err := s.ReadTransact(ctx, func(tx kv.ReadTx) (any, error) { return tx.GetRange(runs.Range(), kv.RangeOptions{}) })
	if err != nil {
		t.Fatal(err)
	}
	accepted := map[string]int{}
	byProcess := map[string]int{}
	for _, e := range v.([]kv.KeyValue) {
		k, _ := runs.Unpack(e.Key)
		accepted[k[0].(string)]++
		byProcess[strings.Split(string(e.Value), "/")[0]]++
	}
	if len(accepted) != n {
		t.Fatalf("%d of %d jobs were accepted", len(accepted), n)
	}
	for id, c := range accepted {
		if c != 1 {
			t.Errorf("%s was accepted %d times", id, c)
		}
	}
	if len(byProcess) != 3 {
		t.Errorf("jobs ran in %d processes, want 3: %v", len(byProcess), byProcess)
	}
	finished := 0
	if err := j.Fold(ctx, typ, ListOptions{Limit: 1000}, func(in Info) error {
		if in.State == Finished {
			finished++
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if finished != n {
		t.Fatalf("%d of %d jobs finished", finished, n)
	}
	t.Logf("jobs per process: %v", byProcess)
}

// TestKilledWorkerJobRunsElsewhere kills a worker process holding a job
// with SIGKILL: the activity monitor re-enqueues the job, another worker
// completes it, and the dead worker's late Finish is refused.
func TestKilledWorkerJobRunsElsewhere(t *testing.T) {
	t.Parallel()
	s, path := newStore(t)
	j := onStore(t, s, Options{})
	const timeout = 300 * time.Millisecond
	if err := j.SetTypeTimeout(ctx, typ, timeout); err != nil {
		t.Fatal(err)
	}
	mustAdd(t, j, NewJob{ID: "victim"})
	cmd, out := startChild(t, "hang "+path)
	if !out.Scan() {
		t.Fatal("the worker said nothing")
	}
	fields := strings.Fields(out.Text())
	lock, err := hex.DecodeString(fields[1])
	if err != nil || fields[0] != "victim" || len(lock) != 16 {
		t.Fatalf("worker said %q", out.Text())
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	killed := time.Now()
	runMonitor(t, j)
	c, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	jobs, err := j.Accept(c, typ, AcceptOptions{Wait: true})
	if err != nil {
		t.Fatalf("the killed worker's job was not re-enqueued: %v", err)
	}
	t.Logf("re-enqueued %v after the kill (timeout %v)", time.Since(killed), timeout)
	if err := j.Finish(ctx, jobs[0], json.RawMessage(`{"by":"survivor"}`)); err != nil {
		t.Fatal(err)
	}
	late := j.Bind(typ, "victim", tuple.UUID(lock))
	if err := j.Finish(ctx, late, json.RawMessage(`{"by":"ghost"}`)); !errors.Is(err, ErrWorkerConflict) {
		t.Fatalf("the dead worker's late finish: %v", err)
	}
	if in := state(t, j, "victim"); in.State != Finished || string(in.Data) != `{"by":"survivor"}` {
		t.Fatalf("victim: %+v", in)
	}
}
