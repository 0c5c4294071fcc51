package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/api"
	"github.com/idem-dev/idem/auth"
	"github.com/idem-dev/idem/canon"
	"github.com/idem-dev/idem/sqlite"
	"github.com/idem-dev/idem/tenants"
)

// fuzzEndpoints are the JSON endpoints FuzzRequestDecoding sends bodies to.
// For the key endpoints other than claim, a fresh key is claimed first so
// the body meets a live record with fencing token 1.
var fuzzEndpoints = []struct {
	method, path string
	admin, claim bool
}{
	{http.MethodPost, "/v1/keys/%s/claim", false, false},
	{http.MethodPost, "/v1/keys/%s/checkpoint", false, true},
	{http.MethodPost, "/v1/keys/%s/complete", false, true},
	{http.MethodPost, "/v1/keys/%s/release", false, true},
	{http.MethodPatch, "/v1/tenant", false, false},
	{http.MethodPost, "/v1/admin/tenants", true, false},
	{http.MethodPatch, "/v1/admin/tenants/fuzz", true, false},
}

// FuzzRequestDecoding sends arbitrary bodies (and, for claims, arbitrary
// keys) through the API's decode path — size limit, content type, JSON
// decoding, I-JSON check, binding, validation — into a real SQLite store.
// It checks that nothing answers 5xx, that every error is problem+json with
// a code, and that whatever was accepted and stored passes the root
// package's rules (so no store can meet text it refuses, like a NUL on
// PostgreSQL). Seeds: testdata/fuzz/FuzzRequestDecoding.
func FuzzRequestDecoding(f *testing.F) {
	seeds := []struct {
		endpoint uint8
		key      string
		body     string
	}{
		{0, "order-1", `{"operation":"POST /v1/payments","request":{"amount":1000,"currency":"usd"}}`},
		{0, "order-2", `{"fingerprint":"v1:abc","lease_seconds":30}`},
		{0, "k", `{"request":{"amount":1000,"amount":1}}`},
		{0, "k", "{\"request\":{\"name\":\"\xff\"}}"},
		{0, "k", `{"operation":"a\u0000b"}`},
		{0, "k%2Fx", ``},
		{0, "", `{}`},
		{1, "", `{"fencing_token":1,"recovery_point":"charge_created","data":{"charge_id":"ch_1"}}`},
		{1, "", `{"fencing_token":1,"recovery_point":"p\u0000"}`},
		{2, "", `{"fencing_token":1,"response":{"status":201,"headers":{"Content-Type":"application/json"},"body":"{\"id\":1}"}}`},
		{2, "", `{"fencing_token":1,"response":{"status":200,"body":"AAEC","body_encoding":"base64"}}`},
		{2, "", `{"fencing_token":1,"response":{"status":200,"headers":{"X":"a\r\nb"}}}`},
		{3, "", `{"fencing_token":1}`},
		{4, "", `{"name":"Acme","settings":{"lease_seconds_max":60,"lease_seconds_default":30}}`},
		{5, "", `{"id":"t1","name":"T\u0000"}`},
		{6, "", `{"disabled":false,"settings":{"rate_limit_per_second":0}}`},
	}
	for _, s := range seeds {
		f.Add(s.endpoint, s.key, []byte(s.body))
	}

	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(f.TempDir(), "idem.db"), sqlite.Options{})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = st.Close() })
	ts := tenants.NewService(st, 0)
	for _, id := range []string{"acme", "fuzz"} {
		if _, err := ts.Create(ctx, id, id, idem.SettingsPatch{}); err != nil {
			f.Fatal(err)
		}
	}
	secret := []byte("fuzz-secret-fuzz-secret-fuzz-secret!")
	v, err := auth.NewVerifier(auth.Config{HS256Secret: secret, Issuer: testIssuer, Audience: testAudience})
	if err != nil {
		f.Fatal(err)
	}
	mint := func(tenant string, scopes ...string) string {
		tok, err := auth.MintHS256(secret, auth.MintClaims{Issuer: testIssuer, Audience: testAudience, Tenant: tenant, Scopes: scopes, TTL: 24 * time.Hour})
		if err != nil {
			f.Fatal(err)
		}
		return tok
	}
	tenantTok := mint("acme", auth.ScopeKeysWrite, auth.ScopeTenantAdmin)
	adminTok := mint("", auth.ScopeAdmin)
	h := api.New(api.Options{Store: st, Tenants: ts, Verifier: v, MaxBodyBytes: testMaxBody})
	var seq atomic.Int64

	serve := func(method, path, tok string, body []byte) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, path, bytes.NewReader(body))
		r.Header.Set("Authorization", "Bearer "+tok)
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}

	f.Fuzz(func(t *testing.T, endpoint uint8, key string, body []byte) {
		ep := fuzzEndpoints[int(endpoint)%len(fuzzEndpoints)]
		tok := tenantTok
		if ep.admin {
			tok = adminTok
		}
		if !ep.claim {
			// A fresh key unless the fuzzer's key is used.
			key = url.PathEscape(key)
		} else {
			key = fmt.Sprintf("fz-%d", seq.Add(1))
			if w := serve(http.MethodPost, "/v1/keys/"+key+"/claim", tenantTok, nil); w.Code != http.StatusCreated {
				t.Fatalf("claim %s: %d %s", key, w.Code, w.Body)
			}
		}
		path := ep.path
		if bytes.Contains([]byte(path), []byte("%s")) {
			path = fmt.Sprintf(path, key)
		}
		w := serve(ep.method, path, tok, body)
		if w.Code >= 500 {
			t.Fatalf("%s %s %q: %d %s", ep.method, path, body, w.Code, w.Body)
		}
		if w.Code >= 400 {
			var p struct {
				Code   string `json:"code"`
				Status int    `json:"status"`
			}
			if w.Header().Get("Content-Type") != "application/problem+json" || json.Unmarshal(w.Body.Bytes(), &p) != nil || p.Code == "" || p.Status != w.Code {
				t.Fatalf("%s %s %q: %d is not a problem: %s", ep.method, path, body, w.Code, w.Body)
			}
			return
		}
		// Accepted: the body was I-JSON and what was stored passes the rules.
		if len(bytes.TrimSpace(body)) > 0 {
			if err := canon.CheckIJSON(body); err != nil {
				t.Fatalf("%s %s accepted non-I-JSON %q: %v", ep.method, path, body, err)
			}
		}
		if ep.path[:8] == "/v1/keys" && w.Code != http.StatusNoContent {
			unescaped, err := url.PathUnescape(key)
			if err != nil {
				t.Fatalf("accepted key %q does not unescape: %v", key, err)
			}
			rec, err := st.GetRecord(ctx, idem.GetRecordParams{TenantID: "acme", Key: unescaped})
			if err != nil {
				t.Fatalf("%s %s answered %d but the record is not there: %v", ep.method, path, w.Code, err)
			}
			checkStored(t, rec)
		} else if ep.path != "/v1/keys/%s/release" {
			list, err := st.ListTenants(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, tn := range list {
				if err := idem.ValidateTenantName(tn.Name); err != nil {
					t.Fatalf("stored tenant %s has name %q: %v", tn.ID, tn.Name, err)
				}
			}
		}
	})
}

// checkStored fails when a stored record holds text the rules refuse.
func checkStored(t *testing.T, rec idem.Record) {
	t.Helper()
	errs := []error{idem.ValidateKey(rec.Key), idem.ValidateOperation(rec.Operation)}
	if rec.Fingerprint != "" {
		errs = append(errs, idem.ValidateFingerprint(rec.Fingerprint))
	}
	if rec.RecoveryPoint != "" {
		errs = append(errs, idem.ValidateRecoveryPoint(rec.RecoveryPoint))
	}
	if len(rec.RecoveryData) > 0 {
		errs = append(errs, canon.CheckIJSON(rec.RecoveryData))
	}
	if rec.Response != nil {
		errs = append(errs, idem.ValidateResponseHeaders(rec.Response.Headers))
	}
	for _, err := range errs {
		if err != nil {
			t.Fatalf("stored record %q breaks a rule: %v", rec.Key, err)
		}
	}
}
