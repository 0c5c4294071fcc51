// Package sqlite is the embedded SQLite implementation of idem.Store, for a
// single-host deployment or development: no server to run, one file on disk.
//
// Every decision on a key (claim, checkpoint, complete, release) reads the
// row, decides with the rules of package idem, and writes, all inside one
// BEGIN IMMEDIATE transaction: SQLite takes its single write lock before the
// read, so the decision cannot race with another writer, whether it sits in
// this process or in another process that opened the same file. Fencing
// tokens come from a one-row counter table, so they keep increasing after a
// release or the reaper deleted the row that held the previous one.
//
// Writers of one Store queue in arrival order for a single writer slot (see
// lockWriter) before they begin: SQLite admits one writer at a time anyway,
// and a writer that finds the lock taken inside SQLite sleeps in its busy
// handler with growing pauses (up to 100 ms), so under load some waited
// seconds while later arrivals went first. Readers do not queue; WAL lets
// them run beside the writer on the other pooled connections. The slot only
// orders this Store's writers: BEGIN IMMEDIATE with busy_timeout still
// guards against writers of other processes or other Stores on the file.
//
// The database runs inside this process, so "the database clock" is this
// host's clock: with Options.Now nil the store uses time.Now. Times are kept
// as INTEGER unix microseconds (see db/schema/sqlite).
//
// Durability: the file is opened in WAL mode with synchronous=FULL, so a
// transaction that returned (a stored response above all) survives a crash or
// a power loss.
package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pressly/goose/v3"
	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver
	sqlitelib "modernc.org/sqlite/lib"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/db/schema"
	"github.com/idem-dev/idem/keyevents"
	"github.com/idem-dev/idem/sqlite/internal/dbsqlc"
)

var (
	_ idem.Driver    = (*Store)(nil)
	_ idem.KeyEvents = (*Store)(nil)
)

// busyTimeout is how long a statement waits for another connection's write
// lock before SQLite gives up with SQLITE_BUSY.
const busyTimeout = 10 * time.Second

// maxOpenConns caps the connections of one Store. Writers of a Store take
// turns on its writer slot (SQLite has a single write lock anyway), and a
// commit costs an fsync (synchronous=FULL), so a larger pool does not claim
// faster (BenchmarkClaimParallel measures 1,
// 4 and 16 connections within noise of each other); a few connections let
// reads run beside the writer in WAL mode.
const maxOpenConns = 4

// migrateAttempts bounds the migration retries when several processes open a
// new file at once: the loser of a race to apply a migration fails inside its
// rolled-back transaction and finds the work done on the next attempt.
const migrateAttempts = 5

// Options tune a Store.
type Options struct {
	// Now is the clock of every decision. nil means this host's clock, which
	// is the database's clock for an embedded database; tests pass a fake
	// clock.
	Now func() time.Time
	// RequireLedger makes Open fail with idem.ErrNoLedger when the file does
	// not exist or holds no idem ledger, instead of creating one. The server
	// sets it unless creating the ledger is explicit.
	RequireLedger bool
	// EventsFallback is how often, while claims wait on keys, every waiter
	// is woken to claim again, for commits made by another process that
	// opened the same file (this Store's own commits wake their waiters at
	// once). 0 means DefaultEventsFallback.
	EventsFallback time.Duration
}

// DefaultEventsFallback is Options.EventsFallback when unset: slow enough
// to cost nothing beside the immediate in-process events, fast enough that
// a waiter sees another process's completion well within its wait.
const DefaultEventsFallback = 2 * time.Second

// Store is an idem.Store backed by one SQLite file.
type Store struct {
	db     *sql.DB
	q      *dbsqlc.Queries
	now    func() time.Time
	closed atomic.Bool
	// path and file are the file this Store opened and its identity
	// (device and inode): every write and Ping checks that path still
	// names that file (see checkFile).
	path string
	file os.FileInfo
	// writer is the writer slot, a semaphore of one: a send takes it, a
	// receive gives it back. Goroutines blocked sending on a channel are
	// woken first in, first out, which makes the queue fair.
	writer chan struct{}
	// events fans key changes out to waiting claims (see Subscribe).
	events   keyevents.Broadcast
	fallback time.Duration
	fallOnce sync.Once
	done     chan struct{}
}

