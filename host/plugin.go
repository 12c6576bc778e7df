package host

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/couchjobs/couchjobs/host/config"
	"github.com/couchjobs/couchjobs/runtime/jobs"
	"github.com/couchjobs/couchjobs/runtime/kv"
	"github.com/couchjobs/couchjobs/sdk"
	pluginv1 "github.com/couchjobs/couchjobs/sdk/proto/couchjobs/plugin/v1"
)

// Plugin states, as PluginStatus reports them.
const (
	PluginStarting = "starting"
	PluginRunning  = "running"
	// PluginRestarting: the plugin exited or crashed and is relaunched
	// after a backoff.
	PluginRestarting = "restarting"
	// PluginFailed: the plugin cannot run until the configuration or the
	// binary is fixed (a missing or mismatched binary, a wrong handshake,
	// a configuration it refused); the node serves its other plugins.
	PluginFailed  = "failed"
	PluginStopped = "stopped"
)

// errPermanent marks launch failures that relaunching cannot cure.
type permanentError struct{ err error }

func (p *permanentError) Error() string { return p.err.Error() }
func (p *permanentError) Unwrap() error { return p.err }

func permanent(format string, args ...any) error {
	return &permanentError{err: fmt.Errorf(format, args...)}
}

// PluginStatus is what the node reports about a plugin.
type PluginStatus struct {
	Name     string   `json:"name"`
	Version  string   `json:"version,omitempty"`
	State    string   `json:"state"`
	Types    []string `json:"types,omitempty"`
	Running  int      `json:"running"`
	Restarts int      `json:"restarts"`
	Error    string   `json:"error,omitempty"`
	// Protocol is the plugin protocol version negotiated with the
	// running process.
	Protocol int `json:"protocol,omitempty"`
}

// plugin runs one plugin process, relaunching it when it dies, and its
// jobs.
type plugin struct {
	n    *Node
	name string
	cfg  *config.Plugin
	path string
	log  hclog.Logger
	sub  kv.Subspace // the plugin's own keys
	// slots caps the plugin's running jobs on this node, and typeSlots
	// those of the types with a cap of their own.
	slots     chan struct{}
	typeSlots map[string]chan struct{}

	mu       sync.Mutex
	state    string
	desc     *pluginv1.DescribeResponse
	lastErr  error
	restarts int
	session  *session
	client   *sdk.Client    // the running process, for admissions and routes
	routes   *http.ServeMux // the plugin's API routes, forwarding to client
	protocol int            // the running process's negotiated protocol version
	stderr   *stderrTail    // the running process's last stderr lines
}

func newPlugin(n *Node, name string, cfg *config.Plugin) *plugin {
	p := &plugin{
		n: n, name: name, cfg: cfg,
		path:  filepath.Join(n.cfg.Resolve(n.cfg.PluginDir), "couchjobs-"+name),
		log:   n.log.Named("plugin").Named(name),
		sub:   kv.Sub("plugins", name),
		state: PluginStarting,
	}
	max := n.cfg.Scheduler.MaxJobs
	if cfg.MaxJobs > 0 {
		max = min(max, cfg.MaxJobs)
	}
	p.slots = make(chan struct{}, max)
	p.typeSlots = map[string]chan struct{}{}
	for typ, n := range cfg.TypeMaxJobs {
		p.typeSlots[typ] = make(chan struct{}, n)
	}
	return p
}

// Status reports the plugin's state.
func (p *plugin) Status() PluginStatus {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := PluginStatus{Name: p.name, State: p.state, Restarts: p.restarts}
	if p.client != nil {
		st.Protocol = p.protocol
	}
	if p.session != nil {
		st.Running = p.session.running()
	}
	if p.desc != nil {
		st.Version = p.desc.Version
		for _, t := range p.desc.Types {
			st.Types = append(st.Types, t.Name)
		}
	}
	if p.lastErr != nil {
		st.Error = p.lastErr.Error()
	}
	return st
}

func (p *plugin) setState(state string, err error) {
	p.mu.Lock()
	p.state, p.lastErr = state, err
	p.mu.Unlock()
}

