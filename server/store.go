package server

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/postgres"
	"github.com/idem-dev/idem/sqlite"
)

// backend is one kind of store: the IDEM_DATABASE_URL prefixes that name
// it, how such a URL becomes what it opens, how to open it and how to
// migrate it. backends is the one table of them; the rest of the server
// sees only idem.Driver.
type backend struct {
	name     string
	prefixes []string
	// target returns what open and migrate take for url: the URL itself for
	// PostgreSQL, the file path for SQLite.
	target  func(url string) (string, error)
	open    func(ctx context.Context, cfg Config, target string) (idem.Driver, error)
	migrate func(ctx context.Context, target string) error
}

// backends lists the stores the binary can run on.
func backends() []backend {
	return []backend{
		{
			name:     "postgres",
			prefixes: []string{"postgres://", "postgresql://"},
			target:   func(url string) (string, error) { return url, nil },
			open: func(ctx context.Context, cfg Config, url string) (idem.Driver, error) {
				return postgres.Open(ctx, url, postgres.Options{
					MaxConns:       int32(cfg.DBMaxConns),
					ConnectTimeout: cfg.DBConnectTimeout,
					RequireLedger:  !cfg.createsLedger(),
				})
			},
			migrate: postgres.Migrate,
		},
		{
			name:     "sqlite",
			prefixes: []string{"sqlite:"},
			target:   sqliteTarget,
			open: func(ctx context.Context, cfg Config, path string) (idem.Driver, error) {
				return sqlite.Open(ctx, path, sqlite.Options{RequireLedger: !cfg.createsLedger()})
			},
			migrate: sqlite.Migrate,
		},
	}
}

// sqliteTarget returns the file path of a sqlite: URL.
func sqliteTarget(url string) (string, error) {
	p := strings.TrimPrefix(strings.TrimPrefix(url, "sqlite:"), "//")
	if p == "" {
		return "", errors.New("IDEM_DATABASE_URL: sqlite: needs a file path, e.g. sqlite:./data/idem.db")
	}
	if p == ":memory:" || strings.HasPrefix(p, "file::memory:") {
		return "", errors.New("IDEM_DATABASE_URL: an in-memory SQLite database is not supported; name a file, e.g. sqlite:./data/idem.db")
	}
	return p, nil
}

// database is IDEM_DATABASE_URL parsed: its backend and what that opens.
type database struct {
	backend backend
	target  string
	// url is the URL as configured, for redacted messages.
	url string
}

// parseDatabase finds the backend of a database URL.
func parseDatabase(url string) (database, error) {
	var prefixes []string
	for _, b := range backends() {
		for _, p := range b.prefixes {
			if strings.HasPrefix(url, p) {
				target, err := b.target(url)
				if err != nil {
					return database{}, err
				}
				return database{backend: b, target: target, url: url}, nil
			}
			prefixes = append(prefixes, p)
		}
	}
	return database{}, fmt.Errorf("IDEM_DATABASE_URL must start with %s (got %q)", orList(prefixes), redactURL(url))
}

// orList joins items as "a, b or c".
func orList(items []string) string {
	if len(items) < 2 {
		return strings.Join(items, "")
	}
	return strings.Join(items[:len(items)-1], ", ") + " or " + items[len(items)-1]
}

// is reports whether the database runs on the named backend.
func (d database) is(name string) bool { return d.backend.name == name }

// String names the database for logs and messages, without credentials.
func (d database) String() string {
	if d.is("sqlite") {
		return "sqlite:" + d.target
	}
	return redactURL(d.url)
}

// migrationsTimeout bounds applying the migrations when a store opens, on
// top of IDEM_DB_CONNECT_TIMEOUT for connecting. It covers waiting for
// another replica that is applying them at the same moment.
const migrationsTimeout = 30 * time.Second

// open opens the store and runs its migrations. The caller closes it.
func (d database) open(ctx context.Context, cfg Config) (idem.Driver, error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.DBConnectTimeout+migrationsTimeout)
	defer cancel()
	s, err := d.backend.open(ctx, cfg, d.target)
	if errors.Is(err, idem.ErrNoLedger) {
		return nil, fmt.Errorf("open store %s: %w\n"+
			"Refusing to start an empty ledger: every key stored before would run again. If the database\n"+
			"was deleted or is not mounted, put it back. To create a new ledger on purpose, run the migrate\n"+
			"command once, or start with --create-db (IDEM_CREATE_DB=1).", d, err)
	}
	if err != nil {
		return nil, fmt.Errorf("open store %s: %w", redactURL(d.url), err)
	}
	return s, nil
}

// OpenStore opens the store named by cfg.DatabaseURL and runs its
// migrations. The caller closes it.
func OpenStore(ctx context.Context, cfg Config) (idem.Driver, error) {
	db, err := parseDatabase(cfg.DatabaseURL)
	if err != nil {
		return nil, err
	}
	return db.open(ctx, cfg)
}

// Migrate runs the migrations of the store named by cfg.DatabaseURL.
func Migrate(ctx context.Context, cfg Config) error {
	db, err := parseDatabase(cfg.DatabaseURL)
	if err != nil {
		return err
	}
	if err := db.backend.migrate(ctx, db.target); err != nil {
		return fmt.Errorf("migrate %s: %w", redactURL(cfg.DatabaseURL), err)
	}
	return nil
}

// dataDirMode is the mode of the folders the server creates for its data
// (the SQLite file, the development-mode secret): they hold secrets and
// stored responses, so only the service's user may read them.
const dataDirMode = 0o700

func ensureDir(dir string) error {
	if err := os.MkdirAll(dir, dataDirMode); err != nil {
		return fmt.Errorf("create data folder %s: %w", dir, err)
	}
	return nil
}
