// Package sqlitekv is the embedded default store: the kv interface on one
// SQLite file, so that couchjobs runs on one machine with no server at all.
//
// Several OS processes may open the same file. SQLite's write-ahead log lets
// readers run beside the single writer, and a write transaction holds
// SQLite's write lock from its first statement to its commit, which makes
// every transaction serializable: a conflict can never be detected late, so
// transactions are retried only when the lock is busy or when they break a
// retryable limit such as the transaction time limit.
//
// Each write commit takes the next value of a version counter, under the
// write lock, and stores it in the file. It supplies versionstamps, which
// are therefore strictly increasing across processes, and lets watchers
// skip unchanged states cheaply. After every commit the
// writer also writes the version to a side file, <path>-notify, which the
// watch checkers of every process follow with inotify (fsnotify), so that a
// watch in one process wakes within a millisecond of a commit in another.
package sqlitekv

import (
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/couchjobs/couchjobs/runtime/kv"
)

// Durability says when a commit reaches the disk. It maps to SQLite's
// synchronous pragma in WAL mode.
type Durability string

// Durability modes.
const (
	// DurabilityNormal survives a crash or SIGKILL of any process, but a
	// power loss or OS crash may undo the last commits (never corrupt the
	// file). It is the default: commits do not wait for fsync.
	DurabilityNormal Durability = "normal"
	// DurabilityFull also survives power loss: every commit waits for fsync.
	DurabilityFull Durability = "full"
	// DurabilityOff leaves flushing to the OS; an OS crash may corrupt the
	// file. For tests and throwaway stores only.
	DurabilityOff Durability = "off"
)

// Options configure a store. The zero value is ready to use.
type Options struct {
	// Durability is the commit durability mode; empty means
	// DurabilityNormal.
	Durability Durability
	// TransactionTimeout bounds how long one transaction may run before it
	// fails with kv.ErrTransactionTooOld, as FoundationDB's 5 s limit does.
	// It keeps a slow transaction from holding the write lock. Zero means
	// 5 s.
	TransactionTimeout time.Duration
	// ReadConns is the number of connections for read-only transactions;
	// zero means 4.
	ReadConns int
	// Logger receives the store's logs; nil discards them.
	Logger hclog.Logger

	// driver is the SQLite driver; tests and benchmarks swap it.
	driver driver
}

// formatVersion is the schema version this build reads and writes.
const formatVersion = 1

// Store is the embedded SQLite store. Its methods are safe for concurrent
// use by many goroutines.
type Store struct {
	path    string
	opts    Options
	log     hclog.Logger
	db      *sql.DB // owns every connection below
	writer  *conn
	writeMu chan struct{} // a one-slot semaphore for the writer, waited on with a context
	readers chan *conn
	// nreaders is how many connections readers holds when idle.
	nreaders int
	// versions is <path>-version, which holds the last commit version any
	// process took; lastVersion is the last one this process committed.
	// Both are used only by the writer, under the write lock.
	versions    *os.File
	lastVersion int64
	closed      atomic.Bool
	done        chan struct{} // closed by Close, to release waiters
	watches     *watcher
}

// conn is one SQLite connection with its prepared statements.
type conn struct {
	c        *sql.Conn
	begin    *sql.Stmt // BEGIN IMMEDIATE on the writer, BEGIN on readers
	commit   *sql.Stmt
	rollback *sql.Stmt
	get      *sql.Stmt
	rangeAsc *sql.Stmt
	rangeDsc *sql.Stmt
	set      *sql.Stmt
	clear    *sql.Stmt
	clearRng *sql.Stmt
	bump     *sql.Stmt
	version  *sql.Stmt
}

