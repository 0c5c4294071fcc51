package server_test

// Resolving orphans by hand (issue 13) through real HTTP on both stores: a
// tenant admin and an operator release, complete and flag orphans with the
// current fencing token; the late worker is fenced off; every resolution is
// in the audit log, per key and per tenant.

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/testkit/servertest"
)

func TestResolveOrphans(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{servertest.BackendSQLite, servertest.BackendPostgres} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			ts := servertest.Start(t, servertest.Options{Backend: backend, Tenants: []string{"acme", "globex"}})
			c := newAPIClient(t, ts)
			writer := ts.Token(t, "acme", "keys:write")
			reader := ts.Token(t, "acme", "keys:read")
			admin := ts.Token(t, "acme", "tenant:admin")
			operator := ts.Token(t, "", "admin")
			const claim = `{"operation":"POST /v1/payments","request":{"amount":1000},"lease_seconds":%d}`
			claimKey := func(key string, lease int) float64 {
				t.Helper()
				status, body, _ := c.call(t, http.MethodPost, "/v1/keys/"+key+"/claim", writer, fmt.Sprintf(claim, lease))
				require.Equal(t, http.StatusCreated, status, "%v", body)
				return body["fencing_token"].(float64)
			}
			resolve := func(path, tok, body string) (int, map[string]any, http.Header) {
				t.Helper()
				return c.call(t, http.MethodPost, path, tok, body)
			}

			// Orphans of a 1 s lease, and one whose lease runs.
			keys := []string{"k-release", "k-complete", "k-review", "k-race"}
			tokens := map[string]float64{}
			for _, k := range keys {
				tokens[k] = claimKey(k, 1)
			}
			live := claimKey("k-live", 60)

			// While the lease runs: release and complete are refused with the
			// lease left, a review is taken and shows on the record.
			status, p, h := resolve("/v1/keys/k-live/resolve", admin, fmt.Sprintf(`{"action":"release","fencing_token":%v}`, live))
			require.Equal(t, http.StatusConflict, status, "%v", p)
			require.Equal(t, "request_in_flight", p["code"])
			require.NotEmpty(t, h.Get("Retry-After"))
			status, p, _ = resolve("/v1/admin/tenants/acme/keys/k-live/resolve", operator,
				fmt.Sprintf(`{"action":"complete","fencing_token":%v,"response":{"status":200}}`, live))
			require.Equal(t, http.StatusConflict, status, "%v", p)
			require.Equal(t, "request_in_flight", p["code"])
			status, res, _ := resolve("/v1/keys/k-live/resolve", admin, fmt.Sprintf(`{"action":"review","fencing_token":%v,"note":"stuck at the provider?"}`, live))
			require.Equal(t, http.StatusOK, status, "%v", res)
			require.Equal(t, "in_flight", res["record"].(map[string]any)["state"])
			status, rec, _ := c.call(t, http.MethodGet, "/v1/keys/k-live", reader, "")
			require.Equal(t, http.StatusOK, status)
			require.Equal(t, "stuck at the provider?", rec["review"].(map[string]any)["note"])
			_, page, _ := c.call(t, http.MethodGet, "/v1/keys?state=in_flight", reader, "")
			require.Equal(t, "stuck at the provider?", page["items"].([]any)[0].(map[string]any)["review"].(map[string]any)["note"], "the flag shows in listings")

			// Who may resolve what.
			status, p, _ = resolve("/v1/keys/k-live/resolve", writer, fmt.Sprintf(`{"action":"review","fencing_token":%v,"note":"x"}`, live))
			require.Equal(t, http.StatusForbidden, status, "keys:write is not enough: %v", p)
			status, p, _ = resolve("/v1/admin/tenants/acme/keys/k-live/resolve", admin, fmt.Sprintf(`{"action":"review","fencing_token":%v,"note":"x"}`, live))
			require.Equal(t, http.StatusForbidden, status, "a tenant admin is no operator: %v", p)
			status, p, _ = resolve("/v1/keys/k-live/resolve", ts.Token(t, "globex", "tenant:admin"), fmt.Sprintf(`{"action":"review","fencing_token":%v,"note":"x"}`, live))
			require.Equal(t, http.StatusNotFound, status, "another tenant's key: %v", p)
			require.Equal(t, "key_not_found", p["code"])
			status, p, _ = resolve("/v1/admin/tenants/nope/keys/k-live/resolve", operator, fmt.Sprintf(`{"action":"review","fencing_token":%v,"note":"x"}`, live))
			require.Equal(t, http.StatusNotFound, status, "%v", p)
			require.Equal(t, "tenant_not_found", p["code"])

			// Bad input names the field.
			for body, field := range map[string]string{
				`{"action":"forget","fencing_token":1}`:                            "action",
				`{"action":"review","fencing_token":1}`:                            "note",
				`{"action":"complete","fencing_token":1}`:                          "response",
				`{"action":"release","fencing_token":1,"response":{"status":200}}`: "response",
				`{"action":"release"}`:                                             "fencing_token",
				`{"action":"complete","fencing_token":1,"response":{"status":99}}`: "response.status",
				`{"action":"review","fencing_token":1,"note":"bell\u0007"}`:        "note",
			} {
				status, p, _ = resolve("/v1/keys/k-live/resolve", admin, body)
				require.Equal(t, http.StatusBadRequest, status, "%s: %v", body, p)
				require.Equal(t, []string{field}, fieldNames(p), body)
			}

			// The 1 s leases run out.
			require.Eventually(t, func() bool {
				_, page, _ := c.call(t, http.MethodGet, "/v1/keys?state=orphaned", reader, "")
				return len(page["items"].([]any)) == len(keys)
			}, 10*time.Second, 50*time.Millisecond)

			// A stale token is refused.
			status, p, _ = resolve("/v1/keys/k-release/resolve", admin, fmt.Sprintf(`{"action":"release","fencing_token":%v}`, tokens["k-release"]+1000))
			require.Equal(t, http.StatusConflict, status, "%v", p)
			require.Equal(t, "lease_lost", p["code"])

			// The tenant admin releases: the late worker finds nothing, the
			// next retry runs the work again.
			status, res, _ = resolve("/v1/keys/k-release/resolve", admin,
				fmt.Sprintf(`{"action":"release","fencing_token":%v,"note":"no recovery point: never started"}`, tokens["k-release"]))
			require.Equal(t, http.StatusOK, status, "%v", res)
			require.Nil(t, res["record"])
			audit := res["audit"].(map[string]any)
			require.Equal(t, "release", audit["action"])
			require.Equal(t, map[string]any{"subject": "servertest", "tenant": "acme", "scope": "tenant:admin"}, audit["actor"])
			require.Equal(t, "no recovery point: never started", audit["note"])
			status, p, _ = c.call(t, http.MethodPost, "/v1/keys/k-release/complete", writer,
				fmt.Sprintf(`{"fencing_token":%v,"response":{"status":201}}`, tokens["k-release"]))
			require.Equal(t, http.StatusNotFound, status, "the late worker after a release: %v", p)
			status, body, _ := c.call(t, http.MethodPost, "/v1/keys/k-release/claim", writer, fmt.Sprintf(claim, 60))
			require.Equal(t, http.StatusCreated, status, "%v", body)
			require.EqualValues(t, 1, body["attempt"])

			// The operator completes with the real response, held to the
			// tenant's max_response_bytes; the late worker is fenced off and
			// the retry gets the operator's response.
			status, p, _ = c.call(t, http.MethodPatch, "/v1/admin/tenants/acme", operator, `{"settings":{"max_response_bytes":64}}`)
			require.Equal(t, http.StatusOK, status, "%v", p)
			big := strings.Repeat("x", 100)
			status, p, _ = resolve("/v1/admin/tenants/acme/keys/k-complete/resolve", operator,
				fmt.Sprintf(`{"action":"complete","fencing_token":%v,"response":{"status":201,"body":"%s"}}`, tokens["k-complete"], big))
			require.Equal(t, http.StatusRequestEntityTooLarge, status, "%v", p)
			status, res, _ = resolve("/v1/admin/tenants/acme/keys/k-complete/resolve", operator,
				fmt.Sprintf(`{"action":"complete","fencing_token":%v,"note":"charge ch_1 found","response":{"status":201,"headers":{"Content-Type":"application/json"},"body":"{\"id\":\"ch_1\"}"}}`, tokens["k-complete"]))
			require.Equal(t, http.StatusOK, status, "%v", res)
			record := res["record"].(map[string]any)
			require.Equal(t, "completed", record["state"])
			require.Greater(t, record["fencing_token"].(float64), tokens["k-complete"])
			audit = res["audit"].(map[string]any)
			require.Equal(t, record["fencing_token"], audit["new_fencing_token"])
			require.Equal(t, map[string]any{"subject": "servertest", "tenant": "", "scope": "admin"}, audit["actor"])
			status, p, _ = c.call(t, http.MethodPost, "/v1/keys/k-complete/complete", writer,
				fmt.Sprintf(`{"fencing_token":%v,"response":{"status":500}}`, tokens["k-complete"]))
			require.Equal(t, http.StatusConflict, status, "the late worker after a completion by hand: %v", p)
			require.Equal(t, "lease_lost", p["code"])
			status, replay, hdr := c.call(t, http.MethodPost, "/v1/keys/k-complete/claim", writer, fmt.Sprintf(claim, 60))
			require.Equal(t, http.StatusOK, status, "%v", replay)
			require.Equal(t, "true", hdr.Get("Idempotent-Replayed"))
			require.Equal(t, `{"id":"ch_1"}`, replay["response"].(map[string]any)["body"])
			status, rec, _ = c.call(t, http.MethodGet, "/v1/admin/tenants/acme/keys/k-complete", operator, "")
			require.Equal(t, http.StatusOK, status, "%v", rec)
			require.Equal(t, "completed", rec["state"])

			// A review by the operator, cleared by a later release.
			status, res, _ = resolve("/v1/admin/tenants/acme/keys/k-review/resolve", operator,
				fmt.Sprintf(`{"action":"review","fencing_token":%v,"note":"ask the payments team"}`, tokens["k-review"]))
			require.Equal(t, http.StatusOK, status, "%v", res)
			require.Equal(t, "orphaned", res["record"].(map[string]any)["state"])
			_, page, _ = c.call(t, http.MethodGet, "/v1/admin/orphans?tenant=acme", operator, "")
			flagged := 0
			for _, it := range page["items"].([]any) {
				if it.(map[string]any)["review"] != nil {
					flagged++
				}
			}
			require.Equal(t, 1, flagged, "the flag shows in the orphan listing")
			status, res, _ = resolve("/v1/keys/k-review/resolve", admin, fmt.Sprintf(`{"action":"release","fencing_token":%v}`, tokens["k-review"]))
			require.Equal(t, http.StatusOK, status, "%v", res)

			// Two resolutions of one orphan at once: one applies.
			var wg sync.WaitGroup
			statuses := make([]int, 2)
			for i, body := range []string{
				fmt.Sprintf(`{"action":"release","fencing_token":%v}`, tokens["k-race"]),
				fmt.Sprintf(`{"action":"complete","fencing_token":%v,"response":{"status":200}}`, tokens["k-race"]),
			} {
				wg.Go(func() { statuses[i], _, _ = resolve("/v1/keys/k-race/resolve", admin, body) })
			}
			wg.Wait()
			ok := 0
			for _, s := range statuses {
				if s == http.StatusOK {
					ok++
				} else {
					require.Contains(t, []int{http.StatusNotFound, http.StatusConflict}, s)
				}
			}
			require.Equal(t, 1, ok, "exactly one resolution applies: %v", statuses)

			// The audit log: per key (also of a released key), per tenant
			// with keyset pages, across tenants for the operator.
			_, page, _ = c.call(t, http.MethodGet, "/v1/keys/k-review/audit", reader, "")
			entries := page["items"].([]any)
			require.Len(t, entries, 2)
			require.Equal(t, "release", entries[0].(map[string]any)["action"], "newest first")
			require.Equal(t, "review", entries[1].(map[string]any)["action"])
			const total = 6 // live review, release, complete, review, release, race winner
			var all []any
			cursor := ""
			for range total {
				status, page, _ = c.call(t, http.MethodGet, "/v1/audit?limit=2"+cursor, admin, "")
				require.Equal(t, http.StatusOK, status, "%v", page)
				all = append(all, page["items"].([]any)...)
				next, _ := page["next_cursor"].(string)
				if next == "" {
					break
				}
				cursor = "&cursor=" + next
			}
			require.Len(t, all, total)
			seen := map[float64]bool{}
			for _, e := range all {
				id := e.(map[string]any)["id"].(float64)
				require.False(t, seen[id], "entry %v listed twice", id)
				seen[id] = true
			}
			_, page, _ = c.call(t, http.MethodGet, "/v1/admin/audit?tenant=acme&limit=500", operator, "")
			require.Len(t, page["items"], total)
			_, page, _ = c.call(t, http.MethodGet, "/v1/admin/audit?tenant=globex", operator, "")
			require.Empty(t, page["items"])
			_, page, _ = c.call(t, http.MethodGet, "/v1/admin/tenants/acme/keys/k-complete/audit", operator, "")
			require.Len(t, page["items"], 1)
			status, p, _ = c.call(t, http.MethodGet, "/v1/admin/tenants/nope/keys/k-complete/audit", operator, "")
			require.Equal(t, http.StatusNotFound, status, "%v", p)
			require.Equal(t, "tenant_not_found", p["code"])
			status, _, _ = c.call(t, http.MethodGet, "/v1/audit", ts.Token(t, "globex", "keys:read"), "")
			require.Equal(t, http.StatusOK, status)
		})
	}
}