// Open opens the SQLite database at path (creating it and its folder when
// missing, unless opts.RequireLedger), applies the embedded migrations and
// returns the store. path is a file path; ":memory:" is not supported, since
// every pooled connection would see its own empty database.
//
// The store remembers which file it opened. If path is later deleted or
// replaced by another file (a restore, a volume swapped under a running
// server), Ping and every write answer store_unavailable instead of writing
// into a file that is no longer the ledger; the pool never creates a file
// again (mode=rw).
func Open(ctx context.Context, path string, opts Options) (*Store, error) {
	db, file, err := openDB(ctx, path, !opts.RequireLedger)
	if err != nil {
		return nil, err
	}
	if opts.RequireLedger {
		err = requireLedger(ctx, db, path)
	}
	if err == nil {
		err = migrate(ctx, db)
	}
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	// Every statement is prepared once per pooled connection: here on the
	// first, later on each connection that runs it (database/sql keeps the
	// prepared statement per connection, and a transaction reuses its
	// connection's). Preparing on every call cost about a quarter of the
	// server's CPU (BenchmarkClaimComplete).
	q, err := dbsqlc.Prepare(ctx, db)
	if err != nil {
		_ = db.Close()
		return nil, interpretError(err, "prepare statements")
	}
	fallback := opts.EventsFallback
	if fallback <= 0 {
		fallback = DefaultEventsFallback
	}
	s := &Store{
		db: db, q: q, now: now, path: path, file: file, writer: make(chan struct{}, 1),
		fallback: fallback, done: make(chan struct{}),
	}
	if err := s.checkFile("open sqlite database"); err != nil {
		_ = q.Close()
		_ = db.Close()
		return nil, err
	}
	return s, nil
}

// Migrate creates the database at path (and its folder) when missing,
// applies the embedded migrations and returns. Open does the same; Migrate
// serves the `migrate` subcommand, the explicit way to create a ledger.
func Migrate(ctx context.Context, path string) error {
	db, _, err := openDB(ctx, path, true)
	if err != nil {
		return err
	}
	defer db.Close()
	return migrate(ctx, db)
}

// DB returns the store's connection pool, for tests.
func (s *Store) DB() *sql.DB { return s.db }

// Webhooks implements idem.Driver: the Store keeps the webhook outbox in
// the ledger's file itself.
func (s *Store) Webhooks() idem.WebhookStore { return s }

// Ledger returns the store itself: it reads its token source and keeps the
// record of rollbacks (ledger.go).
func (s *Store) Ledger() idem.LedgerRollbacks { return s }

// Listener implements idem.Driver: none, the key events are in-process.
func (s *Store) Listener() idem.Listener { return nil }

// KeyEvents implements idem.Driver: the Store publishes the changes it
// commits to the claims waiting on them (Subscribe, Watch).
func (s *Store) KeyEvents() idem.KeyEvents { return s }

// PoolStats implements idem.Driver for the pool metrics and the tenant
// share.
func (s *Store) PoolStats() idem.PoolStats {
	st := s.db.Stats()
	return idem.PoolStats{
		MaxConns:   int64(st.MaxOpenConnections),
		OpenConns:  int64(st.OpenConnections),
		InUseConns: int64(st.InUse),
		IdleConns:  int64(st.Idle),
		Waits:      st.WaitCount,
		WaitTime:   st.WaitDuration,
	}
}

// Ping checks that the path still names the file this Store opened and
// that the database can take a write: it commits a write that changes
// nothing, as a write like every other (see write). A file that still
// answers reads but refuses writes — a full disk, a read-only file or
// folder, failing I/O, another process holding the lock — or that was
// deleted or replaced fails the ping (store_unavailable), so /readyz says so
// while it lasts; a read would not notice. The commit costs one WAL append
// and fsync per ping.
func (s *Store) Ping(ctx context.Context) error {
	return s.write(ctx, "ping database (write probe)", func() error {
		tx, err := s.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }()
		// idem does not use user_version; setting it rewrites the header page
		// even when the value does not change, where an UPDATE to the same
		// value would write nothing.
		if _, err := tx.ExecContext(ctx, "PRAGMA user_version = 0"); err != nil {
			return err
		}
		return tx.Commit()
	})
}

