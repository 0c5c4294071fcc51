package web_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/server"
	"github.com/idem-dev/idem/testkit/browser"
	"github.com/idem-dev/idem/testkit/servertest"
)

// The dashboard shows the keys idem's completer holds (unknown) or gave up
// on (review), in the list and in the key's panel with its attempts in the
// audit trail (issue 24).
func TestDashboardShowsCompleterStates(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{servertest.BackendSQLite, servertest.BackendPostgres} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			// The endpoint cannot tell about "u-key" (ask again in an hour)
			// and asks a person about "r-key".
			ep := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				var call struct{ Key string }
				_ = json.Unmarshal(b, &call)
				w.Header().Set("Content-Type", "application/json")
				if call.Key == "r-key" {
					_, _ = io.WriteString(w, `{"outcome":"review","note":"charged twice? check the PSP"}`)
					return
				}
				_, _ = io.WriteString(w, `{"outcome":"unknown","retry_after_seconds":3600}`)
			}))
			t.Cleanup(ep.Close)
			srv := servertest.Start(t, servertest.Options{Backend: backend, Tenants: []string{"acme"}, Configure: func(c *server.Config) {
				c.Webhooks.AllowPrivate = true
				c.Completer.Interval = 100 * time.Millisecond
				c.Completer.BackoffCap = 2 * time.Hour
			}})
			writer := srv.Token(t, "acme", "keys:write")
			admin := srv.Token(t, "acme", "keys:read tenant:admin")
			require.Equal(t, http.StatusCreated, dashCall(t, srv, admin, "POST", "/v1/completers", map[string]any{"url": ep.URL + "/resume"}, nil))
			dashClaimKey(t, srv, writer, "u-key", 1)
			dashClaimKey(t, srv, writer, "r-key", 1)
			for _, f := range []string{"unknown", "review"} {
				require.Eventually(t, func() bool {
					var page struct{ Items []any }
					dashCall(t, srv, admin, "GET", "/v1/keys?completer="+f, nil, &page)
					return len(page.Items) == 1
				}, 15*time.Second, 50*time.Millisecond, f)
			}

			b := browser.New(t)
			b.Do(
				chromedp.Navigate(srv.URL()+"/dashboard/"),
				dashSignIn(admin),
				chromedp.WaitVisible(chromedp.CSS(`#keys-body tr[data-key="u-key"][data-completer="unknown"]`)),
				chromedp.WaitVisible(chromedp.CSS(`#keys-body tr[data-key="r-key"][data-completer="review"]`)),
			)
			cells := browser.Run(b, chromedp.Evaluate[[]string](
				`[...document.querySelectorAll("#keys-body tr")].map(r => r.dataset.key + ":" + r.querySelector(".completer-cell").textContent)`))
			require.ElementsMatch(t, []string{"u-key:unknown · 1 attempt", "r-key:review · 1 attempt"}, cells)

			b.ClickNow(`#keys-body tr[data-key="r-key"]`)
			b.Do(chromedp.WaitVisible(chromedp.CSS(`#record[data-key="r-key"][data-audit="1"]`)))
			field := browser.Run(b, chromedp.Text(chromedp.CSS(`#record-fields dd[data-field="completer"]`)))
			require.Contains(t, field, "review, 1 attempt: a person must release or complete it")
			require.Contains(t, browser.Run(b, chromedp.Text(chromedp.CSS("#record-review"))), "charged twice? check the PSP")
			rows := browser.Run(b, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#audit-body tr")].map(r => r.dataset.action + ":" + r.cells[4].textContent)`))
			require.Equal(t, []string{"completer_review:charged twice? check the PSP"}, rows)
			require.True(t, strings.HasPrefix(browser.Run(b, chromedp.Text(chromedp.CSS(`#audit-body tr td:nth-child(3)`))), "completer:"))
		})
	}
}
