package server

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestWaitingHandlerClosesEveryConnection: a connection the waiting server
// accepted is closed by the handover's Shutdown once idle, so none of its
// answers may keep it alive, the real handler's included. A kept-alive one
// failed TestServeWaitsForTheDatabase under two make tests side by side: a
// /readyz poll answered by the real handler through the waiting server,
// then the next poll on the same connection got EOF as Shutdown closed it.
func TestWaitingHandlerClosesEveryConnection(t *testing.T) {
	t.Parallel()
	var real atomic.Pointer[http.Handler]
	h := waitingHandler(&real)
	for _, path := range []string{"/healthz", "/readyz", "/v1/keys/k/claim"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		require.Equal(t, "close", rec.Header().Get("Connection"), "waiting: %s", path)
	}
	var served atomic.Int32
	next := http.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		served.Add(1)
		w.WriteHeader(http.StatusOK)
	}))
	real.Store(&next)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	require.Equal(t, int32(1), served.Load(), "the real handler serves once it is set")
	require.Equal(t, http.StatusOK, rec.Code)
	require.Equal(t, "close", rec.Header().Get("Connection"), "the real handler's answer through the waiting server")
}
