package idemhttp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/client/frontdoor"
	"github.com/idem-dev/idem/client/idemhttp"
	"github.com/idem-dev/idem/retrybudget"
	"github.com/idem-dev/idem/server"
	"github.com/idem-dev/idem/testkit/servertest"
)

// TestMiddlewareRetryBudget (docs/frontdoor.md rule 9): the caller's
// retries reach idem as retries through the middleware, and once they use
// the tenant's fleet retry budget the next one is answered 429
// retry_budget_exhausted with idem's Retry-After and Idem-Retry-Budget:
// exhausted, the handler not run and the key as it was (a new key
// unknown, a completed one still completed with its answer); a first
// attempt is served; a 409 request_in_flight whose idem answer said the
// budget is spent says so to the caller. Before, the refusal reached the
// caller as a retryable 503 store_unavailable with no signal, which the
// caller retried.
func TestMiddlewareRetryBudget(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{servertest.BackendSQLite, servertest.BackendPostgres} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			// A window longer than the test: nothing slides out of it on a
			// slow machine.
			srv := servertest.Start(t, servertest.Options{Backend: backend, Tenants: []string{"shop"},
				Configure: func(c *server.Config) { c.RetryBudgetWindow = time.Hour }})
			c, err := client.New(srv.URL(), client.WithToken(srv.Token(t, "shop", "keys:write")),
				client.WithRetryPolicy(client.RetryPolicy{BaseDelay: 20 * time.Millisecond, RetryAfterJitter: 50 * time.Millisecond}))
			require.NoError(t, err)
			a := newApp(t, c, idemhttp.Options{})
			url := a.srv.URL + "/orders/cus_1"
			retry := func(n int, cause string) http.Header {
				return http.Header{client.HeaderAttempt: {fmt.Sprintf("%d;cause=%s", n, cause)}}
			}

			require.Equal(t, http.StatusCreated, post(t, url, "mw-first", `{}`).status)
			for i := range retrybudget.Floor {
				got := postWith(t, url, fmt.Sprintf("mw-%d", i), `{}`, retry(2, "timeout"))
				require.Equal(t, http.StatusCreated, got.status, "retry %d is within the floor: %s", i, got.body)
				require.Empty(t, got.header.Values(frontdoor.HeaderRetryBudget))
			}
			orders := a.orders.Load()
			require.EqualValues(t, retrybudget.Floor+1, orders)

			for _, key := range []string{"mw-refused", "mw-0"} {
				got := postWith(t, url, key, `{}`, retry(3, "unavailable"))
				require.Equal(t, http.StatusTooManyRequests, got.status, got.body)
				require.Equal(t, string(frontdoor.CodeRetryBudgetExhausted), problemCode(t, got))
				var p frontdoor.Problem
				require.NoError(t, json.Unmarshal([]byte(got.body), &p))
				require.True(t, p.Retryable)
				require.Equal(t, frontdoor.RetryBudgetDetail, p.Detail)
				require.NotEmpty(t, got.header.Get("Retry-After"))
				require.Equal(t, []string{frontdoor.RetryBudgetExhausted}, got.header.Values(frontdoor.HeaderRetryBudget))
			}
			require.Equal(t, orders, a.orders.Load(), "a refused retry runs nothing")
			ctx := context.Background()
			_, err = srv.Store().GetRecord(ctx, idem.GetRecordParams{TenantID: "shop", Key: "mw-refused"})
			require.ErrorIs(t, err, idem.ErrKeyNotFound, "a refused retry claims nothing")
			rec, err := srv.Store().GetRecord(ctx, idem.GetRecordParams{TenantID: "shop", Key: "mw-0"})
			require.NoError(t, err)
			require.Equal(t, idem.StateCompleted, rec.State)
			require.Equal(t, 1, rec.Attempt)

			served := post(t, url, "mw-refused", `{}`)
			require.Equal(t, http.StatusCreated, served.status, served.body)
			replay := post(t, url, "mw-refused", `{}`)
			require.Equal(t, "true", replay.header.Get(idemhttp.HeaderReplayed))
			require.Equal(t, served.body, replay.body, "one full stored answer")
			require.Equal(t, orders+1, a.orders.Load(), "one run")

			// Another holder of a key: the 409 says the budget is spent.
			doc, err := frontdoor.Document(frontdoor.Parts{Path: "/orders/cus_1", ContentType: "application/json", Body: []byte(`{}`)}, frontdoor.Rules{})
			require.NoError(t, err)
			_, err = c.Claim(ctx, "mw-held", client.Request{Operation: frontdoor.Operation(http.MethodPost, "/orders/{customer}"), Payload: json.RawMessage(doc)})
			require.NoError(t, err)
			held := post(t, url, "mw-held", `{}`)
			require.Equal(t, http.StatusConflict, held.status, held.body)
			require.Equal(t, string(frontdoor.CodeRequestInFlight), problemCode(t, held))
			require.Equal(t, []string{frontdoor.RetryBudgetExhausted}, held.header.Values(frontdoor.HeaderRetryBudget))
			require.Equal(t, orders+1, a.orders.Load())
		})
	}
}
