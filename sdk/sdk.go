// Package sdk is what a couchjobs job-type plugin imports. A plugin is a
// program that describes its job types and calls Serve; the couchjobs host
// launches it (as couchjobs-<name> in its plugin directory), hands it jobs,
// and stores what it reports. A plugin never touches the store itself.
//
//	func main() {
//		sdk.Serve(&sdk.Plugin{
//			Name:    "thumbnail",
//			Version: "1.0.0",
//			Types: []sdk.Type{{
//				Name:            "thumbnail",
//				ActivityTimeout: time.Minute,
//				Worker:          sdk.WorkerFunc(resize),
//			}},
//		})
//	}
//
//	func resize(ctx context.Context, job *sdk.Job) error {
//		var in struct{ URL string }
//		if err := job.Decode(&in); err != nil {
//			return sdk.Fail(err) // bad data: a terminal failure
//		}
//		...
//		job.SetResult(map[string]any{"url": in.URL, "done": true})
//		return nil
//	}
//
// A worker's return value is the run's outcome: nil completes the job
// (with the data set by SetResult or the last Update), Fail ends it as a
// terminal failure, Resubmit asks for another run later, and any other
// error, or a panic, is a crash that the host retries with backoff.
//
// The protocol is in sdk/proto (couchjobs.plugin.v1); other languages can
// implement it with go-plugin's handshake.
package sdk

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"
)

// ProtocolVersion is the plugin protocol version this SDK speaks. It is
// negotiated in go-plugin's handshake; see the package proto. Version 2
// adds plugin routes (Plugin.Routes, the ServeHTTP call), private job-data
// fields and the host's ListJobs to version 1; both share the
// couchjobs.plugin.v1 schema.
const ProtocolVersion = 2

// MinProtocolVersion is the oldest protocol version hosts built with this
// SDK still serve: a version 1 plugin runs unchanged.
const MinProtocolVersion = 1

// Handshake is the go-plugin handshake of couchjobs plugins. The magic
// cookie only keeps a plugin binary from being run by hand by mistake; it
// is not a security measure.
var Handshake = goplugin.HandshakeConfig{
	MagicCookieKey:   "COUCHJOBS_PLUGIN",
	MagicCookieValue: "6c1d2a0e-couchjobs-plugin",
}

// PluginKey is the name of the plugin in go-plugin's plugin sets.
const PluginKey = "jobs"

// MaxMessageSize bounds one gRPC message between host and plugin: larger
// than gRPC's 4 MiB default, so that a batch of jobs with large data fits.
const MaxMessageSize = 64 << 20

// Plugin describes a plugin.
type Plugin struct {
	// Name is the plugin's name; the host runs it as couchjobs-<Name> and
	// it must match its [plugins.<Name>] table in runtime.toml.
	Name string
	// Version is the plugin's own version, for display.
	Version string
	// Types are the job types the plugin runs.
	Types []Type
	// Configure receives the plugin's [plugins.<Name>.config] table, as
	// JSON, before any job starts. Return ConfigErrors (or any error) to
	// refuse it; the host shows them at start, naming the key.
	Configure func(ctx context.Context, c *Config) error
	// Routes are endpoints of the host's HTTP API the plugin serves.
	Routes []Route
	// Logger is where the plugin logs; by default hclog writing to stderr,
	// which the host collects under the plugin's name.
	Logger hclog.Logger
}

// Type describes one job type.
type Type struct {
	// Name is the job type, unique across the cluster's plugins.
	Name string
	// ActivityTimeout is how long a running job may go without an update
	// before the cluster gives it to another node. The SDK sends heartbeats
	// at a third of it. Default one minute.
	ActivityTimeout time.Duration
	// Continuous jobs run until stopped and may be preempted; one-shot
	// jobs run to completion.
	Continuous bool
	// ConfigSchema is a JSON Schema of the plugin's configuration, for
	// display.
	ConfigSchema string
	// Worker runs the type's jobs.
	Worker Worker
	// Admit, if set, checks every new job of the type before the host
	// stores it: an error refuses the job (the submitter sees it, and
	// nothing is stored). It may normalize the data and choose where the
	// first run goes. Jobs added to the store directly, not through a
	// host, skip it; a worker must still check what it runs.
	Admit func(ctx context.Context, a *Admission) error
	// PrivateFields are top-level keys of the type's job data that the
	// host's API shows only to its admins: credentials a job needs to run
	// belong there.
	PrivateFields []string
}

