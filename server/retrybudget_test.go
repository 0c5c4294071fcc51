package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/retrybudget"
	"github.com/idem-dev/idem/server"
	"github.com/idem-dev/idem/testkit/contract"
	"github.com/idem-dev/idem/testkit/servertest"
)

// The retry budget (issue 28; web/docs/retries): through real HTTP on both
// stores. Every server here runs with a window of an hour, so nothing
// leaves the window while a test runs however slow the machine: the
// figures below are exact, not timing-dependent.

// startBudgeted starts a server whose retry budget window is an hour, with
// tenant id at retry_budget_percent percent.
func startBudgeted(t *testing.T, backend, url string, tenants map[string]int) *servertest.Server {
	t.Helper()
	ts := servertest.Start(t, servertest.Options{Backend: backend, DatabaseURL: url,
		Configure: func(c *server.Config) { c.RetryBudgetWindow = time.Hour }})
	for id, pct := range tenants {
		ts.CreateTenant(t, id, idem.SettingsPatch{RetryBudgetPercent: &pct})
	}
	return ts
}

// attemptClient sends requests with an Idem-Attempt header, every answer
// checked against openapi.yaml.
type attemptClient struct {
	ts   *servertest.Server
	http *http.Client
	tok  string
}

func newAttemptClient(t *testing.T, ts *servertest.Server, tenant string) *attemptClient {
	return &attemptClient{ts: ts, tok: ts.Token(t, tenant, "keys:write", "keys:read"),
		http: &http.Client{Transport: contract.Transport(t, http.DefaultTransport), Timeout: 30 * time.Second}}
}

type budgetAnswer struct {
	status int
	body   map[string]any
	header http.Header
}

// call sends method path with body and the header attempt ("" for none).
func (c *attemptClient) call(t *testing.T, method, path, attempt, body string) budgetAnswer {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, c.ts.URL()+path, r)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+c.tok)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if attempt != "" {
		req.Header.Set(retrybudget.Header, attempt)
	}
	resp, err := c.http.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var out map[string]any
	if len(b) > 0 {
		require.NoError(t, json.Unmarshal(b, &out), "%s %s: %s", method, path, b)
	}
	return budgetAnswer{resp.StatusCode, out, resp.Header}
}

const budgetClaim = `{"operation":"POST /v1/payments","request":{"amount":1}}`

func (c *attemptClient) claim(t *testing.T, key, attempt string) budgetAnswer {
	t.Helper()
	return c.call(t, http.MethodPost, "/v1/keys/"+key+"/claim", attempt, budgetClaim)
}

// requireRefused checks a 429 retry_budget_exhausted problem.
func requireRefused(t *testing.T, a budgetAnswer) {
	t.Helper()
	require.Equal(t, http.StatusTooManyRequests, a.status, "%v", a.body)
	require.Equal(t, "retry_budget_exhausted", a.body["code"])
	require.Equal(t, true, a.body["retryable"])
	require.NotEmpty(t, a.header.Get("Retry-After"))
	require.Equal(t, "application/problem+json", a.header.Get("Content-Type"))
}

// record returns the stored record of key, or key_not_found.
func record(t *testing.T, ts *servertest.Server, tenant, key string) (idem.Record, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return ts.Store().GetRecord(ctx, idem.GetRecordParams{TenantID: tenant, Key: key})
}

func eachBackend(t *testing.T, f func(t *testing.T, backend string)) {
	for _, backend := range []string{servertest.BackendSQLite, servertest.BackendPostgres} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			f(t, backend)
		})
	}
}

