package server_test

// The per-tenant storage quota through real HTTP on both stores: a tenant
// that fills storage_quota_bytes gets 507 storage_quota_exceeded on its next
// new key, before anything is stored; a response or checkpoint of a key
// already claimed that does not fit gets 507 too, the key completed without
// its response (a retry replays it as not replayable, never runs it again)
// or the lease renewed without the new data; another tenant is not
// affected; the quota frees up once the reaper has purged the records.

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/server"
	"github.com/idem-dev/idem/testkit/servertest"
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
			complete := func(key string, token any) (int, map[string]any) {
				t.Helper()
				status, done, _ := c.call(t, http.MethodPost, "/v1/keys/"+key+"/complete", tok,
					fmt.Sprintf(`{"fencing_token":%v,"response":{"status":201,"body":%q}}`, token, body))
				return status, done
			}
			requireNotStored := func(key string, status int, problem map[string]any) {
				t.Helper()
				require.Equal(t, http.StatusInsufficientStorage, status, "the complete of %s: %v", key, problem)
				require.Equal(t, "storage_quota_exceeded", problem["code"])
				require.Equal(t, false, problem["retryable"])
				require.Contains(t, problem["detail"], "completed without it")
				// the key is completed all the same: its retry replays the
				// record of an answer not kept, never runs it again
				status, replay := claim(tok, key)
				require.Equal(t, http.StatusOK, status, "%v", replay)
				require.Equal(t, "completed", replay["state"])
				resp := replay["response"].(map[string]any)
				require.EqualValues(t, 201, resp["status"])
				require.Empty(t, resp["body"])
				require.Contains(t, resp["headers"].(map[string]any)["Idem-Not-Replayable"], "not stored (storage quota)")
			}

			// Two keys in flight, then new keys completed: a response is
			// stored while it fits the quota, and the first that does not
			// completes its key without it (507); new keys are refused
			// once the quota is used up.
			status, a := claim(tok, "inflight-a")
			require.Equal(t, http.StatusCreated, status, "%v", a)
			status, b := claim(tok, "inflight-b")
			require.Equal(t, http.StatusCreated, status, "%v", b)
			var refused map[string]any
			filled, unstored := 0, 0
			for i := range 60 {
				key := fmt.Sprintf("fill-%d", i)
				status, res := claim(tok, key)
				if status == http.StatusInsufficientStorage {
					refused = res
					status, _, _ := c.call(t, http.MethodGet, "/v1/keys/"+key, ts.Token(t, "acme", "keys:read"), "")
					require.Equal(t, http.StatusNotFound, status, "a refused claim stored a record")
					break
				}
				require.Equal(t, http.StatusCreated, status, "%v", res)
				fits := usage()+float64(len(body)) <= 4000
				status, done := complete(key, res["fencing_token"])
				if fits {
					require.Equal(t, http.StatusOK, status, "the complete of %s was refused within the quota: %v", key, done)
					filled++
					continue
				}
				requireNotStored(key, status, done)
				unstored++
			}
			require.NotNil(t, refused, "the tenant filled its quota and kept claiming new keys (usage %v)", usage())
			require.EqualValues(t, 3, filled, "3 × 900 bytes of bodies and the claims fit 4000")
			require.Positive(t, unstored)
			require.Equal(t, "storage_quota_exceeded", refused["code"])
			require.Equal(t, false, refused["retryable"])
			require.Contains(t, refused["detail"], "storage_quota_bytes (4000)")
			full := usage()
			require.GreaterOrEqual(t, full, 4000.0)
			require.Less(t, full, 4000.0+500, "past the quota by more than one claim and one unstored answer")
			// The orphan watch exports usage and quota.
			require.Eventually(t, func() bool {
				return c.metric(t, `idem_tenant_stored_bytes{tenant="acme"}`) == full &&
					c.metric(t, `idem_tenant_storage_quota_bytes{tenant="acme"}`) == 4000
			}, 20*time.Second, 20*time.Millisecond, "the storage gauges")

			// Work already claimed finishes over the quota without growing
			// it: a checkpoint renews the lease but keeps no new data, a
			// complete completes the key without its response; completed
			// keys replay.
			status, cp, _ := c.call(t, http.MethodPost, "/v1/keys/inflight-a/checkpoint", tok,
				fmt.Sprintf(`{"fencing_token":%v,"recovery_point":"charged","data":{"charge":%q}}`, a["fencing_token"], strings.Repeat("c", 500)))
			require.Equal(t, http.StatusInsufficientStorage, status, "a checkpoint over the quota was stored: %v", cp)
			require.Contains(t, cp["detail"], "the lease was renewed")
			status, rec, _ := c.call(t, http.MethodGet, "/v1/keys/inflight-a", ts.Token(t, "acme", "keys:read"), "")
			require.Equal(t, http.StatusOK, status)
			require.Nil(t, rec["recovery_point"], "%v", rec)
			status, done := complete("inflight-a", a["fencing_token"])
			requireNotStored("inflight-a", status, done)
			status, done = complete("inflight-b", b["fencing_token"])
			requireNotStored("inflight-b", status, done)
			require.Less(t, usage(), 4000.0+500, "the in-flight work did not grow the usage past the bound")
			status, replay := claim(tok, "fill-0")
			require.Equal(t, http.StatusOK, status, "%v", replay)
			require.Equal(t, body, replay["response"].(map[string]any)["body"])
			status, p := claim(tok, "fresh")
			require.Equal(t, http.StatusInsufficientStorage, status, "%v", p)

			// Another tenant is not affected.
			status, res := claim(ts.Token(t, "other", "keys:write"), "fresh")
			require.Equal(t, http.StatusCreated, status, "%v", res)

			// The reaper's purge frees the quota.
			ageRecords(t, ts, "acme")
			require.Eventually(t, func() bool { return usage() == 0 }, 20*time.Second, 20*time.Millisecond,
				"the purge did not bring the usage back to zero")
			status, res = claim(tok, "fresh")
			require.Equal(t, http.StatusCreated, status, "%v", res)

			// Raising the quota takes effect at once.
			status, patched, _ := c.call(t, http.MethodPatch, "/v1/admin/tenants/acme", op, `{"settings":{"storage_quota_bytes":1000000}}`)
			require.Equal(t, http.StatusOK, status, "%v", patched)
			require.EqualValues(t, 1000000, patched["settings"].(map[string]any)["storage_quota_bytes"])
			require.Positive(t, patched["usage"].(map[string]any)["stored_bytes"])
		})
	}
}

