package gateway_test

import (
	"net/http"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/client/frontdoor"
)

// TestUnscopedKeyCannotSquatAScopedOne: the record key of alice's key sq
// on a scoped route is alice:sq. Before, an unscoped request (another
// route, or a path no route matches) with Idempotency-Key: alice:sq wrote
// that very record, without any token: alice's own request with sq then
// answered 422 for the replay window (or, with the same body, got the
// squatter's answer). Now an unscoped key with a ':' is refused with 400
// invalid_key before anything is claimed, and no scoped record can be
// written from the unscoped key space.
func TestUnscopedKeyCannotSquatAScopedOne(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		r := newRig(t, backend, "routes:\n  - path: /orders/pay\n    scope_header: X-Account-Id\n  - path: /orders/open\n")
		for _, path := range []string{"/orders/open", "/orders/unmatched"} {
			squat := send(t, http.MethodPost, r.url+path, "alice:sq", `{}`)
			p := requireProblem(t, squat, http.StatusBadRequest, frontdoor.CodeInvalidKey, false)
			require.Contains(t, p["detail"], "':'", path)
		}
		require.EqualValues(t, 0, r.upstream.Count(), "the refused requests did not reach the upstream")
		require.Equal(t, idem.CodeKeyNotFound, r.getRecordErr(t, "alice:sq"), "nothing was claimed")

		own := send(t, http.MethodPost, r.url+"/orders/pay", "sq", `{}`, "X-Account-Id", "alice")
		require.Equal(t, http.StatusCreated, own.status, own.body)
		require.Empty(t, own.header.Get(frontdoor.HeaderReplayed))
		require.Equal(t, "completed", r.apiRecord(t, "alice:sq")["state"])
		require.Equal(t, http.StatusCreated, send(t, http.MethodPost, r.url+"/orders/open", "no-colon", `{}`).status, "unscoped keys without ':' work as before")
		require.EqualValues(t, 2, r.upstream.Count())
	})
}

// TestUnscopedGatewayKeepsColonKeys: a gateway none of whose routes scopes
// keys has no scoped records to guard, so a key with ':' (a key derived
// by joining parts with ':', say) is the record key it always was: run
// once, replayed after.
func TestUnscopedGatewayKeepsColonKeys(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		r := newRig(t, backend, "routes:\n  - path: /orders/open\n")
		first := send(t, http.MethodPost, r.url+"/orders/open", "order-confirm:4711", `{}`)
		require.Equal(t, http.StatusCreated, first.status, first.body)
		again := send(t, http.MethodPost, r.url+"/orders/open", "order-confirm:4711", `{}`)
		require.Equal(t, http.StatusCreated, again.status, again.body)
		require.Equal(t, "true", again.header.Get(frontdoor.HeaderReplayed))
		require.Equal(t, "completed", r.apiRecord(t, "order-confirm:4711")["state"])
		require.EqualValues(t, 1, r.upstream.Count())
	})
}

// TestRouteMatchIgnoresCaseAndTrailingSlash: the route /orders/pay is
// scoped by X-Account-Id. Before, /orders/PAY and /orders/pay/ matched no
// route (ServeMux is exact and case-sensitive), so they fell to the
// defaults and lost the route's scope and policy: a request without the
// scope header ran, under an unscoped key — while many upstreams serve
// those spellings as /orders/pay. Now a route matches its path in any
// case and with or without a trailing slash; the operation is the route's
// pattern, the path sent upstream is the caller's.
func TestRouteMatchIgnoresCaseAndTrailingSlash(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		r := newRig(t, backend, "routes:\n  - path: /orders/pay\n    scope_header: X-Account-Id\n  - path: /orders/Files/\n    required_methods: []\n")
		for _, path := range []string{"/orders/PAY", "/orders/pay/", "/orders/Pay//", "/orders/x/../pay"} {
			noScope := send(t, http.MethodPost, r.url+path, "m-1", `{}`)
			requireProblem(t, noScope, http.StatusBadRequest, frontdoor.CodeInvalidKey, false)
		}
		require.EqualValues(t, 0, r.upstream.Count(), "the route's policy held on every spelling")

		got := send(t, http.MethodPost, r.url+"/orders/PAY/", "m-2", `{}`, "X-Account-Id", "alice")
		require.Equal(t, http.StatusCreated, got.status, got.body)
		rec := r.apiRecord(t, "alice:m-2")
		require.Equal(t, "POST /orders/pay", rec["operation"], "the operation is the route's")
		again := send(t, http.MethodPost, r.url+"/orders/pay", "m-2", `{}`, "X-Account-Id", "alice")
		requireProblem(t, again, http.StatusUnprocessableEntity, frontdoor.CodeFingerprintMismatch, false)
		require.EqualValues(t, 1, r.upstream.Count())

		// A prefix route covers its subtree in any case, and its own path
		// without the slash.
		for _, path := range []string{"/orders/files/a", "/orders/FILES", "/orders/files"} {
			require.Equal(t, http.StatusCreated, send(t, http.MethodPost, r.url+path, "", `{}`).status, path)
		}
		require.EqualValues(t, 4, r.upstream.Count())

		require.NoError(t, os.WriteFile(r.config, []byte("routes:\n  - path: /orders/pay\n  - path: /orders/PAY\n"), 0o600))
		err := r.gw.Reload()
		require.ErrorContains(t, err, "case", "two routes one request could match are refused")
	})
}
