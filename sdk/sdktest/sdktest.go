// Package sdktest runs a plugin's workers in a plugin author's own tests:
// in the test's process, against a real embedded store in a temporary
// directory, through the real host dispatch and plugin protocol (over an
// in-process connection instead of a child process).
//
//	func TestResize(t *testing.T) {
//		h := sdktest.New(t, myPlugin(), map[string]any{"quality": 80})
//		res := h.Run("thumbnail", "img-1", map[string]any{"url": "..."})
//		if res.Outcome != sdktest.Completed { t.Fatal(res.Reason) }
//	}
package sdktest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"
	"golang.org/x/crypto/bcrypt"

	"github.com/couchjobs/couchjobs/host"
	"github.com/couchjobs/couchjobs/host/config"
	"github.com/couchjobs/couchjobs/runtime/jobs"
	"github.com/couchjobs/couchjobs/runtime/kv"
	"github.com/couchjobs/couchjobs/runtime/tuple"
	"github.com/couchjobs/couchjobs/sdk"
)

// Outcomes of a run.
const (
	Completed   = "completed"
	Failed      = "failed"
	Crashed     = "crashed"
	Resubmitted = "resubmitted"
)

// Harness runs one plugin on a private node.
type Harness struct {
	t    testing.TB
	p    *sdk.Plugin
	node *host.Node
}

// New starts a node with plugin p and its configuration table (nil: none),
// and stops it when the test ends. A configuration the plugin refuses
// fails the test with the plugin's errors.
func New(t testing.TB, p *sdk.Plugin, cfg map[string]any) *Harness {
	t.Helper()
	return NewWith(t, p, cfg, Options{})
}

// Options shape the node of NewWith.
type Options struct {
	// Node and Groups are the node's name (default "sdktest") and groups.
	Node   string
	Groups []string
	// Store is the path of the store file; default a new one. Nodes given
	// the same path share a store, as a cluster does.
	Store string
	// MaxJobs caps the plugin's running jobs on the node; 0: no cap.
	MaxJobs int
	// Admins are the node API's admins: name to password.
	Admins map[string]string
}

