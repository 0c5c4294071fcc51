package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/auth"
	"github.com/idem-dev/idem/server"
	"github.com/idem-dev/idem/testkit/contract"
	"github.com/idem-dev/idem/testkit/pgtest"
	"github.com/idem-dev/idem/testkit/servertest"
)

// answer is one HTTP answer of a claim that may have waited.
type answer struct {
	status int
	body   map[string]any
	header http.Header
	err    error
}

// claimAsync sends a claim in the background; cancel its ctx to make the
// client go away.
func claimAsync(ctx context.Context, t *testing.T, base, token, key, body string, header http.Header) <-chan answer {
	t.Helper()
	out := make(chan answer, 1)
	hc := &http.Client{Transport: contract.Transport(t, http.DefaultTransport), Timeout: 60 * time.Second}
	go func() {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/keys/"+key+"/claim", strings.NewReader(body))
		if err != nil {
			out <- answer{err: err}
			return
		}
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		for k, v := range header {
			req.Header[k] = v
		}
		resp, err := hc.Do(req)
		if err != nil {
			out <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		a := answer{status: resp.StatusCode, header: resp.Header, err: err}
		if err == nil && len(b) > 0 {
			a.err = json.Unmarshal(b, &a.body)
		}
		out <- a
	}()
	return out
}

func recv(t *testing.T, ch <-chan answer) answer {
	t.Helper()
	select {
	case a := <-ch:
		require.NoError(t, a.err)
		return a
	case <-time.After(30 * time.Second):
		require.FailNow(t, "the held claim was not answered")
	}
	return answer{}
}

// waitWaiting waits until srv holds n claims.
func waitWaiting(t *testing.T, srv *server.Server, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return srv.Waiting() == n }, 20*time.Second, 2*time.Millisecond,
		"the server should hold %d claims (holds %d)", n, srv.Waiting())
}

func requireStillWaiting(t *testing.T, ch <-chan answer) {
	t.Helper()
	select {
	case a := <-ch:
		require.FailNow(t, "the claim was answered while it should wait", "status %d %v", a.status, a.body)
	default:
	}
}

type waitFixture struct {
	ts  *servertest.Server
	c   *apiClient
	tok string
}

func startWait(t *testing.T, backend string, configure func(*server.Config)) *waitFixture {
	ts := servertest.Start(t, servertest.Options{Backend: backend, Tenants: []string{"acme"}, Configure: configure})
	return &waitFixture{ts: ts, c: newAPIClient(t, ts), tok: ts.Token(t, "acme", "keys:write", "keys:read")}
}

// hold claims key and returns its fencing token.
func (f *waitFixture) hold(t *testing.T, key, body string) int64 {
	t.Helper()
	status, claim, _ := f.c.call(t, http.MethodPost, "/v1/keys/"+key+"/claim", f.tok, body)
	require.Equal(t, http.StatusCreated, status, "%v", claim)
	return int64(claim["fencing_token"].(float64))
}

func bothBackends(t *testing.T, fn func(t *testing.T, backend string)) {
	for _, backend := range []string{servertest.BackendSQLite, servertest.BackendPostgres} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			fn(t, backend)
		})
	}
}

