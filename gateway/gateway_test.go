package gateway_test

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/client/frontdoor"
	"github.com/idem-dev/idem/conformance"
	"github.com/idem-dev/idem/gateway"
	"github.com/idem-dev/idem/keyevents"
	"github.com/idem-dev/idem/server"
	"github.com/idem-dev/idem/testkit/servertest"
	"github.com/idem-dev/idem/testvectors"
)

const tenant = "gw"

// rig is a gateway in front of a conformance.Upstream, on a real idem
// server's store (the API shows the gateway's records).
type rig struct {
	idem     *servertest.Server
	upstream *conformance.Upstream
	upURL    string
	gw       *gateway.Gateway
	url      string
	reg      *prometheus.Registry
	config   string
	waiters  *keyevents.Waiters
}

func newRig(t *testing.T, backend, config string, mutate ...func(*gateway.Options)) *rig {
	t.Helper()
	return newRigOn(t, servertest.Options{Backend: backend}, config, mutate...)
}

// newRigOn is newRig on a server started with sopts (its tenant added).
func newRigOn(t *testing.T, sopts servertest.Options, config string, mutate ...func(*gateway.Options)) *rig {
	t.Helper()
	sopts.Tenants = append(sopts.Tenants, tenant)
	r := &rig{idem: servertest.Start(t, sopts)}
	r.upstream = conformance.NewUpstream()
	up := httptest.NewServer(r.upstream)
	t.Cleanup(up.Close)
	r.upURL = up.URL
	r.config = filepath.Join(t.TempDir(), "gateway.yaml")
	require.NoError(t, os.WriteFile(r.config, []byte(config), 0o600))
	r.reg = prometheus.NewRegistry()
	r.waiters = keyevents.NewWaiters(r.idem.Server().KeyEvents(), 100)
	t.Cleanup(r.waiters.Close)
	opts := gateway.Options{Store: r.idem.Store(), Tenant: tenant, Upstream: up.URL, ConfigFile: r.config, Registerer: r.reg, StoreTimeout: 2 * time.Second, Waiters: r.waiters}
	for _, m := range mutate {
		m(&opts)
	}
	g, err := gateway.New(opts)
	require.NoError(t, err)
	r.gw = g
	srv := httptest.NewServer(g)
	t.Cleanup(srv.Close)
	r.url = srv.URL
	return r
}

type reply struct {
	status int
	header http.Header
	body   string
}

