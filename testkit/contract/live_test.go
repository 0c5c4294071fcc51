package contract_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/testkit/contract"
	"github.com/idem-dev/idem/testkit/servertest"
)

// TestLiveServerMatchesSpec drives every operation of the real server once,
// happy paths and the common errors, through the contract transport: any
// drift between openapi.yaml and the code fails here.
func TestLiveServerMatchesSpec(t *testing.T) {
	t.Parallel()
	srv := servertest.Start(t, servertest.Options{Tenants: []string{"acme", "other"}})
	writer := srv.Token(t, "acme", "keys:write")
	reader := srv.Token(t, "acme", "keys:read")
	tadmin := srv.Token(t, "acme", "tenant:admin")
	operator := srv.Token(t, "", "admin")
	c := &http.Client{Transport: contract.Transport(t, nil)}

	send := func(method, path, token, body string) (int, string) {
		t.Helper()
		var rd io.Reader
		if body != "" {
			rd = strings.NewReader(body)
		}
		req, err := http.NewRequest(method, srv.URL()+path, rd)
		require.NoError(t, err)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := c.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	expect := func(want int, method, path, token, body string) string {
		t.Helper()
		got, b := send(method, path, token, body)
		require.Equal(t, want, got, "%s %s: %s", method, path, b)
		return b
	}

	// Operational endpoints.
	expect(200, "GET", "/healthz", "", "")
	expect(200, "GET", "/readyz", "", "")
	expect(200, "GET", "/metrics", "", "")
	expect(200, "GET", "/openapi.yaml", "", "")

	// The key lifecycle.
	claim := `{"operation":"POST /v1/payments","request":{"amount":1000,"currency":"usd"},"lease_seconds":30}`
	b := expect(201, "POST", "/v1/keys/pay%2F1/claim", writer, claim)
	require.Contains(t, b, `"fencing_token":`)
	tok := between(b, `"fencing_token":`, ",")
	expect(409, "POST", "/v1/keys/pay%2F1/claim", writer, claim)
	expect(422, "POST", "/v1/keys/pay%2F1/claim", writer, `{"operation":"POST /v1/payments","request":{"amount":2}}`)
	expect(200, "POST", "/v1/keys/pay%2F1/checkpoint", writer, `{"fencing_token":`+tok+`,"recovery_point":"charged","data":{"charge_id":"ch_1"}}`)
	expect(409, "POST", "/v1/keys/pay%2F1/checkpoint", writer, `{"fencing_token":999999,"recovery_point":"x"}`)
	done := `{"fencing_token":` + tok + `,"response":{"status":201,"headers":{"Content-Type":"application/json"},"body":"{\"id\":1}"}}`
	expect(200, "POST", "/v1/keys/pay%2F1/complete", writer, done)
	expect(200, "POST", "/v1/keys/pay%2F1/complete", writer, done)
	expect(409, "POST", "/v1/keys/pay%2F1/complete", writer, `{"fencing_token":`+tok+`,"response":{"status":500}}`)
	expect(409, "POST", "/v1/keys/pay%2F1/release", writer, `{"fencing_token":`+tok+`}`)
	expect(200, "POST", "/v1/keys/pay%2F1/claim", writer, claim)
	expect(200, "GET", "/v1/keys/pay%2F1", reader, "")
	expect(200, "GET", "/v1/keys?state=completed&limit=1", reader, "")
	expect(200, "GET", "/v1/keys", reader, "")

	b = expect(201, "POST", "/v1/keys/empty/claim", writer, "")
	expect(204, "POST", "/v1/keys/empty/release", writer, `{"fencing_token":`+between(b, `"fencing_token":`, ",")+`}`)
	expect(404, "POST", "/v1/keys/empty/release", writer, `{"fencing_token":1}`)
	expect(404, "GET", "/v1/keys/nope", reader, "")

	// Errors the spec refuses on the way in.
	expect(400, "POST", "/v1/keys/k/claim", writer, `{"bogus":1}`)
	expect(400, "POST", "/v1/keys/k/claim", writer, `{"fingerprint":"a","request":{}}`)
	expect(400, "POST", "/v1/keys/a%20b/claim", writer, `{}`)
	expect(401, "GET", "/v1/keys", "", "")
	expect(401, "GET", "/v1/keys", "not-a-jwt", "")
	expect(403, "POST", "/v1/keys/k/claim", reader, `{}`)
	expect(403, "GET", "/v1/keys", srv.Token(t, "ghost", "keys:read"), "")
	got, _ := send("POST", "/v1/keys/k/claim", writer, "")
	require.Equal(t, 201, got)

	// Tenant settings.
	expect(200, "GET", "/v1/tenant", reader, "")
	expect(200, "PATCH", "/v1/tenant", tadmin, `{"settings":{"replay_window_seconds":172800,"reaper_threshold_seconds":345600}}`)
	expect(400, "PATCH", "/v1/tenant", tadmin, `{"settings":{"replay_window_seconds":0}}`)
	expect(403, "PATCH", "/v1/tenant", reader, `{"settings":{}}`)

	// Operator endpoints.
	expect(201, "POST", "/v1/admin/tenants", operator, `{"id":"newco","name":"New Co","settings":{"rate_limit_per_second":5}}`)
	expect(409, "POST", "/v1/admin/tenants", operator, `{"id":"newco"}`)
	expect(200, "GET", "/v1/admin/tenants", operator, "")
	expect(200, "GET", "/v1/admin/tenants/newco", operator, "")
	expect(404, "GET", "/v1/admin/tenants/nobody", operator, "")
	expect(200, "PATCH", "/v1/admin/tenants/newco", operator, `{"name":"NewCo","disabled":false}`)
	got, _ = send("DELETE", "/v1/admin/tenants/newco", operator, "")
	require.Contains(t, []int{200, 204}, got)
	expect(200, "GET", "/v1/admin/orphans?tenant=acme", operator, "")
	expect(200, "GET", "/v1/admin/orphans", operator, "")
	expect(403, "GET", "/v1/admin/orphans", writer, "")
}

func between(s, start, end string) string {
	_, after, ok := strings.Cut(s, start)
	if !ok {
		return ""
	}
	v, _, _ := strings.Cut(after, end)
	return v
}
