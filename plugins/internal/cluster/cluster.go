// Package cluster runs couchjobs nodes with one plugin as separate
// processes over one embedded store, for the plugins' failure tests and
// benchmarks: real hosts, and plugin processes, that can be killed with
// SIGKILL.
package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/couchjobs/couchjobs/runtime/jobs"
	"github.com/couchjobs/couchjobs/runtime/kv/sqlitekv"
)

// Plugin is a plugin to build: its name and its main package.
type Plugin struct{ Name, Package string }

// Build compiles the couchjobs host and the plugins into bin.
func Build(ctx context.Context, bin string, plugins ...Plugin) error {
	builds := []struct{ out, pkg string }{{filepath.Join(bin, "couchjobs"), "github.com/couchjobs/couchjobs/host/cmd/couchjobs"}}
	for _, p := range plugins {
		builds = append(builds, struct{ out, pkg string }{filepath.Join(bin, "plugins", "couchjobs-"+p.Name), p.Package})
	}
	for _, b := range builds {
		if out, err := exec.CommandContext(ctx, "go", "build", "-o", b.out, b.pkg).CombinedOutput(); err != nil {
			return fmt.Errorf("build %s: %v\n%s", b.pkg, err, out)
		}
	}
	return nil
}

// Workspace makes a temporary directory for a benchmark's clusters and
// builds the binaries into its bin; remove the directory when done.
func Workspace(ctx context.Context, name string, plugins ...Plugin) (dir, bin string, err error) {
	dir, err = os.MkdirTemp("", "couchjobs-"+name+"-")
	if err != nil {
		return "", "", err
	}
	bin = filepath.Join(dir, "bin")
	fmt.Fprintln(os.Stderr, "building couchjobs and its plugins...")
	if err := Build(ctx, bin, plugins...); err != nil {
		os.RemoveAll(dir)
		return "", "", err
	}
	return dir, bin, nil
}

// Options shape a cluster.
type Options struct {
	// Bin is where Build put the binaries.
	Bin string
	// Plugin is the plugin every node runs, and Config its
	// [plugins.<Plugin>.config] table, as TOML lines.
	Plugin, Config string
	// Scheduler holds extra [scheduler] lines (max_jobs, interval, ...).
	Scheduler string
	// Workers is each node's worker count for the plugin (max_jobs).
	Workers int
	// ActivityTimeout is how soon a dead node's job goes elsewhere.
	ActivityTimeout time.Duration
	// Log receives the nodes' output; nil discards it.
	Log io.Writer
}

// Cluster is nodes sharing one store in dir.
type Cluster struct {
	dir   string
	opts  Options
	Store *sqlitekv.Store
	Jobs  *jobs.Jobs
	nodes map[string]*Node
}

// Node is one host process.
type Node struct {
	Name string
	cmd  *exec.Cmd
	api  string
	done chan struct{}
}

