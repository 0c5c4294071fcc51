package server_test

// End-to-end tests of the ledger's promise against a careless operator,
// through real HTTP on both stores (issue 9, items 1 and 2): the reaper never
// deletes a key whose lease still runs, and disabling a tenant keeps every
// record; only deleting it removes them.

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/testkit/contract"
	"github.com/idem-dev/idem/testkit/servertest"
)

// apiClient calls one test server with traffic checked against openapi.yaml.
type apiClient struct {
	ts   *servertest.Server
	http *http.Client
}

func newAPIClient(t *testing.T, ts *servertest.Server) *apiClient {
	return &apiClient{ts: ts, http: &http.Client{Transport: contract.Transport(t, http.DefaultTransport), Timeout: 30 * time.Second}}
}

// call sends a request and returns the status, the decoded JSON body (nil
// when empty) and the headers.
func (c *apiClient) call(t *testing.T, method, path, token, body string) (int, map[string]any, http.Header) {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, c.ts.URL()+path, r)
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var out map[string]any
	if len(b) > 0 {
		require.NoError(t, json.Unmarshal(b, &out), "body of %s %s: %s", method, path, b)
	}
	return resp.StatusCode, out, resp.Header
}

// metric returns the value of the sample named exactly series (name and
// labels as Prometheus prints them), 0 when absent.
func (c *apiClient) metric(t *testing.T, series string) float64 {
	t.Helper()
	resp, err := http.Get(c.ts.URL() + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if ok && name == series {
			v, err := strconv.ParseFloat(value, 64)
			require.NoError(t, err)
			return v
		}
	}
	require.NoError(t, sc.Err())
	return 0
}

// waitReaperPasses waits until n more reaper passes have succeeded.
func (c *apiClient) waitReaperPasses(t *testing.T, n int) {
	t.Helper()
	const series = `idem_reaper_runs_total{result="ok"}`
	want := c.metric(t, series) + float64(n)
	require.Eventually(t, func() bool { return c.metric(t, series) >= want }, 20*time.Second, 50*time.Millisecond,
		"%d reaper passes did not happen", n)
}

// fieldNames returns the field of every errors[] entry of a problem.
func fieldNames(problem map[string]any) []string {
	var out []string
	list, _ := problem["errors"].([]any)
	for _, e := range list {
		if m, ok := e.(map[string]any); ok {
			out = append(out, fmt.Sprint(m["field"]))
		}
	}
	return out
}

// ageRecords sets purge_after in the past for every record of tenant,
// directly in the database, as records stored by an earlier version with a
// reaper threshold shorter than the lease had it.
func ageRecords(t *testing.T, ts *servertest.Server, tenant string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	url := ts.Config().DatabaseURL
	if path, ok := strings.CutPrefix(url, "sqlite:"); ok {
		db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)")
		require.NoError(t, err)
		defer db.Close()
		_, err = db.ExecContext(ctx, `UPDATE idempotency_keys SET purge_after = created_at WHERE tenant_id = ?`, tenant)
		require.NoError(t, err)
		return
	}
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `UPDATE idempotency_keys SET purge_after = created_at WHERE tenant_id = $1`, tenant)
	require.NoError(t, err)
}

