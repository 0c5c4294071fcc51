// Package examplesrv runs the real idem server wiring for the runnable
// examples of packages client and idemhttp, which have no *testing.T to
// hand to servertest.
package examplesrv

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"time"

	"github.com/idem-dev/idem/auth"
	"github.com/idem-dev/idem/server"
)

// Start runs the real idem server wiring (SQLite in a temporary folder)
// behind an httptest server with the tenant id (display name name) and
// returns its URL, a keys:write token for the tenant with sub claim subject,
// and a stop function. It panics on failure.
func Start(id, name, subject string) (url, token string, stop func()) {
	dir, err := os.MkdirTemp("", "idem-example")
	if err != nil {
		panic(err)
	}
	const secret = "example-hs256-secret-0123456789abcdef"
	cfg := server.DefaultConfig()
	cfg.DatabaseURL = "sqlite:" + dir + "/idem.db"
	cfg.JWTHS256Secret = secret
	cfg.CreateDB = true // a fresh ledger in a temporary folder
	ctx := context.Background()
	srv, err := server.New(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		panic(err)
	}
	if _, err := srv.Tenants().Ensure(ctx, id, name); err != nil {
		panic(err)
	}
	token, err = auth.MintHS256([]byte(secret), auth.MintClaims{Issuer: "idem", Audience: "idem", Subject: subject,
		Tenant: id, Scopes: []string{auth.ScopeKeysWrite}, TTL: time.Hour})
	if err != nil {
		panic(err)
	}
	hs := httptest.NewServer(srv.Handler())
	return hs.URL, token, func() {
		hs.Close()
		_ = srv.Close()
		_ = os.RemoveAll(dir)
	}
}