// Worker runs jobs. Run is called once per run, possibly for many jobs at
// once. Its context is canceled when the host stops the job (preemption,
// cancellation, shutdown) or the node lost the job; Stopped says which.
type Worker interface {
	Run(ctx context.Context, job *Job) error
}

// WorkerFunc adapts a function to Worker.
type WorkerFunc func(ctx context.Context, job *Job) error

// Run calls f.
func (f WorkerFunc) Run(ctx context.Context, job *Job) error { return f(ctx, job) }

// Config is the plugin's configuration table and what the plugin may ask of
// the host.
type Config struct {
	// JSON is the [plugins.<name>.config] table as a JSON object ("{}" if
	// absent).
	JSON json.RawMessage
	// Node is the name of the node the plugin runs on, and Groups its
	// node groups.
	Node   string
	Groups []string
	// Host reaches the host's services (jobs of the plugin's types, its
	// subspace).
	Host *Host
}

// Decode unmarshals the configuration table into v, strictly: a key v has
// no field for is an error naming it, so a misspelt option does not pass
// unnoticed.
func (c *Config) Decode(v any) error {
	dec := json.NewDecoder(bytes.NewReader(c.JSON))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return ConfigErrors{{Key: "", Message: err.Error()}}
	}
	return nil
}

// ParseDuration reads a duration option of a plugin's configuration
// ("30s", "1h30m"): empty is def, and anything but a positive duration
// is an error saying what is wanted, for a ConfigError.
func ParseDuration(s string, def time.Duration) (time.Duration, error) {
	if s == "" {
		return def, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%q: want a positive duration such as \"30s\"", s)
	}
	return d, nil
}

// ConfigError is one problem with the configuration, at a dotted key.
type ConfigError struct {
	Key     string
	Message string
}

// ConfigErrors are problems with the configuration; Configure returns them.
type ConfigErrors []ConfigError

func (e ConfigErrors) Error() string {
	msg := ""
	for i, c := range e {
		if i > 0 {
			msg += "; "
		}
		if c.Key != "" {
			msg += c.Key + ": "
		}
		msg += c.Message
	}
	return msg
}

// Outcomes other than completion, returned by a worker.

// failure is a terminal failure.
type failure struct{ err error }

func (f *failure) Error() string { return f.err.Error() }
func (f *failure) Unwrap() error { return f.err }

// Fail marks err as a terminal failure: the job is finished as failed and
// not retried.
func Fail(err error) error {
	if err == nil {
		err = errors.New("failed")
	}
	return &failure{err: err}
}

// Failf is Fail with a formatted message.
func Failf(format string, args ...any) error { return Fail(fmt.Errorf(format, args...)) }

// resubmit asks for another run.
type resubmit struct {
	at        time.Time
	placement Placement
}

func (r *resubmit) Error() string { return fmt.Sprintf("resubmit at %s", r.at.Format(time.RFC3339)) }

// Resubmit ends the run and asks for another one at time at (the zero time:
// at once): for a job that waits for something, or checkpoints and yields.
func Resubmit(at time.Time) error { return &resubmit{at: at} }

// StopReason says why the host stopped a run.
type StopReason string

// Why a run's context was canceled.
const (
	// StopPreempt: the scheduler lets other jobs run; checkpoint and return
	// (the run is resubmitted).
	StopPreempt StopReason = "preempt"
	// StopCancel: the job was canceled.
	StopCancel StopReason = "cancel"
	// StopShutdown: the node is shutting down; checkpoint and return (the
	// run is resubmitted, and another node takes it at once).
	StopShutdown StopReason = "shutdown"
	// StopLost: the node no longer holds the job (another node runs it, or
	// it was removed); stop without writing.
	StopLost StopReason = "lost"
)

// ErrStopped is the cause of a run's context when the host stopped it.
var ErrStopped = errors.New("sdk: run stopped by the host")

// ErrConflict: an update was refused because this node no longer holds
// the job. The run must stop.
var ErrConflict = errors.New("sdk: the node no longer holds the job")

// ErrCanceled: the job was canceled or removed. The run must stop.
var ErrCanceled = errors.New("sdk: the job was canceled or removed")
