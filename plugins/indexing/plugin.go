package indexing

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/couchjobs/couchjobs/plugins/indexing/js"
	"github.com/couchjobs/couchjobs/plugins/internal/couch"
	"github.com/couchjobs/couchjobs/sdk"
)

// Job types.
const (
	// TypeWatcher follows one database's design documents.
	TypeWatcher = "view-watcher"
	// TypeIndex builds one index: (server, database, signature).
	TypeIndex = "view-index"
	// TypeCleanup deletes an index no design document uses any more.
	TypeCleanup = "view-cleanup"
)

// Version is the plugin's version.
const Version = "1.0.0"

// Database is a database whose views couchjobs builds and serves.
type Database struct {
	// Server names an entry of servers.
	Server string `json:"server"`
	// DB is the database's name on the server.
	DB string `json:"db"`
	// Name is the name queries use (/{name}/_design/...); default DB.
	Name string `json:"name"`
}

// Config is the [plugins.indexing.config] table.
type Config struct {
	// Servers are the CouchDB servers holding the databases; credentials
	// that can read them.
	Servers []couch.ServerConfig `json:"servers"`
	// Databases are the databases to index.
	Databases []Database `json:"databases"`
	// A batch of changes closes at BatchDocs documents, BatchBytes bytes
	// of documents or BatchTime, whichever comes first; its rows commit
	// in one store transaction. Defaults 1000, 4 MiB, "2s".
	BatchDocs  int    `json:"batch_docs"`
	BatchBytes int    `json:"batch_bytes"`
	BatchTime  string `json:"batch_time"`
	// MapTimeout stops a map or reduce call (default "5s", CouchDB's
	// os_process_timeout); MaxEmitBytes bounds what one map call emits
	// (default 1 MiB); MaxMapMemory bounds how much a map or reduce call
	// may grow the plugin's heap (default 256 MiB). Each stops the index
	// with an error.
	MapTimeout   string `json:"map_timeout"`
	MaxEmitBytes int    `json:"max_emit_bytes"`
	MaxMapMemory int    `json:"max_map_memory"`
	// QueryTimeout bounds a query, its wait for the index included
	// (default "60s"). An index no design document uses is deleted
	// QueryTimeout after, when no query can still read it.
	QueryTimeout string `json:"query_timeout"`

	batchBytes int
	batchTime  time.Duration
	query      time.Duration
	limits     js.Limits
	clients    map[string]*couch.Client
	byName     map[string]Database
}

var dbName = regexp.MustCompile(`^[a-z][a-z0-9_$()+/-]*$`)

