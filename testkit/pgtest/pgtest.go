// Package pgtest gives tests an isolated PostgreSQL schema on the server
// named by TEST_DATABASE_URL.
//
// Locally, without TEST_DATABASE_URL, PostgreSQL tests skip. When
// IDEM_REQUIRE_POSTGRES=1 (set by `make test` and by CI) a missing
// TEST_DATABASE_URL fails the test instead, so PostgreSQL coverage can never
// silently disappear.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnvURL names the variable holding the test server's connection URL.
const EnvURL = "TEST_DATABASE_URL"

// EnvRequire names the variable that turns a missing server into a failure.
const EnvRequire = "IDEM_REQUIRE_POSTGRES"

// ServerURL returns TEST_DATABASE_URL, skipping the test when it is unset,
// or failing it when IDEM_REQUIRE_POSTGRES=1.
func ServerURL(tb testing.TB) string {
	tb.Helper()
	u := os.Getenv(EnvURL)
	if u == "" {
		if os.Getenv(EnvRequire) == "1" {
			tb.Fatalf("%s is not set but %s=1: PostgreSQL tests must run", EnvURL, EnvRequire)
		}
		tb.Skipf("%s is not set; skipping PostgreSQL test (run `make test` to get a server)", EnvURL)
	}
	return u
}

// URL creates a fresh, empty schema on the test server and returns a
// connection URL whose search_path points at it, so every table, sequence
// and goose version table the code creates lands there. The schema is
// dropped when the test ends.
func URL(tb testing.TB) string {
	tb.Helper()
	base := ServerURL(tb)
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "idem_test_" + hex.EncodeToString(b[:])

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		tb.Fatalf("pgtest: connect to %s: %v", EnvURL, err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		tb.Fatalf("pgtest: create schema: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, base)
		if err != nil {
			tb.Logf("pgtest: drop schema %s: %v", schema, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			tb.Logf("pgtest: drop schema %s: %v", schema, err)
		}
	})

	u, err := url.Parse(base)
	if err != nil {
		tb.Fatalf("pgtest: parse %s: %v", EnvURL, err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}
