package api_test

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/auth"
	"github.com/idem-dev/idem/canon"
)

func TestHealthAndReady(t *testing.T) {
	t.Parallel()
	b := setup(t)

	r := b.req(t, http.MethodGet, "/healthz", "", nil)
	require.Equal(t, http.StatusOK, r.status)
	require.JSONEq(t, `{"status":"ok"}`, string(r.body))

	r = b.req(t, http.MethodGet, "/readyz", "", nil)
	require.Equal(t, http.StatusOK, r.status)

	// A closed store is an unavailable store: fail closed, retryable.
	require.NoError(t, b.store.Close())
	r = b.req(t, http.MethodGet, "/readyz", "", nil)
	requireProblem(t, r, http.StatusServiceUnavailable, idem.CodeStoreUnavailable, true)
	require.Equal(t, "1", r.header.Get("Retry-After"))

	tok := b.token(t, "acme", auth.ScopeKeysWrite)
	// The tenant is cached; the claim itself hits the closed store.
	r = b.req(t, http.MethodPost, "/v1/keys/k1/claim", tok, map[string]any{})
	requireProblem(t, r, http.StatusServiceUnavailable, idem.CodeStoreUnavailable, true)
	require.Equal(t, "1", r.header.Get("Retry-After"))
}

func TestRequestID(t *testing.T) {
	t.Parallel()
	b := setup(t)

	r := b.req(t, http.MethodGet, "/healthz", "", nil, "X-Request-Id", "caller.id_1-A")
	require.Equal(t, "caller.id_1-A", r.header.Get("X-Request-Id"))

	for _, bad := range []string{"has space", "ü", strings.Repeat("a", 129)} {
		r = b.req(t, http.MethodGet, "/healthz", "", nil, "X-Request-Id", bad)
		got := r.header.Get("X-Request-Id")
		require.NotEqual(t, bad, got)
		require.Len(t, got, 32)
	}
	r = b.req(t, http.MethodGet, "/healthz", "", nil, "X-Request-Id", strings.Repeat("a", 128))
	require.Equal(t, strings.Repeat("a", 128), r.header.Get("X-Request-Id"))

	// Problems carry the id too, and the access log never holds the token.
	tok := b.token(t, "acme", auth.ScopeKeysRead)
	r = b.req(t, http.MethodGet, "/v1/keys/nope", tok, nil, "X-Request-Id", "trace-42")
	p := requireProblem(t, r, http.StatusNotFound, idem.CodeKeyNotFound, false)
	require.Equal(t, "trace-42", p["request_id"])

	b.logMu.Lock()
	logs := b.logs.String()
	b.logMu.Unlock()
	require.Contains(t, logs, `"request_id":"trace-42"`)
	require.Contains(t, logs, `"route":"/v1/keys/{key}"`)
	require.Contains(t, logs, `"tenant":"acme"`)
	require.NotContains(t, logs, tok)
	require.NotContains(t, logs, "Bearer")
}

// TestAccessLogAndObserverAgree: the access log line and the HTTP metric
// come from one observation of each request (one response wrapper, one
// route pattern), so for every request they name the same route, method
// and status: a matched route, an unmatched path, a refused token.
func TestAccessLogAndObserverAgree(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tok := b.token(t, "acme", auth.ScopeKeysWrite)
	r := b.req(t, http.MethodPost, "/v1/keys/agree-1/claim", tok, map[string]any{"operation": "POST /x"})
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	r = b.req(t, http.MethodGet, "/no/such/path", "", nil)
	require.Equal(t, http.StatusNotFound, r.status)
	r = b.req(t, http.MethodPost, "/v1/keys/agree-1/complete", "not-a-token", map[string]any{})
	require.Equal(t, http.StatusUnauthorized, r.status)

	b.logMu.Lock()
	var logged []string
	for line := range strings.Lines(b.logs.String()) {
		var l struct {
			Msg, Route, Method string
			Status             int
		}
		require.NoError(t, json.Unmarshal([]byte(line), &l), line)
		if l.Msg == "http request" {
			logged = append(logged, fmt.Sprintf("%s %s %d", l.Route, l.Method, l.Status))
		}
	}
	b.logMu.Unlock()
	b.obs.mu.Lock()
	defer b.obs.mu.Unlock()
	require.Equal(t, []string{
		"/v1/keys/{key}/claim POST 201",
		" GET 404",
		"/v1/keys/{key}/complete POST 401", // refused after the route matched
	}, b.obs.https)
	require.Equal(t, b.obs.https, logged)
}

