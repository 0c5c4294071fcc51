package idemhttp_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/client/frontdoor"
	"github.com/idem-dev/idem/client/idemhttp"
	"github.com/idem-dev/idem/testkit/completertest"
	"github.com/idem-dev/idem/testkit/servertest"
)

// TestMiddlewareCompleterHeldKeys (docs/frontdoor.md rule 8): a handler
// that dies under the middleware (it panics after its side effect) leaves
// its claim to run out; idem's real completer takes the key over and its
// resume endpoint answers "unknown, ask again in 120 s" (or, for the other
// key, "needs a person"). The caller's retry through the middleware is 409
// request_in_flight, retryable, with idem's Retry-After (the next
// completer attempt) — or 409 outcome_review, not retryable, without
// Retry-After — and the handler does not run again: one side effect per
// key, the completer keeps the key. Once a person releases the reviewed
// key, its retry runs the handler. Before, both were the retryable 503
// store_unavailable, which blamed the store and hid idem's Retry-After.
func TestMiddlewareCompleterHeldKeys(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{servertest.BackendSQLite, servertest.BackendPostgres} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			srv := servertest.Start(t, servertest.Options{Backend: backend, Tenants: []string{"shop"}, Configure: completertest.Configure})
			c, err := client.New(srv.URL(), client.WithToken(srv.Token(t, "shop", "keys:write")))
			require.NoError(t, err)
			ep := completertest.Register(t, srv, "shop", 120*time.Second)

			var charges atomic.Int64
			var die atomic.Bool
			h := idemhttp.Middleware(c, idemhttp.Options{Lease: time.Second})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				charges.Add(1)
				if die.Load() {
					panic("the worker died after the charge")
				}
				w.WriteHeader(http.StatusCreated)
			}))
			app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				defer func() {
					if recover() != nil {
						http.Error(w, "died", http.StatusInternalServerError)
					}
				}()
				h.ServeHTTP(w, r)
			}))
			t.Cleanup(app.Close)
			url := app.URL + "/orders"

			die.Store(true)
			for _, key := range []string{"held-unknown", "held-review"} {
				require.Equal(t, http.StatusInternalServerError, post(t, url, key, `{}`).status)
			}
			die.Store(false)
			require.EqualValues(t, 2, charges.Load())

			held := completertest.WaitHeld(t, srv, "shop", "held-unknown", "unknown")
			for range 2 {
				got := post(t, url, "held-unknown", `{}`)
				p := requireProblem(t, got, http.StatusConflict, frontdoor.CodeRequestInFlight, true)
				require.Equal(t, frontdoor.OutcomeUnknownDetail, p.Detail)
				ra, err := strconv.Atoi(got.header.Get("Retry-After"))
				require.NoError(t, err)
				require.True(t, ra >= 100 && ra <= 120, "Retry-After is idem's, the next completer attempt in 120 s: %d", ra)
			}

			completertest.WaitHeld(t, srv, "shop", "held-review", "review")
			for range 2 {
				got := post(t, url, "held-review", `{}`)
				p := requireProblem(t, got, http.StatusConflict, frontdoor.CodeOutcomeReview, false)
				require.Equal(t, frontdoor.OutcomeReviewDetail, p.Detail)
				require.Equal(t, "Outcome under review", p.Title)
			}
			require.EqualValues(t, 2, charges.Load(), "the handler did not run again")

			after := completertest.Get(t, srv, "shop", "held-unknown")
			require.Equal(t, "unknown", after.Completer.State, "the completer still holds it")
			require.Equal(t, held.FencingToken, after.FencingToken, "no retry took it over")
			require.Equal(t, 1, ep.Calls("held-unknown"))

			completertest.Release(t, srv, "shop", "held-review")
			require.Equal(t, http.StatusCreated, post(t, url, "held-review", `{}`).status)
			again := post(t, url, "held-review", `{}`)
			require.Equal(t, "true", again.header.Get(idemhttp.HeaderReplayed))
			require.EqualValues(t, 3, charges.Load(), "released by a person, the key ran once more")
		})
	}
}
