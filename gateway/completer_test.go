package gateway_test

import (
	"encoding/json"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/client/frontdoor"
	"github.com/idem-dev/idem/testkit/completertest"
	"github.com/idem-dev/idem/testkit/servertest"
)

// TestCompleterHeldKeys (docs/frontdoor.md rule 8): requests the gateway
// had claimed when it died (their claims, exactly as the gateway makes
// them, left to run out) are taken over by idem's real completer, whose
// resume endpoint answers "unknown, ask again in 120 s" for one key and
// "needs a person" for the other. A retry through the gateway of the first
// is 409 request_in_flight, retryable, with idem's Retry-After (the next
// completer attempt), and of the second 409 outcome_review, not retryable,
// without Retry-After — on a fail_open route, which never passes them
// through: the upstream is never called and the completer keeps both keys
// (no takeover, no new attempt). Once a person releases the reviewed key,
// its retry runs the upstream once and is replayed after. Before, both
// were 400 invalid_request ("idem refused the claim"), which told the
// caller to change a request that was fine.
func TestCompleterHeldKeys(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		r := newRigOn(t, servertest.Options{Backend: backend, Configure: completertest.Configure},
			"routes:\n  - path: /orders\n    fail_open: true\n")
		ep := completertest.Register(t, r.idem, tenant, 120*time.Second)
		sdk, err := client.New(r.idem.URL(), client.WithToken(r.idem.Token(t, tenant, "keys:write")))
		require.NoError(t, err)
		const body = `{"amount":1}`
		doc, err := frontdoor.Document(frontdoor.Parts{Path: "/orders", ContentType: "application/json", Body: []byte(body)}, frontdoor.Rules{})
		require.NoError(t, err)
		for _, key := range []string{"held-unknown", "held-review"} {
			_, err := sdk.Claim(t.Context(), key, client.Request{Operation: frontdoor.Operation(http.MethodPost, "/orders"), Payload: json.RawMessage(doc), Lease: time.Second})
			require.NoError(t, err)
		}

		held := completertest.WaitHeld(t, r.idem, tenant, "held-unknown", "unknown")
		for _, prefer := range []string{"", "wait=5"} {
			got := send(t, http.MethodPost, r.url+"/orders", "held-unknown", body, "Prefer", prefer)
			require.Equal(t, http.StatusConflict, got.status, got.body)
			require.Equal(t, string(frontdoor.CodeRequestInFlight), got.code(t))
			p := decode(t, got.body)
			require.Equal(t, true, p["retryable"])
			require.Equal(t, frontdoor.OutcomeUnknownDetail, p["detail"])
			ra, err := strconv.Atoi(got.header.Get("Retry-After"))
			require.NoError(t, err, "Retry-After %q", got.header.Get("Retry-After"))
			require.True(t, ra >= 100 && ra <= 120, "Retry-After is idem's, the next completer attempt in 120 s: %d", ra)
		}

		completertest.WaitHeld(t, r.idem, tenant, "held-review", "review")
		for range 2 {
			got := send(t, http.MethodPost, r.url+"/orders", "held-review", body)
			require.Equal(t, http.StatusConflict, got.status, got.body)
			require.Equal(t, string(frontdoor.CodeOutcomeReview), got.code(t))
			p := decode(t, got.body)
			require.Equal(t, false, p["retryable"])
			require.Equal(t, "Outcome under review", p["title"])
			require.Equal(t, frontdoor.OutcomeReviewDetail, p["detail"])
			require.Empty(t, got.header.Values("Retry-After"))
		}
		require.Zero(t, r.upstream.Count(), "nothing passed through, fail_open or not")

		after := completertest.Get(t, r.idem, tenant, "held-unknown")
		require.Equal(t, "unknown", after.Completer.State, "the completer still holds it")
		require.Equal(t, held.Attempt, after.Attempt, "no retry took it over")
		require.Equal(t, held.FencingToken, after.FencingToken)
		require.Equal(t, 1, ep.Calls("held-unknown"), "the retries made no completer attempt")

		completertest.Release(t, r.idem, tenant, "held-review")
		first := send(t, http.MethodPost, r.url+"/orders", "held-review", body)
		require.Equal(t, http.StatusCreated, first.status, first.body)
		again := send(t, http.MethodPost, r.url+"/orders", "held-review", body)
		require.Equal(t, "true", again.header.Get(frontdoor.HeaderReplayed))
		require.Equal(t, first.body, again.body)
		require.EqualValues(t, 1, r.upstream.Count(), "released by a person, the key ran once")
	})
}
