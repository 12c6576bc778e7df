package sqlitekv

import (
	"errors"

	"github.com/mattn/go-sqlite3"
)

// driver adapts one database/sql SQLite driver: its registered name and how
// its errors say "another connection holds the lock". The store uses
// mattn/go-sqlite3; the benchmarks measure modernc.org/sqlite through the
// same adapter (see docs/BENCHMARKS.md for why mattn was chosen).
type driver struct {
	name   string
	isBusy func(error) bool
}

var mattnDriver = driver{
	name: "sqlite3",
	isBusy: func(err error) bool {
		var e sqlite3.Error
		return errors.As(err, &e) && (e.Code == sqlite3.ErrBusy || e.Code == sqlite3.ErrLocked)
	},
}
