package e2e

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A response completed with 200 survives kill -9 of the server, on both
// stores, and replays byte for byte after a restart.
func TestKill9KeepsCompletedResponses(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"sqlite", "postgres"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			env := backendEnv(t, backend, nil)
			mustCLI(t, env, "tenant", "create", "acme")
			tok := mintToken(t, env, "acme", "keys:write")
			c := newClient(true)

			srv := startServer(t, env)
			const n = 25
			sent := make(map[string]storedResponse, n)
			for i := range n {
				key := fmt.Sprintf("pay-%d", i)
				res := mustCall(t, c, http.MethodPost, srv.url+"/v1/keys/"+key+"/claim", tok,
					map[string]any{"operation": "POST /v1/payments", "fingerprint": "fp-" + key})
				require.Equal(t, http.StatusCreated, res.status, string(res.body))
				rec := decodeRecord(t, res.body)

				resp := storedResponse{
					Status:       201,
					Headers:      map[string]string{"Content-Type": "application/json", "X-Order": key},
					Body:         fmt.Sprintf(`{"id":"ord_%d","note":"h\u00e9llo \u2713 %d"}`, i, i),
					BodyEncoding: "utf8",
				}
				if i%2 == 1 { // arbitrary bytes, base64 in transit
					raw := make([]byte, 64+i)
					_, _ = rand.Read(raw)
					resp = storedResponse{Status: 500 + i%3, Headers: map[string]string{"Content-Type": "application/octet-stream"},
						Body: base64.StdEncoding.EncodeToString(raw), BodyEncoding: "base64"}
				}
				res = mustCall(t, c, http.MethodPost, srv.url+"/v1/keys/"+key+"/complete", tok,
					map[string]any{"fencing_token": rec.FencingToken, "response": resp})
				require.Equal(t, http.StatusOK, res.status, string(res.body))
				sent[key] = resp
			}
			// kill -9 right after the last 200: no graceful anything.
			code, _ := srv.stop(t, syscall.SIGKILL, 10*time.Second)
			require.Equal(t, -1, code, "the process must have died from SIGKILL")

			srv = startServer(t, env)
			for key, want := range sent {
				res := mustCall(t, c, http.MethodPost, srv.url+"/v1/keys/"+key+"/claim", tok,
					map[string]any{"operation": "POST /v1/payments", "fingerprint": "fp-" + key})
				require.Equal(t, http.StatusOK, res.status, "%s: %s", key, res.body)
				require.Equal(t, "true", res.header.Get("Idempotent-Replayed"))
				rec := decodeRecord(t, res.body)
				require.Equal(t, "completed", rec.State)
				require.NotNil(t, rec.Response, key)
				require.Equal(t, want.Status, rec.Response.Status, key)
				require.Equal(t, want.Headers, rec.Response.Headers, key)
				require.Equal(t, decodeBody(t, want), decodeBody(t, *rec.Response), "%s: the replayed body differs", key)
			}
			code, took := srv.stop(t, syscall.SIGTERM, 30*time.Second)
			require.Equal(t, 0, code)
			require.Less(t, took, 20*time.Second)
		})
	}
}

// decodeBody returns the bytes of a response body in either encoding.
func decodeBody(t *testing.T, r storedResponse) []byte {
	t.Helper()
	if r.BodyEncoding == "base64" {
		b, err := base64.StdEncoding.DecodeString(r.Body)
		require.NoError(t, err)
		return b
	}
	return []byte(r.Body)
}
