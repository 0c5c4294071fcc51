package server_test

// Signed webhooks (issue 13) through real HTTP on both stores: a tenant
// admin registers an endpoint at a loopback receiver; an orphan and a
// fenced-off late writer reach it as key.orphaned and key.lease_lost, a
// test send too, each signed (checked by the receiver's own verifier) and
// listed in the delivery log.

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/server"
	"github.com/idem-dev/idem/testkit/servertest"
	"github.com/idem-dev/idem/testkit/webhookreceiver"
)

// webhookConfig makes delivery quick and allows the loopback receiver.
func webhookConfig(c *server.Config) {
	c.Webhooks.AllowPrivate = true
	c.Webhooks.Interval = 50 * time.Millisecond
	c.Webhooks.Timeout = 2 * time.Second
	c.Webhooks.RetryBase = 20 * time.Millisecond
	c.Webhooks.RetryCap = 200 * time.Millisecond
}

func TestWebhooksOverHTTP(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{servertest.BackendSQLite, servertest.BackendPostgres} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			ts := servertest.Start(t, servertest.Options{Backend: backend, Tenants: []string{"acme", "globex"}, Configure: webhookConfig})
			c := newAPIClient(t, ts)
			admin := ts.Token(t, "acme", "tenant:admin")
			writer := ts.Token(t, "acme", "keys:write")
			r := webhookreceiver.New(t, webhookreceiver.Always(204))

			status, p, _ := c.call(t, http.MethodPost, "/v1/webhooks", writer, `{"url":"`+r.URL+`"}`)
			require.Equal(t, http.StatusForbidden, status, "keys:write may not manage webhooks: %v", p)
			status, p, _ = c.call(t, http.MethodPost, "/v1/webhooks", admin, `{"url":"`+r.URL+`","events":["key.exploded"]}`)
			require.Equal(t, http.StatusBadRequest, status, "%v", p)
			require.Equal(t, "events", p["errors"].([]any)[0].(map[string]any)["field"])

			status, ep, _ := c.call(t, http.MethodPost, "/v1/webhooks", admin, `{"url":"`+r.URL+`/hook","events":["key.orphaned","key.lease_lost"]}`)
			require.Equal(t, http.StatusCreated, status, "%v", ep)
			secret := ep["secret"].(string)
			require.True(t, strings.HasPrefix(secret, "whsec_"))
			r.SetSecret(secret)
			id := ep["id"].(string)

			status, got, _ := c.call(t, http.MethodGet, "/v1/webhooks/"+id, admin, "")
			require.Equal(t, http.StatusOK, status)
			require.NotContains(t, got, "secret", "the secret is shown once")
			status, p, _ = c.call(t, http.MethodGet, "/v1/webhooks/"+id, ts.Token(t, "globex", "tenant:admin"), "")
			require.Equal(t, http.StatusNotFound, status, "another tenant's endpoint")
			require.Equal(t, "webhook_not_found", p["code"])

			// An orphan (1 s lease), then a takeover and the late writer.
			const claim = `{"operation":"POST /v1/payments","request":{"amount":1000},"lease_seconds":1}`
			status, rec, _ := c.call(t, http.MethodPost, "/v1/keys/k/claim", writer, claim)
			require.Equal(t, http.StatusCreated, status, "%v", rec)
			stale := rec["fencing_token"].(float64)
			require.Eventually(t, func() bool { return hasType(r, "key.orphaned") }, 15*time.Second, 50*time.Millisecond)
			// The takeover holds a long lease: it must not become an orphan
			// (a second key.orphaned) before the log is read below.
			status, _, _ = c.call(t, http.MethodPost, "/v1/keys/k/claim", writer, strings.Replace(claim, `"lease_seconds":1`, `"lease_seconds":120`, 1))
			require.Equal(t, http.StatusCreated, status)
			status, p, _ = c.call(t, http.MethodPost, "/v1/keys/k/complete", writer, fmt.Sprintf(`{"fencing_token":%v,"response":{"status":200}}`, stale))
			require.Equal(t, http.StatusConflict, status)
			require.Equal(t, "lease_lost", p["code"])
			require.Eventually(t, func() bool { return hasType(r, "key.lease_lost") }, 15*time.Second, 50*time.Millisecond)

			status, d, _ := c.call(t, http.MethodPost, "/v1/webhooks/"+id+"/test", admin, "")
			require.Equal(t, http.StatusAccepted, status, "%v", d)
			require.Eventually(t, func() bool { return hasType(r, "webhook.test") }, 15*time.Second, 50*time.Millisecond)
			require.Empty(t, r.Bad(), "every delivery is signed with the endpoint's secret")

			require.Eventually(t, func() bool {
				_, log, _ := c.call(t, http.MethodGet, "/v1/webhooks/"+id+"/deliveries?limit=2", admin, "")
				items := log["items"].([]any)
				return len(items) == 2 && items[0].(map[string]any)["state"] == "delivered" && log["next_cursor"] != nil
			}, 15*time.Second, 50*time.Millisecond)
			_, log, _ := c.call(t, http.MethodGet, "/v1/webhooks/"+id+"/deliveries?limit=2", admin, "")
			_, rest, _ := c.call(t, http.MethodGet, "/v1/webhooks/"+id+"/deliveries?limit=2&cursor="+log["next_cursor"].(string), admin, "")
			var types []string
			for _, it := range append(log["items"].([]any), rest["items"].([]any)...) {
				types = append(types, it.(map[string]any)["event_type"].(string))
			}
			require.Equal(t, []string{"webhook.test", "key.lease_lost", "key.orphaned"}, types, "newest first, every event once")
			waitMetric(t, ts.URL(), `idem_webhook_attempts_total{result="delivered"}`, func(v float64) bool { return v >= 3 })

			// Disabled: nothing more; a test send is refused.
			status, got, _ = c.call(t, http.MethodPatch, "/v1/webhooks/"+id, admin, `{"enabled":false}`)
			require.Equal(t, http.StatusOK, status)
			require.Equal(t, false, got["enabled"])
			status, p, _ = c.call(t, http.MethodPost, "/v1/webhooks/"+id+"/test", admin, "")
			require.Equal(t, http.StatusConflict, status, "%v", p)
			require.Equal(t, "webhook_disabled", p["code"], "the endpoint exists; it is disabled")

			status, _, _ = c.call(t, http.MethodDelete, "/v1/webhooks/"+id, admin, "")
			require.Equal(t, http.StatusNoContent, status)
			status, list, _ := c.call(t, http.MethodGet, "/v1/webhooks", admin, "")
			require.Equal(t, http.StatusOK, status)
			require.Empty(t, list["items"])
		})
	}
}