// TestRetryBudgetBurst: with retry_budget_percent 10 and 200 first
// attempts in the window, a burst of 60 concurrent retries has exactly 20
// admitted (10 % of 200) and 40 refused with 429 retry_budget_exhausted;
// first attempts sent during and after the burst are all served; every
// refused claim left no record; the metrics count it all.
func TestRetryBudgetBurst(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, backend string) {
		ts := startBudgeted(t, backend, "", map[string]int{"acme": 10})
		c := newAttemptClient(t, ts, "acme")
		for i := range 200 {
			attempt := "1"
			if i%2 == 0 {
				attempt = "" // a missing header is a first attempt
			}
			require.Equal(t, http.StatusCreated, c.claim(t, fmt.Sprintf("first-%d", i), attempt).status)
		}

		const retries = 60
		answers := make([]budgetAnswer, retries)
		var wg sync.WaitGroup
		for i := range retries {
			wg.Go(func() { answers[i] = c.claim(t, fmt.Sprintf("retry-%d", i), "2;cause=unavailable") })
		}
		wg.Wait()
		admitted := 0
		for i, a := range answers {
			key := fmt.Sprintf("retry-%d", i)
			rec, err := record(t, ts, "acme", key)
			if a.status == http.StatusCreated {
				admitted++
				require.NoError(t, err)
				require.Equal(t, idem.StateInFlight, rec.State)
				continue
			}
			requireRefused(t, a)
			require.ErrorIs(t, err, idem.ErrKeyNotFound, "a refused claim of %s stored nothing", key)
		}
		require.Equal(t, 20, admitted, "10 %% of 200 first attempts")

		// First attempts keep being served: 20 more (the allowance grows
		// by 2), then exactly 2 more retries pass.
		for i := range 20 {
			require.Equal(t, http.StatusCreated, c.claim(t, fmt.Sprintf("later-%d", i), "1").status)
		}
		require.Equal(t, http.StatusCreated, c.claim(t, "again-1", "3;cause=timeout").status)
		require.Equal(t, http.StatusCreated, c.claim(t, "again-2", "3;cause=timeout").status)
		requireRefused(t, c.claim(t, "again-3", "3;cause=timeout"))

		m := newAPIClient(t, ts)
		require.Equal(t, 40.0, m.metric(t, `idem_retries_refused_total{cause="unavailable",tenant="acme"}`))
		require.Equal(t, 1.0, m.metric(t, `idem_retries_refused_total{cause="timeout",tenant="acme"}`))
		require.Equal(t, 220.0, m.metric(t, `idem_attempts_total{attempt="first",cause="none",tenant="acme"}`))
		require.Equal(t, 60.0, m.metric(t, `idem_attempts_total{attempt="retry",cause="unavailable",tenant="acme"}`))
		require.InDelta(t, float64(220+63)/220, m.metric(t, `idem_retry_amplification_ratio{tenant="acme"}`), 1e-9)
	})
}

// TestRetryBudgetFloor: a quiet tenant with no first attempts at all and
// retry_budget_percent 0 still gets the floor, 10 retries per window.
func TestRetryBudgetFloor(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, backend string) {
		ts := startBudgeted(t, backend, "", map[string]int{"quiet": 0, "off": 100})
		c := newAttemptClient(t, ts, "quiet")
		for i := range retrybudget.Floor {
			require.Equal(t, http.StatusCreated, c.claim(t, fmt.Sprintf("k-%d", i), "2;cause=network").status, "retry %d", i)
		}
		requireRefused(t, c.claim(t, "k-last", "2;cause=network"))

		// 100 turns the budget off: 50 retries without any first attempt.
		off := newAttemptClient(t, ts, "off")
		off.call(t, http.MethodGet, "/v1/keys/none", "1", "") // the tenant's settings are read once
		for i := range 50 {
			require.Equal(t, http.StatusCreated, off.claim(t, fmt.Sprintf("k-%d", i), "5;cause=timeout").status, "retry %d", i)
		}
	})
}

