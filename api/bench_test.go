package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/api"
	"github.com/idem-dev/idem/auth"
	"github.com/idem-dev/idem/metrics"
	"github.com/idem-dev/idem/postgres"
	"github.com/idem-dev/idem/storemw"
	"github.com/idem-dev/idem/tenants"
	"github.com/idem-dev/idem/testkit/pgtest"
)

// benchClaimBody is the claim cmd/loadgen sends: the server fingerprints the
// request.
var benchClaimBody = []byte(`{"operation":"POST /v1/payments","request":{"amount":1000,"currency":"usd"}}`)

// benchRouter returns the router wired as package server wires it
// (instrumented PostgreSQL store, metrics middleware and observer, JSON
// access log) and a keys:write token of tenant "bench" with the given
// settings. It needs TEST_DATABASE_URL.
func benchRouter(b *testing.B, settings idem.SettingsPatch) (http.Handler, string) {
	ctx := context.Background()
	st, err := postgres.Open(ctx, pgtest.URL(b), postgres.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = st.Close() })
	m := metrics.New(prometheus.NewRegistry())
	store := storemw.Wrap(st, storemw.Options{Metrics: m})
	ts := tenants.NewService(store, tenants.DefaultCacheTTL)
	if _, err := ts.Create(ctx, "bench", "", settings); err != nil {
		b.Fatal(err)
	}
	secret := []byte("bench-secret-bench-secret-bench-secret")
	v, err := auth.NewVerifier(auth.Config{HS256Secret: secret, Issuer: testIssuer, Audience: testAudience})
	if err != nil {
		b.Fatal(err)
	}
	tok, err := auth.MintHS256(secret, auth.MintClaims{
		Issuer: testIssuer, Audience: testAudience, Subject: "bench", Tenant: "bench",
		Scopes: []string{auth.ScopeKeysWrite}, TTL: time.Hour,
	})
	if err != nil {
		b.Fatal(err)
	}
	h := api.New(api.Options{
		Store: store, Tenants: ts, Verifier: v,
		Logger:   slog.New(slog.NewJSONHandler(io.Discard, nil)),
		Observer: m,
	})
	return h, tok
}

// benchClaims sends fresh-key claims to h and requires one of statuses for
// each.
func benchClaims(b *testing.B, h http.Handler, tok string, statuses ...int) {
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		r := httptest.NewRequest(http.MethodPost, "/v1/keys/k-"+strconv.Itoa(i)+"/claim", bytes.NewReader(benchClaimBody))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Authorization", "Bearer "+tok)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if !slices.Contains(statuses, w.Code) {
			b.Fatalf("status %d: %s", w.Code, w.Body)
		}
	}
}

// BenchmarkClaimHTTP runs fresh-key claims through the router wired as
// package server wires it, without the network. Run with -benchmem:
// allocs/op is the HTTP layer's allocation count plus the store's. It needs
// TEST_DATABASE_URL.
func BenchmarkClaimHTTP(b *testing.B) {
	h, tok := benchRouter(b, idem.SettingsPatch{})
	benchClaims(b, h, tok, http.StatusCreated)
}

// BenchmarkRateLimitedHTTP is what one refused claim of a tenant over its
// rate limit costs the server, through the same router: it is decided from
// the limiter alone, before the tenant lookup and the body.
func BenchmarkRateLimitedHTTP(b *testing.B) {
	rate := 1
	h, tok := benchRouter(b, idem.SettingsPatch{RateLimitPerSecond: &rate})
	// Empty the bucket: the first claim takes its one token.
	r := httptest.NewRequest(http.MethodPost, "/v1/keys/first/claim", bytes.NewReader(benchClaimBody))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Authorization", "Bearer "+tok)
	h.ServeHTTP(httptest.NewRecorder(), r)
	// The bucket refills at 1/s: a claim per second goes through.
	benchClaims(b, h, tok, http.StatusTooManyRequests, http.StatusCreated)
}

// BenchmarkLifecycleHTTP runs what `loadgen -mode lifecycle` sends (a claim
// of a fresh key, then its complete with the loadgen's body) through the
// router wired as package server wires it, without the network: one op is
// two requests. Run with -benchmem -cpuprofile to see the HTTP layer's own
// cost beside the store's. It needs TEST_DATABASE_URL.
func BenchmarkLifecycleHTTP(b *testing.B) {
	h, tok := benchRouter(b, idem.SettingsPatch{})
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		key := "/v1/keys/k-" + strconv.Itoa(i)
		r := httptest.NewRequest(http.MethodPost, key+"/claim", bytes.NewReader(benchClaimBody))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Authorization", "Bearer "+tok)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusCreated {
			b.Fatalf("claim: status %d: %s", w.Code, w.Body)
		}
		var claimed struct {
			FencingToken int64 `json:"fencing_token"`
		}
		if err := json.Unmarshal(w.Body.Bytes(), &claimed); err != nil {
			b.Fatal(err)
		}
		body := fmt.Appendf(nil, `{"fencing_token":%d,"response":{"status":201,"headers":{"Content-Type":"application/json"},"body":"{\"id\":\"ord_1\"}"}}`, claimed.FencingToken)
		r = httptest.NewRequest(http.MethodPost, key+"/complete", bytes.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Authorization", "Bearer "+tok)
		w = httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusOK {
			b.Fatalf("complete: status %d: %s", w.Code, w.Body)
		}
	}
}

// BenchmarkReplayHTTP runs what `loadgen -mode replay` sends (claims of a
// completed key, each answered with the stored response) through the
// router wired as package server wires it, without the network. Run with
// -benchmem -cpuprofile for the replay handler's own cost beside the
// store's one read. It needs TEST_DATABASE_URL.
func BenchmarkReplayHTTP(b *testing.B) {
	h, tok := benchRouter(b, idem.SettingsPatch{})
	send := func(path string, body []byte) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Authorization", "Bearer "+tok)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	w := send("/v1/keys/done/claim", benchClaimBody)
	if w.Code != http.StatusCreated {
		b.Fatalf("claim: status %d: %s", w.Code, w.Body)
	}
	var claimed struct {
		FencingToken int64 `json:"fencing_token"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &claimed); err != nil {
		b.Fatal(err)
	}
	body := fmt.Appendf(nil, `{"fencing_token":%d,"response":{"status":201,"headers":{"Content-Type":"application/json"},"body":"{\"id\":\"ord_1\"}"}}`, claimed.FencingToken)
	if w := send("/v1/keys/done/complete", body); w.Code != http.StatusOK {
		b.Fatalf("complete: status %d: %s", w.Code, w.Body)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if w := send("/v1/keys/done/claim", benchClaimBody); w.Code != http.StatusOK {
			b.Fatalf("replay: status %d: %s", w.Code, w.Body)
		}
	}
}
