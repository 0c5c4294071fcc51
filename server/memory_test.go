package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/server/servertest"
)

// backends lists the stores every reliability test runs on.
var backends = []string{servertest.BackendSQLite, servertest.BackendPostgres}

// problemBody is the part of a problem+json answer the tests read.
type problemBody struct {
	Status    int    `json:"status"`
	Code      string `json:"code"`
	Retryable bool   `json:"retryable"`
	Errors    []struct {
		Field string `json:"field"`
	} `json:"errors"`
}

func decodeProblem(t *testing.T, resp *http.Response, body []byte) problemBody {
	t.Helper()
	require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"), string(body))
	var p problemBody
	require.NoError(t, json.Unmarshal(body, &p), string(body))
	require.Equal(t, resp.StatusCode, p.Status)
	return p
}

// TestCheckpointDataBoundedAndListsSmall: checkpoint data is bounded by the
// tenant's max_response_bytes (413 naming "data", nothing stored), and the
// key and orphan listings leave recovery_data out while the record endpoint
// returns it whole (issue 9, item 7).
func TestCheckpointDataBoundedAndListsSmall(t *testing.T) {
	t.Parallel()
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			ts := servertest.Start(t, servertest.Options{Backend: backend})
			limit := 2048
			ts.CreateTenant(t, "acme", idem.SettingsPatch{MaxResponseBytes: &limit})
			tok := ts.Token(t, "acme", "keys:write", "keys:read")
			base := ts.URL() + "/v1/keys/"

			const keys = 40
			tokens := make([]int64, keys)
			for i := range keys {
				resp, body := do(t, http.MethodPost, fmt.Sprintf("%sbig-%d/claim", base, i), tok, `{"operation":"op","fingerprint":"fp","lease_seconds":1}`)
				require.Equal(t, http.StatusCreated, resp.StatusCode, string(body))
				var c struct {
					FencingToken int64 `json:"fencing_token"`
				}
				require.NoError(t, json.Unmarshal(body, &c))
				tokens[i] = c.FencingToken
			}
			// Data that fits: saved. Marker text makes it easy to spot in any
			// answer.
			fits := `{"marker":"` + strings.Repeat("m", limit-20) + `"}`
			for i := range keys {
				resp, body := do(t, http.MethodPost, fmt.Sprintf("%sbig-%d/checkpoint", base, i), tok,
					fmt.Sprintf(`{"fencing_token":%d,"recovery_point":"charged","data":%s,"lease_seconds":1}`, tokens[i], fits))
				require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
			}
			// Data one byte over the tenant's limit: 413 naming data, and
			// the saved checkpoint is untouched.
			over := `{"marker":"` + strings.Repeat("o", limit-12) + `"}`
			require.Len(t, over, limit+1)
			resp, body := do(t, http.MethodPost, base+"big-0/checkpoint", tok,
				fmt.Sprintf(`{"fencing_token":%d,"recovery_point":"next","data":%s}`, tokens[0], over))
			require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode, string(body))
			p := decodeProblem(t, resp, body)
			require.Equal(t, "payload_too_large", p.Code)
			require.False(t, p.Retryable)
			require.Len(t, p.Errors, 1)
			require.Equal(t, "data", p.Errors[0].Field)
			rec, err := ts.Store().GetRecord(context.Background(), idem.GetRecordParams{TenantID: "acme", Key: "big-0"})
			require.NoError(t, err)
			require.Equal(t, "charged", rec.RecoveryPoint)
			require.JSONEq(t, fits, string(rec.RecoveryData), "the refused checkpoint must not change the saved one")

			// The record endpoint returns the data whole.
			resp, body = do(t, http.MethodGet, base+"big-0", tok, "")
			require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
			var one map[string]json.RawMessage
			require.NoError(t, json.Unmarshal(body, &one))
			require.JSONEq(t, fits, string(one["recovery_data"]))

			// The listing leaves recovery_data out: 40 records that hold
			// 80 KiB of data list in a few KiB.
			resp, body = do(t, http.MethodGet, ts.URL()+"/v1/keys?limit=100", tok, "")
			require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
			requireListedWithoutData(t, body, keys)

			// So does the orphan listing, once the 1 s leases ran out.
			admin := ts.Token(t, "", "admin")
			deadline := time.Now().Add(10 * time.Second)
			for {
				resp, body = do(t, http.MethodGet, ts.URL()+"/v1/admin/orphans?limit=100", admin, "")
				require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
				var page struct {
					Items []json.RawMessage `json:"items"`
				}
				require.NoError(t, json.Unmarshal(body, &page))
				if len(page.Items) == keys {
					break
				}
				require.True(t, time.Now().Before(deadline), "orphans never listed: %s", body)
				time.Sleep(100 * time.Millisecond)
			}
			requireListedWithoutData(t, body, keys)
		})
	}
}

// requireListedWithoutData requires a page of n items, each with its
// recovery_point and without a recovery_data member, and no trace of the
// data in the page.
func requireListedWithoutData(t *testing.T, body []byte, n int) {
	t.Helper()
	var page struct {
		Items []map[string]json.RawMessage `json:"items"`
	}
	require.NoError(t, json.Unmarshal(body, &page))
	require.Len(t, page.Items, n)
	for _, it := range page.Items {
		require.JSONEq(t, `"charged"`, string(it["recovery_point"]))
		require.NotContains(t, it, "recovery_data")
	}
	require.NotContains(t, string(body), "mmmm")
	require.Less(t, len(body), n*1024, "a listing must stay small")
}
