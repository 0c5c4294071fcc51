// Package postgres is the PostgreSQL implementation of idem.Store.
//
// Every decision on a key is one SQL statement: a claim is a single
// INSERT … ON CONFLICT DO UPDATE … WHERE, a checkpoint, completion or release
// a single conditional UPDATE or DELETE guarded by the fencing token. Only
// when such a statement does not apply does the store read the row, to tell
// the caller why. Fencing tokens come from one sequence, and time comes from
// the database clock (or from Options.Now in tests), so any number of
// service replicas can share one database.
//
// Tables and sequences are never schema-qualified: the store works inside
// whatever schema the connection's search_path selects.
package postgres

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/db/schema"
	"github.com/idem-dev/idem/postgres/internal/dbsqlc"
)

var (
	_ idem.Driver    = (*Store)(nil)
	_ idem.KeyEvents = (*Store)(nil)
)

// Options tune a Store.
type Options struct {
	// Now is the clock every query uses. nil means the database clock
	// (now()), so that replicas with skewed clocks agree; tests pass a fake
	// clock.
	Now func() time.Time
	// MaxConns caps the connection pool; 0 keeps pgxpool's default (or the
	// URL's pool_max_conns).
	MaxConns int32
	// ConnectTimeout bounds each connection attempt; 0 keeps the URL's
	// connect_timeout or none.
	ConnectTimeout time.Duration
	// RequireLedger makes Open fail with idem.ErrNoLedger when the database
	// (the schema search_path selects) holds no idem tables, instead of
	// creating them: a database re-created empty, or the wrong one. The
	// server sets it unless creating the ledger is explicit.
	RequireLedger bool
}

// Store is an idem.Store backed by PostgreSQL through a pgx pool.
type Store struct {
	pool   *pgxpool.Pool
	q      *dbsqlc.Queries
	now    func() time.Time
	closed atomic.Bool
	// listener is the one connection that hears key events (see Subscribe).
	listener *listener
	// hints are the keys seen completed: their claims read first (Claim).
	hints *completedHints
}

// Open connects to the database at url, applies the embedded migrations and
// returns the store. An unreachable database is an *idem.Error with code
// store_unavailable.
func Open(ctx context.Context, url string, opts Options) (*Store, error) {
	pool, err := newPool(ctx, url, opts)
	if err != nil {
		return nil, err
	}
	if opts.RequireLedger {
		err = requireLedger(ctx, pool)
	}
	if err == nil {
		err = migrate(ctx, pool)
	}
	if err != nil {
		pool.Close()
		return nil, err
	}
	return &Store{pool: pool, q: dbsqlc.New(pool), now: opts.Now, listener: newListener(pool.Config().ConnConfig), hints: newCompletedHints()}, nil
}

// Migrate applies the embedded migrations to the database at url and
// returns. Open does the same; Migrate serves the `migrate` subcommand.
func Migrate(ctx context.Context, url string) error {
	pool, err := newPool(ctx, url, Options{MaxConns: 2})
	if err != nil {
		return err
	}
	defer pool.Close()
	return migrate(ctx, pool)
}

func newPool(ctx context.Context, url string, opts Options) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse database url: %w", err)
	}
	if opts.MaxConns > 0 {
		cfg.MaxConns = opts.MaxConns
	}
	if opts.ConnectTimeout > 0 {
		cfg.ConnConfig.ConnectTimeout = opts.ConnectTimeout
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, interpretError(err, "create connection pool")
	}
	return pool, nil
}

// requireLedger returns idem.ErrNoLedger when the migrations never ran in
// the current schema: goose's version table is missing.
func requireLedger(ctx context.Context, pool *pgxpool.Pool) error {
	var exists bool
	var schema string
	err := pool.QueryRow(ctx, "SELECT to_regclass('goose_db_version') IS NOT NULL, coalesce(current_schema(), '')").Scan(&exists, &schema)
	if err != nil {
		return interpretError(err, "check for the idem tables")
	}
	if !exists {
		return fmt.Errorf("%w: schema %q has no idem tables", idem.ErrNoLedger, schema)
	}
	return nil
}

