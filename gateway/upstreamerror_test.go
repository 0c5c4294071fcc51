package gateway_test

import (
	"fmt"
	"net"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/client/frontdoor"
)

// TestUpstreamErrorSaysWhetherTheRequestArrived: the 502 of an upstream
// that could not be reached says the request never reached it (a retry
// cannot run it twice); the 502 of one that read the request and dropped
// the connection says it may have acted on it. Before, both said "the
// upstream could not be reached": with store_5xx false, and on a request
// passed through, a caller was told a request that had arrived never
// did, and retried it as harmless.
func TestUpstreamErrorSaysWhetherTheRequestArrived(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		dead := "http://" + ln.Addr().String()
		require.NoError(t, ln.Close())
		up := newFlakyUpstream(t)
		r := newRig(t, backend, fmt.Sprintf("upstreams:\n  dead: %s\n  flaky: %s\nroutes:\n  - path: /dead/\n    upstream: dead\n  - path: /flaky/\n    upstream: flaky\n    store_5xx: false\n  - path: /pass/\n    upstream: flaky\n    required_methods: []\n", dead, up.url))

		unreachable := send(t, http.MethodPost, r.url+"/dead/x", "d-1", `{}`)
		p := requireProblem(t, unreachable, http.StatusBadGateway, frontdoor.CodeUpstreamUnavailable, false)
		require.Contains(t, p["detail"], "never reached it")
		require.Equal(t, idem.CodeKeyNotFound, r.getRecordErr(t, "d-1"), "the key was released")
		unreachable = send(t, http.MethodGet, r.url+"/dead/x", "", "")
		p = requireProblem(t, unreachable, http.StatusBadGateway, frontdoor.CodeUpstreamUnavailable, false)
		require.Contains(t, p["detail"], "never reached it", "passed through")

		require.Equal(t, http.StatusCreated, send(t, http.MethodPost, r.url+"/flaky/a", "f-1", "").status)
		dropped := send(t, http.MethodPost, r.url+"/flaky/b", "f-2", "")
		p = requireProblem(t, dropped, http.StatusBadGateway, frontdoor.CodeUpstreamUnavailable, false)
		require.Contains(t, p["detail"], "may have acted")
		require.NotContains(t, p["detail"], "could not be reached")
		require.Equal(t, 1, up.calls("/flaky/b"))
		require.Equal(t, idem.CodeKeyNotFound, r.getRecordErr(t, "f-2"), "store_5xx false released the key")

		require.Equal(t, http.StatusCreated, send(t, http.MethodPost, r.url+"/pass/a", "", "").status)
		passed := send(t, http.MethodPost, r.url+"/pass/b", "", "")
		p = requireProblem(t, passed, http.StatusBadGateway, frontdoor.CodeUpstreamUnavailable, false)
		require.Contains(t, p["detail"], "may have acted")
		require.Equal(t, 1, up.calls("/pass/b"))
	})
}
