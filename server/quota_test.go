package server_test

// The per-tenant storage quota through real HTTP on both stores: a tenant
// that fills storage_quota_bytes gets 507 storage_quota_exceeded on its next
// new key, before anything is stored, while the keys it already claimed
// still checkpoint, complete and replay; another tenant is not affected; the
// quota frees up once the reaper has purged the records.

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/server"
	"github.com/idem-dev/idem/server/servertest"
)

func TestStorageQuota(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{servertest.BackendSQLite, servertest.BackendPostgres} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			// No tenant cache: every claim sees the usage as stored, so the
			// claim checks the quota in its statement from the first byte
			// (idem.Tenant.ClaimQuota; with a cache, from nine tenths on).
			ts := servertest.Start(t, servertest.Options{Backend: backend, ReapInterval: 20 * time.Millisecond, Tenants: []string{"other"},
				Configure: func(c *server.Config) { c.TenantCacheTTL = 0 }})
			c := newAPIClient(t, ts)
			op := ts.Token(t, "", "admin")

			// The quota is validated like the other settings.
			status, problem, _ := c.call(t, http.MethodPost, "/v1/admin/tenants", op,
				`{"id":"acme","settings":{"max_response_bytes":2000,"storage_quota_bytes":1999}}`)
			require.Equal(t, http.StatusBadRequest, status, "a quota below max_response_bytes: %v", problem)
			require.Equal(t, []string{"settings.storage_quota_bytes"}, fieldNames(problem))
			status, problem, _ = c.call(t, http.MethodPost, "/v1/admin/tenants", op,
				`{"id":"acme","settings":{"storage_quota_bytes":1099511627777}}`)
			require.Equal(t, http.StatusBadRequest, status, "a quota above 1 TiB: %v", problem)
			require.Equal(t, []string{"settings.storage_quota_bytes"}, fieldNames(problem))
			status, created, _ := c.call(t, http.MethodPost, "/v1/admin/tenants", op,
				`{"id":"acme","settings":{"max_response_bytes":2000,"storage_quota_bytes":4000}}`)
			require.Equal(t, http.StatusCreated, status, "%v", created)
			require.EqualValues(t, 4000, created["settings"].(map[string]any)["storage_quota_bytes"])
			require.EqualValues(t, 0, created["usage"].(map[string]any)["stored_bytes"])
			status, other, _ := c.call(t, http.MethodGet, "/v1/admin/tenants/other", op, "")
			require.Equal(t, http.StatusOK, status)
			require.EqualValues(t, 1<<30, other["settings"].(map[string]any)["storage_quota_bytes"], "the default quota")

			tok := ts.Token(t, "acme", "keys:write")
			admin := ts.Token(t, "acme", "tenant:admin")
			usage := func() float64 {
				t.Helper()
				status, ten, _ := c.call(t, http.MethodGet, "/v1/tenant", admin, "")
				require.Equal(t, http.StatusOK, status, "%v", ten)
				return ten["usage"].(map[string]any)["stored_bytes"].(float64)
			}
			claim := func(tok, key string) (int, map[string]any) {
				t.Helper()
				status, body, _ := c.call(t, http.MethodPost, "/v1/keys/"+key+"/claim", tok,
					`{"operation":"POST /v1/payments","request":{"amount":1000},"lease_seconds":60}`)
				return status, body
			}
			body := strings.Repeat("x", 900)
			complete := func(key string, token any) {
				t.Helper()
				status, done, _ := c.call(t, http.MethodPost, "/v1/keys/"+key+"/complete", tok,
					fmt.Sprintf(`{"fencing_token":%v,"response":{"status":201,"body":%q}}`, token, body))
				require.Equal(t, http.StatusOK, status, "the complete of %s was refused: %v", key, done)
			}

			// Two keys in flight, then new keys completed until the quota
			// refuses one.
			status, a := claim(tok, "inflight-a")
			require.Equal(t, http.StatusCreated, status, "%v", a)
			status, b := claim(tok, "inflight-b")
			require.Equal(t, http.StatusCreated, status, "%v", b)
			var refused map[string]any
			filled := 0
			for i := range 10 {
				key := fmt.Sprintf("fill-%d", i)
				status, res := claim(tok, key)
				if status == http.StatusInsufficientStorage {
					refused = res
					require.EqualValues(t, 4, filled, "4 × 900 bytes of bodies and the claims fill 4000")
					status, _, _ := c.call(t, http.MethodGet, "/v1/keys/"+key, ts.Token(t, "acme", "keys:read"), "")
					require.Equal(t, http.StatusNotFound, status, "a refused claim stored a record")
					break
				}
				require.Equal(t, http.StatusCreated, status, "%v", res)
				complete(key, res["fencing_token"])
				filled++
			}
			require.NotNil(t, refused, "the tenant filled its quota and kept claiming new keys (usage %v)", usage())
			require.Equal(t, "storage_quota_exceeded", refused["code"])
			require.Equal(t, false, refused["retryable"])
			require.Contains(t, refused["detail"], "storage_quota_bytes (4000)")
			full := usage()
			require.GreaterOrEqual(t, full, 4000.0)
			// The orphan watch exports usage and quota.
			require.Eventually(t, func() bool {
				return c.metric(t, `idem_tenant_stored_bytes{tenant="acme"}`) == full &&
					c.metric(t, `idem_tenant_storage_quota_bytes{tenant="acme"}`) == 4000
			}, 20*time.Second, 20*time.Millisecond, "the storage gauges")

			// Work already claimed finishes over the quota and replays; so
			// do completed keys.
			status, cp, _ := c.call(t, http.MethodPost, "/v1/keys/inflight-a/checkpoint", tok,
				fmt.Sprintf(`{"fencing_token":%v,"recovery_point":"charged","data":{"charge":%q}}`, a["fencing_token"], strings.Repeat("c", 500)))
			require.Equal(t, http.StatusOK, status, "the checkpoint of a claimed key was refused: %v", cp)
			complete("inflight-a", a["fencing_token"])
			complete("inflight-b", b["fencing_token"])
			require.Greater(t, usage(), full+2*900, "the in-flight work is stored over the quota")
			for _, key := range []string{"inflight-a", "inflight-b", "fill-0"} {
				status, replay := claim(tok, key)
				require.Equal(t, http.StatusOK, status, "%v", replay)
				require.Equal(t, "completed", replay["state"])
				require.Equal(t, body, replay["response"].(map[string]any)["body"])
			}
			status, p := claim(tok, "fill-9")
			require.Equal(t, http.StatusInsufficientStorage, status, "%v", p)

			// Another tenant is not affected.
			status, res := claim(ts.Token(t, "other", "keys:write"), "fill-9")
			require.Equal(t, http.StatusCreated, status, "%v", res)

			// The reaper's purge frees the quota.
			ageRecords(t, ts, "acme")
			require.Eventually(t, func() bool { return usage() == 0 }, 20*time.Second, 20*time.Millisecond,
				"the purge did not bring the usage back to zero")
			status, res = claim(tok, "fill-9")
			require.Equal(t, http.StatusCreated, status, "%v", res)

			// Raising the quota takes effect at once.
			status, patched, _ := c.call(t, http.MethodPatch, "/v1/admin/tenants/acme", op, `{"settings":{"storage_quota_bytes":1000000}}`)
			require.Equal(t, http.StatusOK, status, "%v", patched)
			require.EqualValues(t, 1000000, patched["settings"].(map[string]any)["storage_quota_bytes"])
			require.Positive(t, patched["usage"].(map[string]any)["stored_bytes"])
		})
	}
}
