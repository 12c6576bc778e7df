package sqlitekv

import (
	"path/filepath"
	"strings"
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
	spec := filepath.Join(t.TempDir(), "store.db")
	if b.opts.driver.name == moderncDriver.name {
		spec = "modernc:" + spec
	}
	s, err := b.OpenSpec(spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, spec
}

// OpenSpec opens "path" with the default driver, or "modernc:path" with the
// modernc driver, so that helper processes use the driver the test does.
func (b backend) OpenSpec(spec string) (kv.Store, error) {
	o := b.opts
	o.TransactionTimeout = testTimeout
	if path, ok := strings.CutPrefix(spec, "modernc:"); ok {
		o.driver, spec = moderncDriver, path
	}
	return Open(spec, o)
}

func (backend) TransactionTimeout() time.Duration { return testTimeout }

func TestMain(m *testing.M) { kvtest.Main(m, backend{}) }

func TestConformance(t *testing.T) { kvtest.Run(t, backend{}) }
