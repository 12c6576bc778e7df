package peruser

import (
	"fmt"
	"time"

	"github.com/couchjobs/couchjobs/plugins/internal/couch"
	"github.com/couchjobs/couchjobs/sdk"
)

// Config is the [plugins.peruser.config] table.
type Config struct {
	// Servers are the CouchDB servers whose users get databases, each
	// with admin credentials (in the URL, or user and password).
	Servers []Server `json:"servers"`
	// AuthenticationDB is where the users are; default "_users".
	AuthenticationDB string `json:"authentication_db"`
	// DatabasePrefix starts every user database's name; default "userdb-".
	DatabasePrefix string `json:"database_prefix"`
	// DeleteDBs deletes a user's database with the user; otherwise the
	// user is only taken out of its _security. Default false.
	DeleteDBs bool `json:"delete_dbs"`
	// Q is the shard count of new databases, where the server shards;
	// default 1.
	Q int `json:"q"`
	// ReconcileInterval is how often the watcher compares every user with
	// the databases and repairs differences; default "10m".
	ReconcileInterval string `json:"reconcile_interval"`
	// FeedTimeout is how long the watcher waits on the changes feed before
	// it checks that the server still answers; default "60s".
	FeedTimeout string `json:"feed_timeout"`

	reconcile, feedTimeout time.Duration
}

// Server is one CouchDB server, with admin credentials.
type Server struct {
	couch.ServerConfig
	client *couch.Client
}

// configure decodes and checks the table; errors name the key.
func configure(c *sdk.Config) (*Config, error) {
	cfg := &Config{}
	if err := c.Decode(cfg); err != nil {
		return nil, err
	}
	var errs sdk.ConfigErrors
	bad := func(key, format string, args ...any) {
		errs = append(errs, sdk.ConfigError{Key: key, Message: fmt.Sprintf(format, args...)})
	}
	if cfg.AuthenticationDB == "" {
		cfg.AuthenticationDB = "_users"
	}
	if cfg.DatabasePrefix == "" {
		cfg.DatabasePrefix = "userdb-"
	}
	if err := checkPrefix(cfg.DatabasePrefix); err != nil {
		bad("database_prefix", "%v", err)
	}
	switch {
	case cfg.Q == 0:
		cfg.Q = 1
	case cfg.Q < 0:
		bad("q", "%d is negative", cfg.Q)
	}
	var err error
	if cfg.reconcile, err = sdk.ParseDuration(cfg.ReconcileInterval, 10*time.Minute); err != nil {
		bad("reconcile_interval", "%v", err)
	}
	if cfg.feedTimeout, err = sdk.ParseDuration(cfg.FeedTimeout, time.Minute); err != nil {
		bad("feed_timeout", "%v", err)
	}
	if len(cfg.Servers) == 0 {
		bad("servers", "no server: add [[plugins.peruser.config.servers]] with a name and a url")
	}
	configs := make([]couch.ServerConfig, len(cfg.Servers))
	for i, sv := range cfg.Servers {
		configs[i] = sv.ServerConfig
	}
	clients, problems := couch.Connect(configs, couch.Options{})
	for _, p := range problems {
		bad(p.Key, "%s", p.Message)
	}
	for i := range cfg.Servers {
		cfg.Servers[i].client = clients[cfg.Servers[i].Name]
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return cfg, nil
}

// server returns the named server.
func (c *Config) server(name string) *Server {
	for i := range c.Servers {
		if c.Servers[i].Name == name {
			return &c.Servers[i]
		}
	}
	return nil
}
