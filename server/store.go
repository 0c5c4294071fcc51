package server

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/postgres"
	"github.com/idem-dev/idem/sqlite"
)

// backend opens and migrates one kind of store. target is the URL for
// PostgreSQL and the file path for SQLite.
type backend struct {
	open    func(ctx context.Context, cfg Config, target string) (idem.Store, error)
	migrate func(ctx context.Context, target string) error
}

// backends maps a database URL scheme to its store.
func backends() map[string]backend {
	return map[string]backend{
		schemePostgres: {
			open: func(ctx context.Context, cfg Config, url string) (idem.Store, error) {
				return postgres.Open(ctx, url, postgres.Options{
					MaxConns:       int32(cfg.DBMaxConns),
					ConnectTimeout: cfg.DBConnectTimeout,
				})
			},
			migrate: postgres.Migrate,
		},
		schemeSQLite: {
			open: func(ctx context.Context, _ Config, path string) (idem.Store, error) {
				if err := ensureDir(filepath.Dir(path)); err != nil {
					return nil, err
				}
				return sqlite.Open(ctx, path, sqlite.Options{})
			},
			migrate: func(ctx context.Context, path string) error {
				if err := ensureDir(filepath.Dir(path)); err != nil {
					return err
				}
				return sqlite.Migrate(ctx, path)
			},
		},
	}
}

func ensureDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create data folder %s: %w", dir, err)
	}
	return nil
}

func resolveBackend(cfg Config) (backend, string, error) {
	kind, path, err := storeKind(cfg.DatabaseURL)
	if err != nil {
		return backend{}, "", err
	}
	b, ok := backends()[kind]
	if !ok {
		return backend{}, "", fmt.Errorf("IDEM_DATABASE_URL: no store for scheme %q", kind)
	}
	target := cfg.DatabaseURL
	if kind == schemeSQLite {
		target = path
	}
	return b, target, nil
}

// OpenStore opens the store named by cfg.DatabaseURL and runs its
// migrations. The caller closes it.
func OpenStore(ctx context.Context, cfg Config) (idem.Store, error) {
	b, target, err := resolveBackend(cfg)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.DBConnectTimeout+cfg.DBConnectTimeout)
	defer cancel()
	s, err := b.open(ctx, cfg, target)
	if err != nil {
		return nil, fmt.Errorf("open store %s: %w", redactURL(cfg.DatabaseURL), err)
	}
	return s, nil
}

// Migrate runs the migrations of the store named by cfg.DatabaseURL.
func Migrate(ctx context.Context, cfg Config) error {
	b, target, err := resolveBackend(cfg)
	if err != nil {
		return err
	}
	if err := b.migrate(ctx, target); err != nil {
		return fmt.Errorf("migrate %s: %w", redactURL(cfg.DatabaseURL), err)
	}
	return nil
}