// TestWaitCompletionReplays: claims held on a key in flight (one by
// wait_seconds, one by Prefer: wait=N) get the stored response as a 200
// replay as soon as the holder completes; the work ran once.
func TestWaitCompletionReplays(t *testing.T) {
	t.Parallel()
	bothBackends(t, func(t *testing.T, backend string) {
		f := startWait(t, backend, nil)
		token := f.hold(t, "order-1", `{"fingerprint":"fp"}`)
		byBody := claimAsync(t.Context(), t, f.ts.URL(), f.tok, "order-1", `{"fingerprint":"fp","wait_seconds":15}`, nil)
		byPrefer := claimAsync(t.Context(), t, f.ts.URL(), f.tok, "order-1", `{"fingerprint":"fp"}`, http.Header{"Prefer": {"respond-async, wait=15"}})
		waitWaiting(t, f.ts.Server(), 2)

		status, _, _ := f.c.call(t, http.MethodPost, "/v1/keys/order-1/complete", f.tok,
			fmt.Sprintf(`{"fencing_token":%d,"response":{"status":201,"body":"{\"id\":\"ord_1\"}"}}`, token))
		require.Equal(t, http.StatusOK, status)
		for _, ch := range []<-chan answer{byBody, byPrefer} {
			a := recv(t, ch)
			require.Equal(t, http.StatusOK, a.status, "%v", a.body)
			require.Equal(t, "true", a.header.Get("Idempotent-Replayed"))
			require.Equal(t, "wait=15", a.header.Get("Preference-Applied"))
			require.Equal(t, float64(token), a.body["fencing_token"], "the replay is the holder's record")
			require.Equal(t, `{"id":"ord_1"}`, a.body["response"].(map[string]any)["body"])
		}
		require.Equal(t, 0, f.ts.Server().Waiting())
		status, rec, _ := f.c.call(t, http.MethodGet, "/v1/keys/order-1", f.tok, "")
		require.Equal(t, http.StatusOK, status)
		require.Equal(t, float64(1), rec["attempt"], "nobody else ran the work")
	})
}

// TestWaitReleaseGivesClaim: a release hands the key to one held claim
// (201, a new token); the other held claim keeps waiting on the new holder.
func TestWaitReleaseGivesClaim(t *testing.T) {
	t.Parallel()
	bothBackends(t, func(t *testing.T, backend string) {
		f := startWait(t, backend, nil)
		token := f.hold(t, "k", `{"fingerprint":"fp"}`)
		a1 := claimAsync(t.Context(), t, f.ts.URL(), f.tok, "k", `{"fingerprint":"fp","wait_seconds":15}`, nil)
		a2 := claimAsync(t.Context(), t, f.ts.URL(), f.tok, "k", `{"fingerprint":"fp","wait_seconds":15}`, nil)
		waitWaiting(t, f.ts.Server(), 2)
		status, _, _ := f.c.call(t, http.MethodPost, "/v1/keys/k/release", f.tok, fmt.Sprintf(`{"fencing_token":%d}`, token))
		require.Equal(t, http.StatusNoContent, status)

		// Exactly one of the two gets the claim; the other waits on it.
		var won answer
		var loser <-chan answer
		select {
		case won = <-a1:
			loser = a2
		case won = <-a2:
			loser = a1
		case <-time.After(20 * time.Second):
			require.FailNow(t, "no held claim got the released key")
		}
		require.NoError(t, won.err)
		require.Equal(t, http.StatusCreated, won.status, "%v", won.body)
		require.Equal(t, "wait=15", won.header.Get("Preference-Applied"))
		newToken := int64(won.body["fencing_token"].(float64))
		require.Greater(t, newToken, token)
		require.Equal(t, float64(1), won.body["attempt"])
		waitWaiting(t, f.ts.Server(), 1)
		requireStillWaiting(t, loser)

		status, _, _ = f.c.call(t, http.MethodPost, "/v1/keys/k/complete", f.tok,
			fmt.Sprintf(`{"fencing_token":%d,"response":{"status":200,"body":"done"}}`, newToken))
		require.Equal(t, http.StatusOK, status)
		last := recv(t, loser)
		require.Equal(t, http.StatusOK, last.status)
		require.Equal(t, float64(newToken), last.body["fencing_token"])
	})
}

// TestWaitLeaseExpiryTakesOver: a held claim takes the key over when the
// holder's lease runs out (a timer to the lease's end, no event).
func TestWaitLeaseExpiryTakesOver(t *testing.T) {
	t.Parallel()
	bothBackends(t, func(t *testing.T, backend string) {
		f := startWait(t, backend, nil)
		token := f.hold(t, "k", `{"fingerprint":"fp","lease_seconds":1}`)
		a := recv(t, claimAsync(t.Context(), t, f.ts.URL(), f.tok, "k", `{"fingerprint":"fp","wait_seconds":15}`, nil))
		require.Equal(t, http.StatusCreated, a.status, "%v", a.body)
		require.Equal(t, true, a.body["resumed"])
		require.Equal(t, float64(2), a.body["attempt"])
		require.Greater(t, int64(a.body["fencing_token"].(float64)), token)
	})
}