func TestClaimCompleteReplay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tok := b.token(t, "acme", auth.ScopeKeysWrite)
	claimBody := map[string]any{"operation": "POST /v1/payments", "request": map[string]any{"amount": 1000, "currency": "usd"}}

	r := b.req(t, http.MethodPost, "/v1/keys/order-42/claim", tok, claimBody)
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	c := r.json(t)
	require.Equal(t, "order-42", c["key"])
	require.Equal(t, "in_flight", c["state"])
	require.Equal(t, float64(1), c["attempt"])
	require.Equal(t, false, c["resumed"])
	require.Nil(t, c["recovery_point"])
	require.Nil(t, c["recovery_data"])
	require.Contains(t, c, "recovery_data")
	lease, err := time.Parse(time.RFC3339Nano, c["lease_expires_at"].(string))
	require.NoError(t, err)
	require.WithinDuration(t, b.clock.Now().Add(30*time.Second), lease, 5*time.Second)
	require.Empty(t, r.header.Get("Idempotent-Replayed"))
	token := int64(c["fencing_token"].(float64))

	// The fingerprint is the JCS hash: another key order is the same request.
	r = b.req(t, http.MethodGet, "/v1/keys/order-42", tok, nil)
	require.Equal(t, http.StatusOK, r.status)
	rec := r.json(t)
	fp, err := canon.Fingerprint([]byte(`{"currency":"usd","amount":1000}`))
	require.NoError(t, err)
	require.Equal(t, fp, rec["fingerprint"])
	require.Nil(t, rec["response"])
	require.Nil(t, rec["completed_at"])

	r = b.req(t, http.MethodPost, "/v1/keys/order-42/checkpoint", tok, map[string]any{
		"fencing_token": token, "recovery_point": "charge_created", "data": map[string]any{"charge": "ch_1"},
	})
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	require.Equal(t, "charge_created", r.json(t)["recovery_point"])

	resp := map[string]any{"status": 201, "headers": map[string]string{"Content-Type": "application/json"}, "body": `{"id":"ord_1"}`}
	r = b.req(t, http.MethodPost, "/v1/keys/order-42/complete", tok, map[string]any{"fencing_token": token, "response": resp})
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	done := r.json(t)
	require.Equal(t, "completed", done["state"])
	require.Nil(t, done["lease_expires_at"])
	require.NotNil(t, done["completed_at"])

	// Completing again with the same response is a no-op.
	r = b.req(t, http.MethodPost, "/v1/keys/order-42/complete", tok, map[string]any{"fencing_token": token, "response": resp})
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)

	// The retry is a replay of the stored response.
	r = b.req(t, http.MethodPost, "/v1/keys/order-42/claim", tok, map[string]any{"operation": "POST /v1/payments", "request": map[string]any{"currency": "usd", "amount": 1000.0}})
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	require.Equal(t, "true", r.header.Get("Idempotent-Replayed"))
	replay := r.json(t)
	require.Equal(t, "completed", replay["state"])
	require.Equal(t, float64(token), replay["fencing_token"])
	require.Equal(t, map[string]any{"charge": "ch_1"}, replay["recovery_data"])
	require.Equal(t, map[string]any{
		"status": float64(201), "headers": map[string]any{"Content-Type": "application/json"},
		"body": `{"id":"ord_1"}`, "body_encoding": "utf8",
	}, replay["response"])
	for _, f := range []string{"created_at", "completed_at", "replay_until", "purge_after"} {
		ts, err := time.Parse(time.RFC3339Nano, replay[f].(string))
		require.NoError(t, err, f)
		require.Equal(t, time.UTC, ts.Location(), f)
	}

	// A different request on the same key is a mismatch.
	r = b.req(t, http.MethodPost, "/v1/keys/order-42/claim", tok, map[string]any{"operation": "POST /v1/payments", "request": map[string]any{"amount": 999}})
	requireProblem(t, r, http.StatusUnprocessableEntity, idem.CodeFingerprintMismatch, false)

	// A different response with the current token is already_completed.
	other := map[string]any{"status": 500, "body": "boom"}
	r = b.req(t, http.MethodPost, "/v1/keys/order-42/complete", tok, map[string]any{"fencing_token": token, "response": other})
	requireProblem(t, r, http.StatusConflict, idem.CodeAlreadyCompleted, false)

	b.obs.mu.Lock()
	defer b.obs.mu.Unlock()
	require.Equal(t, []idem.ClaimAction{idem.ActionCreate, idem.ActionReplay, 0}, b.obs.claims)
	require.Equal(t, []string{"checkpoint", "complete", "complete", "complete"}, b.obs.writes)
}