// run launches the plugin and keeps it running until ctx is done,
// relaunching it with backoff after it exits or crashes. Jobs are accepted
// only until accept is done.
func (p *plugin) run(ctx, accept context.Context) {
	backoff := kv.Backoff{Min: time.Second, Max: time.Minute}
	for ctx.Err() == nil {
		started := time.Now()
		err := p.runOnce(ctx, accept)
		if ctx.Err() != nil {
			p.setState(PluginStopped, nil)
			return
		}
		var perm *permanentError
		if errors.As(err, &perm) {
			p.log.Error("plugin cannot run", "error", err)
			p.setState(PluginFailed, err)
			return
		}
		if time.Since(started) > 5*time.Minute {
			backoff.Reset() // it ran well for a while
		}
		p.mu.Lock()
		p.restarts++
		p.mu.Unlock()
		p.n.metrics.pluginRestarts.Add(1)
		delay := backoff.Next()
		p.log.Error("plugin crashed; relaunching", "error", err, "in", delay)
		p.setState(PluginRestarting, err)
		if kv.Sleep(ctx, delay) != nil {
			p.setState(PluginStopped, nil)
			return
		}
	}
}

// runOnce launches the plugin and serves it until it dies or ctx is done.
func (p *plugin) runOnce(ctx, accept context.Context) error {
	p.setState(PluginStarting, nil)
	launch := p.n.opts.Launch
	if launch == nil {
		launch = p.launchProcess
	}
	c, stop, err := launch(ctx, p.name)
	if err != nil {
		return err
	}
	defer stop()
	desc, err := c.Plugin.Describe(ctx, &pluginv1.DescribeRequest{})
	if err != nil {
		return fmt.Errorf("plugin %s: describe: %w", p.name, err)
	}
	if err := p.checkDescription(desc); err != nil {
		return err
	}
	for typ := range p.cfg.TypeMaxJobs {
		if !slices.ContainsFunc(desc.Types, func(t *pluginv1.JobType) bool { return t.Name == typ }) {
			return permanent("%s: plugins.%s.type_max_jobs.%s: plugin %s has no job type %q", p.n.cfg.Path(), p.name, typ, p.name, typ)
		}
	}
	if d := p.cfg.ActivityTimeout.Duration; d > 0 {
		for _, t := range desc.Types {
			t.ActivityTimeoutMs = d.Milliseconds()
		}
	}
	routes, err := p.buildRoutes(desc)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.desc, p.routes = desc, routes
	p.mu.Unlock()
	for _, t := range desc.Types {
		if err := p.n.jobs.SetTypeTimeout(ctx, t.Name, time.Duration(t.ActivityTimeoutMs)*time.Millisecond); err != nil {
			return fmt.Errorf("plugin %s: register type %s: %w", p.name, t.Name, err)
		}
	}
	if err := p.registerTypes(ctx, desc); err != nil {
		return fmt.Errorf("plugin %s: register types: %w", p.name, err)
	}
	brokerID := c.Broker.NextId()
	hostSrv := &hostService{p: p}
	go c.Broker.AcceptAndServe(brokerID, func(opts []grpc.ServerOption) *grpc.Server {
		s := grpc.NewServer(append(opts, grpc.MaxRecvMsgSize(sdk.MaxMessageSize), grpc.MaxSendMsgSize(sdk.MaxMessageSize))...)
		pluginv1.RegisterHostServer(s, hostSrv)
		return s
	})
	cfgJSON, err := json.Marshal(p.cfg.Config)
	if err != nil || p.cfg.Config == nil {
		cfgJSON = []byte("{}")
	}
	cresp, err := c.Plugin.Configure(ctx, &pluginv1.ConfigureRequest{ConfigJson: cfgJSON, HostBrokerId: brokerID, NodeName: p.n.cfg.Node.Name, NodeGroups: p.n.cfg.Node.Groups})
	if err != nil {
		return fmt.Errorf("plugin %s: configure: %w", p.name, err)
	}
	if len(cresp.Errors) > 0 {
		var msgs []string
		for _, e := range cresp.Errors {
			key := "plugins." + p.name + ".config"
			if e.Key != "" {
				key += "." + e.Key
			}
			msgs = append(msgs, fmt.Sprintf("%s: %s", key, e.Message))
		}
		return permanent("%s: plugin %s refused its configuration: %s", p.n.cfg.Path(), p.name, strings.Join(msgs, "; "))
	}
	s, err := newSession(ctx, p, c, desc)
	if err != nil {
		return fmt.Errorf("plugin %s: open session: %w", p.name, err)
	}
	p.mu.Lock()
	p.session, p.client = s, c
	p.mu.Unlock()
	p.setState(PluginRunning, nil)
	p.log.Info("plugin running", "version", desc.Version, "types", len(desc.Types))
	err = s.serve(ctx, accept)
	p.mu.Lock()
	p.session, p.client = nil, nil
	p.mu.Unlock()
	if ctx.Err() != nil {
		return nil
	}
	if err == nil {
		err = errors.New("the plugin ended its session")
	}
	if panicText := p.panicText(); panicText != "" {
		err = fmt.Errorf("plugin %s crashed: %s", p.name, panicText)
	}
	return err
}

