package api_test

import (
	"context"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/auth"
	"github.com/idem-dev/idem/tenants"
)

func TestAsymmetricTokensAccepted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := b.keys
	for _, tc := range []struct {
		name   string
		method jwt.SigningMethod
		key    any
		kid    string
	}{
		{"EdDSA", jwt.SigningMethodEdDSA, k.ed, "ed"},
		{"ES256", jwt.SigningMethodES256, k.ec, "ec"},
		{"RS256", jwt.SigningMethodRS256, k.rsa, "rsa"},
	} {
		tok := signed(t, tc.method, tc.key, tc.kid, validClaims("acme", "keys:read"))
		r := b.req(t, http.MethodGet, "/v1/keys", tok, nil)
		require.Equal(t, http.StatusOK, r.status, "%s: %s", tc.name, r.body)
	}
}

func TestTokenAttacks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := b.keys
	edPub := k.ed.Public().(ed25519.PublicKey)
	der, err := x509.MarshalPKIXPublicKey(edPub)
	require.NoError(t, err)
	pemBytes := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
	ecBytes, err := k.ec.PublicKey.Bytes()
	require.NoError(t, err)

	exp := func(mod func(jwt.MapClaims)) jwt.MapClaims {
		c := validClaims("acme", "keys:write")
		mod(c)
		return c
	}
	noneToken := func() string {
		s, err := jwt.NewWithClaims(jwt.SigningMethodNone, validClaims("acme", "keys:write")).SignedString(jwt.UnsafeAllowNoneSignatureType)
		require.NoError(t, err)
		return s
	}
	// A header alg:none with an empty signature, hand-made.
	hdr := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","typ":"JWT"}`))
	payload, err := json.Marshal(validClaims("acme", "keys:write"))
	require.NoError(t, err)
	handNone := hdr + "." + base64.RawURLEncoding.EncodeToString(payload) + "."

	cases := []struct {
		name  string
		token string
	}{
		{"garbage", "not-a-jwt"},
		{"alg none", noneToken()},
		{"alg none by hand", handNone},
		{"HS256 with the Ed25519 raw public key", signed(t, jwt.SigningMethodHS256, []byte(edPub), "ed", validClaims("acme", "keys:write"))},
		{"HS256 with the PEM public key", signed(t, jwt.SigningMethodHS256, pemBytes, "ed", validClaims("acme", "keys:write"))},
		{"HS256 with the EC point", signed(t, jwt.SigningMethodHS256, ecBytes, "ec", validClaims("acme", "keys:write"))},
		{"HS256 with the wrong secret", signed(t, jwt.SigningMethodHS256, []byte(strings.Repeat("s", 40)), "", validClaims("acme", "keys:write"))},
		{"HS384 with the right secret", signed(t, jwt.SigningMethodHS384, b.secret, "", validClaims("acme", "keys:write"))},
		{"RS256 with an unknown kid", signed(t, jwt.SigningMethodRS256, k.rsa, "other", validClaims("acme", "keys:write"))},
		{"ES256 key used for RS256", signed(t, jwt.SigningMethodRS256, k.rsa, "ec", validClaims("acme", "keys:write"))},
		{"RSA key used as PS256", signed(t, jwt.SigningMethodPS256, k.rsa, "rsa", validClaims("acme", "keys:write"))},
		{"expired", signed(t, jwt.SigningMethodHS256, b.secret, "", exp(func(c jwt.MapClaims) { c["exp"] = time.Now().Add(-time.Minute).Unix() }))},
		{"no exp", signed(t, jwt.SigningMethodHS256, b.secret, "", exp(func(c jwt.MapClaims) { delete(c, "exp") }))},
		{"no iat", signed(t, jwt.SigningMethodHS256, b.secret, "", exp(func(c jwt.MapClaims) { delete(c, "iat") }))},
		{"issued before the tenant", signed(t, jwt.SigningMethodHS256, b.secret, "", exp(func(c jwt.MapClaims) { c["iat"] = time.Now().Add(-24 * time.Hour).Unix() }))},
		{"not yet valid", signed(t, jwt.SigningMethodHS256, b.secret, "", exp(func(c jwt.MapClaims) { c["nbf"] = time.Now().Add(time.Minute).Unix() }))},
		{"wrong aud", signed(t, jwt.SigningMethodHS256, b.secret, "", exp(func(c jwt.MapClaims) { c["aud"] = "someone-else" }))},
		{"no aud", signed(t, jwt.SigningMethodHS256, b.secret, "", exp(func(c jwt.MapClaims) { delete(c, "aud") }))},
		{"wrong iss", signed(t, jwt.SigningMethodHS256, b.secret, "", exp(func(c jwt.MapClaims) { c["iss"] = "evil" }))},
		{"tampered payload", func() string {
			parts := strings.Split(b.token(t, "acme", "keys:read"), ".")
			forged, _ := json.Marshal(validClaims("globex", "keys:write admin"))
			parts[1] = base64.RawURLEncoding.EncodeToString(forged)
			return strings.Join(parts, ".")
		}()},
	}
	for _, tc := range cases {
		r := b.req(t, http.MethodPost, "/v1/keys/k/claim", tc.token, nil)
		requireProblem(t, r, http.StatusUnauthorized, idem.CodeUnauthenticated, false)
		require.Contains(t, r.header.Get("WWW-Authenticate"), "Bearer", tc.name)
	}

	// Within the 30 s leeway an expired token still passes.
	tok := signed(t, jwt.SigningMethodHS256, b.secret, "", exp(func(c jwt.MapClaims) { c["exp"] = time.Now().Add(-10 * time.Second).Unix() }))
	r := b.req(t, http.MethodPost, "/v1/keys/k/claim", tok, nil)
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)

	// Missing or non-bearer Authorization.
	r = b.req(t, http.MethodGet, "/v1/keys", "", nil)
	requireProblem(t, r, http.StatusUnauthorized, idem.CodeUnauthenticated, false)
	r = b.req(t, http.MethodGet, "/v1/keys", "", nil, "Authorization", "Basic dXNlcjpwYXNz")
	requireProblem(t, r, http.StatusUnauthorized, idem.CodeUnauthenticated, false)
}

