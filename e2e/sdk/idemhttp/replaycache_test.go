package idemhttp_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/client/frontdoor"
	"github.com/idem-dev/idem/client/idemhttp"
	"github.com/idem-dev/idem/testkit/servertest"
)

// claimCounter is the transport of the middleware's client: it counts the
// claims that reach the idem server.
type claimCounter struct {
	next   http.RoundTripper
	claims atomic.Int64
}

func (c *claimCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	if strings.HasSuffix(r.URL.Path, "/claim") {
		c.claims.Add(1)
	}
	return c.next.RoundTrip(r)
}

// countedClient is a client of the shop tenant whose claims are counted.
func countedClient(t *testing.T, srv *servertest.Server) (*client.Client, *claimCounter) {
	t.Helper()
	cc := &claimCounter{next: client.NewTransport()}
	c, err := client.New(srv.URL(), client.WithToken(srv.Token(t, "shop", "keys:write")),
		client.WithHTTPClient(&http.Client{Transport: cc}),
		client.WithRetryPolicy(client.RetryPolicy{BaseDelay: 20 * time.Millisecond, RetryAfterJitter: 50 * time.Millisecond}))
	require.NoError(t, err)
	return c, cc
}

// rawAnswer sends one POST over its own connection and returns the answer's
// bytes as they came, less the Date line.
func rawAnswer(t *testing.T, base, path, key, body string) []byte {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	require.NoError(t, err)
	defer conn.Close()
	_, err = fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nIdempotency-Key: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		path, key, len(body), body)
	require.NoError(t, err)
	b, err := io.ReadAll(bufio.NewReader(conn))
	require.NoError(t, err)
	return regexp.MustCompile(`(?m)^Date: [^\r\n]*\r\n`).ReplaceAll(b, nil)
}

// TestMiddlewareReplayCache: a replay idem answered is answered again from
// the middleware's replay cache, byte for byte idem's replay, without a
// claim; a request with the key and another body, or on another path, is
// not (idem answers 422, and the entry stays for its own request); the
// handler ran once. With ReplayCache.Off every replay is a claim. Without
// the cache the second replay was a claim; without the fingerprint match
// the 422 was the first request's answer.
func TestMiddlewareReplayCache(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, srv *servertest.Server, _ *client.Client) {
		for _, off := range []bool{false, true} {
			t.Run(fmt.Sprintf("off=%v", off), func(t *testing.T) {
				c, cc := countedClient(t, srv)
				a := newApp(t, c, idemhttp.Options{ReplayCache: frontdoor.ReplayCacheOptions{Off: off}})
				key := fmt.Sprintf("k-cache-%v", off)
				first := rawAnswer(t, a.srv.URL, "/orders/cus_1", key, `{"amount":1}`)
				require.Contains(t, string(first), "HTTP/1.1 201")
				fromIdem := rawAnswer(t, a.srv.URL, "/orders/cus_1", key, `{"amount":1}`)
				require.Contains(t, string(fromIdem), "\r\nIdempotent-Replayed: true\r\n")
				require.Equal(t, int64(2), cc.claims.Load(), "the first replay is idem's")

				again := rawAnswer(t, a.srv.URL, "/orders/cus_1", key, `{"amount":1}`)
				require.Equal(t, string(fromIdem), string(again), "a cached replay is byte for byte idem's")
				want := int64(2)
				if off {
					want = 3
				}
				require.Equal(t, want, cc.claims.Load(), "off=%v: a cached replay makes no claim", off)

				other := rawAnswer(t, a.srv.URL, "/orders/cus_1", key, `{"amount":2}`)
				require.Contains(t, string(other), "HTTP/1.1 422", "another request with the key: %s", other)
				require.Contains(t, string(other), `"code":"fingerprint_mismatch"`)
				path := rawAnswer(t, a.srv.URL, "/orders/cus_2", key, `{"amount":1}`)
				require.Contains(t, string(path), "HTTP/1.1 422", "another path with the key: %s", path)
				want += 2
				require.Equal(t, want, cc.claims.Load(), "another fingerprint goes to idem")

				again = rawAnswer(t, a.srv.URL, "/orders/cus_1", key, `{"amount":1}`)
				require.Equal(t, string(fromIdem), string(again))
				if off {
					want++
				}
				require.Equal(t, want, cc.claims.Load(), "the entry stays for its own request")
				require.Equal(t, int64(1), a.orders.Load(), "the handler ran once")
			})
		}
	})
}

