// Package config reads a node's runtime.toml.
//
// Decoding is strict: an unknown key or a value of the wrong type is an
// error that names the file, the key and, where the parser knows it, the
// line, so that a typo never silently falls back to a default.
package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
)

// Config is a node's configuration.
type Config struct {
	// Node names this node and the groups it belongs to, for placement.
	Node Node `toml:"node"`
	// Store selects and configures the store backend.
	Store Store `toml:"store"`
	// Log configures logging.
	Log Log `toml:"log"`
	// PluginDir holds the plugin binaries, couchjobs-<name>; relative to
	// the configuration file. Default "plugins".
	PluginDir string `toml:"plugin_dir"`
	// Plugins are the plugins this node loads, by name. Only plugins named
	// here are loaded.
	Plugins map[string]*Plugin `toml:"plugins"`
	// Scheduler holds the node's job limits.
	Scheduler Scheduler `toml:"scheduler"`
	// HTTP configures the node's API.
	HTTP HTTP `toml:"http"`

	// path is the file the configuration was read from; relative paths in
	// it are relative to its directory.
	path string
}

// Node identifies the node.
type Node struct {
	// Name is unique in the cluster; the host name if empty.
	Name string `toml:"name"`
	// Groups are the node groups this node belongs to.
	Groups []string `toml:"groups"`
}

// Store configures the store backend.
type Store struct {
	// Backend is "sqlite" (the embedded default) or "fdb".
	Backend string `toml:"backend"`
	// Path is the SQLite file, relative to the configuration file.
	Path string `toml:"path"`
	// Durability is the SQLite commit durability: normal, full or off.
	Durability string `toml:"durability"`
	// ClusterFile is the FoundationDB cluster file; empty means
	// FDB_CLUSTER_FILE, then the client's default.
	ClusterFile string `toml:"cluster_file"`
	// APIVersion is the FoundationDB API version; zero means the default.
	APIVersion int `toml:"api_version"`
}

// Plugin configures one plugin.
type Plugin struct {
	// Enabled loads the plugin; default true.
	Enabled *bool `toml:"enabled"`
	// SHA256, if set, pins the binary: a binary with another digest is
	// refused.
	SHA256 string `toml:"sha256"`
	// MaxJobs caps the plugin's running jobs on this node; 0 means the
	// node's limit.
	MaxJobs int `toml:"max_jobs"`
	// TypeMaxJobs caps the running jobs of some of the plugin's types on
	// this node, within MaxJobs: { type = N }.
	TypeMaxJobs map[string]int `toml:"type_max_jobs"`
	// ActivityTimeout, if set, replaces the activity timeout the plugin
	// declares for each of its types: how long a job whose node died waits
	// before another node takes it. Set it alike on every node.
	ActivityTimeout Duration `toml:"activity_timeout"`
	// Config is handed to the plugin, which validates it.
	Config map[string]any `toml:"config"`
}

// On reports whether the plugin is enabled.
func (p *Plugin) On() bool { return p.Enabled == nil || *p.Enabled }

// Scheduler holds the node's limits.
type Scheduler struct {
	// MaxJobs caps the running jobs on this node, all plugins together;
	// default 500 (CouchDB's max_jobs).
	MaxJobs int `toml:"max_jobs"`
	// MinBackoff and MaxBackoff bound the delay before a crashed job runs
	// again: MinBackoff × 2^(crashes-1), capped at MaxBackoff, ±25%.
	// Defaults 32s and 48h, CouchDB 4.x's.
	MinBackoff Duration `toml:"min_backoff"`
	MaxBackoff Duration `toml:"max_backoff"`
	// HealthThreshold: a run that lasts this long heals its job, whose
	// crash count starts again from zero; default 2m (CouchDB's).
	HealthThreshold Duration `toml:"health_threshold"`
	// ShutdownGrace is how long running jobs get to checkpoint and stop on
	// SIGTERM before they are handed back to the queue; default 10s.
	ShutdownGrace Duration `toml:"shutdown_grace"`
	// Interval is the fair-share accounting period: the node rolls its
	// groups' usage up and publishes it once per interval; default 15s
	// (CouchDB 4.x). Set it alike on every node.
	Interval Duration `toml:"interval"`
	// UsageCoeff decays a group's usage each interval; default 0.5.
	UsageCoeff float64 `toml:"usage_coeff"`
	// MaxChurn bounds the continuous jobs the node preempts per interval;
	// default 20 (CouchDB's); -1 turns preemption off.
	MaxChurn int `toml:"max_churn"`
	// MinRunTime: a continuous job runs at least this long before it can
	// be preempted; default 60s (CouchDB 4.x's).
	MinRunTime Duration `toml:"min_run_time"`
	// Shares seeds share groups' shares (1 to 1000; default 100) where
	// none was set at run time (couchjobs shares set).
	Shares map[string]int `toml:"shares"`
}