// TestRefusedRetryLeavesKey: a refused retry is decided before its body is
// read or the store is called: its key, in flight or absent, is exactly as
// it was, and the same calls made as first attempts afterwards go through.
func TestRefusedRetryLeavesKey(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, backend string) {
		ts := startBudgeted(t, backend, "", map[string]int{"acme": 0})
		c := newAttemptClient(t, ts, "acme")
		claimed := c.claim(t, "held", "1")
		require.Equal(t, http.StatusCreated, claimed.status)
		before, err := record(t, ts, "acme", "held")
		require.NoError(t, err)

		// Use the floor up with reads.
		for range retrybudget.Floor {
			require.Equal(t, http.StatusOK, c.call(t, http.MethodGet, "/v1/keys/held", "2;cause=timeout", "").status)
		}
		requireRefused(t, c.call(t, http.MethodGet, "/v1/keys/held", "2;cause=timeout", ""))
		requireRefused(t, c.claim(t, "held", "2;cause=timeout"))
		requireRefused(t, c.claim(t, "fresh", "2;cause=server-error"))
		// Not even a malformed body is looked at: no 400, the 429.
		requireRefused(t, c.call(t, http.MethodPost, "/v1/keys/fresh/claim", "2;cause=server-error", `{not json`))

		after, err := record(t, ts, "acme", "held")
		require.NoError(t, err)
		before.ObservedAt, after.ObservedAt = time.Time{}, time.Time{}
		require.Equal(t, before, after, "the refused retries changed nothing")
		_, err = record(t, ts, "acme", "fresh")
		require.ErrorIs(t, err, idem.ErrKeyNotFound)

		// Afterwards, as a first attempt: the claim goes through.
		require.Equal(t, http.StatusCreated, c.claim(t, "fresh", "1").status)
	})
}

// TestRetryBudgetSparesFinishingWrites: the writes that record work which
// ran (checkpoint, complete, release) are outside the fleet budget. With
// the tenant's budget spent (a claim's retry is refused), their retries are
// served, not refused, and use none of the allowance: the work is
// recorded once, under the one claim's token, and a retry of the caller
// replays it instead of running it again after the lease. Their attempts
// are still counted in idem_attempts_total, never in
// idem_retries_refused_total.
func TestRetryBudgetSparesFinishingWrites(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, backend string) {
		ts := startBudgeted(t, backend, "", map[string]int{"acme": 0})
		c := newAttemptClient(t, ts, "acme")
		token := map[string]int64{}
		for _, key := range []string{"done", "given-up"} {
			a := c.claim(t, key, "1")
			require.Equal(t, http.StatusCreated, a.status)
			token[key] = int64(a.body["fencing_token"].(float64))
		}
		for range retrybudget.Floor {
			require.Equal(t, http.StatusOK, c.call(t, http.MethodGet, "/v1/keys/done", "2;cause=timeout", "").status)
		}
		requireRefused(t, c.claim(t, "other", "2;cause=unavailable")) // the budget is spent

		signal := func(a budgetAnswer) string { return a.header.Get(retrybudget.SignalHeader) }
		cp := c.call(t, http.MethodPost, "/v1/keys/done/checkpoint", "2;cause=timeout", fmt.Sprintf(`{"fencing_token":%d,"recovery_point":"charged"}`, token["done"]))
		require.Equal(t, http.StatusOK, cp.status, "%v", cp.body)
		require.Empty(t, signal(cp))
		complete := fmt.Sprintf(`{"fencing_token":%d,"response":{"status":201,"body":"{\"charged\":1}"}}`, token["done"])
		done := c.call(t, http.MethodPost, "/v1/keys/done/complete", "3;cause=unavailable", complete)
		require.Equal(t, http.StatusOK, done.status, "the complete's retry is served: %v", done.body)
		require.Empty(t, signal(done))
		rel := c.call(t, http.MethodPost, "/v1/keys/given-up/release", "2;cause=network", fmt.Sprintf(`{"fencing_token":%d}`, token["given-up"]))
		require.Equal(t, http.StatusNoContent, rel.status, "%v", rel.body)

		rec, err := record(t, ts, "acme", "done")
		require.NoError(t, err)
		require.Equal(t, idem.StateCompleted, rec.State)
		require.Equal(t, token["done"], rec.FencingToken, "the one claim's token, never replaced")
		require.Equal(t, "charged", rec.RecoveryPoint)
		_, err = record(t, ts, "acme", "given-up")
		require.ErrorIs(t, err, idem.ErrKeyNotFound, "released")

		// The caller's own retry now replays the recorded answer: nothing
		// runs twice. (A first attempt: a retry's claim is still refused.)
		replay := c.claim(t, "done", "1")
		require.Equal(t, http.StatusOK, replay.status, "%v", replay.body)
		require.Equal(t, "completed", replay.body["state"])
		requireRefused(t, c.claim(t, "other", "2;cause=unavailable"))

		m := newAPIClient(t, ts)
		require.Equal(t, 3.0, m.metric(t, `idem_attempts_total{attempt="retry",cause="unavailable",tenant="acme"}`), "the two refused claims and the complete's retry are attempts")
		require.Equal(t, 1.0, m.metric(t, `idem_attempts_total{attempt="retry",cause="network",tenant="acme"}`), "the release's retry is an attempt")
		require.Equal(t, 2.0, m.metric(t, `idem_retries_refused_total{cause="unavailable",tenant="acme"}`), "only the claims' retries were refused")
	})
}

