package host

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/crypto/bcrypt"

	"github.com/couchjobs/couchjobs/host/config"
	"github.com/couchjobs/couchjobs/runtime/jobs"
	"github.com/couchjobs/couchjobs/runtime/kv"
	"github.com/couchjobs/couchjobs/runtime/kv/kvtest"
	"github.com/couchjobs/couchjobs/runtime/kv/sqlitekv"
	"github.com/couchjobs/couchjobs/sdk"
)

// pluginDir holds the test plugin built under every name the tests use.
var pluginDir string

// adminHash is the bcrypt hash of the test admin's password, "secret".
var adminHash = func() string {
	h, err := bcrypt.GenerateFromPassword([]byte("secret"), bcrypt.MinCost)
	if err != nil {
		panic(err)
	}
	return string(h)
}()

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "couchjobs-plugins")
	if err != nil {
		panic(err)
	}
	pluginDir = dir
	bin := filepath.Join(dir, "couchjobs-alpha")
	if out, err := exec.Command("go", "build", "-o", bin, "./testdata/testplugin").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build the test plugin: %v\n%s", err, out)
		os.Exit(1)
	}
	for _, name := range []string{"beta", "stdout", "hang", "cookie", "version", "crashy", "rejecting", "slowbeat", "gatekeeper", "continuous", "v1"} {
		if err := os.Link(bin, filepath.Join(dir, "couchjobs-"+name)); err != nil {
			panic(err)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

type testNode struct {
	*Node
	stop func()
	done chan error
}

// startNode runs a node with the given extra configuration until the test
// ends.
func startNode(t *testing.T, extra string) *testNode {
	t.Helper()
	return startNodeOn(t, filepath.Join(t.TempDir(), "store.db"), "n1", extra)
}

// startNodeOn runs a node named name on the store at path, which other
// nodes of the test may share.
func startNodeOn(t *testing.T, store, name, extra string) *testNode {
	t.Helper()
	return startNodeWith(t, store, name, extra, Options{})
}

// startNodeWith is startNodeOn with options.
func startNodeWith(t *testing.T, store, name, extra string, opts Options) *testNode {
	t.Helper()
	text := fmt.Sprintf(`
plugin_dir = %q
[node]
name = %q
[store]
path = %q
[http]
listen = "127.0.0.1:0"
admins = { admin = %q }
[scheduler]
min_backoff = "50ms"
max_backoff = "200ms"
shutdown_grace = "2s"
`, pluginDir, name, store, adminHash) + extra
	cfg, err := config.Parse(filepath.Join(t.TempDir(), "runtime.toml"), []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	level := hclog.Warn
	if os.Getenv("COUCHJOBS_TEST_DEBUG") != "" {
		level = hclog.Debug
	}
	log := hclog.New(&hclog.LoggerOptions{Name: t.Name(), Level: level, Output: testWriter{t}})
	opts.PluginStartTimeout = 2 * time.Second
	n, err := NewNode(cfg, log, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tn := &testNode{Node: n, stop: cancel, done: make(chan error, 1)}
	go func() { tn.done <- n.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-tn.done:
		case <-time.After(30 * time.Second):
			t.Error("the node did not stop")
		}
	})
	return tn
}

// testWriter sends logs to the test's log, so they show only on failure.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// waitFor polls cond until it holds or the timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (n *testNode) plugin(name string) PluginStatus {
	for _, p := range n.Plugins() {
		if p.Name == name {
			return p
		}
	}
	return PluginStatus{}
}

func (n *testNode) waitRunning(t *testing.T, name string) {
	t.Helper()
	waitFor(t, 20*time.Second, "plugin "+name+" to run", func() bool { return n.plugin(name).State == PluginRunning })
}

func (n *testNode) add(t *testing.T, typ, id, data string) {
	t.Helper()
	if err := n.Jobs().Add(context.Background(), jobs.NewJob{Type: typ, ID: id, Data: json.RawMessage(data)}); err != nil {
		t.Fatal(err)
	}
}

func (n *testNode) get(t *testing.T, typ, id string) jobs.Info {
	t.Helper()
	in, err := n.Jobs().Get(context.Background(), typ, id)
	if err != nil {
		t.Fatal(err)
	}
	return in
}

func (n *testNode) waitState(t *testing.T, typ, id string, state jobs.State) jobs.Info {
	t.Helper()
	var in jobs.Info
	waitFor(t, 20*time.Second, fmt.Sprintf("job %s/%s to be %s", typ, id, state), func() bool {
		in = n.get(t, typ, id)
		return in.State == state
	})
	return in
}

func meta(t *testing.T, in jobs.Info) map[string]any {
	t.Helper()
	var d struct {
		Meta map[string]any `json:"_couchjobs"`
	}
	if err := json.Unmarshal(in.Data, &d); err != nil {
		t.Fatalf("job data %s: %v", in.Data, err)
	}
	return d.Meta
}

func TestEndToEnd(t *testing.T) {
	t.Parallel()
	n := startNode(t, "[plugins.alpha]\n")
	n.waitRunning(t, "alpha")
	const count = 20
	for i := range count {
		n.add(t, "alpha", fmt.Sprintf("job-%02d", i), `{"updates":2,"write":"out"}`)
	}
	for i := range count {
		in := n.waitState(t, "alpha", fmt.Sprintf("job-%02d", i), jobs.Finished)
		var d struct {
			Done bool   `json:"done"`
			ID   string `json:"id"`
		}
		json.Unmarshal(in.Data, &d)
		if !d.Done || d.ID != in.ID || meta(t, in)["outcome"] != "completed" {
			t.Fatalf("finished job data: %s", in.Data)
		}
	}
	// Every update's writes landed in the plugin's subspace.
	v, err := n.Store().ReadTransact(context.Background(), func(tx kv.ReadTx) (any, error) {
		return tx.GetRange(kv.Sub("plugins", "alpha").Range(), kv.RangeOptions{})
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := len(v.([]kv.KeyValue)); got != 2*count {
		t.Fatalf("%d writes in the plugin's subspace, want %d", got, 2*count)
	}
	// Failures are terminal and say why.
	n.add(t, "alpha", "bad", `{"fail":"the input is wrong"}`)
	in := n.waitState(t, "alpha", "bad", jobs.Finished)
	if m := meta(t, in); m["outcome"] != "failed" || m["reason"] != "the input is wrong" {
		t.Fatalf("failed job: %s", in.Data)
	}
}

func TestPluginKilledMidJobIsRelaunched(t *testing.T) {
	t.Parallel()
	n := startNode(t, "[plugins.alpha]\n")
	n.waitRunning(t, "alpha")
	n.add(t, "alpha", "victim", `{"exit_once":"died-once"}`)
	in := n.waitState(t, "alpha", "victim", jobs.Finished)
	if m := meta(t, in); m["outcome"] != "completed" {
		t.Fatalf("the job did not complete on its second run: %s", in.Data)
	}
	if st := n.plugin("alpha"); st.Restarts < 1 {
		t.Fatalf("the plugin was not relaunched: %+v", st)
	}
}

func TestBadPluginsFailClearly(t *testing.T) {
	t.Parallel()
	n := startNode(t, `
[plugins.alpha]
[plugins.stdout]
[plugins.hang]
[plugins.cookie]
[plugins.version]
[plugins.v1]
[plugins.missing]
[plugins.beta]
sha256 = "0000000000000000000000000000000000000000000000000000000000000000"
[plugins.rejecting.config]
reject = "rejecting needs a server list"
`)
	want := map[string]string{
		"stdout":    "wrote something else than the go-plugin handshake to stdout",
		"hang":      "did not complete its handshake in time",
		"cookie":    "exited at launch",
		"version":   "another plugin protocol version",
		"missing":   "couchjobs-missing",
		"beta":      "plugins.beta.sha256 does not match",
		"rejecting": "plugins.rejecting.config.reject: rejecting needs a server list",
	}
	for name, text := range want {
		waitFor(t, 20*time.Second, "plugin "+name+" to fail", func() bool { return n.plugin(name).State == PluginFailed })
		if st := n.plugin(name); !strings.Contains(st.Error, text) {
			t.Errorf("plugin %s: error %q does not say %q", name, st.Error, text)
		}
	}
	// The good plugins serve their jobs all along, a version 1 plugin
	// among them.
	for _, name := range []string{"alpha", "v1"} {
		n.waitRunning(t, name)
		n.add(t, name, "fine", `{}`)
		n.waitState(t, name, "fine", jobs.Finished)
	}
	if a, v1 := n.plugin("alpha").Protocol, n.plugin("v1").Protocol; a != sdk.ProtocolVersion || v1 != 1 {
		t.Errorf("negotiated protocols: alpha %d, v1 %d", a, v1)
	}
}

func TestPanicsAreReported(t *testing.T) {
	t.Parallel()
	n := startNode(t, "[plugins.alpha]\n[plugins.crashy]\n")
	n.waitRunning(t, "alpha")
	n.add(t, "alpha", "p", `{"panic":"kaboom"}`)
	waitFor(t, 20*time.Second, "the panic to be recorded", func() bool {
		m := meta(t, n.get(t, "alpha", "p"))
		return m != nil && m["outcome"] == "crashed"
	})
	m := meta(t, n.get(t, "alpha", "p"))
	if r, _ := m["reason"].(string); !strings.Contains(r, "panic: kaboom") {
		t.Fatalf("crash reason %q lacks the panic text", r)
	}
	// A plugin that panics outside a job is relaunched, and reported as
	// crashed with the panic text.
	waitFor(t, 20*time.Second, "the crashy plugin to be relaunched", func() bool { return n.plugin("crashy").Restarts >= 1 })
	waitFor(t, 20*time.Second, "the crash to be reported", func() bool {
		return strings.Contains(n.plugin("crashy").Error, "plugin crashy crashed: panic: crashy plugin: a bug outside any job")
	})
}

func TestGracefulShutdownHandsJobsBack(t *testing.T) {
	t.Parallel()
	n := startNode(t, "[plugins.alpha]\n")
	n.waitRunning(t, "alpha")
	n.add(t, "alpha", "long", `{"sleep_ms":60000}`)
	n.add(t, "alpha", "stubborn", `{"sleep_ms":60000,"ignore_stop":true}`)
	n.waitState(t, "alpha", "long", jobs.Running)
	n.waitState(t, "alpha", "stubborn", jobs.Running)
	start := time.Now()
	n.stop()
	select {
	case <-n.done:
		n.done <- nil
	case <-time.After(20 * time.Second):
		t.Fatal("the node did not stop")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("shutdown took %v with a 2s grace", d)
	}
	// Reopen the store: both jobs are pending again, without waiting for
	// the activity timeout.
	cfg := n.cfg
	s, err := OpenStore(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	j := jobs.New(s, jobs.Options{})
	defer j.Close()
	for _, id := range []string{"long", "stubborn"} {
		in, err := j.Get(context.Background(), "alpha", id)
		if err != nil || in.State != jobs.Pending {
			t.Fatalf("%s after shutdown: %v %v", id, in.State, err)
		}
	}
}

func TestPluginUsesHostServices(t *testing.T) {
	t.Parallel()
	n := startNode(t, "[plugins.alpha]\n")
	n.waitRunning(t, "alpha")
	n.add(t, "alpha", "parent", `{"manage":true}`)
	in := n.waitState(t, "alpha", "parent", jobs.Finished)
	var got struct {
		States         []string `json:"states"`
		ChildState     string   `json:"child_state"`
		ChildWrites    int      `json:"child_writes"`
		Gone           bool     `json:"gone"`
		ForeignRefused bool     `json:"foreign_refused"`
	}
	if err := json.Unmarshal(in.Data, &got); err != nil {
		t.Fatal(err)
	}
	if got.States[len(got.States)-1] != "finished" || got.ChildState != "finished" || got.ChildWrites != 2 || !got.Gone || !got.ForeignRefused {
		t.Fatalf("what the plugin saw through the host: %s", in.Data)
	}
}

func TestUpdateOverTheValueLimitIsRefused(t *testing.T) {
	t.Parallel()
	n := startNode(t, "[plugins.alpha]\n")
	n.waitRunning(t, "alpha")
	n.add(t, "alpha", "huge", `{"big_update":200000}`)
	in := n.waitState(t, "alpha", "huge", jobs.Finished)
	m := meta(t, in)
	if r, _ := m["reason"].(string); m["outcome"] != "failed" || !strings.Contains(r, "exceeds the limit") {
		t.Fatalf("an update over the value limit: %s", in.Data)
	}
}

// TestCancelStopsTheRunAtOnce cancels a running job of a type whose
// heartbeats come every 20 s: the plugin must be told at once.
func TestCancelStopsTheRunAtOnce(t *testing.T) {
	t.Parallel()
	n := startNode(t, "[plugins.slowbeat]\n")
	n.waitRunning(t, "slowbeat")
	n.add(t, "slowbeat", "long", `{"sleep_ms":600000}`)
	waitFor(t, 20*time.Second, "the job to run in the plugin", func() bool { return n.plugin("slowbeat").Running == 1 })
	canceled := time.Now()
	if err := n.Jobs().Cancel(context.Background(), "slowbeat", "long"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the plugin to end the canceled run", func() bool { return n.plugin("slowbeat").Running == 0 })
	t.Logf("the run ended %v after the cancel", time.Since(canceled))
	if in := n.get(t, "slowbeat", "long"); in.State != jobs.Finished || !in.Canceled {
		t.Fatalf("canceled job: %+v", in)
	}
}

// TestLeaseStopsACutOffRun cuts a node off from its store (its commits
// hang) while a job runs: the SDK stops the run as lost before the
// activity timeout could hand the job to another node, so the job never
// runs in two places.
func TestLeaseStopsACutOffRun(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, err := sqlitekv.Open(filepath.Join(dir, "store.db"), sqlitekv.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	faulty := kvtest.NewFaulty(s)
	n := startNodeWith(t, filepath.Join(dir, "store.db"), "n1", "[plugins.alpha]\n", Options{Store: faulty})
	n.waitRunning(t, "alpha")
	stopFile := filepath.Join(dir, "stopped")
	n.add(t, "alpha", "cut", fmt.Sprintf(`{"sleep_ms":30000,"stop_file":%q}`, stopFile))
	n.waitState(t, "alpha", "cut", jobs.Running)
	var cut atomic.Bool
	cut.Store(true)
	t.Cleanup(func() { cut.Store(false) }) // before the node stops
	faulty.SetInject(func(p kvtest.Point) error {
		for p.Op == "commit" && cut.Load() {
			time.Sleep(10 * time.Millisecond)
		}
		return nil
	})
	start := time.Now()
	waitFor(t, 10*time.Second, "the run to stop", func() bool {
		_, err := os.Stat(stopFile)
		return err == nil
	})
	took := time.Since(start)
	cut.Store(false)
	if b, _ := os.ReadFile(stopFile); string(b) != string(sdk.StopLost) {
		t.Fatalf("run stopped for %q", b)
	}
	// The type's activity timeout is 2 s: the lease ends at 80% of it
	// after the last stored update, which was at most a heartbeat ago.
	if took > 2*time.Second {
		t.Fatalf("the run went on %v after its node was cut off", took)
	}
}

// TestHealing runs two jobs that crash at the end of every run: one whose
// runs outlast the health threshold, whose crash count stays at 1 (each
// long run heals it first), and one whose short runs do not, whose count
// grows.
func TestHealing(t *testing.T) {
	t.Parallel()
	// The extra lines continue the test node's [scheduler] table.
	n := startNode(t, "health_threshold = \"200ms\"\n[plugins.alpha]\n")
	n.waitRunning(t, "alpha")
	n.add(t, "alpha", "long", `{"sleep_ms":300,"crash":"boom"}`)
	n.add(t, "alpha", "short", `{"crash":"boom"}`)
	retries := map[string]bool{}
	waitFor(t, 20*time.Second, "the long job to crash three times", func() bool {
		m := meta(t, n.get(t, "alpha", "long"))
		if c, _ := m["crashes"].(float64); c > 1 {
			t.Fatalf("a job whose runs outlast the health threshold counts %v crashes", c)
		}
		if at, ok := m["retry_at"].(string); ok {
			retries[at] = true
		}
		return len(retries) >= 3
	})
	waitFor(t, 20*time.Second, "the short job's crashes to add up", func() bool {
		c, _ := meta(t, n.get(t, "alpha", "short"))["crashes"].(float64)
		return c >= 3
	})
}

// TestTypeMaxJobs caps one type's running jobs below its plugin's cap,
// and refuses a cap for a type the plugin does not have.
func TestTypeMaxJobs(t *testing.T) {
	t.Parallel()
	n := startNode(t, "[plugins.alpha]\nmax_jobs = 10\ntype_max_jobs = { alpha = 2 }\n")
	n.waitRunning(t, "alpha")
	for i := range 5 {
		n.add(t, "alpha", fmt.Sprint("j", i), `{"sleep_ms":400}`)
	}
	most := 0
	waitFor(t, 20*time.Second, "every job to finish", func() bool {
		// One transaction reads the five states: reading them one by one
		// could see a job that has since ended beside the one that took
		// its slot.
		v, err := n.Store().ReadTransact(context.Background(), func(tx kv.ReadTx) (any, error) {
			counts := map[jobs.State]int{}
			for i := range 5 {
				in, err := n.Jobs().GetTx(tx, "alpha", fmt.Sprint("j", i))
				if err != nil {
					return nil, err
				}
				counts[in.State]++
			}
			return counts, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		counts := v.(map[jobs.State]int)
		most = max(most, counts[jobs.Running])
		return counts[jobs.Finished] == 5
	})
	if most > 2 || most == 0 {
		t.Fatalf("at most %d jobs ran at once; the type's cap is 2", most)
	}
	bad := startNode(t, "[plugins.beta]\ntype_max_jobs = { gamma = 1 }\n")
	waitFor(t, 10*time.Second, "the plugin to fail", func() bool {
		st := bad.plugin("beta")
		return st.State == PluginFailed && strings.Contains(st.Error, `plugins.beta.type_max_jobs.gamma: plugin beta has no job type "gamma"`)
	})
}

// TestFairShare runs continuous jobs of two groups with 300 and 100 shares,
// more than the node's 4 slots: preemption and ranked acceptance settle on
// 3 and 1 running jobs, while every job takes turns. One-shot jobs in a
// group with 1 share are never preempted.
func TestFairShare(t *testing.T) {
	t.Parallel()
	// The extra lines continue the test node's [scheduler] table.
	n := startNode(t, "max_jobs = 4\ninterval = \"100ms\"\nmin_run_time = \"200ms\"\n[scheduler.shares]\nbig = 300\nsmall = 100\nlow = 1\n[plugins.continuous]\n[plugins.alpha]\n")
	n.waitRunning(t, "continuous")
	n.waitRunning(t, "alpha")
	stopFile := filepath.Join(t.TempDir(), "stopped")
	n.api(t).do("POST", "/jobs/alpha", fmt.Sprintf(`{"id":"oneshot","group":"low","data":{"sleep_ms":1500,"stop_file":%q}}`, stopFile), true)
	n.waitState(t, "alpha", "oneshot", jobs.Running)
	for i := range 8 {
		for _, g := range []string{"big", "small"} {
			n.api(t).do("POST", "/jobs/continuous", fmt.Sprintf(`{"id":"%s%d","group":%q,"data":{"forever":true}}`, g, i, g), true)
		}
	}
	if in := n.waitState(t, "alpha", "oneshot", jobs.Finished); meta(t, in)["outcome"] != "completed" {
		t.Fatalf("the one-shot job ended %v", meta(t, in))
	}
	if _, err := os.Stat(stopFile); err == nil {
		t.Fatal("a one-shot job was preempted")
	}
	time.Sleep(time.Second) // settle
	counts := map[string]int{}
	samples := 0
	started := map[string]bool{}
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		for _, r := range n.acct.Runs() {
			counts[r.Group]++
			started[r.ID] = true
		}
		samples++
	}
	big, small := float64(counts["big"])/float64(samples), float64(counts["small"])/float64(samples)
	t.Logf("running on average: big %.2f, small %.2f; %d jobs ran", big, small, len(started))
	if big < 2.6 || big > 3.4 || small < 0.6 || small > 1.4 {
		t.Fatalf("big ran %.2f and small %.2f of 4 slots; shares say 3 and 1", big, small)
	}
	if len(started) < 12 {
		t.Fatalf("only %d of 16 jobs ran in 3 s: jobs do not take turns", len(started))
	}
}
