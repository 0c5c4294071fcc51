package gateway_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/client/frontdoor"
)

// patchTenant changes the gateway's tenant through the admin API, as an
// operator or the tenant's admin would while the gateway runs.
func (r *rig) patchTenant(t *testing.T, body string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPatch, r.idem.URL()+"/v1/admin/tenants/"+tenant, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+r.idem.Token(t, "", "admin"))
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
}

// requireProblem asserts the exact status, code and retryability of a
// problem answer, and that Retry-After comes with the retryable ones only.
func requireProblem(t *testing.T, got reply, status int, code frontdoor.Code, retryable bool) map[string]any {
	t.Helper()
	require.Equal(t, status, got.status, got.body)
	require.Equal(t, string(code), got.code(t), got.body)
	p := decode(t, got.body)
	require.Equal(t, retryable, p["retryable"], got.body)
	if retryable {
		require.NotEmpty(t, got.header.Get("Retry-After"))
	} else {
		require.Empty(t, got.header.Get("Retry-After"))
	}
	return p
}

// TestTenantRefusalNeverFailsOpen: the gateway's tenant is disabled while
// the gateway runs. That is idem refusing (the store is up), not a store
// failure: every protected request gets 403 tenant_unknown, not
// retryable, and none reaches the upstream — on a fail_open route too.
// Before, the refusal took the store-failure branch: a fail_open route
// sent each request upstream unprotected (the same key twice: two
// upstream calls), a fail-closed one answered 503 store_unavailable,
// retryable, for as long as the tenant stayed disabled.
func TestTenantRefusalNeverFailsOpen(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		r := newRig(t, backend, "routes:\n  - path: /orders/open\n    fail_open: true\n")
		require.Equal(t, http.StatusCreated, send(t, http.MethodPost, r.url+"/orders/open", "before-1", `{}`).status)
		require.EqualValues(t, 1, r.upstream.Count())

		r.patchTenant(t, `{"disabled":true}`)
		for range 2 {
			open := send(t, http.MethodPost, r.url+"/orders/open", "off-1", `{}`)
			requireProblem(t, open, http.StatusForbidden, frontdoor.CodeTenantUnknown, false)
			closed := send(t, http.MethodPost, r.url+"/orders", "off-2", `{}`)
			requireProblem(t, closed, http.StatusForbidden, frontdoor.CodeTenantUnknown, false)
		}
		require.EqualValues(t, 1, r.upstream.Count(), "no refused request reached the upstream")

		r.patchTenant(t, `{"disabled":false}`)
		again := send(t, http.MethodPost, r.url+"/orders/open", "before-1", `{}`)
		require.Equal(t, "true", again.header.Get(frontdoor.HeaderReplayed), "re-enabled, the tenant's records replay: %s", again.body)
		require.Equal(t, http.StatusCreated, send(t, http.MethodPost, r.url+"/orders/open", "off-1", `{}`).status)
		require.EqualValues(t, 2, r.upstream.Count())
	})
}

// TestRouteLeaseOverTheTenantsMaxIsClamped: a route's lease is over the
// tenant's lease_seconds_max, lowered by the tenant's admin while the
// gateway runs. The route stays protected: its claims take the tenant's
// maximum (the lease is renewed while the upstream works, so a long call
// is not cut short), and the same key twice calls the upstream once.
// Before, idem's refusal of the lease was taken for a store failure: on a
// fail_open route each request went upstream unprotected (two calls for
// one key), on a fail-closed one every request got 503 store_unavailable.
func TestRouteLeaseOverTheTenantsMaxIsClamped(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		r := newRig(t, backend, "routes:\n  - path: /orders/open\n    lease: 2m\n    fail_open: true\n  - path: /orders/closed\n    lease: 2m\n")
		r.patchTenant(t, `{"settings":{"lease_seconds_max":60}}`)

		release := r.upstream.Hold()
		t.Cleanup(release) // before the servers close, should the test fail
		done := make(chan reply, 1)
		go func() { done <- send(t, http.MethodPost, r.url+"/orders/open", "lease-1", `{}`) }()
		require.Eventually(t, func() bool { return r.upstream.Entered() == 1 }, 10*time.Second, 5*time.Millisecond)
		rec, err := r.idem.Store().GetRecord(context.Background(), idem.GetRecordParams{TenantID: tenant, Key: "lease-1"})
		require.NoError(t, err)
		require.Equal(t, idem.StateInFlight, rec.State)
		require.LessOrEqual(t, rec.LeaseExpiresAt.Sub(rec.ObservedAt), 60*time.Second, "the lease is the tenant's maximum")
		dup := send(t, http.MethodPost, r.url+"/orders/open", "lease-1", `{}`)
		requireProblem(t, dup, http.StatusConflict, frontdoor.CodeRequestInFlight, true)
		release()
		first := <-done
		require.Equal(t, http.StatusCreated, first.status, first.body)
		again := send(t, http.MethodPost, r.url+"/orders/open", "lease-1", `{}`)
		require.Equal(t, "true", again.header.Get(frontdoor.HeaderReplayed), again.body)
		require.Equal(t, first.body, again.body)
		require.EqualValues(t, 1, r.upstream.Count(), "one upstream call for the key")

		for range 2 {
			closed := send(t, http.MethodPost, r.url+"/orders/closed", "lease-2", `{}`)
			require.Equal(t, http.StatusCreated, closed.status, closed.body)
		}
		require.EqualValues(t, 2, r.upstream.Count(), "one upstream call for the key")
	})
}
