package idemhttp_test

import (
	"context"
	"encoding/json"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/client/frontdoor"
	"github.com/idem-dev/idem/client/idemhttp"
	"github.com/idem-dev/idem/testkit/servertest"
)

// requireProblem checks that r is the problem+json of code, not
// retryable, without Retry-After, and returns its body.
func requireProblem(t *testing.T, r reply, status int, code frontdoor.Code, retryable bool) frontdoor.Problem {
	t.Helper()
	require.Equal(t, status, r.status, r.body)
	require.Equal(t, "application/problem+json", r.header.Get("Content-Type"))
	var p frontdoor.Problem
	require.NoError(t, json.Unmarshal([]byte(r.body), &p))
	require.Equal(t, code, p.Code)
	require.Equal(t, retryable, p.Retryable)
	require.Equal(t, retryable, r.header.Get("Retry-After") != "", "Retry-After only when retryable: %q", r.header.Get("Retry-After"))
	return p
}

// TestMiddlewareTenantUnknown: an operator disables the middleware's
// tenant (the admin API); idem refuses its claims 403 tenant_unknown, and
// the middleware answers 403 tenant_unknown, not retryable, without
// Retry-After, with the fixed detail, the handler not run and nothing
// claimed. Once the tenant is enabled again, the same key runs the handler
// once and its retry is a replay. Before, the refusal fell into the
// fail-closed branch: 503 store_unavailable with Retry-After, telling
// every caller to retry for as long as the tenant stayed disabled (issue
// 21, hole 2's class in the SDK front doors).
func TestMiddlewareTenantUnknown(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, srv *servertest.Server, c *client.Client) {
		ctx := t.Context()
		admin, err := client.New(srv.URL(), client.WithToken(srv.Token(t, "", "admin")))
		require.NoError(t, err)
		a := newApp(t, c, idemhttp.Options{})
		url := a.srv.URL + "/orders/cus_1"

		require.NoError(t, admin.DisableTenant(ctx, "shop"))
		for range 2 {
			got := post(t, url, "k-suspended", `{}`)
			p := requireProblem(t, got, http.StatusForbidden, frontdoor.CodeTenantUnknown, false)
			require.Equal(t, frontdoor.TenantUnknownDetail, p.Detail)
			require.Equal(t, "Tenant unknown", p.Title)
		}
		require.Zero(t, a.entered.Load(), "the handler must not run")

		_, err = admin.AdminUpdateTenant(ctx, "shop", client.TenantPatch{Disabled: client.Ptr(false)})
		require.NoError(t, err)
		_, err = c.Get(ctx, "k-suspended")
		require.ErrorIs(t, err, client.ErrKeyNotFound, "nothing was claimed while the tenant was disabled")
		first := post(t, url, "k-suspended", `{}`)
		require.Equal(t, http.StatusCreated, first.status, first.body)
		again := post(t, url, "k-suspended", `{}`)
		require.Equal(t, http.StatusCreated, again.status, again.body)
		require.Equal(t, "true", again.header.Get(idemhttp.HeaderReplayed))
		require.Equal(t, first.body, again.body)
		require.Equal(t, int64(1), a.orders.Load(), "the key ran the handler once")
	})
}

// TestMiddlewareTokenRefusedIsRetryable pins the decision for idem's
// refusals of the middleware's own token (docs/frontdoor.md rule 5): 401
// unauthenticated (expired, a rotated secret, a token of a deleted tenant)
// and 403 forbidden (without keys:write) are a fault of the service's
// credentials, not of the caller's request, and a rotation fixes them, so
// the caller gets the retryable 503 store_unavailable with Retry-After
// (never a 401 or 403 that would blame its own credentials), the handler
// not run and nothing claimed; once the token source hands out a good
// token, the same request with the same key runs once. (This pins the
// behaviour the SDKs had; it passed before the tenant_unknown change too.)
func TestMiddlewareTokenRefusedIsRetryable(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, srv *servertest.Server, _ *client.Client) {
		good := srv.Token(t, "shop", "keys:write")
		var tok atomic.Pointer[string]
		c, err := client.New(srv.URL(), client.WithTokenSource(func(context.Context) (string, error) { return *tok.Load(), nil }),
			client.WithRetryPolicy(client.RetryPolicy{BaseDelay: 20 * time.Millisecond, RetryAfterJitter: 50 * time.Millisecond}))
		require.NoError(t, err)
		a := newApp(t, c, idemhttp.Options{UnavailableRetryAfter: 2 * time.Second})
		url := a.srv.URL + "/orders/cus_1"

		for _, bad := range []string{"not-a-jwt", srv.Token(t, "shop", "keys:read")} {
			tok.Store(&bad)
			got := post(t, url, "k-rotated", `{}`)
			requireProblem(t, got, http.StatusServiceUnavailable, frontdoor.CodeStoreUnavailable, true)
			require.Equal(t, "2", got.header.Get("Retry-After"))
		}
		require.Zero(t, a.entered.Load(), "the handler must not run")

		tok.Store(&good)
		first := post(t, url, "k-rotated", `{}`)
		require.Equal(t, http.StatusCreated, first.status, first.body)
		again := post(t, url, "k-rotated", `{}`)
		require.Equal(t, "true", again.header.Get(idemhttp.HeaderReplayed))
		require.Equal(t, int64(1), a.orders.Load(), "the key ran the handler once")
	})
}
