package e2e

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/testkit/pgtest"
	"github.com/idem-dev/idem/testkit/webhookreceiver"
)

// webhookEnv lets the real binary deliver to the loopback receiver, fast.
func webhookEnv(t *testing.T, backend string) map[string]string {
	return backendEnv(t, backend, map[string]string{
		"IDEM_WEBHOOK_ALLOW_PRIVATE": "1",
		"IDEM_WEBHOOK_INTERVAL":      "100ms",
		"IDEM_WEBHOOK_TIMEOUT":       "3s", // the claim lease is 2×3 s + 5 s = 11 s
		"IDEM_WEBHOOK_RETRY_BASE":    "50ms",
		"IDEM_WEBHOOK_RETRY_CAP":     "500ms",
	})
}

// registerWebhook registers an endpoint for key.lease_lost at r through
// the API and gives r its secret; it returns the endpoint id.
func registerWebhook(t *testing.T, c *http.Client, url, admin string, r *webhookreceiver.Receiver) string {
	t.Helper()
	res := mustCall(t, c, http.MethodPost, url+"/v1/webhooks", admin, map[string]any{"url": r.URL + "/hook", "events": []string{"key.lease_lost"}})
	require.Equal(t, http.StatusCreated, res.status, string(res.body))
	var ep struct{ ID, Secret string }
	require.NoError(t, json.Unmarshal(res.body, &ep))
	r.SetSecret(ep.Secret)
	return ep.ID
}

// lostLease makes one key.lease_lost event: a claim, a takeover after the
// 1 s lease, and a complete with the first token.
func lostLease(t *testing.T, c *http.Client, url, writer, key string) {
	t.Helper()
	claim := map[string]any{"operation": "POST /v1/payments", "fingerprint": "fp-" + key, "lease_seconds": 1}
	res := mustCall(t, c, http.MethodPost, url+"/v1/keys/"+key+"/claim", writer, claim)
	require.Equal(t, http.StatusCreated, res.status, string(res.body))
	stale := decodeRecord(t, res.body).FencingToken
	require.Eventually(t, func() bool {
		res = mustCall(t, c, http.MethodPost, url+"/v1/keys/"+key+"/claim", writer, claim)
		return res.status == http.StatusCreated
	}, 10*time.Second, 100*time.Millisecond, "takeover")
	res = mustCall(t, c, http.MethodPost, url+"/v1/keys/"+key+"/complete", writer,
		map[string]any{"fencing_token": stale, "response": map[string]any{"status": 200}})
	require.Equal(t, http.StatusConflict, res.status, string(res.body))
}

// deliveryLog lists the event ids of an endpoint's log (at most 100).
func deliveryLog(t *testing.T, c *http.Client, url, admin, id string) map[string]string {
	t.Helper()
	res := mustCall(t, c, http.MethodGet, url+"/v1/webhooks/"+id+"/deliveries?limit=100", admin, nil)
	require.Equal(t, http.StatusOK, res.status, string(res.body))
	var page struct {
		Items []struct {
			EventID string `json:"event_id"`
			State   string `json:"state"`
		} `json:"items"`
	}
	require.NoError(t, json.Unmarshal(res.body, &page))
	out := map[string]string{}
	for _, it := range page.Items {
		out[it.EventID] = it.State
	}
	return out
}

// kill -9 of the server while it delivers loses no event: after a restart
// every event queued before the kill reaches the receiver at least once,
// with its webhook-id and a valid signature, the one cut off too.
func TestKill9DuringWebhookDeliveryLosesNoEvent(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"sqlite", "postgres"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			env := webhookEnv(t, backend)
			mustCLI(t, env, "tenant", "create", "acme")
			admin := mintToken(t, env, "acme", "tenant:admin")
			writer := mintToken(t, env, "acme", "keys:write")
			c := newClient(true)
			// The first request hangs: the server is killed in the middle
			// of it. Every later one is acknowledged.
			r := webhookreceiver.New(t, func(n int) webhookreceiver.Answer {
				if n == 0 {
					return webhookreceiver.Answer{Status: 200, Hang: time.Minute}
				}
				return webhookreceiver.Answer{Status: 204}
			})

			srv := startServer(t, env)
			id := registerWebhook(t, c, srv.url, admin, r)
			for i := range 3 {
				lostLease(t, c, srv.url, writer, fmt.Sprintf("k-%d", i))
			}
			require.Eventually(t, func() bool { return len(r.Requests()) > 0 }, 15*time.Second, 10*time.Millisecond)
			cut := r.Requests()[0].ID
			code, _ := srv.stop(t, syscall.SIGKILL, 10*time.Second)
			require.Equal(t, -1, code, "the process must have died from SIGKILL")

			srv = startServer(t, env)
			events := deliveryLog(t, c, srv.url, admin, id)
			require.Len(t, events, 3, "three key.lease_lost events were queued")
			require.Contains(t, events, cut)
			require.Eventually(t, func() bool {
				acked := r.Acked()
				for ev := range events {
					if acked[ev] == 0 {
						return false
					}
				}
				return true
			}, 30*time.Second, 50*time.Millisecond, "every event is delivered after the restart")
			require.Empty(t, r.Bad(), "every request is signed")
			for _, q := range r.Requests() {
				require.Contains(t, events, q.ID, "a request with an unknown webhook-id")
				require.Equal(t, "key.lease_lost", q.Type)
			}
			require.GreaterOrEqual(t, r.ByID()[cut], 2, "the cut-off event is sent again, with the same webhook-id")
			require.Eventually(t, func() bool {
				for _, st := range deliveryLog(t, c, srv.url, admin, id) {
					if st != "delivered" {
						return false
					}
				}
				return true
			}, 10*time.Second, 50*time.Millisecond)
		})
	}
}

