package webhooks_test

import (
	"context"
	"net"
	"net/url"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/testkit/webhookreceiver"
	"github.com/idem-dev/idem/webhooks"
)

// endpointAt stores an enabled endpoint of tenant "acme" at rawURL as it
// is, past the registration check: an endpoint registered before a range
// was refused, or a name that resolves elsewhere now.
func endpointAt(t *testing.T, s store, rawURL string) idem.WebhookEndpoint {
	t.Helper()
	ctx := context.Background()
	if _, err := s.GetTenant(ctx, idem.GetTenantParams{ID: "acme"}); err != nil {
		_, err := s.CreateTenant(ctx, idem.CreateTenantParams{ID: "acme", Name: "acme", Settings: idem.DefaultSettings()})
		require.NoError(t, err)
	}
	e, err := s.CreateWebhookEndpoint(ctx, idem.WebhookEndpoint{
		TenantID: "acme", ID: idem.NewWebhookEndpointID(), URL: rawURL, Secret: idem.NewWebhookSecret(), Enabled: true,
	})
	require.NoError(t, err)
	return e
}

// anAddress matches an IPv4 address, a bracketed IPv6 address or a DNS
// port: what a delivery error must not show the tenant.
var anAddress = regexp.MustCompile(`\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}|\[[0-9a-fA-F:.%]*\]|[0-9a-fA-F]*::[0-9a-fA-F:.]*|:53\b`)

// IPv4-compatible ([::127.0.0.1]), local-use NAT64 and site-local targets
// are refused at connect time like any private address: the loopback
// receiver whose port they name gets nothing, and the log says why
// without the address. Before, the three passed as public and were
// dialled (the log held "connect: network is unreachable" or a timeout).
func TestDeliveryRefusesReservedIPv6Targets(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) store) {
		s := open(t)
		r := webhookreceiver.New(t, webhookreceiver.Always(200))
		u, err := url.Parse(r.URL)
		require.NoError(t, err)
		var eps []idem.WebhookEndpoint
		for _, host := range []string{"::127.0.0.1", "64:ff9b:1::7f00:1", "fec0::1", "::ffff:0:7f00:1", "100::1"} {
			e := endpointAt(t, s, "http://"+net.JoinHostPort(host, u.Port())+"/hook")
			testEvent(t, s, e)
			eps = append(eps, e)
		}
		cfg := fastConfig()
		cfg.AllowPrivate = false
		n, err := webhooks.New(s, cfg, nil, nil).DeliverOnce(context.Background())
		require.NoError(t, err)
		require.Equal(t, len(eps), n)
		require.Empty(t, r.Requests(), "the loopback receiver was reached")
		for _, e := range eps {
			log := logOf(t, s, e)
			require.Len(t, log, 1, e.URL)
			require.Equal(t, idem.DeliveryPending, log[0].State, e.URL)
			require.Equal(t, "refused: the target resolves to a private or reserved address", log[0].LastError, e.URL)
		}
	})
}

// nxdomainResolver is a resolver whose server, on loopback, answers every
// query "no such name" (the query sent back with the response bit and
// rcode 3 set). The error of a lookup through it names the resolver the
// system is configured with (resolv.conf's nameserver, or 127.0.0.1:53
// without one): a private address of the operator's network.
func nxdomainResolver(t *testing.T) *net.Resolver {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = pc.Close() })
	go func() {
		b := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(b)
			if err != nil {
				return
			}
			if n < 12 {
				continue
			}
			q := append([]byte(nil), b[:n]...)
			q[2] |= 0x80                // QR: a response
			q[3] = q[3]&0x70 | 0x80 | 3 // RA, RCODE 3: NXDOMAIN
			_, _ = pc.WriteTo(q, from)
		}
	}()
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", pc.LocalAddr().String())
	}}
}

// A delivery's error, shown to the tenant in its delivery log, names no
// address: not the resolver's when the name does not resolve, not the
// target's when the connection is refused. Before, the log held "dial
// tcp: lookup hooks.idem-test.invalid on 10.255.255.53:53: no such host"
// and "dial tcp 127.0.0.1:PORT: connect: connection refused".
func TestDeliveryErrorNamesNoAddress(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) store) {
		s := open(t)
		nx := endpointAt(t, s, "http://hooks.idem-test.invalid/hook")
		testEvent(t, s, nx)
		// A port nobody listens on, on loopback: private targets are
		// allowed here (the refusal of private targets names no address
		// either, see TestDeliveryRefusesReservedIPv6Targets), and the
		// name's lookup fails before any address is checked.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		closed := ln.Addr().String()
		require.NoError(t, ln.Close())
		refused := endpointAt(t, s, "http://"+closed+"/hook")
		testEvent(t, s, refused)

		cfg := webhooks.WithResolver(fastConfig(), nxdomainResolver(t))
		n, err := webhooks.New(s, cfg, nil, nil).DeliverOnce(context.Background())
		require.NoError(t, err)
		require.Equal(t, 2, n)
		require.Equal(t, "the endpoint's host name does not resolve", logOf(t, s, nx)[0].LastError)
		require.Equal(t, "connection refused", logOf(t, s, refused)[0].LastError)
		for _, e := range []idem.WebhookEndpoint{nx, refused} {
			require.NotRegexp(t, anAddress, logOf(t, s, e)[0].LastError)
		}
	})
}