// TestReaperNeverDeletesRunningLease: settings whose reaper threshold is
// shorter than the longest lease are refused (create and change, 400 naming
// the field), and a record whose purge time has come while its lease still
// runs (as one stored before this rule had it) survives reaper passes: the
// retry gets 409 and the claimant's checkpoint and complete still land. A
// record whose lease has run out is then reaped, logged and counted as an
// orphan.
func TestReaperNeverDeletesRunningLease(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{servertest.BackendSQLite, servertest.BackendPostgres} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			logs := &syncBuffer{}
			ts := servertest.Start(t, servertest.Options{Backend: backend, ReapInterval: 20 * time.Millisecond,
				Logger: slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
			c := newAPIClient(t, ts)
			op := ts.Token(t, "", "admin")

			// The settings of the report: replay 2 s, reaper 3 s, lease max 60 s.
			bad := `"settings":{"replay_window_seconds":2,"reaper_threshold_seconds":3,"lease_seconds_max":60}`
			status, problem, _ := c.call(t, http.MethodPost, "/v1/admin/tenants", op, `{"id":"acme",`+bad+`}`)
			require.Equal(t, http.StatusBadRequest, status, "create with reaper_threshold_seconds < lease_seconds_max: %v", problem)
			require.Equal(t, "invalid_request", problem["code"])
			require.Equal(t, []string{"settings.reaper_threshold_seconds"}, fieldNames(problem))

			ok := `"settings":{"replay_window_seconds":2,"reaper_threshold_seconds":60,"lease_seconds_default":1,"lease_seconds_max":60}`
			status, body, _ := c.call(t, http.MethodPost, "/v1/admin/tenants", op, `{"id":"acme",`+ok+`}`)
			require.Equal(t, http.StatusCreated, status, "%v", body)
			status, problem, _ = c.call(t, http.MethodPatch, "/v1/admin/tenants/acme", op, `{"settings":{"reaper_threshold_seconds":3}}`)
			require.Equal(t, http.StatusBadRequest, status, "%v", problem)
			require.Equal(t, []string{"settings.reaper_threshold_seconds"}, fieldNames(problem))
			status, problem, _ = c.call(t, http.MethodPatch, "/v1/tenant", ts.Token(t, "acme", "tenant:admin"), `{"settings":{"lease_seconds_max":600}}`)
			require.Equal(t, http.StatusBadRequest, status, "raising lease_seconds_max above the threshold: %v", problem)
			require.Equal(t, []string{"settings.reaper_threshold_seconds"}, fieldNames(problem))

			tok := ts.Token(t, "acme", "keys:write")
			claim := `{"operation":"POST /v1/payments","request":{"amount":1000},"lease_seconds":60}`
			status, first, _ := c.call(t, http.MethodPost, "/v1/keys/pay-1/claim", tok, claim)
			require.Equal(t, http.StatusCreated, status, "%v", first)
			token := first["fencing_token"]

			// The purge time has come; the lease has 60 s to run.
			ageRecords(t, ts, "acme")
			c.waitReaperPasses(t, 2)
			status, retry, hdr := c.call(t, http.MethodPost, "/v1/keys/pay-1/claim", tok, claim)
			require.Equal(t, http.StatusConflict, status, "the reaper deleted a key whose lease still runs: the retry got %v", retry)
			require.Equal(t, "request_in_flight", retry["code"])
			require.NotEmpty(t, hdr.Get("Retry-After"))

			// A checkpoint renews the lease; the record stays through more passes.
			status, cp, _ := c.call(t, http.MethodPost, "/v1/keys/pay-1/checkpoint", tok,
				fmt.Sprintf(`{"fencing_token":%v,"recovery_point":"charged","lease_seconds":60}`, token))
			require.Equal(t, http.StatusOK, status, "%v", cp)
			ageRecords(t, ts, "acme")
			c.waitReaperPasses(t, 2)
			status, done, _ := c.call(t, http.MethodPost, "/v1/keys/pay-1/complete", tok,
				fmt.Sprintf(`{"fencing_token":%v,"response":{"status":201,"body":"{\"id\":\"ord_1\"}"}}`, token))
			require.Equal(t, http.StatusOK, status, "the first worker's complete was lost: %v", done)
			status, replay, _ := c.call(t, http.MethodPost, "/v1/keys/pay-1/claim", tok, claim)
			require.Equal(t, http.StatusOK, status, "%v", replay)
			require.Equal(t, "completed", replay["state"])
			require.EqualValues(t, 1, replay["attempt"], "the work ran once")

			// An orphan (lease of 1 s run out) is reaped once its purge time
			// has come, logged and counted.
			const orphans = `idem_reaper_orphans_deleted_total{tenant="acme"}`
			before := c.metric(t, orphans)
			status, body, _ = c.call(t, http.MethodPost, "/v1/keys/lost/claim", tok, `{"operation":"POST /v1/payments","lease_seconds":1}`)
			require.Equal(t, http.StatusCreated, status, "%v", body)
			read := ts.Token(t, "acme", "keys:read")
			require.Eventually(t, func() bool {
				_, rec, _ := c.call(t, http.MethodGet, "/v1/keys/lost", read, "")
				return rec["state"] == "orphaned"
			}, 10*time.Second, 50*time.Millisecond)
			ageRecords(t, ts, "acme")
			require.Eventually(t, func() bool { return c.metric(t, orphans) == before+1 }, 20*time.Second, 50*time.Millisecond,
				"the reaped orphan was not counted")
			require.Contains(t, logs.String(), `"msg":"reaper deleted orphan"`)
			require.Contains(t, logs.String(), `"key":"lost"`)
			require.NotContains(t, logs.String(), `"key":"pay-1"`, "only orphans are logged one by one")
			status, _, _ = c.call(t, http.MethodGet, "/v1/keys/lost", read, "")
			require.Equal(t, http.StatusNotFound, status)
			status, _, _ = c.call(t, http.MethodGet, "/v1/keys/pay-1", read, "")
			require.Equal(t, http.StatusNotFound, status, "the completed record past its purge time goes too")
		})
	}
}