// HTTP configures the node's HTTP API.
type HTTP struct {
	// Listen is the API's address; default "127.0.0.1:5985". "off"
	// disables the API.
	Listen string `toml:"listen"`
	// Admins maps admin names to bcrypt hashes of their passwords
	// (couchjobs passwd makes one). Mutating endpoints need an admin.
	Admins map[string]string `toml:"admins"`
}

// DefaultListen is the API's default address.
const DefaultListen = "127.0.0.1:5985"

// Duration is a time.Duration written as a string, such as "30s".
type Duration struct{ time.Duration }

// UnmarshalText parses a duration string.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("duration %q: want a number with a unit, such as \"30s\" or \"5m\"", b)
	}
	if v < 0 {
		return fmt.Errorf("duration %q is negative", b)
	}
	d.Duration = v
	return nil
}

// MarshalText formats the duration.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

var sha256RE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// Log configures logging.
type Log struct {
	// Level is trace, debug, info, warn or error.
	Level string `toml:"level"`
	// JSON writes one JSON object per line instead of text.
	JSON bool `toml:"json"`
}

// Backends.
const (
	BackendSQLite = "sqlite"
	BackendFDB    = "fdb"
)

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// Load reads and validates the configuration file at path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	return Parse(path, data)
}

// Parse decodes and validates configuration text; path names it in errors
// and anchors relative paths.
func Parse(path string, data []byte) (*Config, error) {
	c := &Config{path: path}
	md, err := toml.Decode(string(data), c)
	if err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			return nil, fmt.Errorf("%s:%d: %s", path, pe.Position.Line, pe.Message)
		}
		return nil, fmt.Errorf("%s: %s", path, strings.TrimPrefix(err.Error(), "toml: "))
	}
	var unknown []string
	for _, k := range md.Undecoded() {
		// A plugin's config table is the plugin's to check; the decoder
		// reports arrays of tables inside it as undecoded.
		if len(k) > 3 && k[0] == "plugins" && k[2] == "config" {
			continue
		}
		unknown = append(unknown, k.String())
	}
	if len(unknown) > 0 {
		return nil, fmt.Errorf("%s: unknown key %s", path, strings.Join(unknown, ", "))
	}
	if err := c.validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