// NewWith is New with options: several harnesses over one store are the
// nodes of a cluster, each running its own instance of the plugin.
func NewWith(t testing.TB, p *sdk.Plugin, cfg map[string]any, o Options) *Harness {
	t.Helper()
	if err := p.Validate(); err != nil {
		t.Fatalf("plugin %s: %v", p.Name, err)
	}
	dir := t.TempDir()
	if o.Node == "" {
		o.Node = "sdktest"
	}
	if o.Store == "" {
		o.Store = filepath.Join(dir, "store.db")
	}
	text := fmt.Sprintf("plugin_dir = %q\n[node]\nname = %q\n[store]\npath = %q\n[http]\nlisten = \"off\"\n[scheduler]\nmin_backoff = \"10ms\"\nmax_backoff = \"100ms\"\n[plugins.%s]\n",
		dir, o.Node, o.Store, p.Name)
	c, err := config.Parse(filepath.Join(dir, "runtime.toml"), []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	c.Node.Groups = o.Groups
	for name, pass := range o.Admins {
		hash, err := bcrypt.GenerateFromPassword([]byte(pass), bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		if c.HTTP.Admins == nil {
			c.HTTP.Admins = map[string]string{}
		}
		c.HTTP.Admins[name] = string(hash)
	}
	c.Plugins[p.Name].Config = cfg
	c.Plugins[p.Name].MaxJobs = o.MaxJobs
	log := hclog.New(&hclog.LoggerOptions{Name: "sdktest", Level: hclog.Warn, Output: testWriter{t}})
	if p.Logger == nil {
		p.Logger = log.Named(p.Name)
	}
	n, err := host.NewNode(c, log, host.Options{Launch: func(context.Context, string) (*sdk.Client, func(), error) {
		gc, _ := goplugin.TestPluginGRPCConn(t, false, map[string]goplugin.Plugin{sdk.PluginKey: &sdk.GRPCPlugin{Impl: p}})
		raw, err := gc.Dispense(sdk.PluginKey)
		if err != nil {
			return nil, nil, err
		}
		return raw.(*sdk.Client), func() { gc.Close() }, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { n.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
	defer rcancel()
	if err := n.Ready(rctx); err != nil {
		t.Fatal(err)
	}
	return &Harness{t: t, p: p, node: n}
}

// Result is how one run of a job ended.
type Result struct {
	// Outcome is Completed, Failed, Crashed or Resubmitted.
	Outcome string
	// Reason explains Failed and Crashed.
	Reason string
	// Data is the job's data after the run, without the host's own
	// "_couchjobs" field.
	Data json.RawMessage
}

// Decode unmarshals the run's data into v.
func (r Result) Decode(v any) error { return json.Unmarshal(r.Data, v) }

// Run adds a job and waits, up to a minute, for the end of its first run
// after this add.
func (h *Harness) Run(typ, id string, data any) Result {
	h.t.Helper()
	added := h.add(typ, id, data)
	return h.wait(typ, id, func(ev jobs.Event, ran bool) bool {
		// Any change after the add that leaves the job pending or
		// finished is the end of a run: the add itself left it pending.
		return ev.State == jobs.Finished || (ev.State == jobs.Pending && versionAfter(ev.Info.Version, added))
	})
}

// Add adds a job (or re-adds it) without waiting. Like the host's API, it
// passes the job through the type's Admit hook first.
func (h *Harness) Add(typ, id string, data any) {
	h.t.Helper()
	h.add(typ, id, data)
}

// TryAdd is Add returning the error, such as the Admit hook's refusal
// (jobs.ErrInvalid), instead of failing the test.
func (h *Harness) TryAdd(typ, id string, data any) error {
	h.t.Helper()
	_, err := h.tryAdd(typ, id, data)
	return err
}

// add adds a job and returns the versionstamp its record got.
func (h *Harness) add(typ, id string, data any) tuple.Versionstamp {
	h.t.Helper()
	vs, err := h.tryAdd(typ, id, data)
	if err != nil {
		h.t.Fatal(err)
	}
	return vs
}

func (h *Harness) tryAdd(typ, id string, data any) (tuple.Versionstamp, error) {
	n := jobs.NewJob{Type: typ, ID: id}
	if data != nil {
		b, err := json.Marshal(data)
		if err != nil {
			return tuple.Versionstamp{}, fmt.Errorf("job data: %w", err)
		}
		n.Data = b
	}
	if err := h.node.Admit(context.Background(), &n); err != nil {
		return tuple.Versionstamp{}, err
	}
	var vs kv.VersionstampFuture
	if _, err := h.node.Store().Transact(context.Background(), func(tx kv.Tx) (any, error) {
		vs = tx.Versionstamp()
		return nil, h.node.Jobs().AddTx(tx, n)
	}); err != nil {
		return tuple.Versionstamp{}, fmt.Errorf("add %s/%s: %w", typ, id, err)
	}
	v, err := vs.Get()
	if err != nil {
		return tuple.Versionstamp{}, err
	}
	return tuple.Versionstamp{TransactionVersion: v}, nil
}

func versionAfter(a, b tuple.Versionstamp) bool {
	return bytes.Compare(a.Bytes(), b.Bytes()) > 0
}

// Wait waits, up to a minute, for the job's current run, or its next one,
// to end. (A run that ended before Wait was called is not seen: use Run.)
func (h *Harness) Wait(typ, id string) Result {
	h.t.Helper()
	return h.wait(typ, id, func(ev jobs.Event, ran bool) bool {
		return ev.State == jobs.Finished || (ran && ev.State == jobs.Pending)
	})
}

func (h *Harness) wait(typ, id string, ended func(ev jobs.Event, ran bool) bool) Result {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sub, err := h.node.Jobs().Subscribe(ctx, typ, id)
	if err != nil {
		h.t.Fatal(err)
	}
	defer sub.Close()
	ran := false
	for ev := sub.Latest(); ; {
		if ev.State == jobs.NotFound {
			h.t.Fatalf("job %s/%s was removed", typ, id)
		}
		if ev.State == jobs.Running {
			ran = true
		}
		if ended(ev, ran) {
			return result(ev.Info)
		}
		if ev, err = sub.Next(ctx); err != nil {
			h.t.Fatalf("job %s/%s did not end its run within a minute (%s)", typ, id, sub.Latest().State)
		}
	}
}

func result(in jobs.Info) Result {
	var obj map[string]json.RawMessage
	json.Unmarshal(in.Data, &obj)
	var meta struct {
		Outcome string `json:"outcome"`
		Reason  string `json:"reason"`
	}
	json.Unmarshal(obj["_couchjobs"], &meta)
	delete(obj, "_couchjobs")
	data, _ := json.Marshal(obj)
	r := Result{Outcome: meta.Outcome, Reason: meta.Reason, Data: data}
	if in.State == jobs.Pending && r.Outcome != Crashed {
		r.Outcome = Resubmitted
	}
	return r
}

// Get reads a key of the plugin's own subspace, as its writes left it; nil
// if absent.
func (h *Harness) Get(key []byte) []byte {
	h.t.Helper()
	prefix := kv.Sub("plugins", h.p.Name).Bytes()
	v, err := h.node.Store().ReadTransact(context.Background(), func(tx kv.ReadTx) (any, error) {
		return tx.Get(append(append([]byte(nil), prefix...), key...))
	})
	if err != nil {
		h.t.Fatal(err)
	}
	return v.([]byte)
}

// Jobs gives the test the node's job layer, to inspect or arrange jobs.
func (h *Harness) Jobs() *jobs.Jobs { return h.node.Jobs() }

// Handler is the node's HTTP API, the plugin's routes included, for
// tests with net/http/httptest.
func (h *Harness) Handler() http.Handler { return h.node.Handler() }

// testWriter sends the node's warnings to the test log.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}