// TestDisableKeepsRecordsDeletePurges: disabling a tenant refuses its
// tokens (403) and keeps every record through reaper passes; re-enabled, its
// completed requests replay (200, attempt 1) instead of running again.
// Deleting it removes the tenant and its records (404 afterwards, problem+json
// on an unknown id) and leaves other tenants alone.
func TestDisableKeepsRecordsDeletePurges(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{servertest.BackendSQLite, servertest.BackendPostgres} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			ts := servertest.Start(t, servertest.Options{Backend: backend, ReapInterval: 20 * time.Millisecond, Tenants: []string{"acme", "other"}})
			c := newAPIClient(t, ts)
			op := ts.Token(t, "", "admin")
			tok := ts.Token(t, "acme", "keys:write")
			otherTok := ts.Token(t, "other", "keys:write")

			claim := func(token, key string) (int, map[string]any) {
				status, body, _ := c.call(t, http.MethodPost, "/v1/keys/"+key+"/claim", token, `{"operation":"POST /v1/orders","request":{"key":"`+key+`"}}`)
				return status, body
			}
			complete := func(token, key string, rec map[string]any) {
				status, body, _ := c.call(t, http.MethodPost, "/v1/keys/"+key+"/complete", token,
					fmt.Sprintf(`{"fencing_token":%v,"response":{"status":201,"body":"{\"order\":\"%s\"}"}}`, rec["fencing_token"], key))
				require.Equal(t, http.StatusOK, status, "%v", body)
			}
			keys := []string{"order-1", "order-2", "order-3"}
			for _, k := range keys {
				status, rec := claim(tok, k)
				require.Equal(t, http.StatusCreated, status, "%v", rec)
				complete(tok, k, rec)
			}
			status, inflight := claim(tok, "order-4")
			require.Equal(t, http.StatusCreated, status, "%v", inflight)
			status, rec := claim(otherTok, "order-1")
			require.Equal(t, http.StatusCreated, status, "%v", rec)
			complete(otherTok, "order-1", rec)

			status, body, _ := c.call(t, http.MethodPatch, "/v1/admin/tenants/acme", op, `{"disabled":true}`)
			require.Equal(t, http.StatusOK, status, "%v", body)
			require.Equal(t, true, body["disabled"])
			status, problem := claim(tok, "order-1")
			require.Equal(t, http.StatusForbidden, status, "%v", problem)
			require.Equal(t, "tenant_unknown", problem["code"])
			c.waitReaperPasses(t, 3)

			status, body, _ = c.call(t, http.MethodPatch, "/v1/admin/tenants/acme", op, `{"disabled":false}`)
			require.Equal(t, http.StatusOK, status, "%v", body)
			replayed := 0
			for _, k := range keys {
				status, rec := claim(tok, k)
				require.Equal(t, http.StatusOK, status, "%s ran again after the tenant was re-enabled: %v", k, rec)
				require.EqualValues(t, 1, rec["attempt"])
				resp, _ := rec["response"].(map[string]any)
				require.Equal(t, `{"order":"`+k+`"}`, resp["body"])
				replayed++
			}
			require.Equal(t, len(keys), replayed)
			status, rec = claim(tok, "order-4")
			require.Equal(t, http.StatusConflict, status, "the in-flight key kept its lease: %v", rec)
			status, body, _ = c.call(t, http.MethodPost, "/v1/keys/order-4/complete", tok,
				fmt.Sprintf(`{"fencing_token":%v,"response":{"status":201,"body":"{}"}}`, inflight["fencing_token"]))
			require.Equal(t, http.StatusOK, status, "the in-flight key kept its fencing token: %v", body)

			// DELETE removes the tenant and all of its records.
			status, body, _ = c.call(t, http.MethodDelete, "/v1/admin/tenants/acme", op, "")
			require.Equal(t, http.StatusNoContent, status, "%v", body)
			status, problem, hdr := c.call(t, http.MethodGet, "/v1/admin/tenants/acme", op, "")
			require.Equal(t, http.StatusNotFound, status, "%v", problem)
			require.Equal(t, "tenant_not_found", problem["code"])
			require.Equal(t, "application/problem+json", hdr.Get("Content-Type"))
			status, problem, hdr = c.call(t, http.MethodDelete, "/v1/admin/tenants/acme", op, "")
			require.Equal(t, http.StatusNotFound, status, "%v", problem)
			require.Equal(t, "tenant_not_found", problem["code"])
			require.Equal(t, "application/problem+json", hdr.Get("Content-Type"))
			status, problem = claim(tok, "order-1")
			require.Equal(t, http.StatusForbidden, status, "%v", problem)

			// The other tenant keeps its record.
			status, rec = claim(otherTok, "order-1")
			require.Equal(t, http.StatusOK, status, "%v", rec)

			// The id may be created again, as a new, empty tenant.
			status, body, _ = c.call(t, http.MethodPost, "/v1/admin/tenants", op, `{"id":"acme"}`)
			require.Equal(t, http.StatusCreated, status, "%v", body)
			status, rec = claim(tok, "order-1")
			require.Equal(t, http.StatusCreated, status, "%v", rec)
			require.EqualValues(t, 1, rec["attempt"])
		})
	}
}

