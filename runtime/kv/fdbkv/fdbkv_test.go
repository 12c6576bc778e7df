//go:build fdb

package fdbkv

import (
	"os"
	"testing"
	"time"

	"github.com/couchjobs/couchjobs/runtime/kv"
	"github.com/couchjobs/couchjobs/runtime/kv/kvtest"
)

// backend runs the suite on the cluster FDB_CLUSTER_FILE names. Every test
// works in a subspace of its own, so one database serves them all.
type backend struct{}

func (backend) Name() string { return "foundationdb" }

func (b backend) Open(t testing.TB) (kv.Store, string) {
	cluster := os.Getenv("FDB_CLUSTER_FILE")
	if cluster == "" {
		t.Skip("FDB_CLUSTER_FILE is not set: no FoundationDB cluster to test against")
	}
	s, err := b.OpenSpec(cluster)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, cluster
}

func (backend) OpenSpec(cluster string) (kv.Store, error) {
	return Open(Options{ClusterFile: cluster})
}

// TransactionTimeout is FoundationDB's fixed five seconds.
func (backend) TransactionTimeout() time.Duration { return 5 * time.Second }

func TestMain(m *testing.M) { kvtest.Main(m, backend{}) }

func TestConformance(t *testing.T) { kvtest.Run(t, backend{}) }

func BenchmarkStore(b *testing.B) { kvtest.Bench(b, backend{}) }