// TestWaitTimeout: when the wait runs out the held claim answers 409 with
// Retry-After (the lease left), as an immediate claim would.
func TestWaitTimeout(t *testing.T) {
	t.Parallel()
	bothBackends(t, func(t *testing.T, backend string) {
		f := startWait(t, backend, nil)
		f.hold(t, "k", `{"fingerprint":"fp","lease_seconds":60}`)
		start := time.Now()
		a := recv(t, claimAsync(t.Context(), t, f.ts.URL(), f.tok, "k", `{"fingerprint":"fp","wait_seconds":1}`, nil))
		require.GreaterOrEqual(t, time.Since(start), time.Second, "the claim was held for its wait")
		require.Equal(t, http.StatusConflict, a.status)
		require.Equal(t, "request_in_flight", a.body["code"])
		require.Equal(t, "wait=1", a.header.Get("Preference-Applied"))
		ra, err := strconv.Atoi(a.header.Get("Retry-After"))
		require.NoError(t, err)
		require.True(t, ra >= 57 && ra <= 60, "Retry-After is the lease left: %d", ra)
		require.Equal(t, 0, f.ts.Server().Waiting())
	})
}

// TestWaitCapAndPreferences: past IDEM_MAX_WAITERS a claim answers the 409
// at once without Preference-Applied; wait_seconds 0 wins over Prefer; a
// tenant with max_wait_seconds 0 never waits; a wait above the tenant's
// cap is shortened to it.
func TestWaitCapAndPreferences(t *testing.T) {
	t.Parallel()
	bothBackends(t, func(t *testing.T, backend string) {
		f := startWait(t, backend, func(c *server.Config) { c.MaxWaiters = 1 })
		token := f.hold(t, "k", `{"fingerprint":"fp"}`)
		held := claimAsync(t.Context(), t, f.ts.URL(), f.tok, "k", `{"fingerprint":"fp","wait_seconds":300}`, nil)
		waitWaiting(t, f.ts.Server(), 1)

		over := recv(t, claimAsync(t.Context(), t, f.ts.URL(), f.tok, "k", `{"fingerprint":"fp","wait_seconds":15}`, nil))
		require.Equal(t, http.StatusConflict, over.status, "past the waiter cap: the immediate 409")
		require.Empty(t, over.header.Get("Preference-Applied"))
		require.NotEmpty(t, over.header.Get("Retry-After"))
		requireStillWaiting(t, held)

		bodyWins := recv(t, claimAsync(t.Context(), t, f.ts.URL(), f.tok, "k", `{"fingerprint":"fp","wait_seconds":0}`, http.Header{"Prefer": {"wait=15"}}))
		require.Equal(t, http.StatusConflict, bodyWins.status)
		require.Empty(t, bodyWins.header.Get("Preference-Applied"))

		bad := recv(t, claimAsync(t.Context(), t, f.ts.URL(), f.tok, "k", `{"fingerprint":"fp","wait_seconds":301}`, nil))
		require.Equal(t, http.StatusBadRequest, bad.status)
		require.Equal(t, []string{"wait_seconds"}, fieldNames(bad.body))

		status, _, _ := f.c.call(t, http.MethodPost, "/v1/keys/k/complete", f.tok,
			fmt.Sprintf(`{"fencing_token":%d,"response":{"status":200}}`, token))
		require.Equal(t, http.StatusOK, status)
		a := recv(t, held)
		require.Equal(t, http.StatusOK, a.status)
		require.Equal(t, "wait="+strconv.Itoa(idem.DefaultMaxWaitSeconds), a.header.Get("Preference-Applied"), "capped by max_wait_seconds")

		f.ts.CreateTenant(t, "nowait", idem.SettingsPatch{MaxWaitSeconds: new(0)})
		tok := f.ts.Token(t, "nowait", "keys:write")
		status, _, _ = f.c.call(t, http.MethodPost, "/v1/keys/k/claim", tok, `{"fingerprint":"fp"}`)
		require.Equal(t, http.StatusCreated, status)
		off := recv(t, claimAsync(t.Context(), t, f.ts.URL(), tok, "k", `{"fingerprint":"fp","wait_seconds":15}`, nil))
		require.Equal(t, http.StatusConflict, off.status)
		require.Empty(t, off.header.Get("Preference-Applied"))
	})
}