// TestRetryBudgetSignalSparesFinishingWrites: Idem-Retry-Budget: exhausted
// is never on the answer of a checkpoint, complete or release, whatever the
// budget: an SDK that read it would stop recording work that ran. The
// tenant is rate limited (1 per second), so its requests get 429
// rate_limited, a retryable failure; its 10 first such answers spend the
// budget (percent 0: each invites a retry), and the claims' 429s carry the
// signal from then on, the finishing writes' never.
func TestRetryBudgetSignalSparesFinishingWrites(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, backend string) {
		ts := startBudgeted(t, backend, "", nil)
		pct, rate := 0, 1
		ts.CreateTenant(t, "slow", idem.SettingsPatch{RetryBudgetPercent: &pct, RateLimitPerSecond: &rate})
		c := newAttemptClient(t, ts, "slow")
		signal := func(a budgetAnswer) string { return a.header.Get(retrybudget.SignalHeader) }
		limited := func(a budgetAnswer) bool {
			if a.status != http.StatusTooManyRequests {
				return false
			}
			require.Equal(t, "rate_limited", a.body["code"])
			return true
		}
		// The claim whose token the finishing writes carry, then claims
		// until one 429 says the budget is spent.
		var token int64
		for i := 0; token == 0; i++ {
			require.Less(t, i, 1000)
			if a := c.claim(t, "held", "1"); a.status == http.StatusCreated {
				token = int64(a.body["fencing_token"].(float64))
			}
		}
		spent := false
		for i := 0; !spent; i++ {
			require.Less(t, i, 1000, "no claim's 429 said the budget is spent")
			a := c.claim(t, fmt.Sprintf("k-%d", i), "1")
			spent = limited(a) && signal(a) == retrybudget.Exhausted
		}
		finishing := map[string]string{
			"checkpoint": fmt.Sprintf(`{"fencing_token":%d,"recovery_point":"x"}`, token),
			"complete":   fmt.Sprintf(`{"fencing_token":%d,"response":{"status":201,"body":"{}"}}`, token),
			"release":    fmt.Sprintf(`{"fencing_token":%d}`, token),
		}
		for _, call := range []string{"checkpoint", "complete", "release"} {
			seen := 0
			for i := 0; seen < 3; i++ {
				require.Less(t, i, 1000, "%s: no 429", call)
				for _, attempt := range []string{"1", "2;cause=throttled"} {
					a := c.call(t, http.MethodPost, "/v1/keys/held/"+call, attempt, finishing[call])
					if limited(a) {
						seen++
						require.Empty(t, signal(a), "%s attempt %s: a finishing write is never told to stop", call, attempt)
					}
				}
			}
		}
		// The control: the claims' 429s still say so.
		for i := 0; ; i++ {
			require.Less(t, i, 1000)
			if a := c.claim(t, fmt.Sprintf("after-%d", i), "1"); limited(a) {
				require.Equal(t, retrybudget.Exhausted, signal(a))
				break
			}
		}
	})
}