// TestMiddlewareReplayCacheEndsAtReplayUntil: with a replay window of 3 s
// and a cache MaxAge of a minute, a cached replay is served no later than
// the record's replay_until (on the server's clock, a second early): once
// the window is over the request is claimed and runs again, as without a
// cache. An entry that lived for its MaxAge alone replayed for a minute.
func TestMiddlewareReplayCacheEndsAtReplayUntil(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, srv *servertest.Server, c *client.Client) {
		admin, err := client.New(srv.URL(), client.WithToken(srv.Token(t, "", "admin")))
		require.NoError(t, err)
		_, err = admin.AdminUpdateTenant(t.Context(), "shop", client.TenantPatch{Settings: &client.SettingsPatch{ReplayWindowSeconds: client.Ptr(3)}})
		require.NoError(t, err)
		a := newApp(t, c, idemhttp.Options{ReplayCache: frontdoor.ReplayCacheOptions{MaxAge: time.Minute}})
		url := a.srv.URL + "/orders/cus_1"
		first := post(t, url, "k-window", `{}`)
		require.Equal(t, http.StatusCreated, first.status, first.body)
		rec, err := c.Get(t.Context(), "k-window")
		require.NoError(t, err)
		var replays int
		deadline := time.Now().Add(30 * time.Second)
		for a.orders.Load() == 1 {
			require.True(t, time.Now().Before(deadline), "the request never ran again after replay_until %s", rec.ReplayUntil)
			sent := time.Now()
			got := post(t, url, "k-window", `{}`)
			require.Equal(t, http.StatusCreated, got.status, got.body)
			if got.header.Get(idemhttp.HeaderReplayed) == "true" {
				replays++
				require.Equal(t, first.body, got.body)
				require.True(t, sent.Before(rec.ReplayUntil), "a replay of a request sent at %s, after replay_until %s", sent, rec.ReplayUntil)
			}
		}
		require.Positive(t, replays, "the key was replayed within its window")
		require.Equal(t, int64(2), a.orders.Load(), "once more after the window, once only")
	})
}

// TestMiddlewareReplayCacheBounded: with room for two entries the third
// key's replay evicts the least recently used, whose next replay is a
// claim again; an answer over a 16th of MaxBytes is never cached.
func TestMiddlewareReplayCacheBounded(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, srv *servertest.Server, _ *client.Client) {
		c, cc := countedClient(t, srv)
		a := newApp(t, c, idemhttp.Options{ReplayCache: frontdoor.ReplayCacheOptions{MaxEntries: 2, MaxBytes: 16384}})
		replay := func(key string, wantClaim bool) {
			t.Helper()
			before := cc.claims.Load()
			got := post(t, a.srv.URL+"/orders/cus_1", key, `{}`)
			require.Equal(t, "true", got.header.Get(idemhttp.HeaderReplayed), "%s: %d %s", key, got.status, got.body)
			require.Equal(t, wantClaim, cc.claims.Load() > before, "%s: claimed in idem", key)
		}
		for _, k := range []string{"a", "b", "c"} {
			post(t, a.srv.URL+"/orders/cus_1", k, `{}`)
		}
		replay("a", true)
		replay("b", true)
		replay("a", false)
		replay("c", true) // evicts b
		replay("a", false)
		replay("c", false)
		replay("b", true)

		a.big = 2000 // over 16384/16
		post(t, a.srv.URL+"/orders/cus_1", "big", `{}`)
		replay("big", true)
		replay("big", true)
	})
}

// TestMiddlewareReplayCacheDroppedWhenTheTenantIsRefused: the tenant
// disabled, the first request the cache cannot answer is refused 403
// tenant_unknown by idem, and that drops the cache: the completed key is
// refused too from then on, as without a cache; re-enabled, it replays.
func TestMiddlewareReplayCacheDroppedWhenTheTenantIsRefused(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, srv *servertest.Server, c *client.Client) {
		admin, err := client.New(srv.URL(), client.WithToken(srv.Token(t, "", "admin")))
		require.NoError(t, err)
		a := newApp(t, c, idemhttp.Options{ReplayCache: frontdoor.ReplayCacheOptions{MaxAge: time.Minute}})
		url := a.srv.URL + "/orders/cus_1"
		post(t, url, "k-kept", `{}`)
		got := post(t, url, "k-kept", `{}`)
		require.Equal(t, "true", got.header.Get(idemhttp.HeaderReplayed))

		require.NoError(t, admin.DisableTenant(t.Context(), "shop"))
		requireProblem(t, post(t, url, "k-other", `{}`), http.StatusForbidden, frontdoor.CodeTenantUnknown, false)
		requireProblem(t, post(t, url, "k-kept", `{}`), http.StatusForbidden, frontdoor.CodeTenantUnknown, false)

		_, err = admin.AdminUpdateTenant(t.Context(), "shop", client.TenantPatch{Disabled: client.Ptr(false)})
		require.NoError(t, err)
		again := post(t, url, "k-kept", `{}`)
		require.Equal(t, "true", again.header.Get(idemhttp.HeaderReplayed), again.body)
		require.Equal(t, int64(1), a.orders.Load())
	})
}
