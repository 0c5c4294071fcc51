package web_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/retrybudget"
	"github.com/idem-dev/idem/server"
	"github.com/idem-dev/idem/testkit/browser"
	"github.com/idem-dev/idem/testkit/servertest"
)

// ampClaim claims key as tenant token with the Idem-Attempt header attempt
// and returns the status.
func ampClaim(t *testing.T, srv *servertest.Server, token, key, attempt string) int {
	t.Helper()
	req, err := http.NewRequest("POST", srv.URL()+"/v1/keys/"+key+"/claim",
		strings.NewReader(`{"operation":"POST /v1/payments","request":{"key":"`+key+`"}}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(retrybudget.Header, attempt)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	return resp.StatusCode
}

// TestDashboardShowsRetryAmplification sends first attempts and retries
// (some refused by the budget) through real HTTP on both stores, then opens
// the dashboard in headless Chromium as the operator and checks the "Retry
// amplification" section: the tenant's ratio over the window, a last-hour
// SVG chart with one point per minute (60), its aria label and the table
// of minutes counting what was sent; and that a tenant token does not see
// the section (its endpoint is scope admin).
func TestDashboardShowsRetryAmplification(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{servertest.BackendSQLite, servertest.BackendPostgres} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			// A window of an hour: the ratio cannot change while the test runs.
			srv := servertest.Start(t, servertest.Options{Backend: backend,
				Configure: func(c *server.Config) { c.RetryBudgetWindow = time.Hour }})
			zero := 0
			srv.CreateTenant(t, "acme", idem.SettingsPatch{RetryBudgetPercent: &zero})
			acme := srv.Token(t, "acme", "keys:write", "keys:read")
			for i := range 20 {
				require.Equal(t, http.StatusCreated, ampClaim(t, srv, acme, fmt.Sprintf("first-%d", i), "1"))
			}
			// retry_budget_percent 0: the floor of 10 admitted, 5 refused.
			for i := range retrybudget.Floor + 5 {
				want := http.StatusCreated
				if i >= retrybudget.Floor {
					want = http.StatusTooManyRequests
				}
				require.Equal(t, want, ampClaim(t, srv, acme, fmt.Sprintf("retry-%d", i), "2;cause=timeout"))
			}
			// (20 + 10 + 5) / 20
			const ratio = "1.75×"

			b := browser.New(t)
			b.Do(
				chromedp.Navigate(srv.URL()+"/dashboard/"),
				dashSignIn(srv.Token(t, "", "admin")),
				chromedp.WaitVisible(chromedp.CSS(`#dash[data-mode="operator"][data-loaded="1"]`)),
				chromedp.WaitVisible(chromedp.CSS(`#amp .amp-tenant[data-tenant="acme"]`)),
			)
			require.Equal(t, "Retry amplification", browser.Run(b, chromedp.Text(chromedp.CSS("#amp h2"))))
			require.Equal(t, ratio, browser.Run(b, chromedp.Text(chromedp.CSS(`#amp .amp-tenant[data-tenant="acme"] .amp-ratio`))))
			require.Contains(t, browser.Run(b, chromedp.Evaluate[string](
				`document.querySelector('#amp .amp-tenant[data-tenant="acme"] .amp-ratio').getAttribute("aria-label")`)), "amplification "+ratio)
			require.Contains(t, browser.Run(b, chromedp.Text(chromedp.CSS(`#amp .amp-tenant[data-tenant="acme"] .amp-head`))),
				"20 first, 10 retries, 5 refused")

			const chart = `#amp svg[data-tenant="acme"]`
			points := browser.Run(b, chromedp.Evaluate[map[string]string](
				`Object.fromEntries([...document.querySelectorAll('`+chart+` path')].map(p => [p.dataset.series, p.dataset.points]))`))
			require.Equal(t, "60", points["attempts"], "one point a minute for the hour")
			require.Equal(t, "60", points["first"])
			require.Equal(t, "60", points["refused"])
			// The ratio has a point per minute with attempts: one, or two
			// when the sends straddled a minute.
			require.Contains(t, []string{"1", "2"}, points["amplification"])
			label := browser.Run(b, chromedp.Evaluate[string](`document.querySelector('`+chart+`').getAttribute("aria-label")`))
			require.Contains(t, label, "20 first attempts, 10 retries admitted, 5 refused")
			require.Equal(t, "img", browser.Run(b, chromedp.Evaluate[string](`document.querySelector('`+chart+`').getAttribute("role")`)))

			// The table of minutes counts what was sent.
			sums := browser.Run(b, chromedp.Evaluate[[]int](`(() => {
				const s = [0, 0, 0];
				for (const tr of document.querySelectorAll('#amp table[data-tenant="acme"] tbody tr'))
					[1, 2, 3].forEach((c, i) => { s[i] += Number(tr.children[c].textContent); });
				return s;
			})()`))
			require.Equal(t, []int{20, 10, 5}, sums)
			require.Contains(t, browser.Run(b, chromedp.Text(chromedp.CSS("#amp-note"))), "replica")
			b.Screenshot("retry-amplification")

			// A tenant's own token: no section (the endpoint is scope admin).
			b.Do(
				chromedp.Click(chromedp.CSS("#signout")),
				dashSignIn(acme),
				chromedp.WaitVisible(chromedp.CSS(`#dash[data-mode="tenant"][data-loaded="1"]`)),
			)
			require.True(t, browser.Run(b, chromedp.Evaluate[bool](`document.querySelector("#amp").hidden`)))
			b.RequireNoConsoleErrors()
			b.RequireLoopbackOnly()
		})
	}
}