func TestScopesAndTenants(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	disabled := true
	_, err := b.tenants.Update(ctx, "globex", tenants.Patch{Disabled: &disabled})
	require.NoError(t, err)

	cases := []struct {
		name         string
		token        string
		method, path string
		status       int
		code         idem.Code
	}{
		{"read scope cannot claim", b.token(t, "acme", auth.ScopeKeysRead), http.MethodPost, "/v1/keys/k/claim", 403, idem.CodeForbidden},
		{"tenant admin cannot claim", b.token(t, "acme", auth.ScopeTenantAdmin), http.MethodPost, "/v1/keys/k/claim", 403, idem.CodeForbidden},
		{"admin cannot claim", b.token(t, "acme", auth.ScopeAdmin), http.MethodPost, "/v1/keys/k/claim", 403, idem.CodeForbidden},
		{"keys:write cannot patch tenant", b.token(t, "acme", auth.ScopeKeysWrite), http.MethodPatch, "/v1/tenant", 403, idem.CodeForbidden},
		{"keys:write cannot use admin", b.token(t, "acme", auth.ScopeKeysWrite, auth.ScopeTenantAdmin), http.MethodGet, "/v1/admin/tenants", 403, idem.CodeForbidden},
		{"no scope", b.token(t, "acme"), http.MethodGet, "/v1/tenant", 403, idem.CodeForbidden},
		{"unknown tenant", b.token(t, "nobody", auth.ScopeKeysWrite), http.MethodPost, "/v1/keys/k/claim", 403, idem.CodeTenantUnknown},
		{"disabled tenant", b.token(t, "globex", auth.ScopeKeysWrite), http.MethodPost, "/v1/keys/k/claim", 403, idem.CodeTenantUnknown},
		{"no tenant", b.token(t, "", auth.ScopeKeysRead), http.MethodGet, "/v1/keys", 403, idem.CodeTenantUnknown},
		{"admin: no such tenant", b.token(t, "", auth.ScopeAdmin), http.MethodGet, "/v1/admin/tenants/nobody", 404, idem.CodeTenantNotFound},
	}
	for _, tc := range cases {
		r := b.req(t, tc.method, tc.path, tc.token, nil)
		require.Equal(t, tc.status, r.status, "%s: %s", tc.name, r.body)
		require.Equal(t, string(tc.code), r.json(t)["code"], tc.name)
	}

	// keys:write implies keys:read; GET /v1/tenant takes keys:read or
	// tenant:admin.
	for _, tok := range []string{
		b.token(t, "acme", auth.ScopeKeysWrite),
		b.token(t, "acme", auth.ScopeKeysRead),
		b.token(t, "acme", auth.ScopeTenantAdmin),
	} {
		r := b.req(t, http.MethodGet, "/v1/tenant", tok, nil)
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	}
	r := b.req(t, http.MethodGet, "/v1/keys/k", b.token(t, "acme", auth.ScopeKeysWrite), nil)
	requireProblem(t, r, http.StatusNotFound, idem.CodeKeyNotFound, false)
}

