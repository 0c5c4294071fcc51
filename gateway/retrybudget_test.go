package gateway_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/canon"
	"github.com/idem-dev/idem/client/frontdoor"
	"github.com/idem-dev/idem/gateway"
	"github.com/idem-dev/idem/retrybudget"
	"github.com/idem-dev/idem/storetest"
)

// TestRetryBudget (docs/frontdoor.md rule 9): the gateway claims in the
// store directly, so it keeps its tenant's fleet retry budget itself. The
// caller's retries (Idem-Attempt above 1) are admitted up to the
// allowance (the floor, with a handful of first attempts); the next retry
// gets 429 retry_budget_exhausted with Retry-After and Idem-Retry-Budget:
// exhausted, before anything is claimed or sent upstream: a new key stays
// unknown, a completed one stays as it was. First attempts are served as
// always, and the gateway's other retryable refusals (409
// request_in_flight) say the budget is spent. Before, the gateway counted
// no attempt at all: every retry reached the store and the upstream.
func TestRetryBudget(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		// A window longer than the test, so nothing slides out of it on a
		// slow machine.
		r := newRig(t, backend, "routes: []\n", func(o *gateway.Options) { o.RetryBudget = retrybudget.New(time.Hour, nil) })
		ctx := context.Background()

		first := send(t, http.MethodPost, r.url+"/orders", "rb-first", `{"n":0}`)
		require.Equal(t, http.StatusCreated, first.status, first.body)
		for i := range retrybudget.Floor {
			a := send(t, http.MethodPost, r.url+"/orders", fmt.Sprintf("rb-%d", i), fmt.Sprintf(`{"n":%d}`, i), frontdoor.HeaderAttempt, "2;cause=timeout")
			require.Equal(t, http.StatusCreated, a.status, "retry %d is within the floor: %s", i, a.body)
			require.Empty(t, a.header.Values(frontdoor.HeaderRetryBudget))
		}
		calls := r.upstream.Count()
		require.EqualValues(t, retrybudget.Floor+1, calls)

		// Past the allowance: a retry of a new key and one of a completed
		// key are refused, neither claimed nor sent upstream.
		for _, key := range []string{"rb-refused", "rb-0"} {
			refused := send(t, http.MethodPost, r.url+"/orders", key, `{"n":0}`, frontdoor.HeaderAttempt, "3;cause=unavailable")
			require.Equal(t, http.StatusTooManyRequests, refused.status, refused.body)
			require.Equal(t, string(frontdoor.CodeRetryBudgetExhausted), refused.code(t))
			require.Equal(t, true, decode(t, refused.body)["retryable"])
			require.Equal(t, frontdoor.RetryBudgetDetail, decode(t, refused.body)["detail"])
			require.NotEmpty(t, refused.header.Get("Retry-After"))
			require.Equal(t, []string{frontdoor.RetryBudgetExhausted}, refused.header.Values(frontdoor.HeaderRetryBudget))
			require.NotEqual(t, "true", refused.header.Get(frontdoor.HeaderReplayed))
		}
		require.Equal(t, calls, r.upstream.Count(), "a refused retry is not sent upstream")
		_, err := r.idem.Store().GetRecord(ctx, idem.GetRecordParams{TenantID: tenant, Key: "rb-refused"})
		require.ErrorIs(t, err, idem.ErrKeyNotFound, "a refused retry claims nothing")
		rec, err := r.idem.Store().GetRecord(ctx, idem.GetRecordParams{TenantID: tenant, Key: "rb-0"})
		require.NoError(t, err)
		require.Equal(t, idem.StateCompleted, rec.State)
		require.Equal(t, 1, rec.Attempt, "the completed key is as it was")

		// A first attempt is served, the refused key included: one run.
		served := send(t, http.MethodPost, r.url+"/orders", "rb-refused", `{"n":0}`)
		require.Equal(t, http.StatusCreated, served.status, served.body)
		require.Equal(t, calls+1, r.upstream.Count())
		replay := send(t, http.MethodPost, r.url+"/orders", "rb-refused", `{"n":0}`)
		require.Equal(t, "true", replay.header.Get(frontdoor.HeaderReplayed))
		require.Equal(t, served.body, replay.body, "one full stored answer")
		require.Equal(t, calls+1, r.upstream.Count())

		// A retryable refusal of a first attempt says the budget is spent.
		doc, err := frontdoor.Document(frontdoor.Parts{Path: "/orders", ContentType: "application/json", Body: []byte(`{}`)}, frontdoor.Rules{})
		require.NoError(t, err)
		p := storetest.ClaimParams(tenant, "rb-held")
		p.Operation = frontdoor.Operation(http.MethodPost, "/orders")
		p.Fingerprint, err = canon.Fingerprint(doc)
		require.NoError(t, err)
		_, err = r.idem.Store().Claim(ctx, p)
		require.NoError(t, err)
		held := send(t, http.MethodPost, r.url+"/orders", "rb-held", `{}`)
		require.Equal(t, http.StatusConflict, held.status, held.body)
		require.Equal(t, string(frontdoor.CodeRequestInFlight), held.code(t))
		require.Equal(t, []string{frontdoor.RetryBudgetExhausted}, held.header.Values(frontdoor.HeaderRetryBudget))
		// A refusal nobody retries does not.
		mismatch := send(t, http.MethodPost, r.url+"/orders", "rb-first", `{"n":1}`)
		require.Equal(t, http.StatusUnprocessableEntity, mismatch.status, mismatch.body)
		require.Empty(t, mismatch.header.Values(frontdoor.HeaderRetryBudget))
	})
}

// TestRetryBudgetOff: a tenant with retry_budget_percent 100 has no
// budget: the gateway admits every retry, as idem does.
func TestRetryBudgetOff(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		r := newRig(t, backend, "routes: []\n", func(o *gateway.Options) { o.RetryBudget = retrybudget.New(time.Hour, nil) })
		r.patchTenant(t, `{"settings":{"retry_budget_percent":100}}`)
		// The first request reads the tenant's settings; the budget
		// decides on the percent of the tenant's last request.
		require.Equal(t, http.StatusCreated, send(t, http.MethodPost, r.url+"/orders", "off-first", `{}`).status)
		for i := range 2 * retrybudget.Floor {
			a := send(t, http.MethodPost, r.url+"/orders", fmt.Sprintf("off-%d", i), `{}`, frontdoor.HeaderAttempt, "2")
			require.Equal(t, http.StatusCreated, a.status, "retry %d: %s", i, a.body)
		}
		require.EqualValues(t, 2*retrybudget.Floor+1, r.upstream.Count())
	})
}
