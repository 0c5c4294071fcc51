package idemhttp_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/client/frontdoor"
	"github.com/idem-dev/idem/client/idemhttp"
	"github.com/idem-dev/idem/testkit/servertest"
)

// TestMiddlewareAnswerWithoutRoomUnderTheQuota: the claim fits the
// tenant's storage_quota_bytes but the handler's answer does not, so idem
// completes the key without it and answers the complete 507
// storage_quota_exceeded. The caller still gets the handler's answer whole;
// the key is completed, not released nor left in flight, so its retry,
// after the claim's lease, is 409 response_not_replayable and the handler
// ran once. Before, the answer was stored past the quota (issue 21, hole
// 4).
func TestMiddlewareAnswerWithoutRoomUnderTheQuota(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{servertest.BackendSQLite, servertest.BackendPostgres} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			srv := servertest.Start(t, servertest.Options{Backend: backend})
			limit, quota := 2000, int64(2000)
			srv.CreateTenant(t, "tight", idem.SettingsPatch{MaxResponseBytes: &limit, StorageQuotaBytes: &quota})
			c, err := client.New(srv.URL(), client.WithToken(srv.Token(t, "tight", "keys:write")),
				client.WithRetryPolicy(client.RetryPolicy{BaseDelay: 20 * time.Millisecond, RetryAfterJitter: 50 * time.Millisecond}))
			require.NoError(t, err)
			var runs atomic.Int64
			body := strings.Repeat("x", 1950)
			app := httptest.NewServer(idemhttp.Middleware(c, idemhttp.Options{Lease: time.Second})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				w.WriteHeader(http.StatusCreated)
				fmt.Fprint(w, body)
			})))
			t.Cleanup(app.Close)

			first := post(t, app.URL+"/exports", "k-no-room", `{}`)
			require.Equal(t, http.StatusCreated, first.status)
			require.Equal(t, body, first.body, "the answer is sent whole")
			rec, err := c.Get(t.Context(), "k-no-room")
			require.NoError(t, err)
			require.Equal(t, client.StateCompleted, rec.State, "the key is completed, neither released nor in flight")
			require.Zero(t, len(rec.Response.Body), "the answer is not stored")
			require.Contains(t, rec.Response.Headers[frontdoor.HeaderNotReplayable], "storage quota")

			time.Sleep(1100 * time.Millisecond) // past the claim's lease: an in-flight key would be taken over now
			again := post(t, app.URL+"/exports", "k-no-room", `{}`)
			require.Equal(t, http.StatusConflict, again.status, "%s", again.body)
			require.Equal(t, string(frontdoor.CodeResponseNotReplayable), problemCode(t, again))
			require.Equal(t, int64(1), runs.Load(), "the handler ran once")
		})
	}
}