// TestRetryBudgetPerReplica: two replicas on one database each hold the
// tenant's retries to the share of the first attempts they see: 10 % of
// 200 first claims each, so 20 retried claims each and 40 across the
// fleet, 10 % of its 400, with no coordination between them.
func TestRetryBudgetPerReplica(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, backend string) {
		a := startBudgeted(t, backend, "", map[string]int{"acme": 10})
		b := startBudgeted(t, "", a.Config().DatabaseURL, nil)
		ca, cb := newAttemptClient(t, a, "acme"), newAttemptClient(t, b, "acme")
		for i := range 200 {
			require.Equal(t, http.StatusCreated, ca.claim(t, fmt.Sprintf("first-a-%d", i), "1").status)
			require.Equal(t, http.StatusCreated, cb.claim(t, fmt.Sprintf("first-b-%d", i), "").status)
		}
		admitted := map[string]int{}
		for i := range 30 {
			for name, c := range map[string]*attemptClient{"a": ca, "b": cb} {
				got := c.claim(t, fmt.Sprintf("%s-%d", name, i), "2;cause=unavailable")
				if got.status == http.StatusCreated {
					admitted[name]++
				} else {
					requireRefused(t, got)
				}
			}
		}
		require.Equal(t, map[string]int{"a": 20, "b": 20}, admitted)
		recs, err := a.Store().ListRecords(context.Background(), idem.ListRecordsParams{TenantID: "acme", Limit: 1000})
		require.NoError(t, err)
		require.Len(t, recs, 400+40, "one record per first claim and per admitted retry, none for a refused one")
	})
}

// TestRetryBudgetPerKind: a retry spends the allowance of the first
// attempts of its own kind of call, as in the storm test, whose window
// before a store outage holds claims and completes alike while only claims
// come (and are retried) during it. With 200 first claims and their 200
// completes in the window, 60 concurrent retried claims have 20 admitted,
// 10 % of the claims (the rule of one count per tenant admitted 40, 20 %
// of the claims); the completes keep an allowance of their own: retried
// completes of the admitted claims pass, each recorded once.
func TestRetryBudgetPerKind(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, backend string) {
		ts := startBudgeted(t, backend, "", map[string]int{"acme": 10})
		c := newAttemptClient(t, ts, "acme")
		complete := func(key, attempt string, token any) budgetAnswer {
			return c.call(t, http.MethodPost, "/v1/keys/"+key+"/complete", attempt,
				fmt.Sprintf(`{"fencing_token":%v,"response":{"status":201,"body":"{}"}}`, token))
		}
		for i := range 200 {
			key := fmt.Sprintf("first-%d", i)
			a := c.claim(t, key, "1")
			require.Equal(t, http.StatusCreated, a.status)
			require.Equal(t, http.StatusOK, complete(key, "1", a.body["fencing_token"]).status)
		}

		const retries = 60
		answers := make([]budgetAnswer, retries)
		var wg sync.WaitGroup
		for i := range retries {
			wg.Go(func() { answers[i] = c.claim(t, fmt.Sprintf("retry-%d", i), "2;cause=unavailable") })
		}
		wg.Wait()
		var admitted []int
		for i, a := range answers {
			_, err := record(t, ts, "acme", fmt.Sprintf("retry-%d", i))
			if a.status == http.StatusCreated {
				admitted = append(admitted, i)
				require.NoError(t, err)
				continue
			}
			requireRefused(t, a)
			require.ErrorIs(t, err, idem.ErrKeyNotFound, "a refused claim stored nothing")
		}
		require.Len(t, admitted, 20, "10 %% of the 200 first claims, not of the 400 first attempts")

		for _, i := range admitted {
			key := fmt.Sprintf("retry-%d", i)
			require.Equal(t, http.StatusOK, complete(key, "2;cause=timeout", answers[i].body["fencing_token"]).status)
			rec, err := record(t, ts, "acme", key)
			require.NoError(t, err)
			require.Equal(t, idem.StateCompleted, rec.State)
		}
		m := newAPIClient(t, ts)
		require.Equal(t, 40.0, m.metric(t, `idem_retries_refused_total{cause="unavailable",tenant="acme"}`))
		require.Equal(t, 0.0, m.metric(t, `idem_retries_refused_total{cause="timeout",tenant="acme"}`))
	})
}

