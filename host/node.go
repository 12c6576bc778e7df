package host

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/couchjobs/couchjobs/host/config"
	"github.com/couchjobs/couchjobs/runtime/jobs"
	"github.com/couchjobs/couchjobs/runtime/kv"
	"github.com/couchjobs/couchjobs/runtime/sched"
	"github.com/couchjobs/couchjobs/sdk"
)

// Options tune a node beyond its configuration file; tests use them.
type Options struct {
	// PluginStartTimeout bounds a plugin's handshake; default 10 s.
	PluginStartTimeout time.Duration
	// Launch starts a plugin and returns its client and a function that
	// stops it. Nil launches the plugin's binary as a process; sdktest
	// serves a plugin in the test's own process instead.
	Launch Launcher
	// Store, if set, is used instead of the configured store, and not
	// closed by the node: for tests that wrap a store (kvtest.Faulty).
	Store kv.Store
}

// Launcher starts the plugin with the given name; see Options.Launch.
type Launcher func(ctx context.Context, name string) (*sdk.Client, func(), error)

// Node is a couchjobs node: it runs the plugins its configuration names
// and the jobs of their types, against the store the configuration names.
type Node struct {
	cfg   *config.Config
	opts  Options
	log   hclog.Logger
	store kv.Store
	jobs  *jobs.Jobs
	// slots caps the node's running jobs, all plugins together.
	slots   chan struct{}
	plugins []*plugin
	metrics metrics
	// shares is the cluster's fair-share state; acct this node's
	// accounting of its runs.
	shares *sched.Store
	acct   *sched.Node
	// view is the last interval's scheduling picture, for the acceptors'
	// ranking (see schedule).
	view    atomic.Pointer[schedView]
	apiAddr atomic.Pointer[string] // where the API listens, once it does
	// verified remembers admin credentials bcrypt accepted, by the SHA-256
	// of name and password.
	verified sync.Map
}

// metrics are the node's counters, for the API and /metrics.
type metrics struct {
	pluginRestarts atomic.Int64
	accepts        atomic.Int64
	acceptNanos    atomic.Int64
}

func (m *metrics) observeAccept(d time.Duration, n int) {
	m.accepts.Add(int64(n))
	m.acceptNanos.Add(int64(d))
}

// NewNode opens the configured store. Run starts the node.
func NewNode(cfg *config.Config, log hclog.Logger, opts Options) (*Node, error) {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	if opts.PluginStartTimeout <= 0 {
		opts.PluginStartTimeout = 10 * time.Second
	}
	store := opts.Store
	if store == nil {
		var err error
		if store, err = OpenStore(cfg, log); err != nil {
			return nil, err
		}
	} else {
		store = unclosed{store}
	}
	n := &Node{
		cfg: cfg, opts: opts, log: log, store: store,
		jobs:  jobs.New(store, jobs.Options{Logger: log}),
		slots: make(chan struct{}, cfg.Scheduler.MaxJobs),
	}
	params := schedParams(n)
	n.shares, n.acct = sched.NewStore(store, params, nil), sched.NewNode(params)
	names := make([]string, 0, len(cfg.Plugins))
	for name, p := range cfg.Plugins {
		if p.On() {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	for _, name := range names {
		n.plugins = append(n.plugins, newPlugin(n, name, cfg.Plugins[name]))
	}
	return n, nil
}

// Jobs returns the node's job layer.
func (n *Node) Jobs() *jobs.Jobs { return n.jobs }

// Store returns the node's store.
func (n *Node) Store() kv.Store { return n.store }

// Plugins reports the state of every plugin the node runs.
func (n *Node) Plugins() []PluginStatus {
	out := make([]PluginStatus, len(n.plugins))
	for i, p := range n.plugins {
		out[i] = p.Status()
	}
	return out
}

// Ready waits until the node's API listens (unless it is off) and every
// plugin runs. It returns an error naming the first plugin that cannot
// run, or ctx's error. Tests, and supervisors that gate on readiness, use
// it after starting Run.
func (n *Node) Ready(ctx context.Context) error {
	for {
		ready := n.cfg.HTTP.Listen == "off" || n.APIAddr() != ""
		for _, p := range n.Plugins() {
			switch p.State {
			case PluginFailed:
				return fmt.Errorf("plugin %s cannot run: %s", p.Name, p.Error)
			case PluginRunning:
			default:
				ready = false
			}
		}
		if ready {
			return nil
		}
		if err := kv.Sleep(ctx, 5*time.Millisecond); err != nil {
			return fmt.Errorf("the node is not ready: %w", err)
		}
	}
}

// typeOwner returns the name of another plugin that declared job type t.
func (n *Node) typeOwner(t string, except *plugin) string {
	for _, p := range n.plugins {
		if p == except {
			continue
		}
		if st := p.Status(); slices.Contains(st.Types, t) {
			return p.name
		}
	}
	return ""
}

// Run runs the node until ctx is done, then shuts it down gracefully: it
// stops accepting, asks running jobs to checkpoint and stop within the
// shutdown grace, hands back those that do not (so that another node
// starts them at once, not after the activity timeout), and stops the
// plugins. It closes the store before returning.
func (n *Node) Run(ctx context.Context) error {
	defer n.store.Close()
	defer n.jobs.Close()
	ln, err := n.listenAPI()
	if err != nil {
		return err
	}
	runCtx, stopRun := context.WithCancel(context.Background())
	defer stopRun()
	acceptCtx, stopAccepting := context.WithCancel(runCtx)
	var wg sync.WaitGroup
	if ln != nil {
		wg.Go(func() { n.serveAPI(runCtx, ln) })
	}
	wg.Go(func() { n.heartbeat(runCtx) })
	wg.Go(func() { n.jobs.RunMonitors(runCtx) })
	wg.Go(func() { n.accounting(runCtx) })
	for _, p := range n.plugins {
		wg.Go(func() { p.run(runCtx, acceptCtx) })
	}
	n.log.Info("node running", "node", n.cfg.Node.Name, "store", n.cfg.Store.Backend, "plugins", len(n.plugins))
	<-ctx.Done()

	grace := n.cfg.Scheduler.ShutdownGrace.Duration
	n.log.Info("shutting down", "grace", grace)
	stopAccepting()
	var drain sync.WaitGroup
	for _, p := range n.plugins {
		drain.Go(func() { p.drain(grace) })
	}
	drain.Wait()
	stopRun()
	wg.Wait()
	n.log.Info("node stopped")
	return nil
}

// String names the node in logs.
func (n *Node) String() string { return fmt.Sprintf("node %s", n.cfg.Node.Name) }

// unclosed is a store the node does not own: closing it does nothing.
type unclosed struct{ kv.Store }

func (unclosed) Close() error { return nil }
