package kvtest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/couchjobs/couchjobs/runtime/kv"
	"github.com/couchjobs/couchjobs/runtime/tuple"
)

// childEnv carries a helper process's orders, as JSON.
const childEnv = "COUCHJOBS_KVTEST_CHILD"

// Main runs the tests, or, in a helper process started by the suite, the
// helper's role. Call it from the backend test package's TestMain.
func Main(m *testing.M, b Backend) {
	if orders := os.Getenv(childEnv); orders != "" {
		os.Exit(runChild(b, orders))
	}
	os.Exit(m.Run())
}

// orders tell a helper process what to do.
type orders struct {
	Role       string `json:"role"`
	Spec       string `json:"spec"`
	Prefix     []byte `json:"prefix"`
	ID         int    `json:"id"`
	N          int    `json:"n"`
	Goroutines int    `json:"goroutines"`
}

// child is a running helper process.
type child struct {
	t     testing.TB
	cmd   *exec.Cmd
	lines chan string
	wait  chan error
}

// startChild starts the test binary as a helper process with the given
// orders; it is killed when the test ends if it is still running.
func startChild(t testing.TB, o orders) *child {
	t.Helper()
	enc, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+string(enc))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start helper process: %v", err)
	}
	c := &child{t: t, cmd: cmd, lines: make(chan string, 1024), wait: make(chan error, 1)}
	var readDone sync.WaitGroup
	readDone.Add(1)
	go func() {
		defer readDone.Done()
		defer close(c.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		io.Copy(io.Discard, out)
	}()
	go func() {
		readDone.Wait() // Wait closes the pipe; read it all first
		c.wait <- cmd.Wait()
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-c.wait
	})
	return c
}

// line returns the helper's next line of output, failing the test if none
// comes within the timeout.
func (c *child) line(timeout time.Duration) string {
	c.t.Helper()
	select {
	case l, ok := <-c.lines:
		if !ok {
			c.t.Fatalf("helper process %s ended early", c.cmd.Args[0])
		}
		return l
	case <-time.After(timeout):
		c.t.Fatalf("no output from helper process within %v", timeout)
	}
	return ""
}

// finish waits for the helper to exit and fails the test if it failed.
func (c *child) finish(timeout time.Duration) {
	c.t.Helper()
	select {
	case err := <-c.wait:
		c.wait <- err // for the cleanup
		if err != nil {
			c.t.Fatalf("helper process failed: %v", err)
		}
	case <-time.After(timeout):
		c.t.Fatalf("helper process still running after %v", timeout)
	}
}

// runChild carries out a helper's orders and returns its exit code.
func runChild(b Backend, raw string) int {
	var o orders
	if err := json.Unmarshal([]byte(raw), &o); err != nil {
		fmt.Fprintln(os.Stderr, "kvtest helper: bad orders:", err)
		return 2
	}
	s, err := b.OpenSpec(o.Spec)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kvtest helper: open store:", err)
		return 2
	}
	defer s.Close()
	sub := kv.SubspaceFromBytes(o.Prefix)
	role, ok := roles[o.Role]
	if !ok {
		fmt.Fprintln(os.Stderr, "kvtest helper: unknown role", o.Role)
		return 2
	}
	if err := role(context.Background(), s, sub, o); err != nil {
		fmt.Fprintf(os.Stderr, "kvtest helper %s %d: %v\n", o.Role, o.ID, err)
		return 1
	}
	return 0
}

// say prints one line for the parent and flushes it at once.
func say(format string, args ...any) {
	fmt.Fprintf(os.Stdout, format+"\n", args...)
}

var roles = map[string]func(context.Context, kv.Store, kv.Subspace, orders) error{
	"increment": childIncrement,
	"versionstamps": func(ctx context.Context, s kv.Store, sub kv.Subspace, o orders) error {
		for i := range o.N {
			key, err := sub.PackWithVersionstamp(tuple.Tuple{"vs", tuple.IncompleteVersionstamp(0)})
			if err != nil {
				return err
			}
			if _, err := s.Transact(ctx, func(tx kv.Tx) (any, error) {
				tx.SetVersionstampedKey(key, tuple.Tuple{o.ID, i}.Pack())
				return nil, nil
			}); err != nil {
				return err
			}
		}
		return nil
	},
	"echo":         childEcho,
	"crash-writer": childCrashWriter,
}

// counterKey is the shared counter of the increment tests.
func counterKey(sub kv.Subspace) []byte { return sub.Pack(tuple.Tuple{"counter"}) }

// increment adds one to the counter by reading and writing it, the pattern
// that loses updates without serializable isolation.
func increment(ctx context.Context, s kv.Transactor, key []byte) error {
	_, err := s.Transact(ctx, func(tx kv.Tx) (any, error) {
		v, err := tx.Get(key)
		if err != nil {
			return nil, err
		}
		n := 0
		if v != nil {
			if n, err = strconv.Atoi(string(v)); err != nil {
				return nil, err
			}
		}
		tx.Set(key, []byte(strconv.Itoa(n+1)))
		return nil, nil
	})
	return err
}

func childIncrement(ctx context.Context, s kv.Store, sub kv.Subspace, o orders) error {
	errs := make(chan error, o.Goroutines)
	for range o.Goroutines {
		go func() {
			for range o.N {
				if err := increment(ctx, s, counterKey(sub)); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range o.Goroutines {
		if err := <-errs; err != nil {
			return err
		}
	}
	return nil
}

// childEcho answers each new value of "ping" by copying it to "pong",
// prefixed with the wall-clock time it woke at, until ping is "stop". It
// says "ready" once its first watch is set.
func childEcho(ctx context.Context, s kv.Store, sub kv.Subspace, o orders) error {
	ping, pong := sub.Pack(tuple.Tuple{"ping"}), sub.Pack(tuple.Tuple{"pong"})
	var last []byte
	ready := false
	for {
		woke := time.Now().UnixNano()
		v, err := s.Transact(ctx, func(tx kv.Tx) (any, error) {
			cur, err := tx.Get(ping)
			if err != nil {
				return nil, err
			}
			if cur != nil && string(cur) != string(last) && string(cur) != "stop" {
				tx.Set(pong, fmt.Appendf(nil, "%d %s", woke, cur))
			}
			return [2]any{cur, tx.Watch(ping)}, nil
		})
		if err != nil {
			return err
		}
		pair := v.([2]any)
		cur, w := pair[0].([]byte), pair[1].(kv.Watch)
		if string(cur) == "stop" {
			w.Cancel()
			return nil
		}
		last = cur
		if !ready {
			say("ready")
			ready = true
		}
		if err := kv.WaitWatch(ctx, w); err != nil {
			return err
		}
	}
}

// childCrashWriter commits transactions of o.N rows each, forever, and says
// the number of each after it commits. Every transaction i writes rows
// (i, 0..N-1) and sets "last" to i, so a reader can check that the store
// holds exactly the transactions that committed.
func childCrashWriter(ctx context.Context, s kv.Store, sub kv.Subspace, o orders) error {
	payload := make([]byte, 200)
	for i := 0; ; i++ {
		if _, err := s.Transact(ctx, func(tx kv.Tx) (any, error) {
			for j := range o.N {
				tx.Set(sub.Pack(tuple.Tuple{"row", i, j}), payload)
			}
			tx.Set(sub.Pack(tuple.Tuple{"last"}), []byte(strconv.Itoa(i)))
			return nil, nil
		}); err != nil {
			return err
		}
		say("%d", i)
	}
}