// Open opens or creates the store in the SQLite file at path.
func Open(path string, opts Options) (*Store, error) {
	if opts.Durability == "" {
		opts.Durability = DurabilityNormal
	}
	switch opts.Durability {
	case DurabilityNormal, DurabilityFull, DurabilityOff:
	default:
		return nil, fmt.Errorf("open store %s: unknown durability %q (want normal, full or off)", path, opts.Durability)
	}
	if opts.TransactionTimeout <= 0 {
		opts.TransactionTimeout = 5 * time.Second
	}
	if opts.ReadConns <= 0 {
		opts.ReadConns = 4
	}
	if opts.driver.name == "" {
		opts.driver = mattnDriver
	}
	log := opts.Logger
	if log == nil {
		log = hclog.NewNullLogger()
	}
	s := &Store{
		path:    path,
		opts:    opts,
		log:     log.Named("store"),
		writeMu: make(chan struct{}, 1),
		readers: make(chan *conn, opts.ReadConns),
		done:    make(chan struct{}),
	}
	if err := s.open(); err != nil {
		s.closeConns()
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	return s, nil
}

func (s *Store) open() error {
	db, err := sql.Open(s.opts.driver.name, "file:"+s.path)
	if err != nil {
		return err
	}
	s.db = db
	ctx := context.Background()
	if s.writer, err = s.newConn(ctx, false); err != nil {
		return err
	}
	if err := s.initSchema(ctx); err != nil {
		return err
	}
	if err := s.writer.prepare(ctx, true); err != nil {
		return err
	}
	if err := s.writer.version.QueryRowContext(ctx).Scan(&s.lastVersion); err != nil {
		return fmt.Errorf("read the commit version: %w", err)
	}
	if s.versions, err = os.OpenFile(s.path+"-version", os.O_RDWR|os.O_CREATE, 0o644); err != nil {
		return err
	}
	for range s.opts.ReadConns {
		c, err := s.newConn(ctx, true)
		if err != nil {
			return err
		}
		if err := c.prepare(ctx, false); err != nil {
			return err
		}
		s.readers <- c
		s.nreaders++
	}
	s.watches, err = newWatcher(s)
	return err
}

// newConn opens a connection and sets its pragmas. The writer never waits
// inside SQLite for a busy lock (busy_timeout 0): Transact waits in Go, with
// a context and short jittered sleeps. Readers in WAL mode are blocked only
// during recovery after a crash, which they wait out.
func (s *Store) newConn(ctx context.Context, reader bool) (*conn, error) {
	c, err := s.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	busy := 0
	if reader {
		busy = 10000
	}
	pragmas := []string{
		// Every commit writes each page it touched to the log, so small
		// pages make small transactions cheap: 1 KiB pages commit 30-40%
		// faster than SQLite's default 4 KiB here (docs/BENCHMARKS.md). The
		// page size takes effect when the file is created.
		"PRAGMA page_size = 1024",
		// Checkpoint every ~10 MiB of log rather than every 1,000 pages
		// (1 MiB at this page size): fewer, larger checkpoints.
		"PRAGMA wal_autocheckpoint = 10000",
		fmt.Sprintf("PRAGMA busy_timeout = %d", busy),
		"PRAGMA journal_mode = WAL",
		"PRAGMA synchronous = " + string(s.opts.Durability),
		"PRAGMA cache_size = -32768", // 32 MiB of page cache
		"PRAGMA mmap_size = 268435456",
		"PRAGMA temp_store = MEMORY",
	}
	if reader {
		pragmas = append(pragmas, "PRAGMA query_only = 1")
	}
	for _, p := range pragmas {
		if err := s.retryBusy(ctx, func() error { _, err := c.ExecContext(ctx, p); return err }); err != nil {
			c.Close()
			return nil, fmt.Errorf("%s: %w", p, err)
		}
	}
	return &conn{c: c}, nil
}

// initSchema creates the tables once, however many processes open the file
// at the same moment, and refuses files written by a newer format.
func (s *Store) initSchema(ctx context.Context) error {
	return s.retryBusy(ctx, func() error {
		c := s.writer.c
		if _, err := c.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
			return err
		}
		err := func() error {
			for _, q := range []string{
				`CREATE TABLE IF NOT EXISTS kv (key BLOB PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID`,
				`CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID`,
				`INSERT OR IGNORE INTO meta (name, value) VALUES ('version', 0)`,
				fmt.Sprintf(`INSERT OR IGNORE INTO meta (name, value) VALUES ('format', %d)`, formatVersion),
			} {
				if _, err := c.ExecContext(ctx, q); err != nil {
					return err
				}
			}
			var format int
			if err := c.QueryRowContext(ctx, `SELECT value FROM meta WHERE name = 'format'`).Scan(&format); err != nil {
				return err
			}
			if format != formatVersion {
				return fmt.Errorf("store format %d is not %d, the one this build reads", format, formatVersion)
			}
			return nil
		}()
		if err != nil {
			c.ExecContext(ctx, "ROLLBACK")
			return err
		}
		_, err = c.ExecContext(ctx, "COMMIT")
		return err
	})
}

func (c *conn) prepare(ctx context.Context, writer bool) error {
	begin := "BEGIN"
	if writer {
		begin = "BEGIN IMMEDIATE"
	}
	stmts := []struct {
		dst **sql.Stmt
		q   string
	}{
		{&c.begin, begin},
		{&c.commit, "COMMIT"},
		{&c.rollback, "ROLLBACK"},
		{&c.get, `SELECT value FROM kv WHERE key = ?`},
		{&c.rangeAsc, `SELECT key, value FROM kv WHERE key >= ? AND key < ? ORDER BY key LIMIT ?`},
		{&c.rangeDsc, `SELECT key, value FROM kv WHERE key >= ? AND key < ? ORDER BY key DESC LIMIT ?`},
		{&c.version, `SELECT value FROM meta WHERE name = 'version'`},
	}
	if writer {
		stmts = append(stmts, []struct {
			dst **sql.Stmt
			q   string
		}{
			{&c.set, `INSERT OR REPLACE INTO kv (key, value) VALUES (?, ?)`},
			{&c.clear, `DELETE FROM kv WHERE key = ?`},
			{&c.clearRng, `DELETE FROM kv WHERE key >= ? AND key < ?`},
			{&c.bump, `UPDATE meta SET value = ? WHERE name = 'version'`},
		}...)
	}
	for _, st := range stmts {
		p, err := c.c.PrepareContext(ctx, st.q)
		if err != nil {
			return fmt.Errorf("prepare %q: %w", st.q, err)
		}
		*st.dst = p
	}
	return nil
}