// New opens the cluster's store.
func New(dir string, o Options) (*Cluster, error) {
	if o.Workers == 0 {
		o.Workers = 2
	}
	if o.ActivityTimeout == 0 {
		o.ActivityTimeout = 2 * time.Second
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	s, err := sqlitekv.Open(filepath.Join(dir, "store.db"), sqlitekv.Options{})
	if err != nil {
		return nil, err
	}
	return &Cluster{dir: dir, opts: o, Store: s, Jobs: jobs.New(s, jobs.Options{}), nodes: map[string]*Node{}}, nil
}

// Start launches a node and waits until its plugin runs.
func (c *Cluster) Start(ctx context.Context, name string, groups ...string) (*Node, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := l.Addr().String()
	l.Close()
	gs, _ := json.Marshal(groups)
	if groups == nil {
		gs = []byte("[]")
	}
	text := fmt.Sprintf(`plugin_dir = %q
[node]
name = %q
groups = %s
[store]
path = "store.db"
[http]
listen = %q
[log]
level = "warn"
[scheduler]
min_backoff = "100ms"
max_backoff = "1s"
%s
[plugins.%s]
max_jobs = %d
activity_timeout = %q
[plugins.%s.config]
%s
`, filepath.Join(c.opts.Bin, "plugins"), name, gs, addr, c.opts.Scheduler, c.opts.Plugin, c.opts.Workers, c.opts.ActivityTimeout, c.opts.Plugin, c.opts.Config)
	path := filepath.Join(c.dir, name+".toml")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		return nil, err
	}
	cmd := exec.Command(filepath.Join(c.opts.Bin, "couchjobs"), "run", "-config", path)
	cmd.Stdout, cmd.Stderr = c.opts.Log, c.opts.Log
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	n := &Node{Name: name, cmd: cmd, api: "http://" + addr, done: make(chan struct{})}
	go func() { cmd.Wait(); close(n.done) }()
	c.nodes[name] = n
	for {
		if n.pluginRunning(c.opts.Plugin) {
			return n, nil
		}
		select {
		case <-n.done:
			return nil, fmt.Errorf("node %s exited at start", name)
		case <-ctx.Done():
			n.Kill()
			return nil, fmt.Errorf("node %s did not start: %w", name, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (n *Node) pluginRunning(plugin string) bool {
	resp, err := http.Get(n.api + "/plugins")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var out struct {
		Plugins []struct{ Name, State string }
	}
	json.NewDecoder(resp.Body).Decode(&out)
	for _, p := range out.Plugins {
		if p.Name == plugin && p.State == "running" {
			return true
		}
	}
	return false
}

// URL is the base URL of the node's HTTP API.
func (n *Node) URL() string { return n.api }

// Kill kills the node with SIGKILL, as a crash would, and waits for it.
func (n *Node) Kill() {
	n.cmd.Process.Signal(syscall.SIGKILL)
	<-n.done
}

// Stop stops the node gracefully.
func (n *Node) Stop() {
	n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.done:
	case <-time.After(30 * time.Second):
		n.Kill()
	}
}

// WaitFinished waits until every job of typ named is finished.
func (c *Cluster) WaitFinished(ctx context.Context, typ string, ids ...string) error {
	for _, id := range ids {
		sub, err := c.Jobs.Subscribe(ctx, typ, id)
		if err != nil {
			return err
		}
		ev := sub.Latest()
		for ev.State != jobs.Finished && err == nil {
			if ev.State == jobs.NotFound {
				err = fmt.Errorf("job %s was removed", id)
				break
			}
			ev, err = sub.Next(ctx)
		}
		sub.Close()
		if err != nil {
			return fmt.Errorf("job %s: %w", id, err)
		}
	}
	return nil
}

// KillPlugin kills the node's plugin process with SIGKILL; the host
// relaunches it.
func (n *Node) KillPlugin(plugin string) error {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return err
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		comm := "couchjobs-" + plugin
		comm = comm[:min(len(comm), 15)] // the kernel keeps 15 bytes
		if i < 0 || !strings.Contains(s[:i], "("+comm) {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) > 1 && f[1] == fmt.Sprint(n.cmd.Process.Pid) {
			var pid int
			fmt.Sscan(e.Name(), &pid)
			return syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	return fmt.Errorf("no couchjobs-%s process under node %s", plugin, n.Name)
}

// Commits is the number of write transactions the store has committed.
func (c *Cluster) Commits(ctx context.Context) (int64, error) {
	st, err := c.Store.Stats(ctx)
	return st.Version, err
}

// Close stops every node still running and closes the store.
func (c *Cluster) Close() error {
	var errs []string
	for _, n := range c.nodes {
		select {
		case <-n.done:
		default:
			n.Stop()
		}
	}
	c.Jobs.Close()
	if err := c.Store.Close(); err != nil {
		errs = append(errs, err.Error())
	}
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "; "))
	}
	return nil
}

// TestLog is an Options.Log that writes the nodes' output to a test's log.
func TestLog(t testing.TB) io.Writer { return testLog{t} }

type testLog struct{ t testing.TB }

func (l testLog) Write(b []byte) (int, error) {
	l.t.Logf("%s", strings.TrimRight(string(b), "\n"))
	return len(b), nil
}