// Two replicas (real binaries) on one PostgreSQL database deliver each
// event once when nothing fails.
func TestTwoReplicasDeliverWebhooksOnce(t *testing.T) {
	t.Parallel()
	env := webhookEnv(t, "sqlite")
	env["IDEM_DATABASE_URL"] = pgtest.URL(t)
	mustCLI(t, env, "tenant", "create", "acme")
	admin := mintToken(t, env, "acme", "tenant:admin")
	c := newClient(true)
	r := webhookreceiver.New(t, webhookreceiver.Always(200))
	a, b := startServer(t, env), startServer(t, env)
	id := registerWebhook(t, c, a.url, admin, r)
	const events = 40
	for i := range events {
		url := a.url
		if i%2 == 1 {
			url = b.url
		}
		res := mustCall(t, c, http.MethodPost, url+"/v1/webhooks/"+id+"/test", admin, nil)
		require.Equal(t, http.StatusAccepted, res.status, string(res.body))
	}
	require.Eventually(t, func() bool { return len(r.Acked()) == events }, 30*time.Second, 50*time.Millisecond)
	require.Empty(t, r.Bad())
	for ev, n := range r.ByID() {
		require.Equal(t, 1, n, "event %s delivered %d times", ev, n)
	}
	require.Len(t, r.Requests(), events)
}

// The CLI manages endpoints on the store: create prints the secret once,
// private URLs are refused without IDEM_WEBHOOK_ALLOW_PRIVATE, a test
// event queued by the CLI is delivered by the running server, signed, and
// shows in the delivery log.
func TestCLIWebhooks(t *testing.T) {
	t.Parallel()
	env := webhookEnv(t, "sqlite")
	mustCLI(t, env, "tenant", "create", "acme")
	r := webhookreceiver.New(t, webhookreceiver.Always(200))

	strict := maps.Clone(env)
	delete(strict, "IDEM_WEBHOOK_ALLOW_PRIVATE")
	_, errOut, code := runCLI(t, strict, "webhooks", "create", "--tenant", "acme", "--url", r.URL)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "private")
	_, errOut, code = runCLI(t, env, "webhooks", "create", "--tenant", "acme", "--url", r.URL, "--events", "key.nope")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "unknown event type")

	var ep struct {
		ID     string   `json:"id"`
		Secret string   `json:"secret"`
		Events []string `json:"events"`
	}
	require.NoError(t, json.Unmarshal([]byte(mustCLI(t, env, "webhooks", "create", "--tenant", "acme", "--url", r.URL, "--events", "key.orphaned,key.resolved")), &ep))
	require.True(t, strings.HasPrefix(ep.Secret, "whsec_"))
	require.Equal(t, []string{"key.orphaned", "key.resolved"}, ep.Events)
	r.SetSecret(ep.Secret)
	require.NotContains(t, mustCLI(t, env, "webhooks", "list", "--tenant", "acme"), "whsec_", "list never shows secrets")

	startServer(t, env)
	mustCLI(t, env, "webhooks", "test", "--tenant", "acme", "--id", ep.ID)
	require.Eventually(t, func() bool { return len(r.Acked()) == 1 }, 15*time.Second, 50*time.Millisecond)
	require.Empty(t, r.Bad())
	require.Eventually(t, func() bool {
		return strings.Contains(mustCLI(t, env, "webhooks", "deliveries", "--tenant", "acme", "--id", ep.ID), `"state": "delivered"`)
	}, 10*time.Second, 50*time.Millisecond)

	out := mustCLI(t, env, "webhooks", "set", "--tenant", "acme", "--id", ep.ID, "--enabled=false")
	require.Contains(t, out, `"enabled": false`)
	_, errOut, code = runCLI(t, env, "webhooks", "test", "--tenant", "acme", "--id", ep.ID)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "webhook_disabled")
	mustCLI(t, env, "webhooks", "delete", "--tenant", "acme", "--id", ep.ID)
	require.Equal(t, "[]", strings.TrimSpace(mustCLI(t, env, "webhooks", "list", "--tenant", "acme")))
}