// migrate runs the goose migrations under a session advisory lock, so
// replicas starting together apply them once. The lock id is derived from
// the current schema: stores in different schemas of one server (tests) do
// not wait on each other.
func migrate(ctx context.Context, pool *pgxpool.Pool) error {
	var current string
	if err := pool.QueryRow(ctx, "SELECT current_schema()").Scan(&current); err != nil {
		return interpretError(err, "migrate: read current schema")
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte("idem-migrations:" + current))
	locker, err := lock.NewPostgresSessionLocker(
		lock.WithLockID(int64(h.Sum64()>>1)),
		lock.WithLockTimeout(1, 120),
	)
	if err != nil {
		return fmt.Errorf("migrate: create locker: %w", err)
	}
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	provider, err := goose.NewProvider(goose.DialectPostgres, db, schema.Postgres(),
		goose.WithSessionLocker(locker),
		goose.WithDisableGlobalRegistry(true),
	)
	if err != nil {
		return fmt.Errorf("migrate: create goose provider: %w", err)
	}
	if _, err := provider.Up(ctx); err != nil {
		return interpretError(err, "migrate: apply migrations")
	}
	return nil
}

// Webhooks implements idem.Driver: the Store keeps the webhook outbox in
// the ledger's schema itself.
func (s *Store) Webhooks() idem.WebhookStore { return s }

// Ledger returns the store itself: it reads its token source and keeps the
// record of rollbacks (ledger.go).
func (s *Store) Ledger() idem.LedgerRollbacks { return s }

// KeyEvents implements idem.Driver: the Store LISTENs for the keys its
// claims wait on (Subscribe, Watch).
func (s *Store) KeyEvents() idem.KeyEvents { return s }

// Listener implements idem.Driver: the Store's LISTEN connection can be
// lost and comes back (listenlog.go).
func (s *Store) Listener() idem.Listener { return s }

// SerialWrites implements idem.Driver: PostgreSQL's writes run side by
// side, each on a connection of the pool, so a tenant's reads and writes
// share one share of it.
func (s *Store) SerialWrites() bool { return false }

// PoolStats implements idem.Driver for the pool metrics and the tenant
// share.
func (s *Store) PoolStats() idem.PoolStats {
	st := s.pool.Stat()
	return idem.PoolStats{
		MaxConns:   int64(st.MaxConns()),
		OpenConns:  int64(st.TotalConns()),
		InUseConns: int64(st.AcquiredConns()),
		IdleConns:  int64(st.IdleConns()),
		Waits:      st.EmptyAcquireCount(),
		WaitTime:   st.EmptyAcquireWaitTime(),
	}
}

// Ping checks that the database answers.
func (s *Store) Ping(ctx context.Context) error {
	return s.interpretError(s.pool.Ping(ctx), "ping database")
}

// Close closes the pool. Calls after Close fail with store_unavailable.
func (s *Store) Close() error {
	s.closed.Store(true)
	s.listener.close()
	s.pool.Close()
	return nil
}

// clock returns the query parameter "now": NULL for the database clock, or
// the injected clock truncated to PostgreSQL's microsecond precision.
func (s *Store) clock() pgtype.Timestamptz {
	if s.now == nil {
		return pgtype.Timestamptz{}
	}
	return pgtype.Timestamptz{Time: s.now().Truncate(time.Microsecond), Valid: true}
}

// hintNow is the instant a hint is checked at: the injected clock, else
// this process's (a hint only decides which statement asks first).
func (s *Store) hintNow() time.Time {
	if s.now == nil {
		return time.Now()
	}
	return s.now()
}

// interpretError is interpretError plus the closed-pool case.
func (s *Store) interpretError(err error, doing string) error {
	if err != nil && s.closed.Load() {
		return unavailable(fmt.Errorf("%s: store is closed: %w", doing, err))
	}
	return interpretError(err, doing)
}

// errContention is returned when a claim kept racing with concurrent changes
// of the same row; it does not happen in practice.
var errContention = errors.New("the record kept changing under concurrent requests")
