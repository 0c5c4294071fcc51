package web_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/server"
	"github.com/idem-dev/idem/testkit/browser"
	"github.com/idem-dev/idem/testkit/servertest"
	"github.com/idem-dev/idem/web"
)

// dashCall sends one API request to the test server and decodes the JSON
// answer into out (when non-nil). It returns the status code.
func dashCall(t *testing.T, srv *servertest.Server, token, method, path string, body, out any) int {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		require.NoError(t, err)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, srv.URL()+path, rd)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	if out != nil && len(raw) > 0 {
		require.NoError(t, json.Unmarshal(raw, out), "body: %s", raw)
	}
	return resp.StatusCode
}

type dashClaim struct {
	FencingToken int64 `json:"fencing_token"`
}

func dashClaimKey(t *testing.T, srv *servertest.Server, token, key string, lease int) dashClaim {
	t.Helper()
	var c dashClaim
	status := dashCall(t, srv, token, "POST", "/v1/keys/"+key+"/claim",
		map[string]any{"operation": "POST /v1/payments", "request": map[string]any{"key": key}, "lease_seconds": lease}, &c)
	require.Equal(t, http.StatusCreated, status, "claim %s", key)
	return c
}

// dashSignIn fills the dashboard's token form with token and submits it.
func dashSignIn(token string) chromedp.Action[chromedp.Void] {
	return chromedp.Steps(
		chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), token),
		chromedp.Click(chromedp.CSS("#login-form button[type=submit]")),
	)
}

// dashMetric returns the value of one series line of /metrics, or "" when
// the series is absent.
func dashMetric(t *testing.T, srv *servertest.Server, series string) string {
	t.Helper()
	resp, err := http.Get(srv.URL() + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindSubmatch(raw)
	if m == nil {
		return ""
	}
	return string(m[1])
}

func TestDashboardEmbedded(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"index.html", "dashboard.js", "dashboard.css"} {
		b, err := fs.ReadFile(web.Dashboard(), name)
		require.NoError(t, err)
		// No CDN, no remote fonts: every reference stays on this server.
		require.NotRegexp(t, `(?i)(src|href)=["']?(https?:)?//`, string(b), name)
		require.NotContains(t, string(b), "@import", name)
		require.NotContains(t, string(b), "localStorage", name, "the token belongs in sessionStorage")
	}
}