// TestRetryBudgetSignal: Idem-Retry-Budget: exhausted is on the retryable
// failures of a tenant whose budget is spent, and on nothing else. With
// retry_budget_percent 0 the allowance is the floor, 10 retries: the first
// 10 failures (409 request_in_flight, a retry each may make) go out without
// it, each inviting a retry, and every later one carries it; on a
// tenant whose 10 retries were admitted, the first failure carries it; a
// refused retry always does; answers that invite no retry (2xx, 404, 400)
// never do, nor anything of a tenant with the budget off.
func TestRetryBudgetSignal(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, backend string) {
		ts := startBudgeted(t, backend, "", map[string]int{"acme": 0, "busy": 10, "off": 100})
		signal := func(a budgetAnswer) string { return a.header.Get(retrybudget.SignalHeader) }

		c := newAttemptClient(t, ts, "acme")
		for i := range 3 {
			a := c.claim(t, fmt.Sprintf("k-%d", i), "1")
			require.Equal(t, http.StatusCreated, a.status)
			require.Empty(t, signal(a), "a success never carries the signal")
		}
		for i := range retrybudget.Floor {
			a := c.claim(t, "k-0", "1") // the key is in flight: 409
			require.Equal(t, http.StatusConflict, a.status)
			require.Equal(t, "request_in_flight", a.body["code"])
			require.Empty(t, signal(a), "failure %d: the budget has room for its retry", i)
		}
		for i := range 5 {
			a := c.claim(t, "k-0", "1")
			require.Equal(t, http.StatusConflict, a.status)
			require.Equal(t, retrybudget.Exhausted, signal(a), "failure %d past the allowance", i)
		}
		nf := c.call(t, http.MethodGet, "/v1/keys/none", "1", "")
		require.Equal(t, http.StatusNotFound, nf.status)
		require.Empty(t, signal(nf), "a 404 invites no retry")
		bad := c.call(t, http.MethodPost, "/v1/keys/k-bad/claim", "1", `{"operation":`)
		require.Equal(t, http.StatusBadRequest, bad.status)
		require.Empty(t, signal(bad), "a 400 invites no retry")
		// The signal is advice: first attempts are served as before.
		require.Equal(t, http.StatusCreated, c.claim(t, "k-after", "1").status)

		// Spent by admitted retries: the floor's 10, then the next
		// failure says so, and the refused retry too.
		busy := newAttemptClient(t, ts, "busy")
		require.Equal(t, http.StatusCreated, busy.claim(t, "b-0", "1").status)
		for i := range retrybudget.Floor {
			require.Equal(t, http.StatusCreated, busy.claim(t, fmt.Sprintf("r-%d", i), "2;cause=unavailable").status)
		}
		a := busy.claim(t, "b-0", "1")
		require.Equal(t, http.StatusConflict, a.status)
		require.Equal(t, retrybudget.Exhausted, signal(a))
		refused := busy.claim(t, "r-last", "2;cause=unavailable")
		requireRefused(t, refused)
		require.Equal(t, retrybudget.Exhausted, signal(refused))

		// Off: never spent.
		off := newAttemptClient(t, ts, "off")
		require.Equal(t, http.StatusCreated, off.claim(t, "o-0", "1").status)
		for i := range 30 {
			a := off.claim(t, "o-0", "2;cause=in-flight")
			require.Equal(t, http.StatusConflict, a.status)
			require.Empty(t, signal(a), "failure %d with the budget off", i)
		}
	})
}
