package api_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/api"
	"github.com/idem-dev/idem/auth"
	"github.com/idem-dev/idem/retrybudget"
	"github.com/idem-dev/idem/sqlite"
	"github.com/idem-dev/idem/tenants"
	"github.com/idem-dev/idem/testkit/contract"
)

const (
	testIssuer   = "idem-test"
	testAudience = "idem-api"
	// testMaxBody is the request body limit of the test server.
	testMaxBody = 64 << 10
)

// signingKeys are the asymmetric keys of the test JWKS. RSA key generation is
// slow, so they are generated once for the package.
type signingKeys struct {
	ed  ed25519.PrivateKey
	ec  *ecdsa.PrivateKey
	rsa *rsa.PrivateKey
}

var testKeys = sync.OnceValue(func() signingKeys {
	_, ed, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		panic(err)
	}
	ec, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic(err)
	}
	rk, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		panic(err)
	}
	return signingKeys{ed: ed, ec: ec, rsa: rk}
})

func b64u(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

// jwksDoc returns the JWKS of the public halves of k.
func jwksDoc(t *testing.T, k signingKeys) []byte {
	t.Helper()
	ecBytes, err := k.ec.PublicKey.Bytes() // 0x04 || X || Y
	require.NoError(t, err)
	doc := map[string]any{"keys": []map[string]any{
		{"kty": "OKP", "crv": "Ed25519", "kid": "ed", "use": "sig", "x": b64u(k.ed.Public().(ed25519.PublicKey))},
		{"kty": "EC", "crv": "P-256", "kid": "ec", "alg": "ES256", "x": b64u(ecBytes[1:33]), "y": b64u(ecBytes[33:])},
		{"kty": "RSA", "kid": "rsa", "alg": "RS256", "n": b64u(k.rsa.N.Bytes()), "e": b64u(big.NewInt(int64(k.rsa.E)).Bytes())},
	}}
	b, err := json.Marshal(doc)
	require.NoError(t, err)
	return b
}

// clock is a test clock for the store: real time plus an offset that tests
// advance instead of sleeping; or, once frozen, a fixed instant that only
// Advance moves, for tests whose assertions leave no room for the real time
// a loaded machine takes between two requests.
type clock struct {
	offset atomic.Int64
	frozen atomic.Int64 // UnixNano of the frozen instant; 0 while real time runs
}

func (c *clock) Now() time.Time {
	if f := c.frozen.Load(); f != 0 {
		return time.Unix(0, f).Add(time.Duration(c.offset.Load()))
	}
	return time.Now().Add(time.Duration(c.offset.Load()))
}
func (c *clock) Advance(d time.Duration) { c.offset.Add(int64(d)) }

// Freeze stops the clock at the real time now.
func (c *clock) Freeze() { c.frozen.Store(time.Now().UnixNano()) }

// bundle is what setup returns.
type bundle struct {
	url     string
	secret  []byte
	keys    signingKeys
	store   *sqlite.Store
	tenants *tenants.Service
	clock   *clock
	client  *http.Client
	obs     *recordingObserver
	logs    *bytes.Buffer
	logMu   *sync.Mutex
}

// recordingObserver counts the observer hooks.
type recordingObserver struct {
	mu     sync.Mutex
	claims []idem.ClaimAction
	writes []string
	https  []string // "route method status" of each request
}

func (o *recordingObserver) ObserveHTTP(route, method string, status int, _ time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.https = append(o.https, fmt.Sprintf("%s %s %d", route, method, status))
}

func (o *recordingObserver) ObserveClaim(_ string, action idem.ClaimAction, _ error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.claims = append(o.claims, action)
}

func (o *recordingObserver) InflightBudget(func() int64) {}

func (o *recordingObserver) ObserveAttempt(string, retrybudget.Attempt, bool) {}

func (o *recordingObserver) RetryBudget(func() []retrybudget.Stats) {}

func (o *recordingObserver) ObserveWrite(_, op string, _ error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.writes = append(o.writes, op)
}

// lockedWriter serializes writes of the log handler into a buffer.
type lockedWriter struct {
	mu  *sync.Mutex
	buf *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

// newTestClient is the one place tests build their HTTP client. Every
// exchange goes through the OpenAPI contract validator.
func newTestClient(t *testing.T) *http.Client {
	t.Helper()
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 64,
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: contract.Transport(t, tr), Timeout: 30 * time.Second}
}

// setup starts the API on a real SQLite store and a real HTTP server on
// 127.0.0.1 with tenants "acme" and "globex".
func setup(t *testing.T) *bundle {
	t.Helper()
	ctx := context.Background()
	b := &bundle{
		secret: []byte("test-secret-test-secret-test-secret!"),
		keys:   testKeys(),
		clock:  &clock{},
		obs:    &recordingObserver{},
		logs:   &bytes.Buffer{},
		logMu:  &sync.Mutex{},
	}
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "idem.db"), sqlite.Options{Now: b.clock.Now})
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	b.store = st
	b.tenants = tenants.NewService(st, tenants.DefaultCacheTTL)
	for _, id := range []string{"acme", "globex"} {
		_, err := b.tenants.Create(ctx, id, id+" inc", idem.SettingsPatch{})
		require.NoError(t, err)
	}
	v, err := auth.NewVerifier(auth.Config{HS256Secret: b.secret, JWKS: jwksDoc(t, b.keys), Issuer: testIssuer, Audience: testAudience})
	require.NoError(t, err)
	logger := slog.New(slog.NewJSONHandler(lockedWriter{b.logMu, b.logs}, nil))
	h := api.New(api.Options{
		Store: st, Tenants: b.tenants, Verifier: v, Logger: logger,
		MaxBodyBytes: testMaxBody, Observer: b.obs,
	})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := httptest.NewUnstartedServer(h)
	srv.Listener = l
	srv.Start()
	t.Cleanup(srv.Close)
	b.url = srv.URL
	b.client = newTestClient(t)
	return b
}