// TestWaitClientGoneFreesSlot: a held claim whose client goes away leaves
// at once, and its place serves the next waiter.
func TestWaitClientGoneFreesSlot(t *testing.T) {
	t.Parallel()
	bothBackends(t, func(t *testing.T, backend string) {
		f := startWait(t, backend, func(c *server.Config) { c.MaxWaiters = 1 })
		f.hold(t, "k", `{"fingerprint":"fp"}`)
		ctx, cancel := context.WithCancel(t.Context())
		gone := claimAsync(ctx, t, f.ts.URL(), f.tok, "k", `{"fingerprint":"fp","wait_seconds":60}`, nil)
		waitWaiting(t, f.ts.Server(), 1)
		cancel()
		require.Error(t, (<-gone).err)
		waitWaiting(t, f.ts.Server(), 0)
		next := claimAsync(t.Context(), t, f.ts.URL(), f.tok, "k", `{"fingerprint":"fp","wait_seconds":60}`, nil)
		waitWaiting(t, f.ts.Server(), 1)
		requireStillWaiting(t, next)
	})
}

// TestWaitTwoReplicas: two servers on one PostgreSQL schema; claims held on
// replica B are woken by a completion and a release made through replica A
// (LISTEN/NOTIFY), not by a timer.
func TestWaitTwoReplicas(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	a := servertest.Start(t, servertest.Options{DatabaseURL: url, Tenants: []string{"acme"}})
	b := servertest.Start(t, servertest.Options{DatabaseURL: url})
	ca := newAPIClient(t, a)
	tok := a.Token(t, "acme", "keys:write")

	status, claim, _ := ca.call(t, http.MethodPost, "/v1/keys/shared/claim", tok, `{"fingerprint":"fp","lease_seconds":3600}`)
	require.Equal(t, http.StatusCreated, status)
	token := int64(claim["fencing_token"].(float64))
	onB := claimAsync(t.Context(), t, b.URL(), tok, "shared", `{"fingerprint":"fp","wait_seconds":20}`, nil)
	waitWaiting(t, b.Server(), 1)
	start := time.Now()
	status, _, _ = ca.call(t, http.MethodPost, "/v1/keys/shared/complete", tok,
		fmt.Sprintf(`{"fencing_token":%d,"response":{"status":200,"body":"ok"}}`, token))
	require.Equal(t, http.StatusOK, status)
	got := recv(t, onB)
	require.Equal(t, http.StatusOK, got.status)
	require.Equal(t, "true", got.header.Get("Idempotent-Replayed"))
	require.Less(t, time.Since(start), 10*time.Second, "woken by the notification, not by the end of the wait")

	status, claim, _ = ca.call(t, http.MethodPost, "/v1/keys/other/claim", tok, `{"fingerprint":"fp","lease_seconds":3600}`)
	require.Equal(t, http.StatusCreated, status)
	token = int64(claim["fencing_token"].(float64))
	onB = claimAsync(t.Context(), t, b.URL(), tok, "other", `{"fingerprint":"fp","wait_seconds":20}`, nil)
	waitWaiting(t, b.Server(), 1)
	status, _, _ = ca.call(t, http.MethodPost, "/v1/keys/other/release", tok, fmt.Sprintf(`{"fencing_token":%d}`, token))
	require.Equal(t, http.StatusNoContent, status)
	got = recv(t, onB)
	require.Equal(t, http.StatusCreated, got.status)
	require.Greater(t, int64(got.body["fencing_token"].(float64)), token)
}

