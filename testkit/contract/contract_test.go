package contract_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/testkit/contract"
)

// recorder is a testing.TB that collects what the transport reports instead
// of failing the real test.
type recorder struct {
	testing.TB
	mu   sync.Mutex
	errs []string
}

func (r *recorder) Helper() {}

func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

func (r *recorder) reported() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.errs, "\n")
}

// canned answers every request with the given status, headers and body.
type canned struct {
	status  int
	headers map[string]string
	body    string
}

const claimed = `{"key":"order-42","state":"in_flight","fencing_token":7,"attempt":1,"resumed":false,` +
	`"lease_expires_at":"2026-11-29T10:00:30Z","recovery_point":null,"recovery_data":null}`

func problem(code string, status int) string {
	return fmt.Sprintf(`{"type":"/docs/errors#%s","title":"x","status":%d,"detail":"d","code":%q,"retryable":false,"request_id":"r1"}`, code, status, code)
}

// exchange serves one canned answer on 127.0.0.1, sends req through the
// contract transport and returns what the transport reported.
func exchange(t *testing.T, answer canned, method, path, contentType, body string, auth bool) string {
	t.Helper()
	var gotBody string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		gotBody = string(b)
		for k, v := range answer.headers {
			w.Header().Set(k, v)
		}
		w.WriteHeader(answer.status)
		_, _ = io.WriteString(w, answer.body)
	}))
	t.Cleanup(srv.Close)

	rec := &recorder{TB: t}
	client := &http.Client{Transport: contract.Transport(rec, srv.Client().Transport)}
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, srv.URL+path, rd)
	require.NoError(t, err)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if auth {
		req.Header.Set("Authorization", "Bearer test-token")
	}
	resp, err := client.Do(req)
	require.NoError(t, err)
	got, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, answer.body, string(got), "the transport must hand the response body on unchanged")
	require.Equal(t, body, gotBody, "the transport must send the request body unchanged")
	return rec.reported()
}

func jsonAnswer(status int, body string, extra ...string) canned {
	h := map[string]string{"Content-Type": "application/json", "X-Request-Id": "r1"}
	for i := 0; i+1 < len(extra); i += 2 {
		h[extra[i]] = extra[i+1]
	}
	return canned{status: status, headers: h, body: body}
}

func problemAnswer(status int, code string, extra ...string) canned {
	c := jsonAnswer(status, problem(code, status), extra...)
	c.headers["Content-Type"] = "application/problem+json"
	return c
}

func TestValidExchangesPass(t *testing.T) {
	t.Parallel()
	const claimBody = `{"operation":"POST /v1/payments","request":{"amount":1000},"lease_seconds":30}`
	tests := []struct {
		name                   string
		answer                 canned
		method, path, ct, body string
		auth                   bool
	}{
		{"claim created", jsonAnswer(201, claimed), "POST", "/v1/keys/order-42/claim", "application/json", claimBody, true},
		{"claim with empty body", jsonAnswer(201, claimed), "POST", "/v1/keys/order-42/claim", "", "", true},
		{"claim replay", jsonAnswer(200, `{"key":"order-42","state":"completed","operation":"","fingerprint":"","fencing_token":7,"attempt":1,`+
			`"lease_expires_at":null,"recovery_point":null,"recovery_data":null,"created_at":"2026-11-29T10:00:00Z",`+
			`"completed_at":"2026-11-29T10:00:01Z","replay_until":"2026-11-30T10:00:01Z","purge_after":"2026-12-02T10:00:00Z",`+
			`"response":{"status":201,"headers":{"Content-Type":"application/json"},"body":"{}","body_encoding":"utf8"}}`,
			"Idempotent-Replayed", "true"), "POST", "/v1/keys/order-42/claim", "application/json", claimBody, true},
		{"claim in flight", problemAnswer(409, "request_in_flight", "Retry-After", "12"), "POST", "/v1/keys/order-42/claim", "application/json", claimBody, true},
		{"escaped key", jsonAnswer(201, claimed), "POST", "/v1/keys/a%2Fb%25c/claim", "application/json", `{}`, true},
		{"release", canned{status: 204, headers: map[string]string{"X-Request-Id": "r1"}}, "POST", "/v1/keys/k/release", "application/json", `{"fencing_token":3}`, true},
		{"list keys", jsonAnswer(200, `{"items":[],"next_cursor":null}`), "GET", "/v1/keys?state=orphaned&limit=10", "", "", true},
		{"unknown field refused", problemAnswer(400, "invalid_request"), "POST", "/v1/keys/k/claim", "application/json", `{"bogus":1}`, true},
		{"no token refused", problemAnswer(401, "unauthenticated"), "GET", "/v1/keys/k", "", "", false},
		{"healthz", jsonAnswer(200, `{"status":"ok"}`), "GET", "/healthz", "", "", false},
		{"docs unchecked", canned{status: 200, headers: map[string]string{"Content-Type": "text/html"}, body: "<html></html>"}, "GET", "/docs/", "", "", false},
		{"unknown path 404", canned{status: 404, headers: map[string]string{"Content-Type": "text/plain"}, body: "404 page not found"}, "GET", "/v2/nothing", "", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Empty(t, exchange(t, tc.answer, tc.method, tc.path, tc.ct, tc.body, tc.auth))
		})
	}
}