// token mints an HS256 token for tenant with scopes.
func (b *bundle) token(t *testing.T, tenant string, scopes ...string) string {
	t.Helper()
	tok, err := auth.MintHS256(b.secret, auth.MintClaims{
		Issuer: testIssuer, Audience: testAudience, Subject: "test", Tenant: tenant, Scopes: scopes, TTL: time.Hour,
	})
	require.NoError(t, err)
	return tok
}

// signed signs claims with method and key, setting kid when not empty.
func signed(t *testing.T, method jwt.SigningMethod, key any, kid string, claims jwt.MapClaims) string {
	t.Helper()
	tok := jwt.NewWithClaims(method, claims)
	if kid != "" {
		tok.Header["kid"] = kid
	}
	s, err := tok.SignedString(key)
	require.NoError(t, err)
	return s
}

// validClaims returns claims accepted by the test verifier.
func validClaims(tenant, scope string) jwt.MapClaims {
	now := time.Now()
	return jwt.MapClaims{
		"iss": testIssuer, "aud": testAudience, "sub": "test",
		"iat": now.Unix(), "exp": now.Add(time.Hour).Unix(),
		"tenant": tenant, "scope": scope,
	}
}

// result is a decoded HTTP response.
type result struct {
	status int
	header http.Header
	body   []byte
}

func (r result) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(r.body, &m), "body: %s", r.body)
	return m
}

// req sends a request. body is marshalled to JSON unless it is a string or
// []byte, which are sent as they are; ct "" means application/json when
// there is a body.
func (b *bundle) req(t *testing.T, method, path, token string, body any, headers ...string) result {
	t.Helper()
	var rd io.Reader
	ct := ""
	switch v := body.(type) {
	case nil:
	case string:
		rd, ct = strings.NewReader(v), "application/json"
	case []byte:
		rd, ct = bytes.NewReader(v), "application/json"
	default:
		buf, err := json.Marshal(v)
		require.NoError(t, err)
		rd, ct = bytes.NewReader(buf), "application/json"
	}
	r, err := http.NewRequest(method, b.url+path, rd)
	require.NoError(t, err)
	if ct != "" {
		r.Header.Set("Content-Type", ct)
	}
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		if headers[i+1] == "" {
			r.Header.Del(headers[i])
		} else {
			r.Header.Set(headers[i], headers[i+1])
		}
	}
	resp, err := b.client.Do(r)
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return result{status: resp.StatusCode, header: resp.Header, body: data}
}

// requireProblem checks a problem+json answer.
func requireProblem(t *testing.T, r result, status int, code idem.Code, retryable bool) map[string]any {
	t.Helper()
	require.Equal(t, status, r.status, "body: %s", r.body)
	require.Equal(t, "application/problem+json", r.header.Get("Content-Type"))
	p := r.json(t)
	require.Equal(t, string(code), p["code"], "body: %s", r.body)
	require.Equal(t, float64(status), p["status"])
	require.Equal(t, retryable, p["retryable"])
	require.Equal(t, "/docs/errors#"+string(code), p["type"])
	require.NotEmpty(t, p["title"])
	require.NotEmpty(t, p["detail"])
	require.Equal(t, r.header.Get("X-Request-Id"), p["request_id"])
	if !retryable {
		require.Empty(t, r.header.Get("Retry-After"))
	}
	return p
}

// requireField checks that a problem names field in its errors array.
func requireField(t *testing.T, p map[string]any, field string) {
	t.Helper()
	errs, ok := p["errors"].([]any)
	require.True(t, ok, "problem has no errors array: %v", p)
	for _, e := range errs {
		if e.(map[string]any)["field"] == field {
			return
		}
	}
	require.Failf(t, "field not named", "want %q in %v", field, errs)
}

// claim claims key for tenant acme and returns the fencing token.
func (b *bundle) claim(t *testing.T, tok, key string, body any) int64 {
	t.Helper()
	r := b.req(t, http.MethodPost, "/v1/keys/"+escape(key)+"/claim", tok, body)
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	return int64(r.json(t)["fencing_token"].(float64))
}

// escape path-escapes a key (including '/', '?' and '#').
func escape(key string) string { return url.PathEscape(key) }