// Close closes the store's connections. Later calls return store_unavailable.
func (s *Store) Close() error {
	if !s.closed.Swap(true) {
		close(s.done)
	}
	if err := errors.Join(s.q.Close(), s.db.Close()); err != nil {
		return fmt.Errorf("close database: %w", err)
	}
	return nil
}

// dsn returns the driver DSN for path: open read-write but never create
// (mode=rw; Open creates the file itself when it may), the pragmas every
// pooled connection runs when it opens, and BEGIN IMMEDIATE for every
// transaction.
func dsn(path string) string {
	q := url.Values{}
	q.Set("mode", "rw")
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", busyTimeout.Milliseconds()))
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(FULL)")
	q.Add("_pragma", "foreign_keys(ON)")
	q.Set("_txlock", "immediate")
	return "file:" + path + "?" + q.Encode()
}

// openDB opens the pool on the file at path, creating an empty file (and
// its folder) first when create is set, and returns the identity of the
// file it opened. Without create, a missing file is idem.ErrNoLedger.
func openDB(ctx context.Context, path string, create bool) (*sql.DB, os.FileInfo, error) {
	if path == "" || path == ":memory:" || len(path) >= 5 && path[:5] == "file:" {
		return nil, nil, fmt.Errorf("open sqlite database: %q is not a file path", path)
	}
	if create {
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil { // only the service reads stored responses
			return nil, nil, fmt.Errorf("open sqlite database: create folder: %w", err)
		}
		// An empty file is an empty SQLite database.
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, nil, fmt.Errorf("open sqlite database: create %s: %w", path, err)
		}
		_ = f.Close()
	}
	file, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, fmt.Errorf("open sqlite database: %w: %s does not exist", idem.ErrNoLedger, path)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("open sqlite database: %w", err)
	}
	db, err := sql.Open("sqlite", dsn(path))
	if err != nil {
		return nil, nil, fmt.Errorf("open sqlite database: %w", err)
	}
	db.SetMaxOpenConns(maxOpenConns)
	db.SetMaxIdleConns(maxOpenConns)
	db.SetConnMaxIdleTime(0)
	// Processes opening a new file at once race to switch it to WAL, and
	// SQLite answers that switch SQLITE_BUSY without waiting on the busy
	// timeout: the first connection is tried again (a new one each time,
	// as the failed one is not pooled) for up to busyTimeout.
	busyUntil := time.Now().Add(busyTimeout)
	for {
		err = db.PingContext(ctx)
		if err == nil || sqliteCode(err) != sqlitelib.SQLITE_BUSY || time.Now().After(busyUntil) || ctx.Err() != nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		_ = db.Close()
		return nil, nil, interpretError(err, "open sqlite database "+path)
	}
	return db, file, nil
}