// TestDashboardShowsOrphans creates orphans through the API on a real
// server, checks they appear in the list endpoints and in /metrics, then
// opens /dashboard/ in headless Chromium, pastes an operator token, then a
// tenant token, and checks the orphan rows, the claim rates, that no
// request left loopback, and that the console stayed clean.
func TestDashboardShowsOrphans(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{servertest.BackendSQLite, servertest.BackendPostgres} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			srv := servertest.Start(t, servertest.Options{Backend: backend, Tenants: []string{"acme", "beta"}})
			acme := srv.Token(t, "acme", "keys:write")
			beta := srv.Token(t, "beta", "keys:write")
			operator := srv.Token(t, "", "admin")

			// Orphans-to-be: 1 s leases nobody completes.
			c := dashClaimKey(t, srv, acme, "order-1001", 1)
			require.Equal(t, http.StatusOK, dashCall(t, srv, acme, "POST", "/v1/keys/order-1001/checkpoint",
				map[string]any{"fencing_token": c.FencingToken, "recovery_point": "charge_created", "data": map[string]any{"charge": "ch_1"}, "lease_seconds": 1}, nil))
			dashClaimKey(t, srv, acme, "order-1002", 1)
			dashClaimKey(t, srv, beta, "invoice-7", 1)
			// Not orphans: a completed key and a live claim.
			done := dashClaimKey(t, srv, acme, "order-done", 1)
			require.Equal(t, http.StatusOK, dashCall(t, srv, acme, "POST", "/v1/keys/order-done/complete",
				map[string]any{"fencing_token": done.FencingToken, "response": map[string]any{"status": 201, "body": "{}"}}, nil))
			dashClaimKey(t, srv, acme, "order-live", 600)
			time.Sleep(1100 * time.Millisecond)

			// The list endpoints see them.
			var orphans struct {
				Items []struct{ Tenant, Key string } `json:"items"`
			}
			require.Equal(t, http.StatusOK, dashCall(t, srv, operator, "GET", "/v1/admin/orphans", nil, &orphans))
			var got []string
			for _, o := range orphans.Items {
				got = append(got, o.Tenant+"/"+o.Key)
			}
			require.ElementsMatch(t, []string{"acme/order-1001", "acme/order-1002", "beta/invoice-7"}, got)
			var keys struct {
				Items []struct{ Key string } `json:"items"`
			}
			require.Equal(t, http.StatusOK, dashCall(t, srv, beta, "GET", "/v1/keys?state=orphaned", nil, &keys))
			require.Len(t, keys.Items, 1)
			require.Equal(t, "invoice-7", keys.Items[0].Key)

			// The orphan watch puts them in /metrics.
			require.Eventually(t, func() bool {
				return dashMetric(t, srv, `idem_orphans{tenant="acme"}`) == "2" &&
					dashMetric(t, srv, `idem_orphans{tenant="beta"}`) == "1"
			}, 5*time.Second, 50*time.Millisecond, "orphan gauges")
			require.Equal(t, "4", dashMetric(t, srv, `idem_claims_total{outcome="created",tenant="acme"}`))
			require.Equal(t, "1", dashMetric(t, srv, `idem_claims_total{outcome="created",tenant="beta"}`))
			require.Equal(t, "1", dashMetric(t, srv, `idem_key_writes_total{op="checkpoint",result="ok",tenant="acme"}`))
			require.Equal(t, "1", dashMetric(t, srv, `idem_key_writes_total{op="complete",result="ok",tenant="acme"}`))

			// The dashboard, as the operator.
			b := browser.New(t)
			b.Do(
				chromedp.Navigate(srv.URL()+"/dashboard/"),
				dashSignIn(operator),
				chromedp.WaitVisible(chromedp.CSS(`#dash[data-mode="operator"][data-loaded="1"]`)),
				chromedp.WaitVisible(chromedp.CSS(`#keys-body tr[data-key="order-1002"]`)),
			)
			rows := browser.Run(b, chromedp.Evaluate[[]string](
				`[...document.querySelectorAll("#keys-body tr")].map(r => r.dataset.tenant + "/" + r.dataset.key + "/" + r.cells[4].textContent)`))
			require.ElementsMatch(t, []string{"acme/order-1001/charge_created", "acme/order-1002/none", "beta/invoice-7/none"}, rows)
			tenantRows := browser.Run(b, chromedp.Evaluate[[]string](
				`[...document.querySelectorAll("#tenants-body tr")].map(r => r.dataset.tenant + ":" + r.cells[1].textContent)`))
			require.Equal(t, []string{"acme:2", "beta:1"}, tenantRows)
			require.Equal(t, "3", browser.Run(b, chromedp.Text(chromedp.CSS("#stat-orphans"))))
			require.Contains(t, browser.Run(b, chromedp.Text(chromedp.CSS("#updated"))), "Updated")

			// Claim rates show from the first refresh (a second sample two
			// seconds after the first), well before the 10 s auto-refresh.
			browser.Run(b, chromedp.Poll[bool](`document.querySelector("#stat-rate").textContent !== "–"`))
			require.Contains(t, browser.Run(b, chromedp.Text(chromedp.CSS("#stat-rate-note"))), "over the last")
			require.Len(t, browser.Run(b, chromedp.Evaluate[[]string](
				`[...document.querySelectorAll("#rates .rate-val")].map(n => n.textContent).filter(v => v.startsWith("–"))`)), 0,
				"every outcome has a rate after the first refresh")

			// The last-hour chart: inline SVG with the orphan line (3 now)
			// and one line per claim outcome.
			require.Equal(t, "Orphans: 3", browser.Run(b, chromedp.Evaluate[string](
				`document.querySelector('#chart svg path[data-series="orphans"] + circle title').textContent`)))
			require.ElementsMatch(t, []string{"orphans", "created", "replayed", "takeover", "in_flight", "mismatch", "error"},
				browser.Run(b, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#chart svg path")].map(p => p.dataset.series)`)))

			// The token stays out of the URL and in sessionStorage.
			loc := browser.Run(b, chromedp.Location())
			require.NotContains(t, loc, operator)
			require.Equal(t, operator, browser.Run(b, chromedp.Evaluate[string](`sessionStorage.getItem("idem.dashboard.token")`)))

			// A claim between two refreshes shows up as a created rate.
			dashClaimKey(t, srv, acme, "order-between", 60)
			b.Do(chromedp.Click(chromedp.CSS("#refresh")))
			browser.Run(b, chromedp.Poll[bool](`document.querySelector("#stat-rate").textContent !== "–"`))
			browser.Run(b, chromedp.Poll[bool](`document.querySelector('#chart svg path[data-series="created"]').dataset.points === "2"`))
			created := browser.Run(b, chromedp.Text(chromedp.CSS(`#rates li[data-outcome="created"] .rate-val`)))
			require.NotRegexp(t, `^(–|0/min)`, created, "created rate after a claim between refreshes")
			// The chart grew by the refresh: two samples of each line, the
			// created line above zero at the end.
			require.Equal(t, "2", browser.Run(b, chromedp.Evaluate[string](`document.querySelector('#chart svg path[data-series="orphans"]').dataset.points`)))
			require.NotEqual(t, "Created / min: 0", browser.Run(b, chromedp.Evaluate[string](
				`document.querySelector('#chart svg path[data-series="created"] + circle title').textContent`)))
			// A reload keeps this tab's history.
			b.Do(chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS(`#dash[data-mode="operator"][data-loaded="1"]`)))
			browser.Run(b, chromedp.Poll[bool](`Number(document.querySelector('#chart svg path[data-series="orphans"]')?.dataset.points) >= 3`))
			b.Screenshot("operator")

			// Filter by tenant by clicking its row.
			b.ClickNow(`#tenants-body tr[data-tenant="beta"]`)
			b.Do(chromedp.WaitNotPresent(chromedp.CSS(`#keys-body tr[data-key="order-1001"]`)))
			require.Equal(t, 1, browser.Run(b, chromedp.Evaluate[int](`document.querySelectorAll("#keys-body tr").length`)))

			// As tenant beta: only its own orphan.
			b.Do(
				chromedp.Click(chromedp.CSS("#signout")),
				dashSignIn(srv.Token(t, "beta", "keys:read")),
				chromedp.WaitVisible(chromedp.CSS(`#dash[data-mode="tenant"][data-loaded="1"]`)),
				chromedp.WaitVisible(chromedp.CSS(`#keys-body tr[data-key="invoice-7"]`)),
			)
			rows = browser.Run(b, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#keys-body tr")].map(r => r.dataset.key)`))
			require.Equal(t, []string{"invoice-7"}, rows)
			require.Equal(t, "Tenant · beta", browser.Run(b, chromedp.Text(chromedp.CSS("#identity"))))
			require.Equal(t, []string{"beta:1"}, browser.Run(b, chromedp.Evaluate[[]string](
				`[...document.querySelectorAll("#tenants-body tr")].map(r => r.dataset.tenant + ":" + r.cells[1].textContent)`)))
			require.Equal(t, "1", browser.Run(b, chromedp.Text(chromedp.CSS("#stat-orphans"))))
			b.Screenshot("tenant")

			b.RequireNoConsoleErrors()
			b.RequireLoopbackOnly()
			for _, u := range b.Requests() {
				require.NotContains(t, u, "eyJ", "a token leaked into a URL: %s", u)
			}

			// A token the server rejects sends the user back to the token form.
			forged := strings.Join(append(strings.Split(operator, ".")[:2], "c2lnbmF0dXJl"), ".")
			b.Do(
				chromedp.Click(chromedp.CSS("#signout")),
				dashSignIn(forged),
				chromedp.WaitVisible(chromedp.CSS("#login-error")),
			)
			msg := browser.Run(b, chromedp.Text(chromedp.CSS("#login-error")))
			require.Contains(t, msg, "rejected")
			require.Nil(t, browser.Run(b, chromedp.Evaluate[*string](`sessionStorage.getItem("idem.dashboard.token")`)))
			require.True(t, slices.ContainsFunc(b.Requests(), func(u string) bool { return strings.HasSuffix(u, "/v1/admin/tenants") }),
				fmt.Sprint(b.Requests()))
		})
	}
}

