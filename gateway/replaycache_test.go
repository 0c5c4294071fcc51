package gateway_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/client/frontdoor"
	"github.com/idem-dev/idem/gateway"
	"github.com/idem-dev/idem/tenants"
)

// claimCounter is the gateway's store, counting the claims that reach it.
type claimCounter struct {
	idem.Driver
	claims atomic.Int64
}

func (c *claimCounter) Claim(ctx context.Context, p idem.ClaimParams) (idem.ClaimResult, error) {
	c.claims.Add(1)
	return c.Driver.Claim(ctx, p)
}

// rawPost sends one POST over its own connection and returns the answer's
// bytes as they came, less the Date line (the only one that may differ
// between two answers a second apart).
func rawPost(t *testing.T, base, path, key, body string) []byte {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	require.NoError(t, err)
	defer conn.Close()
	_, err = fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nIdempotency-Key: %s\r\nX-Request-Id: req-fixed\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		path, key, len(body), body)
	require.NoError(t, err)
	b, err := io.ReadAll(bufio.NewReader(conn))
	require.NoError(t, err)
	return regexp.MustCompile(`(?m)^Date: [^\r\n]*\r\n`).ReplaceAll(b, nil)
}

// TestReplayCache: a replay the gateway had from the store is answered
// again from its replay cache, byte for byte the store's replay
// (Idempotent-Replayed, stored headers, body), without a claim in the
// store; a request with the key and another body is not (the store
// answers 422, and the cached entry stays for its own request); the
// upstream ran once. With the cache off every replay is a claim. Without
// the cache the second replay was a claim too; without the fingerprint
// match the 422 was the first request's answer.
func TestReplayCache(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		for _, off := range []bool{false, true} {
			t.Run(fmt.Sprintf("off=%v", off), func(t *testing.T) {
				var store *claimCounter
				r := newRig(t, backend, "", func(o *gateway.Options) {
					store = &claimCounter{Driver: o.Store}
					o.Store = store
					o.ReplayCache.Off = off
				})
				key := "k-cache"
				first := rawPost(t, r.url, "/orders", key, `{"amount":1}`)
				require.Contains(t, string(first), "HTTP/1.1 201")
				require.Equal(t, int64(1), store.claims.Load())

				fromStore := rawPost(t, r.url, "/orders", key, `{"amount":1}`)
				require.Contains(t, string(fromStore), "\r\nIdempotent-Replayed: true\r\n")
				require.Equal(t, int64(2), store.claims.Load(), "the first replay is the store's")

				again := rawPost(t, r.url, "/orders", key, `{"amount":1}`)
				require.Equal(t, string(fromStore), string(again), "a cached replay is byte for byte the store's")
				wantClaims := int64(2)
				if off {
					wantClaims = 3
				}
				require.Equal(t, wantClaims, store.claims.Load(), "off=%v: a cached replay makes no claim", off)

				other := rawPost(t, r.url, "/orders", key, `{"amount":2}`)
				require.Contains(t, string(other), "HTTP/1.1 422", "another request with the key: %s", other)
				require.Contains(t, string(other), `"code":"fingerprint_mismatch"`)
				wantClaims++
				require.Equal(t, wantClaims, store.claims.Load(), "another fingerprint goes to the store")

				// Another path is another document (and operation): the store's.
				path := rawPost(t, r.url, "/orders/7", key, `{"amount":1}`)
				require.Contains(t, string(path), "HTTP/1.1 422")
				wantClaims++
				require.Equal(t, wantClaims, store.claims.Load())

				again = rawPost(t, r.url, "/orders", key, `{"amount":1}`)
				require.Equal(t, string(fromStore), string(again))
				if off {
					wantClaims++
				}
				require.Equal(t, wantClaims, store.claims.Load(), "the entry stays for its own request")
				require.Equal(t, int64(1), r.upstream.Count(), "the upstream ran once")

				wantHits := 2.0
				if off {
					wantHits = 0
				}
				require.Equal(t, wantHits, gathered(t, r, "idem_gateway_replay_cache_hits_total"))
			})
		}
	})
}

// gathered is the value of the gateway's metric name (no labels).
func gathered(t *testing.T, r *rig, name string) float64 {
	t.Helper()
	mfs, err := r.reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			m := mf.GetMetric()[0]
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// TestReplayCacheEndsAtReplayUntil: with a replay window of 3 s and a
// cache max_age of a minute, a cached replay is served no later than the
// record's replay_until: once the window is over the request is claimed
// again and runs again (the record is expired, a new key), as without a
// cache. An entry that lived for its max_age alone replayed for a minute.
func TestReplayCacheEndsAtReplayUntil(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		r := newRig(t, backend, "replay_cache: {max_age: 1m}\n")
		window := 3
		_, err := r.idem.Server().Tenants().Update(t.Context(), tenant, tenants.Patch{Settings: idem.SettingsPatch{ReplayWindowSeconds: &window}})
		require.NoError(t, err)
		first := send(t, http.MethodPost, r.url+"/orders", "k-window", `{}`)
		require.Equal(t, http.StatusCreated, first.status, first.body)
		rec, err := r.idem.Store().GetRecord(t.Context(), idem.GetRecordParams{TenantID: tenant, Key: "k-window"})
		require.NoError(t, err)
		var replays int
		deadline := time.Now().Add(30 * time.Second)
		for r.upstream.Count() == 1 {
			require.True(t, time.Now().Before(deadline), "the request never ran again after replay_until %s", rec.ReplayUntil)
			sent := time.Now()
			got := send(t, http.MethodPost, r.url+"/orders", "k-window", `{}`)
			require.Equal(t, http.StatusCreated, got.status, got.body)
			if got.header.Get(frontdoor.HeaderReplayed) == "true" {
				replays++
				require.Equal(t, first.body, got.body)
				require.True(t, sent.Before(rec.ReplayUntil), "a replay of a request sent at %s, after replay_until %s", sent, rec.ReplayUntil)
			}
		}
		require.Positive(t, replays, "the key was replayed within its window")
		require.Positive(t, gathered(t, r, "idem_gateway_replay_cache_hits_total"), "replays came from the cache")
		require.Equal(t, int64(2), r.upstream.Count(), "once more after the window, once only")
	})
}

