// Package host is the couchjobs node process: it opens the store a
// runtime.toml names and, as later layers land, runs the job-type plugins
// against it.
package host

import (
	"fmt"

	"github.com/hashicorp/go-hclog"

	"github.com/couchjobs/couchjobs/host/config"
	"github.com/couchjobs/couchjobs/runtime/kv"
	"github.com/couchjobs/couchjobs/runtime/kv/sqlitekv"
)

// openFDB opens the FoundationDB backend. It is set by store_fdb.go when
// couchjobs is built with the fdb tag, and nil otherwise.
var openFDB func(cfg config.Store) (kv.Store, error)

// OpenStore opens the store backend the configuration names.
func OpenStore(cfg *config.Config, log hclog.Logger) (kv.Store, error) {
	switch cfg.Store.Backend {
	case config.BackendSQLite:
		return sqlitekv.Open(cfg.Resolve(cfg.Store.Path), sqlitekv.Options{
			Durability: sqlitekv.Durability(cfg.Store.Durability),
			Logger:     log,
		})
	case config.BackendFDB:
		if openFDB == nil {
			return nil, fmt.Errorf("%s: store.backend is %q, but this couchjobs was built without FoundationDB support; rebuild it with `make build-fdb` (go build -tags fdb)", cfg.Path(), config.BackendFDB)
		}
		return openFDB(cfg.Store)
	}
	return nil, fmt.Errorf("%s: unknown store.backend %q", cfg.Path(), cfg.Store.Backend)
}