func TestBase64BodyAndFiveHundred(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tok := b.token(t, "acme", auth.ScopeKeysWrite)
	token := b.claim(t, tok, "bin", map[string]any{"fingerprint": "v1:abc"})

	raw := []byte{0xff, 0x00, 0xfe}
	r := b.req(t, http.MethodPost, "/v1/keys/bin/complete", tok, map[string]any{"fencing_token": token, "response": map[string]any{
		"status": 503, "body": base64.StdEncoding.EncodeToString(raw), "body_encoding": "base64",
	}})
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	r = b.req(t, http.MethodPost, "/v1/keys/bin/claim", tok, map[string]any{"fingerprint": "v1:abc"})
	require.Equal(t, http.StatusOK, r.status)
	resp := r.json(t)["response"].(map[string]any)
	require.Equal(t, float64(503), resp["status"])
	require.Equal(t, "base64", resp["body_encoding"])
	require.Equal(t, base64.StdEncoding.EncodeToString(raw), resp["body"])
}

func TestCompleteValidation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tok := b.token(t, "acme", auth.ScopeKeysWrite)
	token := b.claim(t, tok, "v", nil)

	cases := []struct {
		name, body, field string
	}{
		{"missing token", `{"response":{"status":200}}`, "fencing_token"},
		{"missing response", `{"fencing_token":1}`, "response"},
		{"missing status", `{"fencing_token":1,"response":{}}`, "response.status"},
		{"status too low", `{"fencing_token":1,"response":{"status":99}}`, "response.status"},
		{"status too high", `{"fencing_token":1,"response":{"status":600}}`, "response.status"},
		{"bad encoding", `{"fencing_token":1,"response":{"status":200,"body":"x","body_encoding":"gzip"}}`, "response.body_encoding"},
		{"bad base64", `{"fencing_token":1,"response":{"status":200,"body":"!!","body_encoding":"base64"}}`, "response.body"},
		{"lone surrogate", `{"fencing_token":1,"response":{"status":200,"body":"\ud800"}}`, "response.body"},
		{"invalid utf8", "{\"fencing_token\":1,\"response\":{\"status\":200,\"body\":\"\xff\"}}", "response.body"},
		{"token type", `{"fencing_token":"1","response":{"status":200}}`, "fencing_token"},
	}
	for _, tc := range cases {
		r := b.req(t, http.MethodPost, "/v1/keys/v/complete", tok, tc.body)
		p := requireProblem(t, r, http.StatusBadRequest, idem.CodeInvalidRequest, false)
		requireField(t, p, tc.field)
	}

	// A written U+FFFD is valid UTF-8 and kept.
	r := b.req(t, http.MethodPost, "/v1/keys/v/complete", tok, map[string]any{"fencing_token": token, "response": map[string]any{"status": 200, "body": "\uFFFD ok"}})
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
}

func TestResponseTooLarge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tok := b.token(t, "acme", auth.ScopeKeysWrite, auth.ScopeTenantAdmin)
	r := b.req(t, http.MethodPatch, "/v1/tenant", tok, map[string]any{"settings": map[string]any{"max_response_bytes": 100}})
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)

	token := b.claim(t, tok, "big", nil)
	// 90 body bytes + "X-A" + 10 = 103 > 100.
	resp := map[string]any{"status": 200, "headers": map[string]string{"X-A": strings.Repeat("v", 10)}, "body": strings.Repeat("b", 90)}
	r = b.req(t, http.MethodPost, "/v1/keys/big/complete", tok, map[string]any{"fencing_token": token, "response": resp})
	requireProblem(t, r, http.StatusRequestEntityTooLarge, idem.CodePayloadTooLarge, false)

	// Nothing was stored: the claim stays in flight and a fitting response
	// completes it.
	r = b.req(t, http.MethodGet, "/v1/keys/big", tok, nil)
	require.Equal(t, "in_flight", r.json(t)["state"])
	resp["body"] = strings.Repeat("b", 87)
	r = b.req(t, http.MethodPost, "/v1/keys/big/complete", tok, map[string]any{"fencing_token": token, "response": resp})
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
}