// TestLostClaimAnswerRecovered: a claim sent again with its attempt_id
// while its lease runs gets the same attempt back (201, same fencing token,
// attempt 1) instead of 409; another or no attempt_id gets 409; an invalid
// attempt_id is 400 naming the field; after the lease ran out the same
// attempt_id takes over with a new token.
func TestLostClaimAnswerRecovered(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{servertest.BackendSQLite, servertest.BackendPostgres} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			ts := servertest.Start(t, servertest.Options{Backend: backend, Tenants: []string{"acme"}})
			c := newAPIClient(t, ts)
			tok := ts.Token(t, "acme", "keys:write")
			claim := func(attemptID string, lease int) (int, map[string]any) {
				body := fmt.Sprintf(`{"operation":"POST /v1/payments","request":{"amount":1000},"lease_seconds":%d`, lease)
				if attemptID != "" {
					body += `,"attempt_id":"` + attemptID + `"`
				}
				status, out, _ := c.call(t, http.MethodPost, "/v1/keys/pay-1/claim", tok, body+"}")
				return status, out
			}

			status, first := claim("6f1c2a9e-3b7d-4e0a-9c1f-2d8b5e7a4c10", 1)
			require.Equal(t, http.StatusCreated, status, "%v", first)
			// The answer was lost; the client sends the same claim again.
			status, again := claim("6f1c2a9e-3b7d-4e0a-9c1f-2d8b5e7a4c10", 1)
			require.Equal(t, http.StatusCreated, status, "the lost claim was not recovered: %v", again)
			require.Equal(t, first["fencing_token"], again["fencing_token"])
			require.EqualValues(t, 1, again["attempt"])
			require.Equal(t, false, again["resumed"])
			require.NotEmpty(t, again["lease_expires_at"], "the recovered lease, renewed from now")

			status, problem := claim("another-attempt", 1)
			require.Equal(t, http.StatusConflict, status, "%v", problem)
			require.Equal(t, "request_in_flight", problem["code"])
			status, problem = claim("", 1)
			require.Equal(t, http.StatusConflict, status, "%v", problem)
			for _, bad := range []string{`has space`, strings.Repeat("a", 65)} {
				status, problem = claim(bad, 1)
				require.Equal(t, http.StatusBadRequest, status, "%q: %v", bad, problem)
				require.Equal(t, []string{"attempt_id"}, fieldNames(problem))
			}

			// Past the 1 s lease the same attempt id takes over.
			read := ts.Token(t, "acme", "keys:read")
			require.Eventually(t, func() bool {
				_, rec, _ := c.call(t, http.MethodGet, "/v1/keys/pay-1", read, "")
				return rec["state"] == "orphaned"
			}, 10*time.Second, 50*time.Millisecond)
			status, taken := claim("6f1c2a9e-3b7d-4e0a-9c1f-2d8b5e7a4c10", 30)
			require.Equal(t, http.StatusCreated, status, "%v", taken)
			require.Greater(t, taken["fencing_token"], first["fencing_token"])
			require.EqualValues(t, 2, taken["attempt"])
			require.Equal(t, true, taken["resumed"])
			status, again = claim("6f1c2a9e-3b7d-4e0a-9c1f-2d8b5e7a4c10", 30)
			require.Equal(t, http.StatusCreated, status, "%v", again)
			require.Equal(t, taken["fencing_token"], again["fencing_token"])
			require.Equal(t, true, again["resumed"], "the recovered takeover answers as the takeover did")
			status, done, _ := c.call(t, http.MethodPost, "/v1/keys/pay-1/complete", tok,
				fmt.Sprintf(`{"fencing_token":%v,"response":{"status":201,"body":"{}"}}`, first["fencing_token"]))
			require.Equal(t, http.StatusConflict, status, "the first token is fenced off: %v", done)
			require.Equal(t, "lease_lost", done["code"])
		})
	}
}

