package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestCLIKeysResolve: an operator resolves orphans with the real binary's
// `keys` command on the store the running server uses, and the server
// answers accordingly: a review flag on the record, a completion replayed
// to the retry (the late worker fenced off), a release that lets the next
// claim run afresh, each in the audit log as subject "cli".
func TestCLIKeysResolve(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	env := map[string]string{
		"IDEM_DATABASE_URL":     "sqlite:" + filepath.Join(dir, "idem.db"),
		"IDEM_JWT_HS256_SECRET": testSecret,
	}
	mustCLI(t, env, "migrate")
	mustCLI(t, env, "tenant", "create", "acme")
	srv := startServer(t, env)
	c := newClient(true)
	tok := mintToken(t, env, "acme", "keys:write")
	admin := mintToken(t, env, "", "admin")
	tokens := map[string]string{}
	for _, k := range []string{"pay-1", "pay-2"} {
		res := mustCall(t, c, http.MethodPost, srv.url+"/v1/keys/"+k+"/claim", tok, map[string]any{"fingerprint": "fp", "lease_seconds": 1})
		require.Equal(t, http.StatusCreated, res.status, string(res.body))
		var claim struct {
			FencingToken int64 `json:"fencing_token"`
		}
		require.NoError(t, json.Unmarshal(res.body, &claim))
		tokens[k] = fmt.Sprint(claim.FencingToken)
	}

	res := mustCall(t, c, http.MethodPost, srv.url+"/v1/keys/live/claim", tok, map[string]any{"fingerprint": "fp", "lease_seconds": 600})
	require.Equal(t, http.StatusCreated, res.status, string(res.body))
	var live struct {
		FencingToken int64 `json:"fencing_token"`
	}
	require.NoError(t, json.Unmarshal(res.body, &live))

	// Usage errors, and an in-flight key refused by the store's rules.
	_, _, code := runCLI(t, env, "keys", "forget")
	require.Equal(t, 2, code)
	_, errOut, code := runCLI(t, env, "keys", "review", "--tenant", "acme", "--key", "pay-1", "--token", tokens["pay-1"])
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "note")
	_, errOut, code = runCLI(t, env, "keys", "release", "--tenant", "acme", "--key", "live", "--token", fmt.Sprint(live.FencingToken))
	require.Equal(t, 1, code, "the lease still runs")
	require.Contains(t, errOut, "request_in_flight")

	out := mustCLI(t, env, "keys", "review", "--tenant", "acme", "--key", "pay-1", "--token", tokens["pay-1"], "--note", "charge_created: ask the provider")
	require.Contains(t, out, `"action": "review"`)
	res = mustCall(t, c, http.MethodGet, srv.url+"/v1/admin/tenants/acme/keys/pay-1", admin, nil)
	require.Contains(t, string(res.body), `"note":"charge_created: ask the provider"`)

	require.Eventually(t, func() bool {
		res := mustCall(t, c, http.MethodGet, srv.url+"/v1/admin/orphans", admin, nil)
		var page struct{ Items []any }
		return json.Unmarshal(res.body, &page) == nil && len(page.Items) == 2
	}, 10*time.Second, 50*time.Millisecond)

	_, errOut, code = runCLI(t, env, "keys", "release", "--tenant", "acme", "--key", "pay-1", "--token", "999999")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "lease_lost")

	out = mustCLI(t, env, "keys", "complete", "--tenant", "acme", "--key", "pay-1", "--token", tokens["pay-1"],
		"--status", "201", "--header", "Content-Type: application/json", "--body", `{"id":"ch_1"}`, "--note", "ch_1 found")
	require.Contains(t, out, `"new_fencing_token"`)
	res = mustCall(t, c, http.MethodPost, srv.url+"/v1/keys/pay-1/complete", tok, map[string]any{"fencing_token": json.Number(tokens["pay-1"]), "response": map[string]any{"status": 500}})
	require.Equal(t, http.StatusConflict, res.status, string(res.body))
	require.Equal(t, "lease_lost", problemCode(res.body))
	res = mustCall(t, c, http.MethodPost, srv.url+"/v1/keys/pay-1/claim", tok, map[string]any{"fingerprint": "fp"})
	require.Equal(t, http.StatusOK, res.status, string(res.body))
	require.Contains(t, string(res.body), `"body":"{\"id\":\"ch_1\"}"`)

	mustCLI(t, env, "keys", "release", "--tenant", "acme", "--key", "pay-2", "--token", tokens["pay-2"], "--note", "never started")
	res = mustCall(t, c, http.MethodPost, srv.url+"/v1/keys/pay-2/claim", tok, map[string]any{"fingerprint": "fp"})
	require.Equal(t, http.StatusCreated, res.status, string(res.body))
	require.Contains(t, string(res.body), `"attempt":1`)

	res = mustCall(t, c, http.MethodGet, srv.url+"/v1/admin/audit?tenant=acme", admin, nil)
	var audit struct {
		Items []struct {
			Action string
			Actor  struct{ Subject, Scope string }
		}
	}
	require.NoError(t, json.Unmarshal(res.body, &audit))
	require.Len(t, audit.Items, 3)
	for _, e := range audit.Items {
		require.Equal(t, "cli", e.Actor.Subject)
		require.Equal(t, "admin", e.Actor.Scope)
	}
	require.Equal(t, []string{"release", "complete", "review"}, []string{audit.Items[0].Action, audit.Items[1].Action, audit.Items[2].Action})
}