func TestClaimValidation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tok := b.token(t, "acme", auth.ScopeKeysWrite)

	cases := []struct {
		name, body, field string
	}{
		{"both fingerprint and request", `{"fingerprint":"x","request":{}}`, "request"},
		{"unknown field", `{"operation":"x","colour":"red"}`, "colour"},
		{"wrong type", `{"lease_seconds":"30"}`, "lease_seconds"},
		{"lease over max", `{"lease_seconds":3601}`, "lease_seconds"},
		{"negative lease", `{"lease_seconds":-1}`, "lease_seconds"},
		{"empty fingerprint", `{"fingerprint":""}`, "fingerprint"},
		{"long fingerprint", `{"fingerprint":"` + strings.Repeat("f", 257) + `"}`, "fingerprint"},
		{"long operation", `{"operation":"` + strings.Repeat("o", 129) + `"}`, "operation"},
	}
	for _, tc := range cases {
		r := b.req(t, http.MethodPost, "/v1/keys/k/claim", tok, tc.body)
		p := requireProblem(t, r, http.StatusBadRequest, idem.CodeInvalidRequest, false)
		requireField(t, p, tc.field)
	}

	for _, body := range []string{`{"operation":"x"} {}`, `{"operation":`, `[1,2]`, `{"operation":"x"}x`} {
		r := b.req(t, http.MethodPost, "/v1/keys/k/claim", tok, body)
		requireProblem(t, r, http.StatusBadRequest, idem.CodeInvalidRequest, false)
	}

	// 415 for a non-JSON body; an empty body is {} whatever its type.
	r := b.req(t, http.MethodPost, "/v1/keys/k/claim", tok, `{}`, "Content-Type", "text/plain")
	requireProblem(t, r, http.StatusUnsupportedMediaType, idem.CodeUnsupportedMediaType, false)
	r = b.req(t, http.MethodPost, "/v1/keys/k/claim", tok, `{}`, "Content-Type", "")
	requireProblem(t, r, http.StatusUnsupportedMediaType, idem.CodeUnsupportedMediaType, false)
	r = b.req(t, http.MethodPost, "/v1/keys/k/claim", tok, "", "Content-Type", "text/plain")
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	r = b.req(t, http.MethodPost, "/v1/keys/k2/claim", tok, `{}`, "Content-Type", "application/json; charset=utf-8")
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)

	// Nothing of the refused requests was stored.
	r = b.req(t, http.MethodGet, "/v1/keys?limit=10", b.token(t, "acme", auth.ScopeKeysRead), nil)
	require.Len(t, r.json(t)["items"], 2)
}

func TestBodyLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tok := b.token(t, "acme", auth.ScopeKeysWrite)
	big := `{"request":"` + strings.Repeat("x", testMaxBody) + `"}`
	r := b.req(t, http.MethodPost, "/v1/keys/k/claim", tok, big)
	requireProblem(t, r, http.StatusRequestEntityTooLarge, idem.CodePayloadTooLarge, false)
	// Just under the limit is fine.
	ok := `{"request":"` + strings.Repeat("x", testMaxBody-len(`{"request":""}`)) + `"}`
	require.Len(t, ok, testMaxBody)
	r = b.req(t, http.MethodPost, "/v1/keys/k/claim", tok, ok)
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
}

func TestKeysInThePath(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tok := b.token(t, "acme", auth.ScopeKeysWrite)

	maxKey := strings.Repeat("k", idem.MaxKeyBytes-1) + "~"
	for _, key := range []string{"a/b", "a%2Fb", "x?y#z", "%", "!~%25", maxKey} {
		token := b.claim(t, tok, key, nil)
		r := b.req(t, http.MethodGet, "/v1/keys/"+escape(key), tok, nil)
		require.Equal(t, http.StatusOK, r.status, "key %q: %s", key, r.body)
		rec := r.json(t)
		require.Equal(t, key, rec["key"])
		require.Equal(t, float64(token), rec["fencing_token"])
	}
	// "a/b" and "a%2Fb" are different keys.
	r := b.req(t, http.MethodGet, "/v1/keys?limit=500", tok, nil)
	require.Len(t, r.json(t)["items"], 6)

	for _, key := range []string{strings.Repeat("k", idem.MaxKeyBytes+1), "a b", "tab\t", "é"} {
		r := b.req(t, http.MethodPost, "/v1/keys/"+escape(key)+"/claim", tok, nil)
		requireProblem(t, r, http.StatusBadRequest, idem.CodeInvalidKey, false)
	}
}