// TestSuspendedTenantFinishesClaimedWork: a tenant suspended (disabled)
// while its workers hold claims refuses new claims and reads, but still
// takes the token-guarded writes that finish the work already under way:
// a checkpoint, a complete and a release of claims made before the
// suspension. Before, they were 403 tenant_unknown: the worker had done
// the work and could not store its response, and once the tenant was
// re-enabled and the lease had run out the retry took the key over and
// ran the request a second time.
func TestSuspendedTenantFinishesClaimedWork(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{servertest.BackendSQLite, servertest.BackendPostgres} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			ts := servertest.Start(t, servertest.Options{Backend: backend, Tenants: []string{"acme"}})
			c := newAPIClient(t, ts)
			op := ts.Token(t, "", "admin")
			tok := ts.Token(t, "acme", "keys:write", "keys:read")
			claim := func(key string) (int, map[string]any) {
				status, body, _ := c.call(t, http.MethodPost, "/v1/keys/"+key+"/claim", tok, `{"operation":"POST /v1/orders","request":{"key":"`+key+`"}}`)
				return status, body
			}
			status, done := claim("order-1")
			require.Equal(t, http.StatusCreated, status, "%v", done)
			status, dropped := claim("order-2")
			require.Equal(t, http.StatusCreated, status, "%v", dropped)

			status, body, _ := c.call(t, http.MethodPatch, "/v1/admin/tenants/acme", op, `{"disabled":true}`)
			require.Equal(t, http.StatusOK, status, "%v", body)
			status, problem := claim("order-3")
			require.Equal(t, http.StatusForbidden, status, "a suspended tenant takes no new claim: %v", problem)
			require.Equal(t, "tenant_unknown", problem["code"])
			status, problem, _ = c.call(t, http.MethodGet, "/v1/keys/order-1", tok, "")
			require.Equal(t, http.StatusForbidden, status, "nor reads: %v", problem)

			status, body, _ = c.call(t, http.MethodPost, "/v1/keys/order-1/checkpoint", tok,
				fmt.Sprintf(`{"fencing_token":%v,"recovery_point":"charged"}`, done["fencing_token"]))
			require.Equal(t, http.StatusOK, status, "the worker's checkpoint is taken: %v", body)
			status, body, _ = c.call(t, http.MethodPost, "/v1/keys/order-1/complete", tok,
				fmt.Sprintf(`{"fencing_token":%v,"response":{"status":201,"body":"{\"order\":1}"}}`, done["fencing_token"]))
			require.Equal(t, http.StatusOK, status, "the worker's response is stored: %v", body)
			status, body, _ = c.call(t, http.MethodPost, "/v1/keys/order-2/release", tok,
				fmt.Sprintf(`{"fencing_token":%v}`, dropped["fencing_token"]))
			require.Equal(t, http.StatusNoContent, status, "the worker's release is taken: %v", body)
			status, problem, _ = c.call(t, http.MethodPost, "/v1/keys/order-3/complete", tok, `{"fencing_token":1,"response":{"status":201}}`)
			require.Equal(t, http.StatusNotFound, status, "a write finishes only a claim that exists: %v", problem)

			status, body, _ = c.call(t, http.MethodPatch, "/v1/admin/tenants/acme", op, `{"disabled":false}`)
			require.Equal(t, http.StatusOK, status, "%v", body)
			status, rec := claim("order-1")
			require.Equal(t, http.StatusOK, status, "order-1 ran again after the suspension: %v", rec)
			require.EqualValues(t, 1, rec["attempt"])
			resp, _ := rec["response"].(map[string]any)
			require.Equal(t, `{"order":1}`, resp["body"])
			status, rec = claim("order-2")
			require.Equal(t, http.StatusCreated, status, "the released key starts afresh: %v", rec)
		})
	}
}

