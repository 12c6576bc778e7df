//go:build fdb

package host

import (
	"github.com/couchjobs/couchjobs/host/config"
	"github.com/couchjobs/couchjobs/runtime/kv"
	"github.com/couchjobs/couchjobs/runtime/kv/fdbkv"
)

func init() {
	openFDB = func(cfg config.Store) (kv.Store, error) {
		return fdbkv.Open(fdbkv.Options{ClusterFile: cfg.ClusterFile, APIVersion: cfg.APIVersion})
	}
}