func TestInFlightTakeoverAndLeaseLost(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Frozen: the 9.5 s advance leaves half a second of lease, which real
	// time on a loaded machine used up between two requests (the second
	// claim then took the key over instead of answering 409).
	b.clock.Freeze()
	tok := b.token(t, "acme", auth.ScopeKeysWrite)
	first := b.claim(t, tok, "job", map[string]any{"fingerprint": "fp", "lease_seconds": 10})

	r := b.req(t, http.MethodPost, "/v1/keys/job/claim", tok, map[string]any{"fingerprint": "fp"})
	requireProblem(t, r, http.StatusConflict, idem.CodeRequestInFlight, true)
	require.Equal(t, "10", r.header.Get("Retry-After"))

	b.clock.Advance(9500 * time.Millisecond)
	r = b.req(t, http.MethodPost, "/v1/keys/job/claim", tok, map[string]any{"fingerprint": "fp"})
	requireProblem(t, r, http.StatusConflict, idem.CodeRequestInFlight, true)
	require.Equal(t, "1", r.header.Get("Retry-After"), "a partial second rounds up")

	r = b.req(t, http.MethodPost, "/v1/keys/job/checkpoint", tok, map[string]any{"fencing_token": first, "recovery_point": "step1", "data": []int{1, 2}, "lease_seconds": 1})
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)

	// The lease runs out: the orphan shows up for the operator, oldest first.
	b.clock.Advance(2 * time.Second)
	admin := b.token(t, "", auth.ScopeAdmin)
	r = b.req(t, http.MethodGet, "/v1/admin/orphans?tenant=acme", admin, nil)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	page := r.json(t)
	items := page["items"].([]any)
	require.Len(t, items, 1)
	require.Equal(t, "acme", items[0].(map[string]any)["tenant"])
	require.Equal(t, "orphaned", items[0].(map[string]any)["state"])
	require.Nil(t, page["next_cursor"])
	r = b.req(t, http.MethodGet, "/v1/keys?state=orphaned", tok, nil)
	require.Len(t, r.json(t)["items"], 1)

	r = b.req(t, http.MethodPost, "/v1/keys/job/claim", tok, map[string]any{"fingerprint": "fp"})
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	c := r.json(t)
	require.Equal(t, true, c["resumed"])
	require.Equal(t, float64(2), c["attempt"])
	require.Equal(t, "step1", c["recovery_point"])
	require.Equal(t, []any{float64(1), float64(2)}, c["recovery_data"])
	second := int64(c["fencing_token"].(float64))
	require.Greater(t, second, first)

	// The first holder is fenced off for every write.
	for _, op := range []string{"checkpoint", "complete", "release"} {
		body := map[string]any{"fencing_token": first, "recovery_point": "x", "response": map[string]any{"status": 200}}
		switch op {
		case "release":
			body = map[string]any{"fencing_token": first}
		case "checkpoint":
			delete(body, "response")
		case "complete":
			delete(body, "recovery_point")
		}
		r = b.req(t, http.MethodPost, "/v1/keys/job/"+op, tok, body)
		requireProblem(t, r, http.StatusConflict, idem.CodeLeaseLost, false)
	}

	r = b.req(t, http.MethodPost, "/v1/keys/job/release", tok, map[string]any{"fencing_token": second})
	require.Equal(t, http.StatusNoContent, r.status, "body: %s", r.body)
	require.Empty(t, r.body)
	r = b.req(t, http.MethodPost, "/v1/keys/job/release", tok, map[string]any{"fencing_token": second})
	requireProblem(t, r, http.StatusNotFound, idem.CodeKeyNotFound, false)
	r = b.req(t, http.MethodPost, "/v1/keys/job/checkpoint", tok, map[string]any{"fencing_token": second, "recovery_point": "x"})
	requireProblem(t, r, http.StatusNotFound, idem.CodeKeyNotFound, false)
}