func TestMismatchesAreReported(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name                   string
		answer                 canned
		method, path, ct, body string
		auth                   bool
		want                   string
	}{
		{"missing required field", jsonAnswer(201, `{"key":"k","state":"in_flight","attempt":1}`),
			"POST", "/v1/keys/k/claim", "application/json", `{}`, true, "fencing_token"},
		{"undocumented field", jsonAnswer(201, strings.Replace(claimed, `"attempt":1`, `"attempt":1,"tenant":"acme"`, 1)),
			"POST", "/v1/keys/k/claim", "application/json", `{}`, true, "tenant"},
		{"wrong state enum", jsonAnswer(201, strings.Replace(claimed, `"in_flight"`, `"running"`, 1)),
			"POST", "/v1/keys/k/claim", "application/json", `{}`, true, "running"},
		{"undocumented status", jsonAnswer(418, `{}`), "POST", "/v1/keys/k/claim", "application/json", `{}`, true, "418"},
		{"missing request id", canned{status: 201, headers: map[string]string{"Content-Type": "application/json"}, body: claimed},
			"POST", "/v1/keys/k/claim", "application/json", `{}`, true, "X-Request-Id"},
		{"replay without header", jsonAnswer(200, `{"key":"k","state":"completed","fencing_token":1,"attempt":1}`),
			"POST", "/v1/keys/k/claim", "application/json", `{}`, true, "Idempotent-Replayed"},
		{"rate limited without Retry-After", problemAnswer(429, "rate_limited"), "GET", "/v1/keys/k", "", "", true, "Retry-After"},
		{"unknown code", problemAnswer(400, "oops"), "POST", "/v1/keys/k/claim", "application/json", `{}`, true, "oops"},
		{"problem type mismatch", canned{status: 404, headers: map[string]string{"Content-Type": "application/problem+json", "X-Request-Id": "r"},
			body: `{"type":"about:blank","title":"x","status":404,"code":"key_not_found","retryable":false}`},
			"GET", "/v1/keys/k", "", "", true, "/docs/errors#key_not_found"},
		{"problem status mismatch", canned{status: 404, headers: map[string]string{"Content-Type": "application/problem+json", "X-Request-Id": "r"},
			body: problem("key_not_found", 400)}, "GET", "/v1/keys/k", "", "", true, "HTTP status is 404"},
		{"error not problem json", jsonAnswer(404, problem("key_not_found", 404)), "GET", "/v1/keys/k", "", "", true, "problem+json"},
		{"invalid request accepted", jsonAnswer(201, claimed), "POST", "/v1/keys/k/claim", "application/json", `{"bogus":true}`, true, "refuses this request"},
		{"key with a space accepted", jsonAnswer(201, claimed), "POST", "/v1/keys/a%20b/claim", "application/json", `{}`, true, "refuses this request"},
		{"no token accepted", jsonAnswer(200, `{"items":[],"next_cursor":null}`), "GET", "/v1/keys", "", "", false, "bearer"},
		{"unknown path answered", jsonAnswer(200, `{}`), "GET", "/v1/nothing", "", "", true, "no such operation"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := exchange(t, tc.answer, tc.method, tc.path, tc.ct, tc.body, tc.auth)
			require.NotEmpty(t, got, "the mismatch went unreported")
			require.Contains(t, got, tc.want)
		})
	}
}