// TestWaitShutdownWakesWaiters: a graceful shutdown answers held claims
// with 409 and Retry-After at once and is not held up by them.
func TestWaitShutdownWakesWaiters(t *testing.T) {
	t.Parallel()
	bothBackends(t, func(t *testing.T, backend string) {
		cfg := server.DefaultConfig()
		cfg.Addr = "127.0.0.1:0"
		cfg.JWTHS256Secret = servertest.Secret
		cfg.CreateDB = true
		if backend == servertest.BackendPostgres {
			cfg.DatabaseURL = pgtest.URL(t)
		} else {
			cfg.DatabaseURL = "sqlite:" + t.TempDir() + "/idem.db"
		}
		srv, err := server.New(t.Context(), cfg, nil)
		require.NoError(t, err)
		_, err = srv.Tenants().Create(t.Context(), "acme", "acme", idem.SettingsPatch{})
		require.NoError(t, err)
		require.NoError(t, srv.Listen())
		ctx, stop := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- srv.Run(ctx) }()
		t.Cleanup(stop)

		tok := mintToken(t, cfg, "acme")
		resp, body := do(t, http.MethodPost, srv.URL()+"/v1/keys/k/claim", tok, `{"fingerprint":"fp"}`)
		require.Equal(t, http.StatusCreated, resp.StatusCode, string(body))
		held := claimAsync(t.Context(), t, srv.URL(), tok, "k", `{"fingerprint":"fp","wait_seconds":20}`, nil)
		waitWaiting(t, srv, 1)

		start := time.Now()
		stop()
		a := recv(t, held)
		require.Equal(t, http.StatusConflict, a.status)
		require.Equal(t, "request_in_flight", a.body["code"])
		require.NotEmpty(t, a.header.Get("Retry-After"))
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(15 * time.Second):
			require.FailNow(t, "shutdown hung on a held claim")
		}
		require.Less(t, time.Since(start), 10*time.Second, "the shutdown did not wait for the held claim's wait")
	})
}

func mintToken(t *testing.T, cfg server.Config, tenant string) string {
	t.Helper()
	tok, err := auth.MintHS256([]byte(cfg.JWTHS256Secret), auth.MintClaims{
		Issuer: cfg.JWTIssuer, Audience: cfg.JWTAudience, Subject: "wait-test",
		Tenant: tenant, Scopes: []string{"keys:write"}, TTL: time.Hour,
	})
	require.NoError(t, err)
	return tok
}

// TestWaitersShareAcrossTenants: one tenant may hold at most half of
// IDEM_MAX_WAITERS; past its share its claims get the immediate 409, and
// another tenant's claim still waits and gets its replay. Before, one
// tenant's held claims could take every place, and every other tenant's
// wait was refused at once.
func TestWaitersShareAcrossTenants(t *testing.T) {
	t.Parallel()
	bothBackends(t, func(t *testing.T, backend string) {
		f := startWait(t, backend, func(c *server.Config) { c.MaxWaiters = 4 })
		f.hold(t, "k", `{"fingerprint":"fp"}`)
		for range 2 {
			_ = claimAsync(t.Context(), t, f.ts.URL(), f.tok, "k", `{"fingerprint":"fp","wait_seconds":60}`, nil)
		}
		waitWaiting(t, f.ts.Server(), 2)
		over := recv(t, claimAsync(t.Context(), t, f.ts.URL(), f.tok, "k", `{"fingerprint":"fp","wait_seconds":60}`, nil))
		require.Equal(t, http.StatusConflict, over.status, "past the tenant's share of the waiters: the immediate 409")
		require.Empty(t, over.header.Get("Preference-Applied"))

		f.ts.CreateTenant(t, "other", idem.SettingsPatch{})
		tok := f.ts.Token(t, "other", "keys:write")
		status, claim, _ := f.c.call(t, http.MethodPost, "/v1/keys/k/claim", tok, `{"fingerprint":"fp"}`)
		require.Equal(t, http.StatusCreated, status, "%v", claim)
		held := claimAsync(t.Context(), t, f.ts.URL(), tok, "k", `{"fingerprint":"fp","wait_seconds":60}`, nil)
		waitWaiting(t, f.ts.Server(), 3)
		requireStillWaiting(t, held)
		status, _, _ = f.c.call(t, http.MethodPost, "/v1/keys/k/complete", tok,
			fmt.Sprintf(`{"fencing_token":%v,"response":{"status":200}}`, claim["fencing_token"]))
		require.Equal(t, http.StatusOK, status)
		a := recv(t, held)
		require.Equal(t, http.StatusOK, a.status, "the other tenant's claim waited and got the replay: %v", a.body)
		require.NotEmpty(t, a.header.Get("Preference-Applied"))
	})
}
