package server

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/idem-dev/idem/auth"
)

// DevSecretFile is the name of the development-mode secret inside the data
// folder.
const DevSecretFile = "dev-jwt-secret"

// DevTenant is the tenant development mode creates.
const DevTenant = "demo"

// DevTokenTTL is the lifetime of the tokens printed in development mode.
const DevTokenTTL = 7 * 24 * time.Hour

// LoadOrCreateDevSecret returns the development-mode HS256 secret kept in
// dir, creating it (32 random bytes, hex-encoded, file mode 0600) when it
// does not exist yet.
func LoadOrCreateDevSecret(dir string) (secret []byte, created bool, err error) {
	path := filepath.Join(dir, DevSecretFile)
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		s := bytes.TrimSpace(b)
		if len(s) < auth.MinSecretBytes {
			return nil, false, fmt.Errorf("development secret %s is %d bytes; delete it to have a new one created", path, len(s))
		}
		if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
			if err := os.Chmod(path, 0o600); err != nil {
				return nil, false, fmt.Errorf("restrict development secret %s to mode 0600: %w", path, err)
			}
		}
		return s, false, nil
	case !errors.Is(err, fs.ErrNotExist):
		return nil, false, fmt.Errorf("read development secret: %w", err)
	}
	if err := ensureDir(dir); err != nil {
		return nil, false, err
	}
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return nil, false, fmt.Errorf("generate development secret: %w", err)
	}
	s := []byte(hex.EncodeToString(raw[:]))
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) { // another process created it meanwhile
		return LoadOrCreateDevSecret(dir)
	}
	if err != nil {
		return nil, false, fmt.Errorf("create development secret: %w", err)
	}
	if _, err := f.Write(append(s, '\n')); err != nil {
		_ = f.Close()
		return nil, false, fmt.Errorf("write development secret: %w", err)
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return nil, false, fmt.Errorf("write development secret: %w", err)
	}
	if err := f.Close(); err != nil {
		return nil, false, fmt.Errorf("write development secret: %w", err)
	}
	return s, true, nil
}

// SigningSecret returns the HS256 secret tokens are minted with: the
// configured IDEM_JWT_HS256_SECRET, or in development mode the secret file
// in the data folder (created if missing).
func SigningSecret(cfg Config) ([]byte, error) {
	if cfg.JWTHS256Secret != "" {
		return []byte(cfg.JWTHS256Secret), nil
	}
	if cfg.DevMode() {
		s, _, err := LoadOrCreateDevSecret(cfg.DataFolder())
		return s, err
	}
	if cfg.JWTJWKSFile != "" {
		return nil, errors.New("only IDEM_JWT_JWKS_FILE is configured: tokens must be signed by the issuer that holds the private keys; set IDEM_JWT_HS256_SECRET to mint HS256 tokens here")
	}
	return nil, errors.New("no signing key: set IDEM_JWT_HS256_SECRET")
}

// MintingSecret returns the HS256 secret `server token` mints with: the
// configured IDEM_JWT_HS256_SECRET, or in development mode the secret file a
// server created. Unlike SigningSecret it never creates one: a token signed
// by a fresh secret would be rejected by the running server, so a missing
// secret is an error that says where it looked.
func MintingSecret(cfg Config) ([]byte, error) {
	if cfg.JWTHS256Secret != "" || !cfg.DevMode() {
		return SigningSecret(cfg)
	}
	path := filepath.Join(cfg.DataFolder(), DevSecretFile)
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("no signing key: IDEM_JWT_HS256_SECRET is not set, --jwt-hs256-secret not given, and there is no development secret at %s (it is created by the first 'serve' in development mode with IDEM_DATABASE_URL=%s; point IDEM_DATABASE_URL or IDEM_DATA_DIR at that server's data folder, or set IDEM_JWT_HS256_SECRET)", path, cfg.DatabaseURL)
	}
	return SigningSecret(cfg)
}

// DevInfo is what development mode prints at start.
type DevInfo struct {
	// SecretFile is the path of the generated secret.
	SecretFile string
	// OperatorToken has scope admin; DemoToken has keys:write tenant:admin
	// for tenant demo.
	OperatorToken string
	DemoToken     string
}

func mintDevTokens(cfg Config, secret []byte) (DevInfo, error) {
	op, err := auth.MintHS256(secret, auth.MintClaims{
		Issuer: cfg.JWTIssuer, Audience: cfg.JWTAudience, Subject: "dev-operator",
		Scopes: []string{auth.ScopeAdmin}, TTL: DevTokenTTL,
	})
	if err != nil {
		return DevInfo{}, fmt.Errorf("mint operator token: %w", err)
	}
	demo, err := auth.MintHS256(secret, auth.MintClaims{
		Issuer: cfg.JWTIssuer, Audience: cfg.JWTAudience, Subject: "dev-demo", Tenant: DevTenant,
		Scopes: []string{auth.ScopeKeysWrite, auth.ScopeTenantAdmin}, TTL: DevTokenTTL,
	})
	if err != nil {
		return DevInfo{}, fmt.Errorf("mint demo token: %w", err)
	}
	return DevInfo{
		SecretFile:    filepath.Join(cfg.DataFolder(), DevSecretFile),
		OperatorToken: op,
		DemoToken:     demo,
	}, nil
}

// PrintDevBanner writes the development-mode tokens and a ready-to-paste
// curl line for a claim to w. It writes nothing outside development mode.
// addr is the bound address (Server.Addr).
func (s *Server) PrintDevBanner(w io.Writer) {
	if s.dev == nil {
		return
	}
	base := "http://" + displayAddr(s.Addr())
	fmt.Fprintf(w, `
idem is running in DEVELOPMENT MODE (no IDEM_JWT_HS256_SECRET or IDEM_JWT_JWKS_FILE set).
  store:       %s
  secret file: %s (mode 0600)
  docs:        %s/docs/   dashboard: %s/dashboard/   metrics: %s/metrics

Base URL:
  export IDEM_URL=%s

Operator token (scope admin, valid %s):
  export IDEM_OPERATOR_TOKEN=%s

Demo token (tenant %q, scopes keys:write tenant:admin, valid %s):
  export IDEM_TOKEN=%s

Try a claim:
  curl -sS -X POST %s/v1/keys/order-42/claim -H "Authorization: Bearer $IDEM_TOKEN" -H 'Content-Type: application/json' -d '{"operation":"POST /v1/payments","request":{"amount":1000,"currency":"usd"}}'

`, redactURL(s.cfg.DatabaseURL), s.dev.SecretFile, base, base, base,
		base, DevTokenTTL, s.dev.OperatorToken, DevTenant, DevTokenTTL, s.dev.DemoToken, base)
}

// displayAddr turns a bound address into one a local curl can reach.
func displayAddr(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "localhost"
	}
	return net.JoinHostPort(host, port)
}

// bootstrapDev prepares development mode: the secret and the demo tenant.
func (s *Server) bootstrapDev() ([]byte, error) {
	secret, created, err := LoadOrCreateDevSecret(s.cfg.DataFolder())
	if err != nil {
		return nil, err
	}
	s.logger.Info("development mode: no signing key configured, using the generated secret file",
		"secret_file", filepath.Join(s.cfg.DataFolder(), DevSecretFile), "created", created)
	return secret, nil
}