// TestReplayCacheBounded: the cache holds at most max_entries answers
// (and max_bytes bytes): with room for two, the third key's replay evicts
// the least recently used, whose next replay is a claim again; a body
// over a 16th of max_bytes is never cached.
func TestReplayCacheBounded(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		var store *claimCounter
		r := newRig(t, backend, "replay_cache: {max_entries: 2, max_bytes: 16384}\n", func(o *gateway.Options) {
			store = &claimCounter{Driver: o.Store}
			o.Store = store
		})
		replay := func(key, path string, wantClaim bool) {
			t.Helper()
			before := store.claims.Load()
			got := send(t, http.MethodPost, r.url+path, key, `{}`)
			require.Equal(t, "true", got.header.Get(frontdoor.HeaderReplayed), "%s: %d %s", key, got.status, got.body)
			require.Equal(t, wantClaim, store.claims.Load() > before, "%s: claimed in the store", key)
		}
		for _, k := range []string{"a", "b", "c"} {
			send(t, http.MethodPost, r.url+"/orders", k, `{}`)
		}
		replay("a", "/orders", true)
		replay("b", "/orders", true)
		replay("a", "/orders", false) // a is now the most recently used
		replay("c", "/orders", true)  // evicts b
		replay("a", "/orders", false)
		replay("c", "/orders", false)
		replay("b", "/orders", true)
		require.Equal(t, 2.0, gathered(t, r, "idem_gateway_replay_cache_entries"))
		require.LessOrEqual(t, gathered(t, r, "idem_gateway_replay_cache_bytes"), 16384.0)

		// 2000 bytes: over 16384/16, never cached.
		send(t, http.MethodPost, r.url+"/orders?size=2000", "big", `{}`)
		replay("big", "/orders?size=2000", true)
		replay("big", "/orders?size=2000", true)
	})
}

// TestReplayCacheDroppedWhenTheTenantIsRefused: the tenant disabled, the
// first request the cache cannot answer is refused 403 tenant_unknown by
// the store, and that drops the tenant's entries: its completed keys are
// refused too from then on, as without a cache. Re-enabled, they replay
// again. (Within max_age of the disabling, a cached key may still be
// replayed: the documented bound.)
func TestReplayCacheDroppedWhenTheTenantIsRefused(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		r := newRig(t, backend, "replay_cache: {max_age: 1m}\n")
		send(t, http.MethodPost, r.url+"/orders", "k-kept", `{}`)
		got := send(t, http.MethodPost, r.url+"/orders", "k-kept", `{}`)
		require.Equal(t, "true", got.header.Get(frontdoor.HeaderReplayed))
		require.Equal(t, 1.0, gathered(t, r, "idem_gateway_replay_cache_entries"))

		disabled := true
		_, err := r.idem.Server().Tenants().Update(t.Context(), tenant, tenants.Patch{Disabled: &disabled})
		require.NoError(t, err)
		refused := send(t, http.MethodPost, r.url+"/orders", "k-other", `{}`)
		require.Equal(t, http.StatusForbidden, refused.status, refused.body)
		require.Equal(t, "tenant_unknown", refused.code(t))
		require.Zero(t, gathered(t, r, "idem_gateway_replay_cache_entries"), "the refusal dropped the tenant's entries")
		kept := send(t, http.MethodPost, r.url+"/orders", "k-kept", `{}`)
		require.Equal(t, http.StatusForbidden, kept.status, "a completed key of a refused tenant: %s", kept.body)

		disabled = false
		_, err = r.idem.Server().Tenants().Update(t.Context(), tenant, tenants.Patch{Disabled: &disabled})
		require.NoError(t, err)
		again := send(t, http.MethodPost, r.url+"/orders", "k-kept", `{}`)
		require.Equal(t, "true", again.header.Get(frontdoor.HeaderReplayed), again.body)
		require.Equal(t, int64(1), r.upstream.Count())
	})
}

// TestReplayCacheConfig: the file's replay_cache turns the cache off
// (every replay a claim) and its bounds are checked when the file loads.
func TestReplayCacheConfig(t *testing.T) {
	t.Parallel()
	var store *claimCounter
	r := newRig(t, "sqlite", "replay_cache: {enabled: false}\n", func(o *gateway.Options) {
		store = &claimCounter{Driver: o.Store}
		o.Store = store
	})
	for range 3 {
		send(t, http.MethodPost, r.url+"/orders", "k-off", `{}`)
	}
	require.Equal(t, int64(3), store.claims.Load(), "off in the file: every replay is a claim")
	require.Zero(t, gathered(t, r, "idem_gateway_replay_cache_hits_total"))

	for _, bad := range []string{"replay_cache: {max_age: 2m}\n", "replay_cache: {max_entries: -1}\n", "replay_cache: {max_bytes: -1}\n"} {
		require.NoError(t, os.WriteFile(r.config, []byte(bad), 0o600))
		require.ErrorContains(t, r.gw.Reload(), "replay_cache", bad)
	}
}