func TestOwnTenantSettings(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tok := b.token(t, "acme", auth.ScopeTenantAdmin, auth.ScopeKeysWrite)

	r := b.req(t, http.MethodGet, "/v1/tenant", tok, nil)
	require.Equal(t, http.StatusOK, r.status)
	ten := r.json(t)
	require.Equal(t, "acme", ten["id"])
	require.Equal(t, "acme inc", ten["name"])
	require.Equal(t, false, ten["disabled"])
	require.Equal(t, map[string]any{
		"replay_window_seconds": float64(86400), "reaper_threshold_seconds": float64(259200),
		"lease_seconds_default": float64(30), "lease_seconds_max": float64(3600),
		"max_response_bytes": float64(1048576), "rate_limit_per_second": float64(0), "max_wait_seconds": float64(20),
		"storage_quota_bytes": float64(1 << 30), "retry_budget_percent": float64(10),
	}, ten["settings"])
	require.Equal(t, map[string]any{"stored_bytes": float64(0)}, ten["usage"])

	bad := []struct{ body, field string }{
		{`{"settings":{"replay_window_seconds":0}}`, "settings.replay_window_seconds"},
		{`{"settings":{"replay_window_seconds":300000}}`, "settings.reaper_threshold_seconds"},
		{`{"settings":{"lease_seconds_default":4000}}`, "settings.lease_seconds_default"},
		{`{"settings":{"lease_seconds_max":86401}}`, "settings.lease_seconds_max"},
		{`{"settings":{"max_response_bytes":8388609}}`, "settings.max_response_bytes"},
		{`{"settings":{"rate_limit_per_second":-1}}`, "settings.rate_limit_per_second"},
		{`{"settings":{"max_wait_seconds":301}}`, "settings.max_wait_seconds"},
		{`{"settings":{"retry_budget_percent":101}}`, "settings.retry_budget_percent"},
		{`{"settings":{"retry_budget_percent":-1}}`, "settings.retry_budget_percent"},
		{`{"settings":{"storage_quota_bytes":1048575}}`, "settings.storage_quota_bytes"},
		{`{"settings":{"storage_quota_bytes":1099511627777}}`, "settings.storage_quota_bytes"},
		{`{"settings":{"max_response_bytes":2000000,"storage_quota_bytes":1500000}}`, "settings.storage_quota_bytes"},
		{`{"settings":{"lease_seconds_max":1.5}}`, "settings.lease_seconds_max"},
		{`{"settings":{"lease_seconds_max":"10"}}`, "settings.lease_seconds_max"},
		{`{"settings":{"speed":1}}`, "speed"},
		{`{"disabled":true}`, "disabled"},
		{`{"name":"` + strings.Repeat("n", 257) + `"}`, "name"},
	}
	for _, tc := range bad {
		r := b.req(t, http.MethodPatch, "/v1/tenant", tok, tc.body)
		p := requireProblem(t, r, http.StatusBadRequest, idem.CodeInvalidRequest, false)
		requireField(t, p, tc.field)
	}

	r = b.req(t, http.MethodPatch, "/v1/tenant", tok, map[string]any{"settings": map[string]any{"lease_seconds_default": 5, "lease_seconds_max": 10}})
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	s := r.json(t)["settings"].(map[string]any)
	require.Equal(t, float64(5), s["lease_seconds_default"])
	require.Equal(t, float64(86400), s["replay_window_seconds"])

	// The change applies to the next claim on this replica at once.
	r = b.req(t, http.MethodPost, "/v1/keys/k/claim", tok, map[string]any{"lease_seconds": 11})
	p := requireProblem(t, r, http.StatusBadRequest, idem.CodeInvalidRequest, false)
	requireField(t, p, "lease_seconds")
	r = b.req(t, http.MethodPost, "/v1/keys/k/claim", tok, nil)
	require.Equal(t, http.StatusCreated, r.status)
	lease, err := time.Parse(time.RFC3339Nano, r.json(t)["lease_expires_at"].(string))
	require.NoError(t, err)
	require.WithinDuration(t, b.clock.Now().Add(5*time.Second), lease, 2*time.Second)
}