// requireLedger returns idem.ErrNoLedger when the database has never been
// migrated: an empty file, or a SQLite file of something else.
func requireLedger(ctx context.Context, db *sql.DB, path string) error {
	var n int
	err := db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'goose_db_version'`).Scan(&n)
	if err != nil {
		return interpretError(err, "open sqlite database "+path)
	}
	if n == 0 {
		return fmt.Errorf("open sqlite database: %w: %s holds no idem tables", idem.ErrNoLedger, path)
	}
	return nil
}

// checkFile returns store_unavailable when path no longer names the file
// this Store opened: deleted, or replaced by another file. Writes into the
// opened file would then vanish with it, so none is made; putting the file
// back (the same inode) heals it, a restart picks up a replacement.
func (s *Store) checkFile(doing string) error {
	cur, err := os.Stat(s.path)
	if err == nil && os.SameFile(cur, s.file) {
		return nil
	}
	if err == nil {
		err = errors.New("the path names another file than the one opened")
	}
	return idem.StoreUnavailable("the database file was deleted or replaced while the server ran",
		fmt.Errorf("%s: database file %s: %w", doing, s.path, err))
}

// migrate applies the embedded goose migrations with a provider (no global
// goose state).
func migrate(ctx context.Context, db *sql.DB) error {
	provider, err := goose.NewProvider(goose.DialectSQLite3, db, schema.SQLite())
	if err != nil {
		return fmt.Errorf("migrate: create provider: %w", err)
	}
	for attempt := 1; ; attempt++ {
		_, err = provider.Up(ctx)
		if err == nil {
			return nil
		}
		if attempt == migrateAttempts || ctx.Err() != nil {
			return interpretError(err, "migrate")
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(attempt) * 50 * time.Millisecond):
		}
	}
}

// clock returns the instant of a decision, at the microsecond precision the
// database keeps.
func (s *Store) clock() time.Time {
	return s.now().UTC().Truncate(time.Microsecond)
}

// lockWriter waits, behind the writers that arrived earlier, for this
// Store's writer slot, or until ctx ends; it returns ctx's error then, as
// BeginTx would. A nil error obliges the caller to call unlockWriter.
func (s *Store) lockWriter(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	select {
	case s.writer <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// unlockWriter gives the writer slot to the next writer in line.
func (s *Store) unlockWriter() { <-s.writer }

// SerialWrites implements idem.Driver: writers queue for the writer slot
// before they take a connection, and reads run beside the writer, so a
// tenant's share of the store (storemw.WithTenantShare) counts its writes
// and its reads apart.
func (s *Store) SerialWrites() bool { return true }

// interpretError is interpretError plus the closed-store case.
func (s *Store) interpretError(err error, doing string) error {
	if err != nil && s.closed.Load() {
		return unavailable(fmt.Errorf("%s: store is closed: %w", doing, err))
	}
	return interpretError(err, doing)
}

// write runs fn holding the writer slot, between two checks that the path
// still names the opened file (checkFile): before, so nothing is written
// into a deleted or replaced file; after, so a write that raced with the
// deletion is not reported as stored. fn's error is interpreted once.
func (s *Store) write(ctx context.Context, doing string, fn func() error) error {
	if err := s.lockWriter(ctx); err != nil {
		return s.interpretError(err, doing)
	}
	defer s.unlockWriter()
	if err := s.checkFile(doing); err != nil {
		return err
	}
	if err := fn(); err != nil {
		return s.interpretError(err, doing)
	}
	return s.checkFile(doing)
}

// inTx runs fn inside one BEGIN IMMEDIATE transaction (the DSN's _txlock)
// as a write, with the instant of the decision, taken once the write lock
// is held. fn's error rolls the transaction back.
func (s *Store) inTx(ctx context.Context, doing string, fn func(q *dbsqlc.Queries, now time.Time) error) error {
	return s.write(ctx, doing, func() error {
		tx, err := s.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }()
		if err := fn(s.q.WithTx(tx), s.clock()); err != nil {
			return err
		}
		return tx.Commit()
	})
}

// Subscribe implements idem.KeyEvents. A complete, release, reap or tenant
// deletion of this Store wakes the key's subscriptions as soon as it
// commits. Another process that opened the same file cannot reach them, so
// while any subscription is live every one is also woken each
// Options.EventsFallback to claim again: a slow re-check shared by all
// waiters, not a poll per waiter.
func (s *Store) Subscribe(ctx context.Context, tenantID, key string) (*idem.Subscription, error) {
	if s.closed.Load() {
		return nil, idem.StoreUnavailable("the store is closed", nil)
	}
	s.fallOnce.Do(func() { go s.recheck() })
	return s.events.Subscribe(tenantID, key), nil
}

// Watch implements idem.KeyEvents: it reports whether the key is in flight.
// Every change this Store commits is published to the key's subscriptions
// (and the re-check covers other processes), so unlike PostgreSQL, which
// notifies only for flagged rows, there is nothing to flag.
func (s *Store) Watch(ctx context.Context, tenantID, key string) (bool, error) {
	stored, err := getKey(ctx, s.q, tenantID, key, s.clock())
	if err != nil {
		return false, s.interpretError(err, "watch key")
	}
	return stored != nil && stored.State == idem.StateInFlight, nil
}

// recheck wakes every subscription each s.fallback while there are any,
// until the store closes.
func (s *Store) recheck() {
	t := time.NewTicker(s.fallback)
	defer t.Stop()
	for {
		select {
		case <-s.done:
			return
		case <-t.C:
			if s.events.Len() > 0 {
				s.events.PublishAll()
			}
		}
	}
}