// Without IDEM_WEBHOOK_ALLOW_PRIVATE, loopback, link-local and private
// URLs are refused at registration.
func TestWebhookPrivateTargetsRefused(t *testing.T) {
	t.Parallel()
	ts := servertest.Start(t, servertest.Options{Tenants: []string{"acme"}})
	c := newAPIClient(t, ts)
	admin := ts.Token(t, "acme", "tenant:admin")
	for _, u := range []string{"http://127.0.0.1:8080/h", "http://localhost/h", "http://169.254.169.254/latest/meta-data", "http://[::1]/h", "http://10.0.0.7/h"} {
		status, p, _ := c.call(t, http.MethodPost, "/v1/webhooks", admin, `{"url":"`+u+`"}`)
		require.Equal(t, http.StatusBadRequest, status, "%s: %v", u, p)
		require.Equal(t, "url", p["errors"].([]any)[0].(map[string]any)["field"])
	}
}

func hasType(r *webhookreceiver.Receiver, typ string) bool {
	for _, q := range r.Requests() {
		if q.Type == typ {
			return true
		}
	}
	return false
}

// TestWebhookEndpointsBounded: a tenant has at most 16 webhook endpoints.
// Every key event of the tenant (a lease_lost is one refused write with a
// stale token) is queued once per endpoint inside the write's own
// transaction — on SQLite under the one write lock every tenant shares —
// so endpoints without a bound let one tenant make every such write as
// long as it liked (3,000 endpoints: 18 ms per stale write, all of it
// holding the lock), and its unbounded listing with it. The 17th is 409
// webhook_limit_reached; concurrent creates cannot pass the bound either;
// deleting one makes room. Before, the 17th was 201 on both stores.
func TestWebhookEndpointsBounded(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{servertest.BackendSQLite, servertest.BackendPostgres} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			ts := servertest.Start(t, servertest.Options{Backend: backend, Tenants: []string{"acme"}, Configure: webhookConfig})
			c := newAPIClient(t, ts)
			admin := ts.Token(t, "acme", "tenant:admin")
			create := func(i int) (int, map[string]any) {
				status, body, _ := c.call(t, http.MethodPost, "/v1/webhooks", admin, fmt.Sprintf(`{"url":"http://127.0.0.1:9/h%d"}`, i))
				return status, body
			}
			var first string
			for i := range 15 {
				status, ep := create(i)
				require.Equal(t, http.StatusCreated, status, "%v", ep)
				if i == 0 {
					first = ep["id"].(string)
				}
			}
			statuses := make(chan int, 8)
			for i := range 8 {
				go func() {
					status, _ := create(100 + i)
					statuses <- status
				}()
			}
			created := 0
			for range 8 {
				switch status := <-statuses; status {
				case http.StatusCreated:
					created++
				case http.StatusConflict:
				default:
					t.Fatalf("unexpected status %d", status)
				}
			}
			require.Equal(t, 1, created, "8 concurrent creates for the one place left: one is created")
			status, p := create(200)
			require.Equal(t, http.StatusConflict, status, "the 17th endpoint: %v", p)
			require.Equal(t, "webhook_limit_reached", p["code"])
			status, list, _ := c.call(t, http.MethodGet, "/v1/webhooks", admin, "")
			require.Equal(t, http.StatusOK, status)
			require.Len(t, list["items"], 16)

			status, _, _ = c.call(t, http.MethodDelete, "/v1/webhooks/"+first, admin, "")
			require.Equal(t, http.StatusNoContent, status)
			status, p = create(201)
			require.Equal(t, http.StatusCreated, status, "a deleted endpoint makes room: %v", p)
		})
	}
}