// TestLoweredResponseLimitKeepsClaimsInFlight: a tenant lowers its
// max_response_bytes while a worker holds a claim. The worker's response,
// within the limit in force when it claimed, is still stored (and so is
// its checkpoint data); a claim made after the change is held to the new
// limit. Before, the complete was 413 payload_too_large: the work was done
// and its response could not be stored, so once the lease ran out the
// retry took the key over and ran the request a second time.
func TestLoweredResponseLimitKeepsClaimsInFlight(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{servertest.BackendSQLite, servertest.BackendPostgres} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			ts := servertest.Start(t, servertest.Options{Backend: backend, Tenants: []string{"acme"}})
			c := newAPIClient(t, ts)
			op := ts.Token(t, "", "admin")
			tok := ts.Token(t, "acme", "keys:write", "keys:read")
			claim := func(key string) (int, map[string]any) {
				status, body, _ := c.call(t, http.MethodPost, "/v1/keys/"+key+"/claim", tok, `{"operation":"POST /v1/orders","request":{"key":"`+key+`"}}`)
				return status, body
			}
			big := strings.Repeat("x", 2000)
			status, before := claim("order-1")
			require.Equal(t, http.StatusCreated, status, "%v", before)

			status, body, _ := c.call(t, http.MethodPatch, "/v1/admin/tenants/acme", op, `{"settings":{"max_response_bytes":1024}}`)
			require.Equal(t, http.StatusOK, status, "%v", body)
			status, after := claim("order-2")
			require.Equal(t, http.StatusCreated, status, "%v", after)

			status, body, _ = c.call(t, http.MethodPost, "/v1/keys/order-1/checkpoint", tok,
				fmt.Sprintf(`{"fencing_token":%v,"recovery_point":"charged","data":{"note":%q}}`, before["fencing_token"], big))
			require.Equal(t, http.StatusOK, status, "checkpoint data within the limit it claimed under: %v", body)
			status, body, _ = c.call(t, http.MethodPost, "/v1/keys/order-1/complete", tok,
				fmt.Sprintf(`{"fencing_token":%v,"response":{"status":201,"body":%q}}`, before["fencing_token"], big))
			require.Equal(t, http.StatusOK, status, "a response within the limit it claimed under is stored: %v", body)
			status, rec := claim("order-1")
			require.Equal(t, http.StatusOK, status, "order-1 ran again: %v", rec)
			resp, _ := rec["response"].(map[string]any)
			require.Equal(t, big, resp["body"])

			status, problem, _ := c.call(t, http.MethodPost, "/v1/keys/order-2/complete", tok,
				fmt.Sprintf(`{"fencing_token":%v,"response":{"status":201,"body":%q}}`, after["fencing_token"], big))
			require.Equal(t, http.StatusRequestEntityTooLarge, status, "a claim made after the change has the new limit: %v", problem)
			require.Equal(t, "payload_too_large", problem["code"])
			status, problem, _ = c.call(t, http.MethodPost, "/v1/keys/order-2/checkpoint", tok,
				fmt.Sprintf(`{"fencing_token":%v,"recovery_point":"charged","data":{"note":%q}}`, after["fencing_token"], big))
			require.Equal(t, http.StatusRequestEntityTooLarge, status, "%v", problem)
			status, problem, _ = c.call(t, http.MethodPost, "/v1/keys/order-9/complete", tok, fmt.Sprintf(`{"fencing_token":1,"response":{"status":201,"body":%q}}`, big))
			require.Equal(t, http.StatusRequestEntityTooLarge, status, "an unknown key is refused for its size first, as before: %v", problem)
		})
	}
}