// TestDashboardSaysWhenTenantIsBucketed: with IDEM_METRICS_MAX_TENANTS=1
// the second tenant's claims are counted under tenant="(other)"; its
// dashboard says so instead of showing silent zeros, and the first
// tenant's does not.
func TestDashboardSaysWhenTenantIsBucketed(t *testing.T) {
	t.Parallel()
	srv := servertest.Start(t, servertest.Options{Tenants: []string{"acme", "beta"},
		Configure: func(c *server.Config) { c.MetricsMaxTenants = 1 }})
	acme := srv.Token(t, "acme", "keys:write")
	beta := srv.Token(t, "beta", "keys:write")
	dashClaimKey(t, srv, acme, "a-1", 60)
	dashClaimKey(t, srv, beta, "b-1", 60)
	require.Equal(t, "1", dashMetric(t, srv, `idem_claims_total{outcome="created",tenant="acme"}`))
	require.Equal(t, "1", dashMetric(t, srv, `idem_claims_total{outcome="created",tenant="(other)"}`))

	b := browser.New(t)
	b.Do(chromedp.Navigate(srv.URL() + "/dashboard/"))
	for i, c := range []struct {
		token    string
		bucketed bool
	}{{beta, true}, {acme, false}} {
		if i > 0 {
			b.Do(chromedp.Click(chromedp.CSS("#signout")))
		}
		b.Do(
			dashSignIn(c.token),
			chromedp.WaitVisible(chromedp.CSS(`#dash[data-mode="tenant"][data-loaded="1"]`)),
		)
		browser.Run(b, chromedp.Poll[bool](`document.querySelector("#stat-rate").textContent !== "–"`))
		note := browser.Run(b, chromedp.Text(chromedp.CSS("#rates-note")))
		if c.bucketed {
			require.Contains(t, note, `tenant="(other)"`)
		} else {
			require.NotContains(t, note, "(other)")
		}
	}
	b.RequireNoConsoleErrors()
	b.RequireLoopbackOnly()
}

