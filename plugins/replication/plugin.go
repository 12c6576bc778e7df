package replication

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/couchjobs/couchjobs/plugins/internal/couch"
	"github.com/couchjobs/couchjobs/sdk"
)

// Job types.
const (
	// TypeReplication: one replication, persistent or transient.
	TypeReplication = "replication"
	// TypeWatcher: follows one _replicator database of a server.
	TypeWatcher = "replicator-db"
	// TypeManager: the one job that finds _replicator databases (adding
	// and removing their watchers) and removes transient replications
	// kept past transient_ttl.
	TypeManager = "replication-manager"
)

// managerID is the manager job's id.
const managerID = "manager"

// Version is the plugin's version.
const Version = "1.0.0"

// Config is the [plugins.replication.config] table.
type Config struct {
	// Servers are the CouchDB servers whose _replicator databases hold
	// persistent replications; admin credentials.
	Servers []couch.ServerConfig `json:"servers"`
	// TransientTTL is how long a transient replication's job is kept
	// after it ends, so that its result can be read; default "24h".
	TransientTTL string `json:"transient_ttl"`
	// ScanInterval is how often the manager looks for _replicator
	// databases and expired transient jobs; default "1m".
	ScanInterval string `json:"scan_interval"`
	// CreateReplicatorDB creates a server's _replicator database if it is
	// missing, as CouchDB does at start; default true.
	CreateReplicatorDB *bool `json:"create_replicator_db"`

	ttl, scan time.Duration
	clients   map[string]*couch.Client
}

func configure(c *sdk.Config) (*Config, error) {
	cfg := &Config{}
	if err := c.Decode(cfg); err != nil {
		return nil, err
	}
	var errs sdk.ConfigErrors
	var err error
	if cfg.ttl, err = sdk.ParseDuration(cfg.TransientTTL, 24*time.Hour); err != nil {
		errs = append(errs, sdk.ConfigError{Key: "transient_ttl", Message: err.Error()})
	}
	if cfg.scan, err = sdk.ParseDuration(cfg.ScanInterval, time.Minute); err != nil {
		errs = append(errs, sdk.ConfigError{Key: "scan_interval", Message: err.Error()})
	}
	if cfg.CreateReplicatorDB == nil {
		yes := true
		cfg.CreateReplicatorDB = &yes
	}
	var problems []couch.ConfigProblem
	cfg.clients, problems = couch.Connect(cfg.Servers, couch.Options{Retries: 2})
	for _, p := range problems {
		errs = append(errs, sdk.ConfigError{Key: p.Key, Message: p.Message})
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return cfg, nil
}

// plugin holds what the job types and routes share.
type plugin struct {
	cfg  *Config
	log  hclog.Logger
	host *sdk.Host
	node string
}

// New returns the plugin, for sdk.Serve or sdktest.
func New() *sdk.Plugin {
	pl := &plugin{log: hclog.NewNullLogger()}
	p := &sdk.Plugin{
		Name:    "replication",
		Version: Version,
		Types: []sdk.Type{
			{
				Name: TypeReplication, ActivityTimeout: 30 * time.Second,
				// Replications checkpoint and resume, so every one may be
				// stopped to let others run, as CouchDB's scheduler does.
				Continuous:    true,
				Worker:        sdk.WorkerFunc(pl.replicate),
				Admit:         pl.admit,
				PrivateFields: []string{"secret"},
			},
			{Name: TypeWatcher, ActivityTimeout: 30 * time.Second, Continuous: true, Worker: sdk.WorkerFunc(pl.watch)},
			{Name: TypeManager, ActivityTimeout: 30 * time.Second, Continuous: true, Worker: sdk.WorkerFunc(pl.manage)},
		},
	}
	p.Routes = pl.routes()
	p.Configure = func(ctx context.Context, c *sdk.Config) error {
		cfg, err := configure(c)
		if err != nil {
			return err
		}
		pl.cfg, pl.host, pl.node = cfg, c.Host, c.Node
		if p.Logger != nil {
			pl.log = p.Logger
		}
		if c.Host == nil {
			return nil
		}
		// Every node makes sure the manager exists; the job layer lets
		// one add it.
		info, err := c.Host.GetJob(ctx, TypeManager, managerID)
		switch {
		case errors.Is(err, sdk.ErrNotFound):
			err = c.Host.AddJob(ctx, sdk.NewJob{Type: TypeManager, ID: managerID, Data: map[string]any{}, Exclusive: true})
			if errors.Is(err, sdk.ErrExists) {
				err = nil
			}
		case err == nil && info.State == "finished":
			err = c.Host.AddJob(ctx, sdk.NewJob{Type: TypeManager, ID: managerID})
		}
		return err
	}
	return p
}

// persistentID is the job id of a _replicator document: database names
// hold no ':' and server names neither.
func persistentID(server, db, docID string) string {
	return "doc:" + server + ":" + db + ":" + docID
}

// watcherID is a _replicator database's watcher job id.
func watcherID(server, db string) string { return server + ":" + db }

func splitWatcherID(id string) (server, db string, ok bool) { return strings.Cut(id, ":") }

// isReplicatorDB: named _replicator or ending in /_replicator.
func isReplicatorDB(name string) bool {
	return name == "_replicator" || strings.HasSuffix(name, "/_replicator")
}
