package sqlitekv

import (
	"errors"
	"testing"

	"modernc.org/sqlite"

	"github.com/couchjobs/couchjobs/runtime/kv/kvtest"
)

// moderncDriver is the pure-Go alternative, measured against mattn on the
// same benchmarks. It is linked into the test binary only.
var moderncDriver = driver{
	name: "sqlite",
	isBusy: func(err error) bool {
		var e *sqlite.Error
		return errors.As(err, &e) && (e.Code()&0xff == 5 || e.Code()&0xff == 6) // SQLITE_BUSY, SQLITE_LOCKED
	},
}

// BenchmarkStore runs the store benchmarks on the driver the store uses.
func BenchmarkStore(b *testing.B) { kvtest.Bench(b, backend{}) }

// BenchmarkDrivers runs them on both drivers, to back the choice of driver.
func BenchmarkDrivers(b *testing.B) {
	b.Run("mattn", func(b *testing.B) { kvtest.Bench(b, backend{}) })
	b.Run("modernc", func(b *testing.B) { kvtest.Bench(b, backend{opts: Options{driver: moderncDriver}}) })
}

// TestModerncConformance runs the conformance suite on the other driver too,
// so the comparison is between two correct stores.
func TestModerncConformance(t *testing.T) {
	if testing.Short() {
		t.Skip("the default driver's suite covers the store in -short runs")
	}
	kvtest.Run(t, backend{opts: Options{driver: moderncDriver}})
}
