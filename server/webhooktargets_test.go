package server_test

// Webhook targets and delivery errors (issue 21, hole 8) through real
// HTTP on both stores: IPv4-compatible, local-use NAT64 and site-local
// targets are refused at registration, and the delivery log a tenant reads
// names no address of the operator's network.

import (
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/server"
	"github.com/idem-dev/idem/testkit/servertest"
)

// publicOnlyWebhooks makes delivery quick, private targets refused.
func publicOnlyWebhooks(c *server.Config) {
	webhookConfig(c)
	c.Webhooks.AllowPrivate = false
}

// TestWebhookReservedTargetsRefused: the ranges PublicAddr let through
// before (IPv4-compatible [::127.0.0.1], local-use NAT64 64:ff9b:1::/48,
// site-local fec0::/10, discard-only 100::/64, documentation) are 400
// naming url at registration; a NAT64 address of a public IPv4 address is
// accepted (an IPv6-only network reaches public receivers so).
func TestWebhookReservedTargetsRefused(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{servertest.BackendSQLite, servertest.BackendPostgres} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			ts := servertest.Start(t, servertest.Options{Backend: backend, Tenants: []string{"acme"}, Configure: publicOnlyWebhooks})
			c := newAPIClient(t, ts)
			admin := ts.Token(t, "acme", "tenant:admin")
			for _, u := range []string{"http://[::127.0.0.1]:8080/h", "http://[::ffff:127.0.0.1]/h", "http://[64:ff9b::7f00:1]/h",
				"http://[64:ff9b:1::1]/h", "http://[fec0::1]/h", "http://[100::1]/h", "http://[2001:db8::1]/h", "http://203.0.113.7/h"} {
				status, p, _ := c.call(t, http.MethodPost, "/v1/webhooks", admin, `{"url":"`+u+`"}`)
				require.Equal(t, http.StatusBadRequest, status, "%s: %v", u, p)
				require.Equal(t, "url", p["errors"].([]any)[0].(map[string]any)["field"])
			}
			status, p, _ := c.call(t, http.MethodPost, "/v1/webhooks", admin, `{"url":"https://[64:ff9b::808:808]/h","enabled":false}`)
			require.Equal(t, http.StatusCreated, status, "%v", p)
		})
	}
}

// addressLike matches an IPv4 address, a bracketed or ::-compressed IPv6
// address, or a DNS port.
var addressLike = regexp.MustCompile(`\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}|\[[0-9a-fA-F:.%]*\]|[0-9a-fA-F]*::[0-9a-fA-F:.]*|:53\b`)

// TestWebhookDeliveryErrorNamesNoAddress: an endpoint whose name does not
// resolve (.invalid, RFC 6761) gets a delivery log entry, read through the
// API, that says so without naming the server's resolver. Before, it read
// "dial tcp: lookup hooks.idem-test.invalid on 10.255.255.53:53: no such
// host": the resolver's private address, shown to every tenant.
func TestWebhookDeliveryErrorNamesNoAddress(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{servertest.BackendSQLite, servertest.BackendPostgres} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			ts := servertest.Start(t, servertest.Options{Backend: backend, Tenants: []string{"acme"}, Configure: publicOnlyWebhooks})
			c := newAPIClient(t, ts)
			admin := ts.Token(t, "acme", "tenant:admin")
			status, ep, _ := c.call(t, http.MethodPost, "/v1/webhooks", admin, `{"url":"http://hooks.idem-test.invalid/hook"}`)
			require.Equal(t, http.StatusCreated, status, "%v", ep)
			id := ep["id"].(string)
			status, _, _ = c.call(t, http.MethodPost, "/v1/webhooks/"+id+"/test", admin, "")
			require.Equal(t, http.StatusAccepted, status)

			var last string
			require.Eventually(t, func() bool {
				_, log, _ := c.call(t, http.MethodGet, "/v1/webhooks/"+id+"/deliveries", admin, "")
				items := log["items"].([]any)
				if len(items) == 0 {
					return false
				}
				last, _ = items[0].(map[string]any)["last_error"].(string)
				return last != ""
			}, 30*time.Second, 50*time.Millisecond)
			// Which failure depends on the machine's resolver (no such
			// host, or none reachable); none names an address.
			require.True(t, strings.HasPrefix(last, "the endpoint's host name") || strings.HasPrefix(last, "timeout resolving"), last)
			require.NotRegexp(t, addressLike, last)
		})
	}
}
