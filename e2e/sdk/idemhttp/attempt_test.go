package idemhttp_test

import (
	"bufio"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/client/idemhttp"
	"github.com/idem-dev/idem/testkit/servertest"
)

// attempts sums the server's idem_attempts_total of tenant by attempt
// (first|retry) and cause.
func attempts(t *testing.T, srv *servertest.Server, tenant string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(srv.URL() + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, "idem_attempts_total{")
		if !ok || !strings.Contains(rest, `tenant="`+tenant+`"`) {
			continue
		}
		labels, value, _ := strings.Cut(rest, "} ")
		var attempt, cause string
		for _, l := range strings.Split(labels, ",") {
			k, v, _ := strings.Cut(l, "=")
			v = strings.Trim(v, `"`)
			switch k {
			case "attempt":
				attempt = v
			case "cause":
				cause = v
			}
		}
		f, err := strconv.ParseFloat(value, 64)
		require.NoError(t, err, line)
		out[attempt+"/"+cause] += f
	}
	require.NoError(t, sc.Err())
	return out
}

// TestMiddlewareForwardsIdemAttempt (the retry contract's Idem-Attempt,
// issue 28): a caller's retry that arrives through the middleware with
// Idem-Attempt: 2;cause=timeout is claimed as that retry, so idem's fleet
// retry budget counts it (idem_attempts_total{attempt="retry"} with the
// caller's cause); a missing or unparsable field is a first attempt, never
// an error, and the request is served either way. Before, every claim of
// the middleware said Idem-Attempt: 1, and the retries of its callers were
// invisible to the budget.
func TestMiddlewareForwardsIdemAttempt(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, srv *servertest.Server, c *client.Client) {
		a := newApp(t, c, idemhttp.Options{})
		url := a.srv.URL + "/orders/cus_1"
		before := attempts(t, srv, "shop")

		for i, h := range []string{"2;cause=timeout", "3; cause=unavailable;x=1", "", "abc", "0", "2;cause=\"timeout\"", "1"} {
			header := http.Header{}
			if h != "" {
				header.Set(client.HeaderAttempt, h)
			}
			got := postWith(t, url, "attempt-"+strconv.Itoa(i), `{}`, header)
			require.Equal(t, http.StatusCreated, got.status, "Idem-Attempt %q: %s", h, got.body)
		}
		require.EqualValues(t, 7, a.orders.Load())

		after := attempts(t, srv, "shop")
		delta := func(k string) float64 { return after[k] - before[k] }
		require.Equal(t, 1.0, delta("retry/timeout"), "the caller's retry after a timeout: %v", after)
		require.Equal(t, 1.0, delta("retry/unavailable"), "%v", after)
		// "2;cause=\"timeout\"": a retry whose cause is not a Token (a
		// String): a retry without a cause the budget names.
		require.Equal(t, 1.0, delta("retry/other"), "%v", after)
		retries := 0.0
		for k := range after {
			if strings.HasPrefix(k, "retry/") {
				retries += delta(k)
			}
		}
		require.Equal(t, 3.0, retries, "absent, unparsable, 0 and 1 are first attempts: %v", after)
	})
}
