package gateway_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/client/frontdoor"
)

// TestAnswerWithoutRoomUnderTheQuota: the claim fits the tenant's
// storage_quota_bytes but the upstream's answer does not: the caller gets
// the answer whole, the store completes the key without it (marked
// Idem-Not-Replayable), and a retry is 409 response_not_replayable with the
// upstream called once. Before, the gateway's complete passed no quota and
// stored the answer past it (issue 21, hole 4).
func TestAnswerWithoutRoomUnderTheQuota(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		r := newRig(t, backend, "routes: []\n")
		req, err := http.NewRequest(http.MethodPatch, r.idem.URL()+"/v1/admin/tenants/"+tenant,
			strings.NewReader(`{"settings":{"max_response_bytes":2000,"storage_quota_bytes":2000}}`))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+r.idem.Token(t, "", "admin"))
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, string(b))

		first := send(t, http.MethodPost, r.url+"/orders?size=1900", "no-room", `{}`)
		require.Equal(t, http.StatusOK, first.status, first.body)
		require.Equal(t, strings.Repeat("x", 1900), first.body, "the answer is sent whole")
		rec, err := r.idem.Store().GetRecord(context.Background(), idem.GetRecordParams{TenantID: tenant, Key: "no-room"})
		require.NoError(t, err)
		require.Equal(t, idem.StateCompleted, rec.State, "the key is completed, not left in flight")
		require.Zero(t, len(rec.Response.Body), "the answer is not stored")
		require.Contains(t, rec.Response.Headers[frontdoor.HeaderNotReplayable], "storage quota")

		again := send(t, http.MethodPost, r.url+"/orders?size=1900", "no-room", `{}`)
		require.Equal(t, http.StatusConflict, again.status, again.body)
		require.Equal(t, string(frontdoor.CodeResponseNotReplayable), again.code(t))
		require.EqualValues(t, 1, r.upstream.Count(), "the upstream was called once")
	})
}