// TestClaimRace sends 32 concurrent claims of one key over HTTP: exactly one
// wins, the others are told the key is in flight, and the stored record is
// the winner's.
func TestClaimRace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tok := b.token(t, "acme", auth.ScopeKeysWrite)

	const n = 32
	var wg sync.WaitGroup
	results := make([]result, n)
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			results[i] = b.req(t, http.MethodPost, "/v1/keys/race/claim", tok, map[string]any{"fingerprint": "same"})
		})
	}
	close(start)
	wg.Wait()

	var winners []int64
	for _, r := range results {
		switch r.status {
		case http.StatusCreated:
			winners = append(winners, int64(r.json(t)["fencing_token"].(float64)))
		case http.StatusConflict:
			require.Equal(t, string(idem.CodeRequestInFlight), r.json(t)["code"])
			require.NotEmpty(t, r.header.Get("Retry-After"))
		default:
			t.Fatalf("unexpected answer %d: %s", r.status, r.body)
		}
	}
	require.Len(t, winners, 1)

	r := b.req(t, http.MethodGet, "/v1/keys/race", tok, nil)
	rec := r.json(t)
	require.Equal(t, float64(winners[0]), rec["fencing_token"])
	require.Equal(t, float64(1), rec["attempt"])
}

func TestListKeysPagination(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tok := b.token(t, "acme", auth.ScopeKeysWrite)
	for i := range 5 {
		b.claim(t, tok, "k"+string(rune('a'+i)), nil)
		b.clock.Advance(time.Millisecond)
	}
	// Another tenant's keys never show.
	b.claim(t, b.token(t, "globex", auth.ScopeKeysWrite), "other", nil)

	var keys []string
	cursor := ""
	pages := 0
	for {
		r := b.req(t, http.MethodGet, "/v1/keys?limit=2&cursor="+cursor, tok, nil)
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		page := r.json(t)
		for _, it := range page["items"].([]any) {
			item := it.(map[string]any)
			require.Nil(t, item["response"])
			keys = append(keys, item["key"].(string))
		}
		pages++
		if page["next_cursor"] == nil {
			break
		}
		cursor = page["next_cursor"].(string)
	}
	require.Equal(t, []string{"ke", "kd", "kc", "kb", "ka"}, keys)
	require.Equal(t, 3, pages)

	r := b.req(t, http.MethodGet, "/v1/keys?state=completed", tok, nil)
	require.Empty(t, r.json(t)["items"])

	for q, field := range map[string]string{
		"state=done": "state", "limit=0": "limit", "limit=501": "limit", "limit=x": "limit",
		"cursor=%21%21": "cursor", "cursor=e30": "cursor",
	} {
		r := b.req(t, http.MethodGet, "/v1/keys?"+q, tok, nil)
		p := requireProblem(t, r, http.StatusBadRequest, idem.CodeInvalidRequest, false)
		requireField(t, p, field)
	}
}

func TestTenantIsolation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	acme := b.token(t, "acme", auth.ScopeKeysWrite)
	globex := b.token(t, "globex", auth.ScopeKeysWrite)
	token := b.claim(t, acme, "shared", map[string]any{"fingerprint": "a"})

	r := b.req(t, http.MethodGet, "/v1/keys/shared", globex, nil)
	requireProblem(t, r, http.StatusNotFound, idem.CodeKeyNotFound, false)
	r = b.req(t, http.MethodPost, "/v1/keys/shared/complete", globex, map[string]any{"fencing_token": token, "response": map[string]any{"status": 200}})
	requireProblem(t, r, http.StatusNotFound, idem.CodeKeyNotFound, false)
	// The same key is free in the other tenant, with another fingerprint.
	b.claim(t, globex, "shared", map[string]any{"fingerprint": "b"})
}

func TestRateLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	admin := b.token(t, "acme", auth.ScopeTenantAdmin, auth.ScopeKeysRead)
	r := b.req(t, http.MethodPatch, "/v1/tenant", admin, map[string]any{"settings": map[string]any{"rate_limit_per_second": 1}})
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)

	// Burst of one: the first request passes, the next is refused.
	r = b.req(t, http.MethodGet, "/v1/keys", admin, nil)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	r = b.req(t, http.MethodGet, "/v1/keys", admin, nil)
	requireProblem(t, r, http.StatusTooManyRequests, idem.CodeRateLimited, true)
	require.Equal(t, "1", r.header.Get("Retry-After"))
	// Other tenants are not affected.
	r = b.req(t, http.MethodGet, "/v1/keys", b.token(t, "globex", auth.ScopeKeysRead), nil)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
}