// TestStorageQuotaBoundsCompletes is issue 21's scenario through real HTTP
// on both stores, with the tenant cache on as by default: 300 claims, then
// 300 completes of 64 KB (16 at a time) on a 64 KB quota used to end at
// 19.5 MB, 298 times the quota. Now the usage ends within the documented
// bound (the quota, plus at most one response per database connection
// completing at once, plus each unstored answer's few bytes), and every
// key replays either its full answer or the record of one not stored;
// none is claimable again (no second run), even after its lease. A second
// tenant, with room for three answers, stores at least three.
func TestStorageQuotaBoundsCompletes(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{servertest.BackendSQLite, servertest.BackendPostgres} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			ts := servertest.Start(t, servertest.Options{Backend: backend})
			c := newAPIClient(t, ts)
			op := ts.Token(t, "", "admin")
			const keys, size, parallel = 300, 64 << 10, 16
			body := strings.Repeat("x", size)
			conns := float64(ts.Config().DBMaxConns)
			if backend == servertest.BackendSQLite {
				conns = 1 // one writer at a time: the check is exact
			}

			run := func(tenant string, quota int) (stored int, usage float64) {
				t.Helper()
				status, created, _ := c.call(t, http.MethodPost, "/v1/admin/tenants", op,
					fmt.Sprintf(`{"id":%q,"settings":{"max_response_bytes":%d,"storage_quota_bytes":%d}}`, tenant, size, quota))
				require.Equal(t, http.StatusCreated, status, "%v", created)
				tok := ts.Token(t, tenant, "keys:write")
				claim := func(key string) (int, map[string]any) {
					status, res, _ := c.call(t, http.MethodPost, "/v1/keys/"+key+"/claim", tok,
						`{"operation":"POST /v1/exports","request":{"rows":1000},"lease_seconds":1}`)
					return status, res
				}
				tokens := make([]any, keys)
				for i := range keys {
					status, res := claim(fmt.Sprintf("k-%03d", i))
					require.Equal(t, http.StatusCreated, status, "claim %d: %v", i, res)
					tokens[i] = res["fencing_token"]
				}
				statuses := make([]int, keys)
				problems := make([]map[string]any, keys)
				var wg sync.WaitGroup
				next := make(chan int)
				for range parallel {
					wg.Go(func() {
						for i := range next {
							// A 503 store_unavailable (the store's deadline
							// on a loaded machine) stored nothing: the
							// worker sends its complete again, as the SDKs
							// do, with the same token.
							for range 20 {
								statuses[i], problems[i], _ = c.call(t, http.MethodPost, fmt.Sprintf("/v1/keys/k-%03d/complete", i), tok,
									fmt.Sprintf(`{"fencing_token":%v,"response":{"status":200,"body":%q}}`, tokens[i], body))
								if statuses[i] != http.StatusServiceUnavailable {
									break
								}
							}
						}
					})
				}
				for i := range keys {
					next <- i
				}
				close(next)
				wg.Wait()

				// every retry, after the lease, replays: the full answer
				// exactly when its complete was 200
				time.Sleep(1100 * time.Millisecond)
				for i := range keys {
					status, replay := claim(fmt.Sprintf("k-%03d", i))
					require.Equal(t, http.StatusOK, status, "key %d was claimable again after its complete (%d): %v", i, statuses[i], replay)
					resp := replay["response"].(map[string]any)
					switch statuses[i] {
					case http.StatusOK:
						stored++
						require.Equal(t, body, resp["body"], "key %d", i)
					case http.StatusInsufficientStorage:
						require.Equal(t, "storage_quota_exceeded", problems[i]["code"])
						require.Empty(t, resp["body"], "key %d", i)
						require.Contains(t, resp["headers"].(map[string]any)["Idem-Not-Replayable"], "not stored (storage quota)")
					default:
						t.Fatalf("the complete of key %d answered %d: %v", i, statuses[i], problems[i])
					}
				}
				status, ten, _ := c.call(t, http.MethodGet, "/v1/tenant", ts.Token(t, tenant, "tenant:admin"), "")
				require.Equal(t, http.StatusOK, status, "%v", ten)
				usage = ten["usage"].(map[string]any)["stored_bytes"].(float64)
				t.Logf("%s: %d of %d answers stored, usage %.0f bytes on a quota of %d", tenant, stored, keys, usage, quota)
				// the bound: the quota, one answer per connection at once,
				// and under 80 bytes per unstored answer
				require.LessOrEqual(t, usage, float64(quota)+(conns-1)*size+float64(keys-stored)*80,
					"%s: the usage passed the documented bound", tenant)
				return stored, usage
			}

			stored, _ := run("issue", size)
			require.Zero(t, stored, "the claims, committed before, use part of the quota: no answer of 64 KB fits")
			// room for the claims (about 80 bytes each), their unstored
			// answers and three answers
			stored, _ = run("roomy", keys*200+3*size)
			require.GreaterOrEqual(t, stored, 3, "answers within the quota were not stored")
			require.LessOrEqual(t, float64(stored), 3+conns-1)
		})
	}
}
