package web_test

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/webhooks"
)

// runNodeResume runs the Node README's resume endpoint (Express) and plays
// idem's completer against it (requireResumeEndpoint).
func runNodeResume(t *testing.T, live *liveServer, _ snippet) {
	project := nodeProject(t, map[string]string{"app.mjs": "readme/node_resume.mjs"}, "express")
	secret := resumeSecret(t)
	port := freePort(t)
	out := startApp(t, []string{interpreter(t, "node"), project + "/app.mjs"},
		"IDEM_URL="+live.url, "IDEM_TOKEN="+live.token, "IDEM_RESUME_SECRET="+secret, "PORT="+strconv.Itoa(port))
	waitListening(t, port, out)
	requireResumeEndpoint(t, live, "http://127.0.0.1:"+strconv.Itoa(port), secret, out)
}

// runPythonResume runs the Python README's resume endpoint (Flask) and
// plays idem's completer against it (requireResumeEndpoint).
func runPythonResume(t *testing.T, live *liveServer, _ snippet) {
	secret := resumeSecret(t)
	port := freePort(t)
	out := startApp(t, pythonSDK("readme/python_resume.py")(t),
		"IDEM_URL="+live.url, "IDEM_TOKEN="+live.token, "IDEM_RESUME_SECRET="+secret, "PORT="+strconv.Itoa(port))
	waitListening(t, port, out)
	requireResumeEndpoint(t, live, "http://127.0.0.1:"+strconv.Itoa(port), secret, out)
}

// resumeSecret returns a fresh endpoint secret, whsec_ and base64.
func resumeSecret(t *testing.T) string {
	var b [24]byte
	_, err := rand.Read(b[:])
	require.NoError(t, err)
	return "whsec_" + base64.StdEncoding.EncodeToString(b[:])
}

// resumeAPI calls the idem API of the live server as the dead worker did;
// it returns the answer's JSON.
func resumeAPI(t *testing.T, live *liveServer, path string, body any) map[string]any {
	t.Helper()
	b, err := json.Marshal(body)
	require.NoError(t, err)
	req, err := http.NewRequest("POST", live.url+path, strings.NewReader(string(b)))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+live.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := apiClient(t).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var out map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	require.Less(t, resp.StatusCode, 300, "%s: %v", path, out)
	return out
}

// callResume posts a completer call to the app's /idem/resume, signed by
// webhooks.Sign with secret; it returns the status and the answer's JSON.
func callResume(t *testing.T, base, secret string, call map[string]any) (int, map[string]any) {
	t.Helper()
	body, err := json.Marshal(call)
	require.NoError(t, err)
	id, now := "rsm_readme_"+strconv.FormatInt(time.Now().UnixNano(), 36), time.Now()
	sig, err := webhooks.Sign(secret, id, now, body)
	require.NoError(t, err)
	req, err := http.NewRequest("POST", base+"/idem/resume", strings.NewReader(string(body)))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("webhook-id", id)
	req.Header.Set("webhook-timestamp", strconv.FormatInt(now.Unix(), 10))
	req.Header.Set("webhook-signature", sig)
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var out map[string]any
	require.NoError(t, json.Unmarshal(b, &out), "%s", b)
	return resp.StatusCode, out
}

// requireResumeEndpoint plays idem's completer against a README resume
// endpoint example: a request runs both steps once; an orphan whose worker
// died after the charge (claimed and checkpointed through the API as that
// worker did) is resumed at the e-mail, the charge not repeated, answered
// completed with the response; one never checkpointed goes to review; a
// call signed with another secret is 401 and runs nothing.
func requireResumeEndpoint(t *testing.T, live *liveServer, base, secret string, out *lockedBuffer) {
	t.Helper()
	first := pay(t, base+"/orders/o1", "unused", `{"amount": 1000}`)
	require.Equal(t, 201, first.status, "%s\n%s", first.body, out.String())
	require.JSONEq(t, `{"order":"o1","charge":"ch_1"}`, first.body)

	order := map[string]any{"id": "o2", "amount": 500}
	claim := resumeAPI(t, live, "/v1/keys/order-o2/claim", map[string]any{"operation": "POST /orders/:id", "request": order, "lease_seconds": 30})
	token := claim["fencing_token"]
	data := map[string]any{"order": order, "charge": "ch_psp_9"}
	resumeAPI(t, live, "/v1/keys/order-o2/checkpoint", map[string]any{"fencing_token": token, "recovery_point": "charged", "data": data})
	soon := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	call := func(key string, point, recovery any) map[string]any {
		return map[string]any{"type": "key.resume", "tenant": "readme", "key": key, "operation": "POST /orders/:id", "attempt": 1,
			"max_attempts": 8, "fencing_token": token, "recovery_point": point, "recovery_data": recovery,
			"lease_expires_at": soon, "deadline": soon}
	}
	status, ans := callResume(t, base, secret, call("order-o2", "charged", data))
	require.Equal(t, 200, status, "%v\n%s", ans, out.String())
	require.Equal(t, "completed", ans["outcome"], "%v\n%s", ans, out.String())
	resp := ans["response"].(map[string]any)
	require.EqualValues(t, 201, resp["status"])
	require.JSONEq(t, `{"order":"o2","charge":"ch_psp_9"}`, resp["body"].(string))
	require.Zero(t, strings.Count(out.String(), "charged 500"), "the resume did not charge again:\n%s", out.String())
	require.Equal(t, 1, strings.Count(out.String(), "emailed the receipt of ch_psp_9"), out.String())
	rec := resumeGet(t, live, "order-o2")
	require.Equal(t, "emailed", rec["recovery_point"], "the e-mail's checkpoint carried idem's token")

	status, ans = callResume(t, base, secret, call("order-o3", nil, nil))
	require.Equal(t, 200, status)
	require.Equal(t, "review", ans["outcome"], "%v", ans)
	require.NotEmpty(t, ans["note"])

	status, ans = callResume(t, base, resumeSecret(t), call("order-o4", "charged", map[string]any{"order": map[string]any{"id": "o4", "amount": 7}, "charge": "ch_o4"}))
	require.Equal(t, 401, status, "%v", ans)
	require.Equal(t, "unauthenticated", ans["code"])
	require.NotContains(t, out.String(), "ch_o4", "a call that does not verify runs nothing")
}

// resumeGet reads a record through the API.
func resumeGet(t *testing.T, live *liveServer, key string) map[string]any {
	t.Helper()
	req, err := http.NewRequest("GET", live.url+"/v1/keys/"+url.PathEscape(key), nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+live.token)
	resp, err := apiClient(t).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var rec map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&rec))
	return rec
}