// panicText returns the panic the plugin process printed before it died,
// if it did: go-plugin logs a plugin's raw stderr only at debug level.
func (p *plugin) panicText() string {
	p.mu.Lock()
	tail := p.stderr
	p.mu.Unlock()
	if tail == nil {
		return ""
	}
	// Give the last lines of a dying process a moment to arrive.
	time.Sleep(50 * time.Millisecond)
	return tail.panic()
}

// stderrTail keeps the last lines of a plugin's raw stderr.
type stderrTail struct {
	mu    sync.Mutex
	lines []string
}

const stderrTailLines = 40

func (t *stderrTail) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.lines = append(t.lines, strings.Split(strings.TrimRight(string(b), "\n"), "\n")...)
	if over := len(t.lines) - stderrTailLines; over > 0 {
		t.lines = append(t.lines[:0], t.lines[over:]...)
	}
	return len(b), nil
}

// panic returns the last "panic:" line and the few lines after it.
func (t *stderrTail) panic() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := len(t.lines) - 1; i >= 0; i-- {
		if strings.HasPrefix(t.lines[i], "panic: ") {
			return strings.Join(t.lines[i:min(len(t.lines), i+6)], "\n")
		}
	}
	return ""
}

// launchProcess starts the plugin binary and returns its client and a
// function that kills it.
func (p *plugin) launchProcess(_ context.Context, _ string) (*sdk.Client, func(), error) {
	tail := &stderrTail{}
	p.mu.Lock()
	p.stderr = tail
	p.mu.Unlock()
	sum, err := p.checkBinary()
	if err != nil {
		return nil, nil, err
	}
	cmd := exec.Command(p.path)
	setProcAttr(cmd)
	client := goplugin.NewClient(&goplugin.ClientConfig{
		HandshakeConfig:  sdk.Handshake,
		VersionedPlugins: protocolVersions(),
		Cmd:              cmd,
		SecureConfig:     &goplugin.SecureConfig{Checksum: sum, Hash: sha256.New()},
		AllowedProtocols: []goplugin.Protocol{goplugin.ProtocolGRPC},
		AutoMTLS:         true,
		Logger:           p.log,
		StartTimeout:     p.n.opts.PluginStartTimeout,
		GRPCDialOptions: []grpc.DialOption{grpc.WithDefaultCallOptions(
			grpc.MaxCallRecvMsgSize(sdk.MaxMessageSize), grpc.MaxCallSendMsgSize(sdk.MaxMessageSize))},
		SyncStdout: logWriter{p.log.Named("stdout")},
		SyncStderr: logWriter{p.log.Named("stderr")},
		Stderr:     tail,
	})
	rpc, err := client.Client()
	if err != nil {
		client.Kill()
		return nil, nil, launchError(p.name, err)
	}
	raw, err := rpc.Dispense(sdk.PluginKey)
	if err != nil {
		client.Kill()
		return nil, nil, permanent("plugin %s: %v", p.name, err)
	}
	p.mu.Lock()
	p.protocol = client.NegotiatedVersion()
	p.mu.Unlock()
	return raw.(*sdk.Client), client.Kill, nil
}

// protocolVersions are the plugin protocol versions the host serves, from
// sdk.MinProtocolVersion to sdk.ProtocolVersion: they share one schema, so
// one plugin set serves them all; a version 1 plugin simply never declares
// routes or private fields.
func protocolVersions() map[int]goplugin.PluginSet {
	out := map[int]goplugin.PluginSet{}
	for v := sdk.MinProtocolVersion; v <= sdk.ProtocolVersion; v++ {
		out[v] = goplugin.PluginSet{sdk.PluginKey: &sdk.GRPCPlugin{}}
	}
	return out
}