// TestLoweredLeaseMaxKeepsClaimsInFlight: a tenant lowers its
// lease_seconds_max while a worker holds a claim with a longer lease. The
// worker's checkpoints, renewing the lease it claimed with, are still
// taken; a claim made after the change is held to the new maximum. Before,
// the checkpoint was 400 invalid_request: the worker could no longer renew
// its lease, and once it ran out a retry took the key over while the
// worker was still at it.
func TestLoweredLeaseMaxKeepsClaimsInFlight(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{servertest.BackendSQLite, servertest.BackendPostgres} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			ts := servertest.Start(t, servertest.Options{Backend: backend, Tenants: []string{"acme"}})
			c := newAPIClient(t, ts)
			op := ts.Token(t, "", "admin")
			tok := ts.Token(t, "acme", "keys:write", "keys:read")
			claim := func(key string, lease int) (int, map[string]any) {
				status, body, _ := c.call(t, http.MethodPost, "/v1/keys/"+key+"/claim", tok,
					fmt.Sprintf(`{"operation":"POST /v1/orders","request":{"key":%q},"lease_seconds":%d}`, key, lease))
				return status, body
			}
			checkpoint := func(key string, rec map[string]any, lease int) (int, map[string]any) {
				status, body, _ := c.call(t, http.MethodPost, "/v1/keys/"+key+"/checkpoint", tok,
					fmt.Sprintf(`{"fencing_token":%v,"recovery_point":"charged","lease_seconds":%d}`, rec["fencing_token"], lease))
				return status, body
			}
			status, before := claim("order-1", 600)
			require.Equal(t, http.StatusCreated, status, "%v", before)

			status, body, _ := c.call(t, http.MethodPatch, "/v1/admin/tenants/acme", op, `{"settings":{"lease_seconds_max":300}}`)
			require.Equal(t, http.StatusOK, status, "%v", body)
			status, problem := claim("order-2", 600)
			require.Equal(t, http.StatusBadRequest, status, "a new claim has the new maximum: %v", problem)
			status, after := claim("order-2", 300)
			require.Equal(t, http.StatusCreated, status, "%v", after)

			status, body = checkpoint("order-1", before, 600)
			require.Equal(t, http.StatusOK, status, "the worker renews the lease it claimed with: %v", body)
			status, problem = checkpoint("order-2", after, 600)
			require.Equal(t, http.StatusBadRequest, status, "a claim made after the change has the new maximum: %v", problem)
			require.Equal(t, "invalid_request", problem["code"])
			status, problem = checkpoint("order-9", after, 600)
			require.Equal(t, http.StatusBadRequest, status, "an unknown key is refused for its lease first, as before: %v", problem)
		})
	}
}