func TestAdminTenants(t *testing.T) {
	t.Parallel()
	b := setup(t)
	admin := b.token(t, "", auth.ScopeAdmin)

	r := b.req(t, http.MethodPost, "/v1/admin/tenants", admin, map[string]any{"id": "initech", "name": "Initech", "settings": map[string]any{"replay_window_seconds": 60}})
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	ten := r.json(t)
	require.Equal(t, "initech", ten["id"])
	require.Equal(t, float64(60), ten["settings"].(map[string]any)["replay_window_seconds"])
	_, err := time.Parse(time.RFC3339Nano, ten["created_at"].(string))
	require.NoError(t, err)

	r = b.req(t, http.MethodPost, "/v1/admin/tenants", admin, map[string]any{"id": "initech"})
	requireProblem(t, r, http.StatusConflict, idem.CodeTenantExists, false)
	for body, field := range map[string]string{
		`{"id":"Bad Id"}`: "id", `{}`: "id", `{"id":"x","settings":{"lease_seconds_max":0}}`: "settings.lease_seconds_max",
	} {
		r = b.req(t, http.MethodPost, "/v1/admin/tenants", admin, body)
		p := requireProblem(t, r, http.StatusBadRequest, idem.CodeInvalidRequest, false)
		requireField(t, p, field)
	}

	r = b.req(t, http.MethodGet, "/v1/admin/tenants", admin, nil)
	require.Equal(t, http.StatusOK, r.status)
	var ids []string
	for _, it := range r.json(t)["items"].([]any) {
		ids = append(ids, it.(map[string]any)["id"].(string))
	}
	require.Equal(t, []string{"acme", "globex", "initech"}, ids)

	r = b.req(t, http.MethodGet, "/v1/admin/tenants/initech", admin, nil)
	require.Equal(t, "Initech", r.json(t)["name"])

	r = b.req(t, http.MethodPatch, "/v1/admin/tenants/initech", admin, map[string]any{"name": "Initech Corp", "settings": map[string]any{"rate_limit_per_second": 5}})
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	require.Equal(t, "Initech Corp", r.json(t)["name"])

	// The tenant works, then disabling it refuses its tokens.
	user := b.token(t, "initech", auth.ScopeKeysWrite)
	b.claim(t, user, "k", nil)
	r = b.req(t, http.MethodPatch, "/v1/admin/tenants/initech", admin, map[string]any{"disabled": true})
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	r = b.req(t, http.MethodPost, "/v1/keys/k2/claim", user, nil)
	requireProblem(t, r, http.StatusForbidden, idem.CodeTenantUnknown, false)
	r = b.req(t, http.MethodGet, "/v1/admin/tenants/initech", admin, nil)
	require.Equal(t, true, r.json(t)["disabled"])

	// Re-enable.
	r = b.req(t, http.MethodPatch, "/v1/admin/tenants/initech", admin, map[string]any{"disabled": false})
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	b.claim(t, user, "k3", nil)

	// DELETE removes the tenant: its tokens are refused and the id is unknown.
	r = b.req(t, http.MethodDelete, "/v1/admin/tenants/initech", admin, nil)
	require.Equal(t, http.StatusNoContent, r.status, "body: %s", r.body)
	r = b.req(t, http.MethodPost, "/v1/keys/k4/claim", user, nil)
	requireProblem(t, r, http.StatusForbidden, idem.CodeTenantUnknown, false)
	r = b.req(t, http.MethodGet, "/v1/admin/tenants/initech", admin, nil)
	requireProblem(t, r, http.StatusNotFound, idem.CodeTenantNotFound, false)

	r = b.req(t, http.MethodDelete, "/v1/admin/tenants/nobody", admin, nil)
	requireProblem(t, r, http.StatusNotFound, idem.CodeTenantNotFound, false)
	r = b.req(t, http.MethodPatch, "/v1/admin/tenants/nobody", admin, map[string]any{})
	requireProblem(t, r, http.StatusNotFound, idem.CodeTenantNotFound, false)
}

func TestAdminOrphansPagination(t *testing.T) {
	t.Parallel()
	b := setup(t)
	admin := b.token(t, "", auth.ScopeAdmin)
	for i, tenant := range []string{"acme", "globex", "acme"} {
		tok := b.token(t, tenant, auth.ScopeKeysWrite)
		b.claim(t, tok, "o"+string(rune('0'+i)), map[string]any{"lease_seconds": 1 + i})
	}
	b.clock.Advance(10 * time.Second)

	var got []string
	cursor := ""
	for {
		r := b.req(t, http.MethodGet, "/v1/admin/orphans?limit=1&cursor="+cursor, admin, nil)
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		page := r.json(t)
		for _, it := range page["items"].([]any) {
			item := it.(map[string]any)
			require.NotContains(t, item, "response")
			got = append(got, item["tenant"].(string)+"/"+item["key"].(string))
		}
		if page["next_cursor"] == nil {
			break
		}
		cursor = page["next_cursor"].(string)
	}
	require.Equal(t, []string{"acme/o0", "globex/o1", "acme/o2"}, got)

	r := b.req(t, http.MethodGet, "/v1/admin/orphans?tenant=Bad!", admin, nil)
	p := requireProblem(t, r, http.StatusBadRequest, idem.CodeInvalidRequest, false)
	requireField(t, p, "tenant")
}

func TestNotFoundRoute(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.req(t, http.MethodGet, "/v2/nothing", "", nil)
	require.Equal(t, http.StatusNotFound, r.status)
	require.Equal(t, "application/problem+json", r.header.Get("Content-Type"))
}