// drain asks the running jobs to stop within grace and hands back those
// that do not; the node calls it on shutdown.
func (p *plugin) drain(grace time.Duration) {
	p.mu.Lock()
	s := p.session
	p.mu.Unlock()
	if s != nil {
		s.drain(grace)
	}
}

// checkBinary finds the plugin binary and returns its SHA-256, checked
// against the pin if there is one.
func (p *plugin) checkBinary() ([]byte, error) {
	f, err := os.Open(p.path)
	if err != nil {
		return nil, permanent("plugin %s: binary %s: %v", p.name, p.path, errors.Unwrap(err))
	}
	defer f.Close()
	h := sha256.New()
	if _, err := f.WriteTo(h); err != nil {
		return nil, permanent("plugin %s: read %s: %v", p.name, p.path, err)
	}
	sum := h.Sum(nil)
	if pin := strings.ToLower(p.cfg.SHA256); pin != "" && pin != hex.EncodeToString(sum) {
		return nil, permanent("%s: plugins.%s.sha256 does not match %s: pinned %s, the binary is %x",
			p.n.cfg.Path(), p.name, p.path, pin, sum)
	}
	return sum, nil
}

// checkDescription refuses a plugin whose description does not fit the
// configuration or another plugin.
func (p *plugin) checkDescription(d *pluginv1.DescribeResponse) error {
	if d.Name != p.name {
		return permanent("plugin %s: the binary says its name is %q", p.name, d.Name)
	}
	if len(d.Types) == 0 {
		return permanent("plugin %s declares no job types", p.name)
	}
	for _, t := range d.Types {
		if t.Name == "" || len(t.Name) > jobs.MaxTypeSize {
			return permanent("plugin %s declares a job type with a bad name %q", p.name, t.Name)
		}
		if t.ActivityTimeoutMs < 10 {
			return permanent("plugin %s: job type %s: activity timeout of %dms is under 10ms", p.name, t.Name, t.ActivityTimeoutMs)
		}
		if other := p.n.typeOwner(t.Name, p); other != "" {
			return permanent("plugin %s: job type %s is also declared by plugin %s", p.name, t.Name, other)
		}
	}
	return nil
}

// launchError explains go-plugin's launch failures. Most of them (a wrong
// handshake, a binary that writes to stdout, one that never answers) will
// not go away by relaunching.
func launchError(name string, err error) error {
	msg := err.Error()
	lower := strings.ToLower(msg)
	switch {
	case strings.Contains(lower, "incompatible api version"), strings.Contains(lower, "incompatible core api version"):
		return permanent("plugin %s speaks another plugin protocol version (this host speaks %d to %d): %v", name, sdk.MinProtocolVersion, sdk.ProtocolVersion, err)
	case strings.Contains(msg, "Failed to read any lines from plugin's stdout"):
		return permanent("plugin %s exited at launch before its handshake (a wrong magic cookie, not a couchjobs plugin, or a crash at start; see its stderr above): %v", name, err)
	case strings.Contains(msg, "Unrecognized remote plugin message"):
		return permanent("plugin %s wrote something else than the go-plugin handshake to stdout (is it a couchjobs plugin, and does it print before sdk.Serve?): %v", name, err)
	case strings.Contains(msg, "timeout while waiting for plugin to start"):
		return permanent("plugin %s did not complete its handshake in time (it hangs before sdk.Serve): %v", name, err)
	case errors.Is(err, goplugin.ErrChecksumsDoNotMatch):
		return permanent("plugin %s changed on disk while it was launched: %v", name, err)
	case strings.Contains(msg, "exited before we could connect"):
		return permanent("plugin %s exited at launch before its handshake (a wrong magic cookie, not a couchjobs plugin, or a crash at start): %v", name, err)
	}
	return fmt.Errorf("plugin %s: launch: %w", name, err)
}

// logWriter turns a plugin's raw output lines into log lines.
type logWriter struct{ log hclog.Logger }

func (w logWriter) Write(b []byte) (int, error) {
	for _, line := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		if line != "" {
			w.log.Info(line)
		}
	}
	return len(b), nil
}
