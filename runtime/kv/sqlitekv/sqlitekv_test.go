package sqlitekv

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/couchjobs/couchjobs/runtime/kv"
	"github.com/couchjobs/couchjobs/runtime/kv/kvtest"
)

// backend opens a new store file per test. The short transaction time limit
// keeps the time-limit test quick.
type backend struct{ opts Options }

const testTimeout = 300 * time.Millisecond

func (backend) Name() string { return "sqlite" }

func (b backend) Open(t testing.TB) (kv.Store, string) {
	path := filepath.Join(t.TempDir(), "store.db")
	s, err := b.OpenSpec(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, path
}

func (b backend) OpenSpec(path string) (kv.Store, error) {
	o := b.opts
	o.TransactionTimeout = testTimeout
	return Open(path, o)
}

func (backend) TransactionTimeout() time.Duration { return testTimeout }

func TestMain(m *testing.M) { kvtest.Main(m, backend{}) }

func TestConformance(t *testing.T) { kvtest.Run(t, backend{}) }