func (r reply) code(t *testing.T) string {
	t.Helper()
	require.Equal(t, "application/problem+json", r.header.Get("Content-Type"), "body %s", r.body)
	var p struct {
		Code string `json:"code"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.body), &p))
	return p.Code
}

func send(t *testing.T, method, url, key, body string, header ...string) reply {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(frontdoor.HeaderKey, key)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := noRedirects.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return reply{resp.StatusCode, resp.Header, string(b)}
}

// noRedirects is the client of send: the gateway's answer is what a test
// asserts, a 3xx included, not the page it points to.
var noRedirects = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

func forEachBackend(t *testing.T, test func(t *testing.T, backend string)) {
	for _, b := range []string{servertest.BackendSQLite, servertest.BackendPostgres} {
		t.Run(b, func(t *testing.T) {
			t.Parallel()
			test(t, b)
		})
	}
}

// TestFingerprintExclusionKeepsTheIJSONRule: a volatile field excluded by
// the route's rules does not change the fingerprint, and cutting it out
// does not hide a duplicate member name elsewhere in the body.
func TestFingerprintExclusionKeepsTheIJSONRule(t *testing.T) {
	t.Parallel()
	r := newRig(t, servertest.BackendSQLite, "routes:\n  - path: /orders/{id}\n    fingerprint:\n      exclude: [/ts]\n")
	first := send(t, http.MethodPost, r.url+"/orders/7", "ex-1", `{"sku":"A","ts":1}`)
	require.Equal(t, http.StatusCreated, first.status, first.body)
	again := send(t, http.MethodPost, r.url+"/orders/7", "ex-1", `{"ts":2,"sku":"A"}`)
	require.Equal(t, "true", again.header.Get(frontdoor.HeaderReplayed), again.body)
	dup := send(t, http.MethodPost, r.url+"/orders/7", "ex-2", `{"sku":"A","ts":1,"sku":"B"}`)
	require.Equal(t, http.StatusBadRequest, dup.status, dup.body)
	require.Equal(t, "invalid_request", dup.code(t))
	require.Equal(t, int64(1), r.upstream.Count())
}

func TestRequestBodyOverTheLimit(t *testing.T) {
	t.Parallel()
	r := newRig(t, servertest.BackendSQLite, "routes:\n  - path: /orders/{id}\n    max_body_bytes: 16\n")
	big := send(t, http.MethodPost, r.url+"/orders/7", "big-1", `{"sku":"AAAAAAAAAAAAAAAAAAAA"}`)
	require.Equal(t, http.StatusRequestEntityTooLarge, big.status, big.body)
	require.Equal(t, "payload_too_large", big.code(t))
	require.Equal(t, int64(0), r.upstream.Count())
}

func TestReplayMismatchAndOrdinaryRecords(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		r := newRig(t, backend, "routes:\n  - path: /orders/{id}\n")
		first := send(t, http.MethodPost, r.url+"/orders/7?x=1", `"order-1"`, `{"sku":"A","qty":1}`)
		require.Equal(t, http.StatusCreated, first.status, first.body)
		require.Empty(t, first.header.Get(frontdoor.HeaderReplayed))
		require.Equal(t, "session=order-1", first.header.Get("Set-Cookie"), "the first answer is the upstream's own")

		again := send(t, http.MethodPost, r.url+"/orders/7?x=1", `order-1`, `{ "qty": 1.0, "sku": "A" }`)
		require.Equal(t, http.StatusCreated, again.status)
		require.Equal(t, "true", again.header.Get(frontdoor.HeaderReplayed), "bare and quoted key are one key; JSON compared canonically")
		require.Equal(t, first.body, again.body)
		require.Equal(t, "/orders/1", again.header.Get("Location"))
		require.Equal(t, `"order-1"`, again.header.Get("ETag"))
		require.Empty(t, again.header.Get("Set-Cookie"), "Set-Cookie is never stored")
		require.Equal(t, int64(1), r.upstream.Count())

		mismatch := send(t, http.MethodPost, r.url+"/orders/7?x=2", "order-1", `{"sku":"A","qty":1}`)
		require.Equal(t, http.StatusUnprocessableEntity, mismatch.status)
		require.Equal(t, "fingerprint_mismatch", mismatch.code(t))
		require.Equal(t, "urn:idem:problem:fingerprint_mismatch", decode(t, mismatch.body)["type"])
		otherPath := send(t, http.MethodPost, r.url+"/orders/8?x=1", "order-1", `{"sku":"A","qty":1}`)
		require.Equal(t, http.StatusUnprocessableEntity, otherPath.status, "the path is fingerprinted: /orders/8 is not /orders/7")
		require.Equal(t, "fingerprint_mismatch", otherPath.code(t))

		missing := send(t, http.MethodPost, r.url+"/orders/7", "", `{}`)
		require.Equal(t, http.StatusBadRequest, missing.status)
		require.Equal(t, "idempotency_key_missing", missing.code(t))
		list := send(t, http.MethodPost, r.url+"/orders/7", "a, b", `{}`)
		require.Equal(t, "invalid_key", list.code(t))
		for i, body := range []string{`{"a":1,"a":2}`, `{"t":"\udc00"}`, "{\"t\":\"\xff\"}", `{"n":1e400}`, `{"a":`} {
			bad := send(t, http.MethodPost, r.url+"/orders/7", fmt.Sprintf("k-bad-%d", i), body)
			require.Equal(t, http.StatusBadRequest, bad.status, body)
			require.Equal(t, "invalid_request", bad.code(t), body)
		}
		require.Equal(t, int64(1), r.upstream.Count(), "refusals never reach the upstream")

		get := send(t, http.MethodGet, r.url+"/count", "", "")
		require.Equal(t, http.StatusOK, get.status)
		require.JSONEq(t, `{"count":1}`, get.body, "safe methods pass through")
		put := send(t, http.MethodPut, r.url+"/orders/9", "", `{}`)
		require.Equal(t, http.StatusCreated, put.status, "PUT without a key passes through")
		require.Equal(t, int64(2), r.upstream.Count())

		// The record is an ordinary record of the tenant: the API shows it
		// under the header's key, with operation METHOD + route pattern.
		rec := r.apiRecord(t, "order-1")
		require.Equal(t, "completed", rec["state"])
		require.Equal(t, "POST /orders/{id}", rec["operation"])
		resp := rec["response"].(map[string]any)
		require.Equal(t, float64(201), resp["status"])
		require.Equal(t, first.body, resp["body"])

		require.Equal(t, 1.0, testutil.ToFloat64(metric(t, r, "/orders/{id}", "replayed", "2xx")))
		require.Equal(t, 1.0, testutil.ToFloat64(metric(t, r, "/orders/{id}", "executed", "2xx")))
	})
}

func metric(t *testing.T, r *rig, route, outcome, status string) prometheus.Collector {
	t.Helper()
	mfs, err := r.reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "idem_gateway_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["route"] == route && labels["outcome"] == outcome && labels["status"] == status {
				return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "x", Help: "x"}, func() float64 { return m.GetCounter().GetValue() })
			}
		}
	}
	t.Fatalf("no idem_gateway_requests_total{route=%q,outcome=%q,status=%q}", route, outcome, status)
	return nil
}

func decode(t *testing.T, s string) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(s), &m))
	return m
}

func (r *rig) apiRecord(t *testing.T, key string) map[string]any {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, r.idem.URL()+"/v1/keys/"+key, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+r.idem.Token(t, tenant, "keys:read"))
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
	return decode(t, string(b))
}

// TestConcurrentDuplicates sends one request many times at once while the
// upstream holds the first: exactly one upstream call, and every caller
// (retrying on 409 as told) gets the same stored response.
func TestConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		r := newRig(t, backend, "")
		release := r.upstream.Hold()
		const callers = 10
		bodies := make([]string, callers)
		conflicts := make(chan struct{}, 1000)
		var wg sync.WaitGroup
		for i := range callers {
			wg.Go(func() {
				for range 200 {
					rep := send(t, http.MethodPost, r.url+"/orders", "dup-1", `{"sku":"Z"}`)
					if rep.status == http.StatusConflict {
						assert.Equal(t, "request_in_flight", rep.code(t))
						assert.NotEmpty(t, rep.header.Get("Retry-After"))
						conflicts <- struct{}{}
						time.Sleep(10 * time.Millisecond)
						continue
					}
					assert.Equal(t, http.StatusCreated, rep.status)
					bodies[i] = rep.body
					return
				}
			})
		}
		require.Eventually(t, func() bool { return r.upstream.Entered() == 1 && len(conflicts) >= callers-1 }, 10*time.Second, 5*time.Millisecond)
		// Prefer: wait=N holds the request until the first one completes,
		// then replays its response; the upstream still runs once.
		waited := make(chan reply, 1)
		go func() {
			waited <- send(t, http.MethodPost, r.url+"/orders", "dup-1", `{"sku":"Z"}`, "Prefer", "wait=10")
		}()
		require.Eventually(t, func() bool { return r.waiters.Waiting() == 1 }, 10*time.Second, 2*time.Millisecond)
		release()
		wg.Wait()
		w := <-waited
		require.Equal(t, http.StatusCreated, w.status, w.body)
		require.Equal(t, "true", w.header.Get(frontdoor.HeaderReplayed))
		require.Equal(t, "wait=10", w.header.Get("Preference-Applied"))
		require.Equal(t, bodies[0], w.body)
		require.Equal(t, int64(1), r.upstream.Count(), "one upstream call")
		for i := range callers {
			require.Equal(t, bodies[0], bodies[i], "caller %d", i)
		}
		require.Contains(t, bodies[0], `"order":1`)
	})
}

// TestStoreDownFailsClosed: the gateway's store is closed (as if the
// database went away); a protected request gets 503 store_unavailable with
// Retry-After and the upstream is not called. A route with fail_open passes
// it through unprotected.
func TestStoreDownFailsClosed(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		idemSrv := servertest.Start(t, servertest.Options{Backend: backend, Tenants: []string{tenant}})
		cfg := idemSrv.Config()
		store, err := server.OpenStore(context.Background(), cfg)
		require.NoError(t, err)
		up := conformance.NewUpstream()
		upSrv := httptest.NewServer(up)
		t.Cleanup(upSrv.Close)
		file := filepath.Join(t.TempDir(), "gw.yaml")
		require.NoError(t, os.WriteFile(file, []byte("routes:\n  - path: /orders/open\n    fail_open: true\n"), 0o600))
		g, err := gateway.New(gateway.Options{Store: store, Tenant: tenant, Upstream: upSrv.URL, ConfigFile: file, StoreTimeout: time.Second})
		require.NoError(t, err)
		gw := httptest.NewServer(g)
		t.Cleanup(gw.Close)
		require.Equal(t, http.StatusCreated, send(t, http.MethodPost, gw.URL+"/orders", "up-1", `{}`).status)
		require.NoError(t, store.Close())

		down := send(t, http.MethodPost, gw.URL+"/orders", "down-1", `{}`)
		require.Equal(t, http.StatusServiceUnavailable, down.status, down.body)
		require.Equal(t, "store_unavailable", down.code(t))
		require.Equal(t, true, decode(t, down.body)["retryable"])
		require.NotEmpty(t, down.header.Get("Retry-After"))
		require.Equal(t, int64(1), up.Count(), "the upstream was not called")

		open := send(t, http.MethodPost, gw.URL+"/orders/open", "down-2", `{}`)
		require.Equal(t, http.StatusCreated, open.status, "fail_open passes the request through")
		require.Equal(t, int64(2), up.Count())
	})
}

// TestUpstreamFailuresReleaseTheKey: an unreachable upstream (the request
// never sent) gives 502 and releases the key, so the retry runs. A slow
// one gives 504: the upstream has the request and may act on it, so by
// default the 504 is stored like a 5xx and the retry gets it replayed,
// the upstream not called again; with store_5xx false the key is released
// and the retry runs. (Before, every 504 released the key: the retry ran
// the request a second time while the first might have done its work.)
func TestUpstreamFailuresReleaseTheKey(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		dead := "http://" + ln.Addr().String()
		require.NoError(t, ln.Close())
		r := newRig(t, backend, fmt.Sprintf("upstreams:\n  dead: %s\nroutes:\n  - path: /dead/\n    upstream: dead\n  - path: /orders/slow\n    timeout: 300ms\n    store_5xx: false\n  - path: /orders/slow-stored\n    timeout: 300ms\n", dead))

		unreachable := send(t, http.MethodPost, r.url+"/dead/x", "u-1", `{}`)
		require.Equal(t, http.StatusBadGateway, unreachable.status)
		require.Equal(t, "upstream_unavailable", unreachable.code(t))
		require.Equal(t, idem.ErrKeyNotFound.Code, r.getRecordErr(t, "u-1"), "the key was released")

		release := r.upstream.Hold()
		slow := send(t, http.MethodPost, r.url+"/orders/slow", "s-1", `{}`)
		require.Equal(t, http.StatusGatewayTimeout, slow.status)
		require.Equal(t, "upstream_timeout", slow.code(t))
		release()
		require.Equal(t, idem.ErrKeyNotFound.Code, r.getRecordErr(t, "s-1"))
		require.Eventually(t, func() bool { return r.upstream.Count() == 1 }, 5*time.Second, 5*time.Millisecond)
		retry := send(t, http.MethodPost, r.url+"/orders/slow", "s-1", `{}`)
		require.Equal(t, http.StatusCreated, retry.status, "the retry runs")

		release = r.upstream.Hold()
		stored := send(t, http.MethodPost, r.url+"/orders/slow-stored", "s-2", `{}`)
		require.Equal(t, http.StatusGatewayTimeout, stored.status)
		require.Equal(t, "upstream_timeout", stored.code(t))
		release()
		require.Eventually(t, func() bool { return r.upstream.Count() == 3 }, 5*time.Second, 5*time.Millisecond)
		require.Equal(t, "completed", r.apiRecord(t, "s-2")["state"], "the 504 is stored")
		again := send(t, http.MethodPost, r.url+"/orders/slow-stored", "s-2", `{}`)
		require.Equal(t, http.StatusGatewayTimeout, again.status)
		require.Equal(t, "true", again.header.Get(frontdoor.HeaderReplayed))
		require.Equal(t, stored.body, again.body)
		require.Equal(t, int64(3), r.upstream.Count(), "the retry did not run the request again")
	})
}

func (r *rig) getRecordErr(t *testing.T, key string) idem.Code {
	t.Helper()
	_, err := r.idem.Store().GetRecord(context.Background(), idem.GetRecordParams{TenantID: tenant, Key: key})
	return idem.ErrorCode(err)
}

// TestLargeResponsesAndServerErrors: a response over max_stored_bytes is
// passed through and recorded without its body (a replay answers
// response_not_replayable, the upstream is not called again); a 5xx is
// stored and replayed by default and releases the key with store_5xx false.
func TestLargeResponsesAndServerErrors(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		r := newRig(t, backend, "defaults:\n  max_stored_bytes: 4096\nroutes:\n  - path: /orders/release\n    store_5xx: false\n")
		big := send(t, http.MethodPost, r.url+"/orders?size=200000", "big-1", "")
		require.Equal(t, http.StatusOK, big.status)
		require.Len(t, big.body, 200000)
		replay := send(t, http.MethodPost, r.url+"/orders?size=200000", "big-1", "")
		require.Equal(t, http.StatusConflict, replay.status)
		require.Equal(t, "response_not_replayable", replay.code(t))
		require.Equal(t, "completed", r.apiRecord(t, "big-1")["state"])
		require.Equal(t, int64(1), r.upstream.Count())

		five := send(t, http.MethodPost, r.url+"/orders?status=503", "5xx-1", `{}`)
		require.Equal(t, http.StatusServiceUnavailable, five.status)
		again := send(t, http.MethodPost, r.url+"/orders?status=503", "5xx-1", `{}`)
		require.Equal(t, "true", again.header.Get(frontdoor.HeaderReplayed), "5xx stored and replayed by default")
		require.Equal(t, five.body, again.body)
		require.Equal(t, int64(2), r.upstream.Count())

		require.Equal(t, http.StatusInternalServerError, send(t, http.MethodPost, r.url+"/orders/release?status=500", "5xx-2", `{}`).status)
		require.Equal(t, idem.ErrKeyNotFound.Code, r.getRecordErr(t, "5xx-2"), "store_5xx false released the key")
		require.Equal(t, int64(3), r.upstream.Count())

		// A 5xx over max_stored_bytes with store_5xx false is released like
		// any other 5xx (rule 5: the size of an answer that is not stored
		// does not matter), as idemhttp and the Python and Node middleware
		// do. Before, the gateway stored it as not replayable.
		require.Equal(t, http.StatusInternalServerError, send(t, http.MethodPost, r.url+"/orders/release?status=500&size=200000", "5xx-big", `{}`).status)
		require.Equal(t, idem.ErrKeyNotFound.Code, r.getRecordErr(t, "5xx-big"), "store_5xx false released the large 5xx")
		require.Equal(t, int64(4), r.upstream.Count())
	})
}

// TestStoreVectors runs the store member of
// testvectors/frontdoor/policy.json through the gateway, over loopback, on
// both stores: an upstream answering each status, on a route with
// store_5xx on (the default) and off, then the retry. "store": the retry
// is the first answer replayed; "release": the key is released and the
// retry calls the upstream again; "not_replayable" (a status outside
// 100–599, which net/http lets the upstream answer up to 999): the first
// answer is the upstream's as sent, the record is completed as
// frontdoor.Unstorable says (502, no body, only Idem-Not-Replayable) and
// the retry is 409 response_not_replayable, the upstream called once,
// whatever store_5xx says. Before, the gateway stored such a status as it
// was and replayed it (GET /v1/keys/{key} showed a status outside the
// API's 100–599), and with store_5xx false released the key: the retry
// called the upstream a second time. A status an upstream cannot send as
// its final answer over HTTP/1.1 (a 1xx is informational to the gateway's
// transport; 99 is not a three-digit status) is not run here.
func TestStoreVectors(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../testvectors/frontdoor/policy.json")
	require.NoError(t, err)
	var file struct {
		Store []struct {
			Status   int    `json:"status"`
			Store5xx bool   `json:"store_5xx"`
			Expect   string `json:"expect"`
		} `json:"store"`
	}
	require.NoError(t, json.Unmarshal(b, &file))
	seen := map[string]int{}
	for _, v := range file.Store {
		if v.Status >= 200 {
			seen[v.Expect]++
		}
	}
	require.Positive(t, seen["store"])
	require.Positive(t, seen["release"])
	require.Positive(t, seen["not_replayable"])
	forEachBackend(t, func(t *testing.T, backend string) {
		r := newRig(t, backend, "defaults:\n  max_stored_bytes: 4096\nroutes:\n  - path: /orders/release\n    store_5xx: false\n")
		for _, v := range file.Store {
			if v.Status < 200 {
				continue
			}
			name := fmt.Sprintf("status %d store_5xx %v", v.Status, v.Store5xx)
			path := "/orders?status=" + strconv.Itoa(v.Status)
			if !v.Store5xx {
				path = "/orders/release?status=" + strconv.Itoa(v.Status)
			}
			key := fmt.Sprintf("k-store-%d-%v", v.Status, v.Store5xx)
			before := r.upstream.Count()
			first := send(t, http.MethodPost, r.url+path, key, `{}`)
			require.Equal(t, v.Status, first.status, name)
			require.Empty(t, first.header.Get(frontdoor.HeaderReplayed), name)
			require.Equal(t, before+1, r.upstream.Count(), name)
			if v.Status != http.StatusNoContent {
				require.Contains(t, first.body, `"order":`, "%s: the upstream's answer as sent", name)
			}
			retry := send(t, http.MethodPost, r.url+path, key, `{}`)
			switch v.Expect {
			case "store":
				require.Equal(t, v.Status, retry.status, name)
				require.Equal(t, "true", retry.header.Get(frontdoor.HeaderReplayed), name)
				require.Equal(t, first.body, retry.body, name)
				require.Equal(t, before+1, r.upstream.Count(), "%s: the upstream called once", name)
			case "release":
				require.Equal(t, v.Status, retry.status, name)
				require.Empty(t, retry.header.Get(frontdoor.HeaderReplayed), name)
				require.Equal(t, before+2, r.upstream.Count(), "%s: the key was released, the retry called the upstream", name)
				require.Equal(t, idem.ErrKeyNotFound.Code, r.getRecordErr(t, key), name)
			case "not_replayable":
				require.Equal(t, http.StatusConflict, retry.status, "%s: %s", name, retry.body)
				require.Equal(t, string(frontdoor.CodeResponseNotReplayable), retry.code(t), name)
				require.Equal(t, before+1, r.upstream.Count(), "%s: the upstream called once", name)
				requireUnstorableRecord(t, r, key, v.Status)
			default:
				t.Fatalf("%s: unknown expectation %q", name, v.Expect)
			}
		}

		// An answer too large to store and of a status idem cannot store
		// either: sent in full, recorded as not replayable for its status.
		for i, path := range []string{"/orders?size=10000&status=799", "/orders/release?size=10000&status=799"} {
			key := fmt.Sprintf("k-large-%d", i)
			before := r.upstream.Count()
			first := send(t, http.MethodPost, r.url+path, key, `{}`)
			require.Equal(t, 799, first.status, path)
			require.Len(t, first.body, 10000, path)
			retry := send(t, http.MethodPost, r.url+path, key, `{}`)
			require.Equal(t, http.StatusConflict, retry.status, path)
			require.Equal(t, string(frontdoor.CodeResponseNotReplayable), retry.code(t), path)
			require.Equal(t, before+1, r.upstream.Count(), "%s: the upstream called once", path)
			requireUnstorableRecord(t, r, key, 799)
		}
	})
}

// requireUnstorableRecord requires key to be completed as not replayable
// for an answer of status (frontdoor.Unstorable): the API shows status 502,
// no body and only the Idem-Not-Replayable header.
func requireUnstorableRecord(t *testing.T, r *rig, key string, status int) {
	t.Helper()
	rec := r.apiRecord(t, key)
	require.Equal(t, "completed", rec["state"], key)
	resp, ok := rec["response"].(map[string]any)
	require.True(t, ok, "%s: %v", key, rec)
	require.Equal(t, float64(frontdoor.UnstorableStatus), resp["status"], key)
	wantStatus, wantHeaders := frontdoor.Unstorable(status)
	require.Equal(t, float64(wantStatus), resp["status"], key)
	headers := map[string]string{}
	for k, v := range resp["headers"].(map[string]any) {
		headers[k] = v.(string)
	}
	require.Equal(t, wantHeaders, headers, key)
	require.Empty(t, resp["body"], key)
}

// TestLeaseKeptAliveDuringLongUpstreamCalls: with a one-second lease, an
// upstream call of two seconds is not taken over by a retry.
func TestLeaseKeptAliveDuringLongUpstreamCalls(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		r := newRig(t, backend, "defaults:\n  lease: 1s\n")
		release := r.upstream.Hold()
		done := make(chan reply, 1)
		go func() { done <- send(t, http.MethodPost, r.url+"/orders", "long-1", `{}`) }()
		require.Eventually(t, func() bool { return r.upstream.Entered() == 1 }, 5*time.Second, 5*time.Millisecond)
		time.Sleep(2 * time.Second) // two leases
		retry := send(t, http.MethodPost, r.url+"/orders", "long-1", `{}`)
		require.Equal(t, http.StatusConflict, retry.status, "still in flight, not taken over")
		release()
		require.Equal(t, http.StatusCreated, (<-done).status)
		require.Equal(t, int64(1), r.upstream.Count())
		require.EqualValues(t, 1, r.apiRecord(t, "long-1")["attempt"])
	})
}

// TestScopeAndReload: a scope header prefixes the record key; a reload
// swaps the configuration while a request is in flight, and that request
// finishes with the configuration it started with.
func TestScopeAndReload(t *testing.T) {
	t.Parallel()
	r := newRig(t, servertest.BackendSQLite, "defaults:\n  scope_header: X-Account-Id\n")
	a := send(t, http.MethodPost, r.url+"/orders", "k1", `{}`, "X-Account-Id", "acct_a")
	b := send(t, http.MethodPost, r.url+"/orders", "k1", `{}`, "X-Account-Id", "acct_b")
	require.Equal(t, http.StatusCreated, a.status)
	require.Equal(t, http.StatusCreated, b.status)
	require.Empty(t, b.header.Get(frontdoor.HeaderReplayed), "another account, another key")
	require.Equal(t, "completed", r.apiRecord(t, "acct_a:k1")["state"])
	noScope := send(t, http.MethodPost, r.url+"/orders", "k1", `{}`)
	require.Equal(t, "invalid_key", noScope.code(t))

	release := r.upstream.Hold()
	done := make(chan reply, 1)
	go func() { done <- send(t, http.MethodPost, r.url+"/orders", "k2", `{}`, "X-Account-Id", "acct_a") }()
	require.Eventually(t, func() bool { return r.upstream.Entered() == 3 }, 5*time.Second, 5*time.Millisecond)
	require.NoError(t, os.WriteFile(r.config, []byte("defaults:\n  required_methods: []\n"), 0o600))
	require.NoError(t, r.gw.Reload())
	release()
	require.Equal(t, http.StatusCreated, (<-done).status, "the in-flight request was not dropped")
	require.Equal(t, "completed", r.apiRecord(t, "acct_a:k2")["state"], "and finished under the old configuration")
	require.Equal(t, http.StatusCreated, send(t, http.MethodPost, r.url+"/orders", "", `{}`).status, "the new configuration requires no key")

	require.NoError(t, os.WriteFile(r.config, []byte("routes:\n  - path: orders\n"), 0o600))
	require.Error(t, r.gw.Reload(), "an invalid file is refused")
	require.Equal(t, http.StatusCreated, send(t, http.MethodPost, r.url+"/orders", "", `{}`).status, "and the running configuration stays")
}

// TestScopeFromCallerJWT: with scope_jwt the record key is the sub claim of
// the caller's verified bearer token, ":" and the key; a forged or missing token
// cannot pick someone else's scope.
func TestScopeFromCallerJWT(t *testing.T) {
	t.Parallel()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	dir := t.TempDir()
	jwks := fmt.Sprintf(`{"keys":[{"kty":"OKP","crv":"Ed25519","kid":"k1","x":%q}]}`, base64.RawURLEncoding.EncodeToString(pub))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "jwks.json"), []byte(jwks), 0o600))
	r := newRig(t, servertest.BackendSQLite, fmt.Sprintf("defaults:\n  scope_jwt:\n    jwks_file: %s\n    issuer: https://auth.example\n    audience: shop-api\n", filepath.Join(dir, "jwks.json")))
	token := func(sub string, key ed25519.PrivateKey) string {
		tok := jwt.NewWithClaims(jwt.SigningMethodEdDSA, jwt.RegisteredClaims{
			Subject: sub, Issuer: "https://auth.example", Audience: jwt.ClaimStrings{"shop-api"},
			ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour)), IssuedAt: jwt.NewNumericDate(time.Now()),
		})
		tok.Header["kid"] = "k1"
		s, err := tok.SignedString(key)
		require.NoError(t, err)
		return s
	}
	a := send(t, http.MethodPost, r.url+"/orders", "k1", `{}`, "Authorization", "Bearer "+token("acct_a", priv))
	require.Equal(t, http.StatusCreated, a.status, a.body)
	require.Equal(t, "completed", r.apiRecord(t, "acct_a:k1")["state"])
	b := send(t, http.MethodPost, r.url+"/orders", "k1", `{}`, "Authorization", "Bearer "+token("acct_b", priv))
	require.Empty(t, b.header.Get(frontdoor.HeaderReplayed), "another subject, another key")

	_, other, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	forged := send(t, http.MethodPost, r.url+"/orders", "k1", `{}`, "Authorization", "Bearer "+token("acct_a", other))
	require.Equal(t, "invalid_key", forged.code(t))
	require.Equal(t, "invalid_key", send(t, http.MethodPost, r.url+"/orders", "k1", `{}`).code(t))
	require.Equal(t, int64(2), r.upstream.Count())
}

// TestWaitCappedPerRoute: a route's max_wait caps Prefer: wait=N; 0s turns
// waiting off (the immediate 409, no Preference-Applied); past the cap the
// held request gets 409 with Retry-After.
func TestWaitCappedPerRoute(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		r := newRig(t, backend, "routes:\n  - path: /orders/nowait\n    max_wait: 0s\n  - path: /orders/short\n    max_wait: 1s\n")
		release := r.upstream.Hold()
		defer release()
		go send(t, http.MethodPost, r.url+"/orders/nowait", "k1", `{}`)
		go send(t, http.MethodPost, r.url+"/orders/short", "k2", `{}`)
		require.Eventually(t, func() bool { return r.upstream.Entered() == 2 }, 10*time.Second, 5*time.Millisecond)

		off := send(t, http.MethodPost, r.url+"/orders/nowait", "k1", `{}`, "Prefer", "wait=10")
		require.Equal(t, http.StatusConflict, off.status)
		require.Empty(t, off.header.Get("Preference-Applied"))

		start := time.Now()
		capped := send(t, http.MethodPost, r.url+"/orders/short", "k2", `{}`, "Prefer", "wait=10")
		require.GreaterOrEqual(t, time.Since(start), time.Second)
		require.Equal(t, http.StatusConflict, capped.status)
		require.Equal(t, "request_in_flight", capped.code(t))
		require.Equal(t, "wait=1", capped.header.Get("Preference-Applied"))
		require.NotEmpty(t, capped.header.Get("Retry-After"))
	})
}

// holdKeyLock makes the store stop answering writes of key from another
// connection, as a lock held elsewhere would, until the returned function
// is called: the SQLite file's write lock (BEGIN IMMEDIATE), or the
// record's row lock in PostgreSQL (SELECT … FOR UPDATE). Writes of the
// key then wait until the gateway's store deadline cancels them.
func holdKeyLock(t *testing.T, r *rig, backend, key string) (release func()) {
	t.Helper()
	ctx := context.Background()
	dbURL := r.idem.Config().DatabaseURL
	var once sync.Once
	if backend == servertest.BackendSQLite {
		db, err := sql.Open("sqlite", "file:"+strings.TrimPrefix(dbURL, "sqlite:")+"?_pragma=busy_timeout(5000)")
		require.NoError(t, err)
		conn, err := db.Conn(ctx)
		require.NoError(t, err)
		_, err = conn.ExecContext(ctx, "BEGIN IMMEDIATE")
		require.NoError(t, err)
		release = func() {
			once.Do(func() {
				_, _ = conn.ExecContext(ctx, "ROLLBACK")
				_ = conn.Close()
				_ = db.Close()
			})
		}
	} else {
		conn, err := pgx.Connect(ctx, dbURL)
		require.NoError(t, err)
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		var one int
		require.NoError(t, tx.QueryRow(ctx, "SELECT 1 FROM idempotency_keys WHERE tenant_id = $1 AND key = $2 FOR UPDATE", tenant, key).Scan(&one))
		release = func() {
			once.Do(func() {
				_ = tx.Rollback(ctx)
				_ = conn.Close(ctx)
			})
		}
	}
	t.Cleanup(release)
	return release
}

// TestCompleteRetriedWhenTheStoreFails: the upstream has answered, and
// storing its response fails for a moment (a lock held elsewhere, past
// the store deadline). The gateway asks again until the response is
// stored, then sends it: the record is completed, a retry is replayed and
// the upstream ran once. Before, the one failed complete was only logged:
// the record stayed in flight, and once its lease ran out the retry took
// it over and ran the upstream a second time.
func TestCompleteRetriedWhenTheStoreFails(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		r := newRig(t, backend, "defaults:\n  lease: 1s\n", func(o *gateway.Options) { o.StoreTimeout = time.Second })
		hold := r.upstream.Hold()
		done := make(chan reply, 1)
		go func() { done <- send(t, http.MethodPost, r.url+"/orders", "c-1", `{"amount":1}`) }()
		require.Eventually(t, func() bool { return r.upstream.Entered() == 1 }, 10*time.Second, 5*time.Millisecond)
		unlock := holdKeyLock(t, r, backend, "c-1")
		hold()
		require.Eventually(t, func() bool { return r.storeFailures(t, "complete") >= 1 }, 15*time.Second, 10*time.Millisecond,
			"the complete waited for the lock and failed")
		unlock()
		first := <-done
		require.Equal(t, http.StatusCreated, first.status, first.body)

		rec := r.apiRecord(t, "c-1")
		require.Equal(t, "completed", rec["state"], "the response was stored before it was sent")
		retry := send(t, http.MethodPost, r.url+"/orders", "c-1", `{"amount":1}`)
		require.Equal(t, "true", retry.header.Get(frontdoor.HeaderReplayed), "the retry is replayed: %d %s", retry.status, retry.body)
		require.Equal(t, first.body, retry.body)
		require.Equal(t, int64(1), r.upstream.Count(), "the upstream ran once")
	})
}

// storeFailures reads the gateway's idem_gateway_store_failures_total{op}
// now (0 before the first failure).
func (r *rig) storeFailures(t *testing.T, op string) float64 {
	t.Helper()
	mfs, err := r.reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "idem_gateway_store_failures_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "op" && l.GetValue() == op {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestScopesCannotCollide: the record key of a scoped request is the scope
// and the key side by side, so the scope must end where the key begins.
// A caller whose scope is "acct" sending the key "b:k1" and one whose
// scope is "acct:b" sending "k1" are two callers with two keys. Before,
// both became the record key "acct:b:k1": the second caller got the first
// one's stored response replayed (its order, its body), on both stores.
func TestScopesCannotCollide(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		r := newRig(t, backend, "defaults:\n  scope_header: X-Account-Id\n")
		a := send(t, http.MethodPost, r.url+"/orders", "b:k1", `{"amount":1}`, "X-Account-Id", "acct")
		require.Equal(t, http.StatusCreated, a.status, a.body)
		b := send(t, http.MethodPost, r.url+"/orders", "k1", `{"amount":1}`, "X-Account-Id", "acct:b")
		require.Equal(t, http.StatusCreated, b.status, b.body)
		require.Empty(t, b.header.Get(frontdoor.HeaderReplayed), "another caller's response was replayed: %s", b.body)
		require.NotEqual(t, a.body, b.body)
		require.Equal(t, int64(2), r.upstream.Count(), "each caller's request ran")
		require.Equal(t, "completed", r.apiRecord(t, "acct:b:k1")["state"])
		require.Equal(t, "completed", r.apiRecord(t, "acct%3Ab:k1")["state"], "a colon in the scope is escaped")

		pct := send(t, http.MethodPost, r.url+"/orders", "k1", `{"amount":1}`, "X-Account-Id", "acct%3Ab")
		require.Empty(t, pct.header.Get(frontdoor.HeaderReplayed), "a scope spelling the escape is a third caller: %s", pct.body)
		require.Equal(t, int64(3), r.upstream.Count())
		again := send(t, http.MethodPost, r.url+"/orders", "k1", `{"amount":1}`, "X-Account-Id", "acct:b")
		require.Equal(t, "true", again.header.Get(frontdoor.HeaderReplayed))
		require.Equal(t, b.body, again.body, "each caller gets its own response back")
	})
}

// TestSlowBodyIsCutOff: a caller that announces a body and stops sending
// it mid-way is answered 400 once BodyReadTimeout has passed, nothing is
// claimed and the upstream is not called. Before, the gateway (whose
// listener has no read timeout, since upstream calls may be long) waited
// for the rest for good: each such connection held a goroutine and the
// bytes read so far, without bound.
func TestSlowBodyIsCutOff(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		r := newRig(t, backend, "", func(o *gateway.Options) { o.BodyReadTimeout = 500 * time.Millisecond })
		conn, err := net.Dial("tcp", strings.TrimPrefix(r.url, "http://"))
		require.NoError(t, err)
		defer conn.Close()
		_, err = fmt.Fprintf(conn, "POST /orders HTTP/1.1\r\nHost: gw\r\nIdempotency-Key: slow-1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"amount\":")
		require.NoError(t, err)
		require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		require.NoError(t, err, "the gateway is still waiting for the rest of the body")
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, string(b))
		require.Equal(t, "invalid_request", reply{resp.StatusCode, resp.Header, string(b)}.code(t))
		require.Equal(t, idem.ErrKeyNotFound.Code, r.getRecordErr(t, "slow-1"), "nothing was claimed")
		require.Equal(t, int64(0), r.upstream.Entered())
	})
}

// TestInflightBudgetRefusesBeforeReading: while one caller holds the whole
// in-flight budget (it announced a body of the route's largest size and
// sent a few bytes of it), a protected request with a Content-Length and a
// chunked one are refused 503 server_busy with Retry-After, unread,
// unclaimed, the upstream not called; once the holder's body is in and
// answered, both go through. Before, the gateway read every body as it
// came with nothing to bound how many at once (each up to the route's
// max_body_bytes, 8 MiB by default).
func TestInflightBudgetRefusesBeforeReading(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		const maxBody, maxStored = 64 << 10, 16 << 10
		r := newRig(t, backend, fmt.Sprintf("defaults:\n  max_body_bytes: %d\n  max_stored_bytes: %d\n", maxBody, maxStored), func(o *gateway.Options) {
			o.MaxInflightBytes = maxBody*gateway.BodyMemoryFactor + maxStored
		})
		finish := holdGatewayBudget(t, r, maxBody)

		busy := send(t, http.MethodPost, r.url+"/orders", "b-1", `{"amount":1}`)
		require.Equal(t, http.StatusServiceUnavailable, busy.status, busy.body)
		require.Equal(t, "server_busy", busy.code(t))
		require.Equal(t, "1", busy.header.Get("Retry-After"))
		// A reader of unknown length: the client sends it chunked.
		req, err := http.NewRequest(http.MethodPost, r.url+"/orders", io.MultiReader(strings.NewReader(`{"amount":`), strings.NewReader(`2}`)))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(frontdoor.HeaderKey, "b-2")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "a chunked body is charged the route's limit")
		require.Equal(t, idem.ErrKeyNotFound.Code, r.getRecordErr(t, "b-1"), "nothing claimed")
		require.Equal(t, idem.ErrKeyNotFound.Code, r.getRecordErr(t, "b-2"))
		require.Equal(t, int64(0), r.upstream.Entered())

		finish()
		require.Equal(t, http.StatusCreated, send(t, http.MethodPost, r.url+"/orders", "b-1", `{"amount":1}`).status)
		require.Equal(t, http.StatusCreated, send(t, http.MethodPost, r.url+"/orders", "b-2", `{"amount":2}`).status)
		require.Equal(t, int64(3), r.upstream.Count())
	})
}

// holdGatewayBudget starts a protected request whose client announces a
// body of size bytes and sends only its first 100: the gateway holds the
// body's budget until the returned finish sends the rest, requires the
// upstream's 201 and waits until every byte of the budget is given back.
func holdGatewayBudget(t *testing.T, r *rig, size int) (finish func()) {
	t.Helper()
	// The requests before it give their budget back once their answers
	// are written, which their clients may see a moment before.
	require.Eventually(t, func() bool { return r.gauge(t, "idem_gateway_request_body_bytes_in_flight") == 0 },
		10*time.Second, 5*time.Millisecond, "the budget is free before the holder starts")
	conn, err := net.Dial("tcp", strings.TrimPrefix(r.url, "http://"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	holder := `{"pad":"` + strings.Repeat("x", size-10) + `"}`
	_, err = fmt.Fprintf(conn, "POST /orders HTTP/1.1\r\nHost: gw\r\nIdempotency-Key: hold-1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(holder), holder[:100])
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return r.gauge(t, "idem_gateway_request_body_bytes_in_flight") == float64(len(holder)*gateway.BodyMemoryFactor)
	}, 10*time.Second, 5*time.Millisecond, "the holder's body is charged before it is read")
	return func() {
		t.Helper()
		_, err := io.WriteString(conn, holder[100:])
		require.NoError(t, err)
		require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
		held, err := http.ReadResponse(bufio.NewReader(conn), nil)
		require.NoError(t, err)
		held.Body.Close()
		require.Equal(t, http.StatusCreated, held.StatusCode)
		require.Eventually(t, func() bool { return r.gauge(t, "idem_gateway_request_body_bytes_in_flight") == 0 },
			10*time.Second, 5*time.Millisecond, "the budget is given back once the answer is written")
	}
}

// TestInflightBudgetCoversAnswers: the upstream's answer, which the gateway
// buffers up to what it may store, and a replayed stored answer are charged
// against the in-flight budget too. While a holder leaves room for small
// bodies but not for an answer, a new protected request and a replay are
// 503 server_busy with Retry-After: nothing claimed, the upstream not
// called. Before, the answer was buffered outside the budget: small
// requests whose answers were large ran the gateway out of memory however
// the bodies were bounded, and so did many replays of a large answer.
func TestInflightBudgetCoversAnswers(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		const maxBody, maxStored = 64 << 10, 32 << 10
		r := newRig(t, backend, fmt.Sprintf("defaults:\n  max_body_bytes: %d\n  max_stored_bytes: %d\n", maxBody, maxStored), func(o *gateway.Options) {
			o.MaxInflightBytes = maxBody*gateway.BodyMemoryFactor + maxStored
		})
		stored := send(t, http.MethodPost, r.url+"/orders?size=20000", "r-1", `{"amount":1}`)
		require.Equal(t, http.StatusOK, stored.status)
		require.Len(t, stored.body, 20000)

		finish := holdGatewayBudget(t, r, maxBody)
		// Room for the small bodies, not for an answer besides.
		for _, c := range []struct{ path, key string }{{"/orders", "b-1"}, {"/orders?size=20000", "r-1"}} {
			busy := send(t, http.MethodPost, r.url+c.path, c.key, `{"amount":1}`)
			require.Equal(t, http.StatusServiceUnavailable, busy.status, "%s: %s", c.key, busy.body)
			require.Equal(t, "server_busy", busy.code(t))
			require.Equal(t, "1", busy.header.Get("Retry-After"))
		}
		require.Equal(t, idem.ErrKeyNotFound.Code, r.getRecordErr(t, "b-1"), "nothing claimed")
		require.Equal(t, int64(1), r.upstream.Entered(), "the upstream was not called")

		finish()
		require.Equal(t, http.StatusCreated, send(t, http.MethodPost, r.url+"/orders", "b-1", `{"amount":1}`).status)
		replay := send(t, http.MethodPost, r.url+"/orders?size=20000", "r-1", `{"amount":1}`)
		require.Equal(t, http.StatusOK, replay.status)
		require.Equal(t, "true", replay.header.Get("Idempotent-Replayed"))
		require.True(t, stored.body == replay.body, "the stored answer, whole")
		require.Equal(t, int64(3), r.upstream.Count(), "r-1, the holder and b-1, once each")
	})
}

// gauge reads a gateway gauge now.
func (r *rig) gauge(t *testing.T, name string) float64 {
	t.Helper()
	mfs, err := r.reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no gauge %s", name)
	return 0
}

// flakyUpstream answers the first request of each connection 201 and
// keeps the connection open; a second request on the same connection is
// read, counted (its side effect done) and the connection closed without
// an answer, as an upstream that dies mid-request or closes a kept-alive
// connection does. It counts requests by path.
type flakyUpstream struct {
	url   string
	mu    sync.Mutex
	count map[string]int
}

func newFlakyUpstream(t *testing.T) *flakyUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	u := &flakyUpstream{url: "http://" + ln.Addr().String(), count: map[string]int{}}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go u.serve(c)
		}
	}()
	return u
}

func (u *flakyUpstream) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	for n := 0; ; n++ {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		u.mu.Lock()
		u.count[req.URL.Path]++
		u.mu.Unlock()
		if n > 0 {
			return // done, and gone before answering
		}
		_, _ = io.WriteString(c, "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
	}
}

func (u *flakyUpstream) calls(path string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.count[path]
}

// TestUpstreamNeverSentTwice: the upstream takes a protected request and
// drops the connection without answering. The gateway must not send it
// again by itself: Go's transport re-sends a request on a new connection
// when a reused one fails this way and the request looks replayable — an
// empty body with an Idempotency-Key header, which the gateway forwards.
// The upstream had already acted, so it ran twice behind a 201. Now it
// runs once; the caller gets 502, and since the upstream may have acted
// the answer is stored like a 5xx (store_5xx, the default): the retry is
// replayed, not run again.
func TestUpstreamNeverSentTwice(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		up := newFlakyUpstream(t)
		r := newRig(t, backend, fmt.Sprintf("upstreams:\n  flaky: %s\nroutes:\n  - path: /flaky/\n    upstream: flaky\n", up.url))
		first := send(t, http.MethodPost, r.url+"/flaky/a", "k1", "")
		require.Equal(t, http.StatusCreated, first.status, first.body)
		second := send(t, http.MethodPost, r.url+"/flaky/b", "k2", "")
		require.Equal(t, 1, up.calls("/flaky/b"), "the upstream got the request once: %d %s", second.status, second.body)
		require.Equal(t, http.StatusBadGateway, second.status, second.body)
		require.Equal(t, "upstream_unavailable", second.code(t))
		retry := send(t, http.MethodPost, r.url+"/flaky/b", "k2", "")
		require.Equal(t, "true", retry.header.Get(frontdoor.HeaderReplayed), "the upstream may have acted: its answer is stored, %d %s", retry.status, retry.body)
		require.Equal(t, http.StatusBadGateway, retry.status)
		require.Equal(t, 1, up.calls("/flaky/b"), "and the retry does not run it again")
	})
}

// TestBrokenAnswerIsNotRunAgain: the upstream acts on a request, starts
// its answer and breaks off mid-body. Its side effect happened; the
// gateway stores its 502 like a 5xx (store_5xx, the default) and the
// retry gets it replayed. Before, the claim was left in flight: once its
// lease ran out the retry took it over and the upstream ran again.
func TestBrokenAnswerIsNotRunAgain(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		var calls atomic.Int64
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		t.Cleanup(func() { _ = ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					req, err := http.ReadRequest(bufio.NewReader(c))
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, req.Body)
					calls.Add(1)
					_, _ = io.WriteString(c, "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"id\":")
				}()
			}
		}()
		r := newRig(t, backend, fmt.Sprintf("defaults:\n  lease: 1s\nupstreams:\n  broken: http://%s\nroutes:\n  - path: /broken/\n    upstream: broken\n", ln.Addr()))
		first := send(t, http.MethodPost, r.url+"/broken/x", "k1", `{"amount":1}`)
		require.Equal(t, http.StatusBadGateway, first.status, first.body)
		require.Equal(t, "upstream_unavailable", first.code(t))
		require.Equal(t, "completed", r.apiRecord(t, "k1")["state"], "the answer is stored, not left to be taken over")
		retry := send(t, http.MethodPost, r.url+"/broken/x", "k1", `{"amount":1}`)
		require.Equal(t, "true", retry.header.Get(frontdoor.HeaderReplayed), "%d %s", retry.status, retry.body)
		require.Equal(t, first.body, retry.body)
		require.Equal(t, int64(1), calls.Load(), "the upstream ran once")
	})
}

// TestStorageQuotaExceeded: the tenant's records fill its
// storage_quota_bytes; the next new key through the gateway is refused
// with 507 storage_quota_exceeded (not retryable, no Retry-After), the
// upstream not called and nothing stored — also on a fail_open route: the
// store is up and refused, which is no store failure to pass through
// unprotected. A completed key still replays. Before, the gateway did not
// pass the tenant's quota to its claims (it was never checked), and the
// refusal, had it come, fell into the store-failure branch: 503
// store_unavailable, or the request sent upstream unprotected.
func TestStorageQuotaExceeded(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		r := newRig(t, backend, "routes:\n  - path: /orders/open\n    fail_open: true\n")
		req, err := http.NewRequest(http.MethodPatch, r.idem.URL()+"/v1/admin/tenants/"+tenant,
			strings.NewReader(`{"settings":{"max_response_bytes":2000,"storage_quota_bytes":4000}}`))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+r.idem.Token(t, "", "admin"))
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, string(b))

		var refused reply
		key := ""
		filled := 0
		for i := range 60 {
			key = fmt.Sprintf("fill-%d", i)
			got := send(t, http.MethodPost, r.url+"/orders?size=900", key, `{}`)
			if got.status != http.StatusOK {
				refused = got
				break
			}
			filled++
		}
		require.NotZero(t, refused.status, "the tenant filled its quota and kept claiming new keys")
		require.EqualValues(t, filled, r.upstream.Count(), "the upstream ran for the stored keys only")
		assertQuotaRefusal := func(got reply) {
			t.Helper()
			require.Equal(t, http.StatusInsufficientStorage, got.status, got.body)
			require.Equal(t, string(frontdoor.CodeStorageQuotaExceeded), got.code(t))
			p := decode(t, got.body)
			require.Equal(t, false, p["retryable"])
			require.Equal(t, frontdoor.StorageQuotaDetail, p["detail"])
			require.Empty(t, got.header.Get("Retry-After"))
		}
		assertQuotaRefusal(refused)
		require.Equal(t, idem.CodeKeyNotFound, r.getRecordErr(t, key), "the refused key is not stored")

		// fail_open is for a failing store: a refused one does not pass the
		// request through unprotected.
		open := send(t, http.MethodPost, r.url+"/orders/open", "open-1", `{}`)
		assertQuotaRefusal(open)
		require.Equal(t, idem.CodeKeyNotFound, r.getRecordErr(t, "open-1"))
		require.EqualValues(t, filled, r.upstream.Count(), "the upstream was not called")

		replay := send(t, http.MethodPost, r.url+"/orders?size=900", "fill-0", `{}`)
		require.Equal(t, http.StatusOK, replay.status, replay.body)
		require.Equal(t, "true", replay.header.Get(frontdoor.HeaderReplayed))
		require.Equal(t, strings.Repeat("x", 900), replay.body)
		require.EqualValues(t, filled, r.upstream.Count())
	})
}

// TestOperationVectors: each request line of
// testvectors/frontdoor/operations.json, sent byte for byte to a path no
// route matches, goes upstream once and is claimed with the operation the
// vector expects — the one idemhttp, the Python and the Node front doors
// give the same bytes. Before, the operation was the decoded path as it
// was: a control character (/pay%00x) reached the store unchecked, which
// PostgreSQL refuses (503 store_unavailable, retryable, for ever) and SQLite
// kept in a label idem's own API refuses, and bytes that are not UTF-8
// (/pay%FF) were stored as they came.
func TestOperationVectors(t *testing.T) {
	t.Parallel()
	vectors := testvectors.Operations(t)
	forEachBackend(t, func(t *testing.T, backend string) {
		r := newRig(t, backend, "routes:\n  - path: /orders/open\n")
		addr := strings.TrimPrefix(r.url, "http://")
		for i, v := range vectors {
			key := fmt.Sprintf("k-operation-%d", i)
			before := r.upstream.Count()
			status := testvectors.Post(t, addr, v.Target, key)
			require.Less(t, status, 500, v.Name)
			require.Equal(t, before+1, r.upstream.Count(), "%s: sent upstream once", v.Name)
			rec := r.apiRecord(t, key)
			assert.Equal(t, "completed", rec["state"], v.Name)
			assert.Equal(t, v.Expect.Operation, rec["operation"], v.Name)
			require.Equal(t, status, testvectors.Post(t, addr, v.Target, key), v.Name)
			require.Equal(t, before+1, r.upstream.Count(), "%s: the retry is a replay", v.Name)
		}
	})
}

// TestConfigRefusesAPatternWithAControlCharacter: a route's pattern names
// it in the operation label, which idem refuses with a control character;
// such a configuration is refused when it is loaded, not claim by claim.
// Before, it loaded, and every claim on the route reached the store with
// the label unchecked (PostgreSQL: 503 store_unavailable for ever).
func TestConfigRefusesAPatternWithAControlCharacter(t *testing.T) {
	t.Parallel()
	srv := servertest.Start(t, servertest.Options{Backend: servertest.BackendSQLite, Tenants: []string{tenant}})
	config := filepath.Join(t.TempDir(), "gateway.yaml")
	require.NoError(t, os.WriteFile(config, []byte("routes:\n  - path: \"/orders/\\x01\"\n"), 0o600))
	_, err := gateway.New(gateway.Options{Store: srv.Store(), Tenant: tenant, Upstream: "http://127.0.0.1:1", ConfigFile: config})
	require.ErrorContains(t, err, "control characters")
}