// retryBusy runs fn until it does not fail with a busy lock, sleeping a
// little longer each time, or until ctx is done.
func (s *Store) retryBusy(ctx context.Context, fn func() error) error {
	b := kv.Backoff{Min: 20 * time.Microsecond, Max: 2 * time.Millisecond}
	for {
		err := fn()
		if err == nil || !s.opts.driver.isBusy(err) {
			return err
		}
		if err := kv.Sleep(ctx, b.Next()); err != nil {
			return err
		}
	}
}

// Path returns the file the store lives in.
func (s *Store) Path() string { return s.path }

// Close waits for running transactions, fails pending watches with
// kv.ErrStoreClosed and closes the file. It is safe to call more than once.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	close(s.done)
	s.writeMu <- struct{}{} // wait for the running write transaction
	if s.watches != nil {
		s.watches.close()
	}
	return s.closeConns()
}

func (s *Store) closeConns() error {
	var errs []error
	if s.versions != nil {
		errs = append(errs, s.versions.Close())
	}
	if s.writer != nil {
		errs = append(errs, s.writer.c.Close())
	}
	for range s.nreaders {
		c := <-s.readers // waits for a running read transaction to end
		errs = append(errs, c.c.Close())
	}
	if s.db != nil {
		errs = append(errs, s.db.Close())
	}
	return errors.Join(errs...)
}

// nextVersion takes the next commit version; the caller holds SQLite's
// write lock. Reading the counter back from SQLite (UPDATE ... RETURNING)
// doubled the cost of a small transaction, so the last version taken by
// any process is kept in <path>-version instead, written before the
// commit under the same lock: the next writer, in whatever process, reads
// a value at least as large as every committed version. A writer that
// crashes between this write and its commit leaves a gap, never a
// duplicate. The meta table keeps the committed version too, so that a
// lost or stale version file (a power loss) cannot take versions back:
// every process starts from the larger of the two.
func (s *Store) nextVersion() (int64, error) {
	var b [8]byte
	n, err := s.versions.ReadAt(b[:], 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return 0, err
	}
	hint := int64(0)
	if n == len(b) {
		hint = int64(binary.BigEndian.Uint64(b[:]))
	}
	v := max(hint, s.lastVersion) + 1
	binary.BigEndian.PutUint64(b[:], uint64(v))
	if _, err := s.versions.WriteAt(b[:], 0); err != nil {
		return 0, err
	}
	return v, nil
}

// notifyPath is the side file commits write to, to wake watchers in other
// processes.
func (s *Store) notifyPath() string { return s.path + "-notify" }

var _ kv.Store = (*Store)(nil)

// IntegrityCheck runs SQLite's full integrity check of the file and returns
// an error listing what is wrong, if anything. It reads the whole file.
func (s *Store) IntegrityCheck(ctx context.Context) error {
	c, err := s.takeReader(ctx)
	if err != nil {
		return err
	}
	defer func() { s.readers <- c }()
	rows, err := c.c.QueryContext(ctx, "PRAGMA integrity_check")
	if err != nil {
		return fmt.Errorf("integrity check: %w", err)
	}
	defer rows.Close()
	var problems []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			return fmt.Errorf("integrity check: %w", err)
		}
		if line != "ok" {
			problems = append(problems, line)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("integrity check: %w", err)
	}
	if len(problems) > 0 {
		return fmt.Errorf("integrity check of %s failed: %s", s.path, strings.Join(problems, "; "))
	}
	return nil
}

// Stats describe a store's file.
type Stats struct {
	// Keys is the number of keys stored.
	Keys int64
	// Version is the number of write commits ever made.
	Version int64
	// FileBytes and WALBytes are the sizes of the file and of its
	// write-ahead log.
	FileBytes, WALBytes int64
}

// Stats counts the keys and reports the file sizes. Counting reads every
// key, so it is for operators, not for hot paths.
func (s *Store) Stats(ctx context.Context) (Stats, error) {
	var st Stats
	_, err := s.ReadTransact(ctx, func(rt kv.ReadTx) (any, error) {
		t := rt.(*tx)
		if err := t.c.c.QueryRowContext(ctx, `SELECT count(*) FROM kv`).Scan(&st.Keys); err != nil {
			return nil, err
		}
		return nil, t.c.version.QueryRowContext(ctx).Scan(&st.Version)
	})
	if err != nil {
		return st, fmt.Errorf("store stats: %w", err)
	}
	if fi, err := os.Stat(s.path); err == nil {
		st.FileBytes = fi.Size()
	}
	if fi, err := os.Stat(s.path + "-wal"); err == nil {
		st.WALBytes = fi.Size()
	}
	return st, nil
}