func (c *Config) validate() error {
	if c.Node.Name == "" {
		host, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("node.name is empty and the host name is unknown: %w", err)
		}
		c.Node.Name = host
	}
	if !nameRE.MatchString(c.Node.Name) {
		return fmt.Errorf("node.name %q: use 1 to 63 letters, digits, '.', '_' or '-', starting with a letter or digit", c.Node.Name)
	}
	for _, g := range c.Node.Groups {
		if !nameRE.MatchString(g) {
			return fmt.Errorf("node.groups: %q: use 1 to 63 letters, digits, '.', '_' or '-', starting with a letter or digit", g)
		}
	}
	switch c.Store.Backend {
	case "":
		c.Store.Backend = BackendSQLite
		fallthrough
	case BackendSQLite:
		if c.Store.Path == "" {
			return errors.New("store.path: the sqlite backend needs a file path")
		}
		switch c.Store.Durability {
		case "", "normal", "full", "off":
		default:
			return fmt.Errorf("store.durability %q: want normal, full or off", c.Store.Durability)
		}
	case BackendFDB:
	default:
		return fmt.Errorf("store.backend %q: want %q or %q", c.Store.Backend, BackendSQLite, BackendFDB)
	}
	if c.PluginDir == "" {
		c.PluginDir = "plugins"
	}
	for name, p := range c.Plugins {
		if !nameRE.MatchString(name) {
			return fmt.Errorf("plugins.%s: a plugin name is 1 to 63 letters, digits, '.', '_' or '-'", name)
		}
		if p.SHA256 != "" && !sha256RE.MatchString(strings.ToLower(p.SHA256)) {
			return fmt.Errorf("plugins.%s.sha256: want 64 hexadecimal digits", name)
		}
		if p.MaxJobs < 0 {
			return fmt.Errorf("plugins.%s.max_jobs: %d is negative", name, p.MaxJobs)
		}
		for typ, n := range p.TypeMaxJobs {
			if n < 1 {
				return fmt.Errorf("plugins.%s.type_max_jobs.%s: %d: want at least 1 (disable the plugin to run none)", name, typ, n)
			}
		}
		if d := p.ActivityTimeout.Duration; d != 0 && d < 100*time.Millisecond {
			return fmt.Errorf("plugins.%s.activity_timeout: %v is under 100ms", name, d)
		}
	}
	if c.Scheduler.MaxJobs < 0 {
		return fmt.Errorf("scheduler.max_jobs: %d is negative", c.Scheduler.MaxJobs)
	}
	if c.Scheduler.MaxJobs == 0 {
		c.Scheduler.MaxJobs = 500
	}
	if c.Scheduler.MinBackoff.Duration == 0 {
		c.Scheduler.MinBackoff.Duration = 32 * time.Second
	}
	if c.Scheduler.MaxBackoff.Duration == 0 {
		c.Scheduler.MaxBackoff.Duration = 48 * time.Hour
	}
	if c.Scheduler.HealthThreshold.Duration == 0 {
		c.Scheduler.HealthThreshold.Duration = 2 * time.Minute
	}
	if c.Scheduler.MaxBackoff.Duration < c.Scheduler.MinBackoff.Duration {
		return fmt.Errorf("scheduler.max_backoff %v is below scheduler.min_backoff %v", c.Scheduler.MaxBackoff, c.Scheduler.MinBackoff)
	}
	if c.Scheduler.ShutdownGrace.Duration == 0 {
		c.Scheduler.ShutdownGrace.Duration = 10 * time.Second
	}
	if c.Scheduler.Interval.Duration == 0 {
		c.Scheduler.Interval.Duration = 15 * time.Second
	}
	if c.Scheduler.Interval.Duration < 10*time.Millisecond {
		return fmt.Errorf("scheduler.interval: %v is under 10ms", c.Scheduler.Interval)
	}
	if c.Scheduler.UsageCoeff == 0 {
		c.Scheduler.UsageCoeff = 0.5
	}
	if u := c.Scheduler.UsageCoeff; u < 0 || u >= 1 {
		return fmt.Errorf("scheduler.usage_coeff: %g is outside [0, 1)", u)
	}
	switch {
	case c.Scheduler.MaxChurn == 0:
		c.Scheduler.MaxChurn = 20
	case c.Scheduler.MaxChurn < -1:
		return fmt.Errorf("scheduler.max_churn: %d: want a count, or -1 to never preempt", c.Scheduler.MaxChurn)
	}
	if c.Scheduler.MinRunTime.Duration == 0 {
		c.Scheduler.MinRunTime.Duration = time.Minute
	}
	for g, v := range c.Scheduler.Shares {
		if g == "" {
			return fmt.Errorf("scheduler.shares: a group name is empty")
		}
		if v < 1 || v > 1000 {
			return fmt.Errorf("scheduler.shares.%s: %d is outside 1..1000", g, v)
		}
	}
	if c.HTTP.Listen == "" {
		c.HTTP.Listen = DefaultListen
	}
	for name, hash := range c.HTTP.Admins {
		if name == "" || strings.ContainsAny(name, ":") {
			return fmt.Errorf("http.admins: admin name %q is empty or has a colon", name)
		}
		if !strings.HasPrefix(hash, "$2a$") && !strings.HasPrefix(hash, "$2b$") && !strings.HasPrefix(hash, "$2y$") {
			return fmt.Errorf("http.admins.%s: want a bcrypt hash (make one with `couchjobs passwd`), not a plain password", name)
		}
	}
	switch strings.ToLower(c.Log.Level) {
	case "":
		c.Log.Level = "info"
	case "trace", "debug", "info", "warn", "error":
	default:
		return fmt.Errorf("log.level %q: want trace, debug, info, warn or error", c.Log.Level)
	}
	return nil
}

// Path returns the file the configuration came from.
func (c *Config) Path() string { return c.path }

// Resolve makes a path from the configuration absolute, relative to the
// configuration file's directory.
func (c *Config) Resolve(p string) string {
	if p == "" || filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(filepath.Dir(c.path), p)
}