// TestDashboardResolvesOrphans clicks through every resolution on both
// stores in headless Chromium: the operator releases one orphan and
// completes another with the real response, cancels a confirmation (nothing
// is written), then a tenant admin flags the third for review. Each step is
// checked through the API (record state, replay, audit entries with who
// acted) and on the page (state, review flag, audit rows).
func TestDashboardResolvesOrphans(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{servertest.BackendSQLite, servertest.BackendPostgres} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			srv := servertest.Start(t, servertest.Options{Backend: backend, Tenants: []string{"acme"}})
			writer := srv.Token(t, "acme", "keys:write")
			operator := srv.Token(t, "", "admin")
			tenantAdmin := srv.Token(t, "acme", "keys:read tenant:admin")

			for _, k := range []string{"o-release", "o-complete", "o-review"} {
				dashClaimKey(t, srv, writer, k, 1)
			}
			require.Eventually(t, func() bool {
				var page struct{ Items []any }
				dashCall(t, srv, operator, "GET", "/v1/admin/orphans", nil, &page)
				return len(page.Items) == 3
			}, 10*time.Second, 50*time.Millisecond)

			type auditEntry struct {
				Action string
				Note   string
				Actor  struct{ Subject, Tenant, Scope string }
			}
			auditOf := func(key string) []auditEntry {
				var page struct{ Items []auditEntry }
				require.Equal(t, http.StatusOK, dashCall(t, srv, operator, "GET", "/v1/admin/tenants/acme/keys/"+key+"/audit", nil, &page))
				return page.Items
			}
			auditRows := func(b *browser.Browser) []string {
				return browser.Run(b, chromedp.Evaluate[[]string](
					`[...document.querySelectorAll("#audit-body tr")].map(r => r.dataset.action + ":" + r.cells[2].textContent + ":" + r.cells[4].textContent)`))
			}
			openKey := func(b *browser.Browser, key string) {
				b.ClickNow(`#keys-body tr[data-key="` + key + `"]`)
				b.Do(chromedp.WaitVisible(chromedp.CSS(`#record[data-key="` + key + `"][data-state="orphaned"]`)))
			}

			b := browser.New(t)
			b.Do(
				chromedp.Navigate(srv.URL()+"/dashboard/"),
				dashSignIn(operator),
				chromedp.WaitVisible(chromedp.CSS(`#dash[data-mode="operator"][data-loaded="1"]`)),
			)

			// Release, with a confirmation step.
			openKey(b, "o-release")
			b.Do(
				chromedp.Click(chromedp.CSS(`#record-actions button[data-action="release"]`)),
				chromedp.WaitVisible(chromedp.CSS(`#confirm[data-action="release"]`)),
			)
			require.Contains(t, browser.Run(b, chromedp.Text(chromedp.CSS("#confirm-text"))), "Release key o-release")
			require.Empty(t, auditOf("o-release"), "nothing is written before the confirmation")
			b.Do(
				chromedp.SendKeys(chromedp.CSS("#confirm-note"), "no recovery point: never started"),
				chromedp.Click(chromedp.CSS("#confirm-go")),
				chromedp.WaitVisible(chromedp.CSS(`#record[data-state="gone"][data-audit="1"]`)),
				chromedp.WaitVisible(chromedp.CSS(`#record-result[data-action="release"]`)),
			)
			require.Equal(t, http.StatusNotFound, dashCall(t, srv, operator, "GET", "/v1/admin/tenants/acme/keys/o-release", nil, nil))
			entries := auditOf("o-release")
			require.Len(t, entries, 1)
			require.Equal(t, "release", entries[0].Action)
			require.Equal(t, "admin", entries[0].Actor.Scope)
			require.Equal(t, "no recovery point: never started", entries[0].Note)
			require.Equal(t, []string{"release:servertest (admin):no recovery point: never started"}, auditRows(b))

			// Complete with the real response.
			openKey(b, "o-complete")
			b.Do(
				chromedp.Click(chromedp.CSS(`#record-actions button[data-action="complete"]`)),
				chromedp.WaitVisible(chromedp.CSS(`#confirm-response`)),
				chromedp.SetValue(chromedp.CSS("#confirm-status"), "201"),
				chromedp.SetValue(chromedp.CSS("#confirm-body"), `{"id":"ch_1"}`),
				chromedp.SendKeys(chromedp.CSS("#confirm-note"), "charge ch_1 found at the provider"),
				chromedp.Click(chromedp.CSS("#confirm-go")),
				chromedp.WaitVisible(chromedp.CSS(`#record[data-key="o-complete"][data-state="completed"][data-audit="1"]`)),
			)
			require.Equal(t, "201", browser.Run(b, chromedp.Text(chromedp.CSS(`#record-fields dd[data-field="response status"]`))))
			var replay struct {
				Response struct {
					Status int
					Body   string
				}
			}
			require.Equal(t, http.StatusOK, dashCall(t, srv, writer, "POST", "/v1/keys/o-complete/claim",
				map[string]any{"operation": "POST /v1/payments", "request": map[string]any{"key": "o-complete"}}, &replay), "the retry is a replay")
			require.Equal(t, 201, replay.Response.Status)
			require.Equal(t, `{"id":"ch_1"}`, replay.Response.Body)
			require.Equal(t, "complete", auditOf("o-complete")[0].Action)

			// A cancelled confirmation writes nothing.
			openKey(b, "o-review")
			b.Do(
				chromedp.Click(chromedp.CSS(`#record-actions button[data-action="release"]`)),
				chromedp.WaitVisible(chromedp.CSS(`#confirm`)),
				chromedp.Click(chromedp.CSS("#confirm-cancel")),
				chromedp.WaitNotVisible(chromedp.CSS(`#confirm`)),
			)
			require.Empty(t, auditOf("o-review"))
			require.Equal(t, http.StatusOK, dashCall(t, srv, operator, "GET", "/v1/admin/tenants/acme/keys/o-review", nil, nil))

			// A tenant admin flags the last orphan for review.
			b.Do(
				chromedp.Click(chromedp.CSS("#signout")),
				dashSignIn(tenantAdmin),
				chromedp.WaitVisible(chromedp.CSS(`#dash[data-mode="tenant"][data-loaded="1"]`)),
			)
			openKey(b, "o-review")
			b.Do(
				chromedp.Click(chromedp.CSS(`#record-actions button[data-action="review"]`)),
				chromedp.WaitVisible(chromedp.CSS(`#confirm[data-action="review"]`)),
				chromedp.SendKeys(chromedp.CSS("#confirm-note"), "ask the payments team"),
				chromedp.Click(chromedp.CSS("#confirm-go")),
				chromedp.WaitVisible(chromedp.CSS(`#record[data-key="o-review"][data-state="orphaned"][data-audit="1"]`)),
				chromedp.WaitVisible(chromedp.CSS(`#record-review`)),
				chromedp.WaitVisible(chromedp.CSS(`#keys-body tr[data-key="o-review"] .pill.review`)),
			)
			require.Contains(t, browser.Run(b, chromedp.Text(chromedp.CSS("#record-review"))), "ask the payments team")
			require.Equal(t, []string{"review:servertest (tenant:admin, acme):ask the payments team"}, auditRows(b))
			var rec struct {
				State  string
				Review *struct{ Note string }
			}
			require.Equal(t, http.StatusOK, dashCall(t, srv, tenantAdmin, "GET", "/v1/keys/o-review", nil, &rec))
			require.Equal(t, "orphaned", rec.State)
			require.NotNil(t, rec.Review)
			require.Equal(t, "ask the payments team", rec.Review.Note)
			b.Screenshot("resolved")

			b.RequireNoConsoleErrors()
			b.RequireLoopbackOnly()
		})
	}
}