func configure(c *sdk.Config) (*Config, error) {
	cfg := &Config{}
	if err := c.Decode(cfg); err != nil {
		return nil, err
	}
	var errs sdk.ConfigErrors
	bad := func(key, format string, args ...any) {
		errs = append(errs, sdk.ConfigError{Key: key, Message: fmt.Sprintf(format, args...)})
	}
	var err error
	if cfg.batchTime, err = sdk.ParseDuration(cfg.BatchTime, 2*time.Second); err != nil {
		bad("batch_time", "%v", err)
	}
	if cfg.query, err = sdk.ParseDuration(cfg.QueryTimeout, time.Minute); err != nil {
		bad("query_timeout", "%v", err)
	}
	if cfg.limits.Timeout, err = sdk.ParseDuration(cfg.MapTimeout, 5*time.Second); err != nil {
		bad("map_timeout", "%v", err)
	}
	positive := func(key string, v *int, def int) {
		switch {
		case *v == 0:
			*v = def
		case *v < 0:
			bad(key, "%d: want a positive number", *v)
		}
	}
	positive("batch_docs", &cfg.BatchDocs, 1000)
	positive("batch_bytes", &cfg.BatchBytes, 4<<20)
	positive("max_emit_bytes", &cfg.MaxEmitBytes, 1<<20)
	positive("max_map_memory", &cfg.MaxMapMemory, 256<<20)
	cfg.batchBytes, cfg.limits.MaxEmitBytes, cfg.limits.MaxMemory = cfg.BatchBytes, cfg.MaxEmitBytes, int64(cfg.MaxMapMemory)
	var problems []couch.ConfigProblem
	cfg.clients, problems = couch.Connect(cfg.Servers, couch.Options{Retries: 2})
	for _, p := range problems {
		bad(p.Key, "%s", p.Message)
	}
	cfg.byName = map[string]Database{}
	for i, d := range cfg.Databases {
		key := fmt.Sprintf("databases.%d", i)
		if d.Name == "" {
			d.Name = d.DB
		}
		switch {
		case cfg.clients[d.Server] == nil:
			bad(key+".server", "%q is not in servers", d.Server)
		case !dbName.MatchString(d.DB):
			bad(key+".db", "%q is not a database name", d.DB)
		case !dbName.MatchString(d.Name):
			bad(key+".name", "%q is not a database name", d.Name)
		case cfg.byName[d.Name] != (Database{}):
			bad(key+".name", "%q is used twice", d.Name)
		}
		cfg.byName[d.Name] = d
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return cfg, nil
}

// plugin holds what the job types and routes share.
type plugin struct {
	cfg     *Config
	log     hclog.Logger
	host    *sdk.Host
	designs designCache
}

// New returns the plugin, for sdk.Serve or sdktest.
func New() *sdk.Plugin {
	pl := &plugin{log: hclog.NewNullLogger()}
	p := &sdk.Plugin{
		Name:    "indexing",
		Version: Version,
		Types: []sdk.Type{
			{Name: TypeWatcher, ActivityTimeout: 30 * time.Second, Continuous: true, Worker: sdk.WorkerFunc(pl.watch)},
			// A build runs to the end of the feed and completes: one-shot,
			// so the scheduler never preempts it; it saves every batch, so
			// a crash or failover resumes from the last one.
			{Name: TypeIndex, ActivityTimeout: 30 * time.Second, Worker: sdk.WorkerFunc(pl.build)},
			{Name: TypeCleanup, ActivityTimeout: 30 * time.Second, Worker: sdk.WorkerFunc(pl.cleanup)},
		},
	}
	p.Routes = pl.routes()
	p.Configure = func(ctx context.Context, c *sdk.Config) error {
		cfg, err := configure(c)
		if err != nil {
			return err
		}
		pl.cfg, pl.host = cfg, c.Host
		if p.Logger != nil {
			pl.log = p.Logger
		}
		if c.Host == nil {
			return nil
		}
		// Every node makes sure each database has its watcher.
		for _, d := range cfg.Databases {
			if err := ensureJob(ctx, c.Host, sdk.NewJob{Type: TypeWatcher, ID: watcherID(d.Server, d.DB),
				Data: WatcherData{Server: d.Server, DB: d.DB}, Group: d.Server + "/" + d.DB}); err != nil {
				return fmt.Errorf("add the watcher of %s: %w", d.DB, err)
			}
		}
		return nil
	}
	return p
}

// ensureJob adds a job unless it exists, and runs a finished one again.
func ensureJob(ctx context.Context, h *sdk.Host, j sdk.NewJob) error {
	info, err := h.GetJob(ctx, j.Type, j.ID)
	switch {
	case errors.Is(err, sdk.ErrNotFound):
		j.Exclusive = true
		err = h.AddJob(ctx, j)
		if errors.Is(err, sdk.ErrExists) {
			return nil
		}
		return err
	case err != nil:
		return err
	case info.State == "finished":
		j.Data = nil
		return h.AddJob(ctx, j)
	}
	return nil
}

// trigger starts a job's run: it adds the job if it is new, runs it again
// if it finished, and flags it for another run if it is running.
func trigger(ctx context.Context, h *sdk.Host, j sdk.NewJob) error {
	_, err := h.GetJob(ctx, j.Type, j.ID)
	if errors.Is(err, sdk.ErrNotFound) {
		return ensureJob(ctx, h, j)
	}
	if err != nil {
		return err
	}
	j.Data = nil
	return h.AddJob(ctx, j)
}

// Job ids: server and database names hold no ':'.
func watcherID(server, db string) string    { return server + ":" + db }
func indexID(server, db, sig string) string { return server + ":" + db + ":" + sig }
