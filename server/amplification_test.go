package server_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/retrybudget"
)

// amplificationAnswer is GET /v1/admin/retry-amplification, decoded.
type amplificationAnswer struct {
	WindowSeconds float64 `json:"window_seconds"`
	BucketSeconds int64   `json:"bucket_seconds"`
	Tenants       []struct {
		Tenant        string  `json:"tenant"`
		Amplification float64 `json:"amplification"`
		Window        struct {
			FirstAttempts int64 `json:"first_attempts"`
			Retries       int64 `json:"retries"`
			Refused       int64 `json:"refused"`
		} `json:"window"`
		Buckets []struct {
			Start         time.Time `json:"start"`
			FirstAttempts int64     `json:"first_attempts"`
			Retries       int64     `json:"retries"`
			Refused       int64     `json:"refused"`
			Amplification float64   `json:"amplification"`
		} `json:"buckets"`
	} `json:"tenants"`
}

func getAmplification(t *testing.T, m *apiClient, token, query string) (int, amplificationAnswer) {
	t.Helper()
	status, body, _ := m.call(t, http.MethodGet, "/v1/admin/retry-amplification"+query, token, "")
	var out amplificationAnswer
	if status == http.StatusOK {
		raw, err := json.Marshal(body)
		require.NoError(t, err)
		require.NoError(t, json.Unmarshal(raw, &out))
	}
	return status, out
}

// TestRetryAmplificationHistory: through real HTTP on both stores, the
// admin endpoint's last hour counts exactly the first attempts, admitted
// retries and refused retries sent (summed over the buckets, whichever
// minute boundary the test straddles), its window agrees with the
// amplification gauge, an unseen tenant reads as 60 empty minutes, and it
// needs scope admin. Every answer is checked against openapi.yaml.
func TestRetryAmplificationHistory(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, backend string) {
		ts := startBudgeted(t, backend, "", map[string]int{"acme": 0, "beta": 10})
		start := time.Now()
		acme := newAttemptClient(t, ts, "acme")
		for i := range 30 {
			require.Equal(t, http.StatusCreated, acme.claim(t, fmt.Sprintf("first-%d", i), "").status)
		}
		// retry_budget_percent 0: the floor (10) admitted, the rest refused.
		for i := range 15 {
			a := acme.claim(t, fmt.Sprintf("retry-%d", i), "2;cause=unavailable")
			if i < retrybudget.Floor {
				require.Equal(t, http.StatusCreated, a.status)
			} else {
				requireRefused(t, a)
			}
		}
		beta := newAttemptClient(t, ts, "beta")
		for i := range 3 {
			require.Equal(t, http.StatusCreated, beta.claim(t, fmt.Sprintf("b-%d", i), "1").status)
		}

		m := newAPIClient(t, ts)
		operator := ts.Token(t, "", "admin")
		status, got := getAmplification(t, m, operator, "?tenant=acme")
		require.Equal(t, http.StatusOK, status)
		require.Equal(t, int64(60), got.BucketSeconds)
		require.Equal(t, time.Hour.Seconds(), got.WindowSeconds)
		require.Len(t, got.Tenants, 1)
		a := got.Tenants[0]
		require.Equal(t, "acme", a.Tenant)
		require.Len(t, a.Buckets, retrybudget.HistoryBuckets)
		var first, retries, refused int64
		for i, b := range a.Buckets {
			first += b.FirstAttempts
			retries += b.Retries
			refused += b.Refused
			if i > 0 {
				require.Equal(t, time.Minute, b.Start.Sub(a.Buckets[i-1].Start), "consecutive minutes, oldest first")
			}
		}
		last := a.Buckets[len(a.Buckets)-1].Start
		require.False(t, last.After(time.Now()), "the last bucket is the current minute")
		require.True(t, last.After(start.Add(-time.Minute)))
		require.Equal(t, [3]int64{30, 10, 5}, [3]int64{first, retries, refused}, "the buckets count what was sent")
		require.Equal(t, [3]int64{30, 10, 5}, [3]int64{a.Window.FirstAttempts, a.Window.Retries, a.Window.Refused})
		require.InDelta(t, 45.0/30, a.Amplification, 1e-9)
		require.InDelta(t, m.metric(t, `idem_retry_amplification_ratio{tenant="acme"}`), a.Amplification, 1e-9)

		// Every tenant seen, in id order.
		status, all := getAmplification(t, m, operator, "")
		require.Equal(t, http.StatusOK, status)
		require.Len(t, all.Tenants, 2)
		require.Equal(t, "acme", all.Tenants[0].Tenant)
		require.Equal(t, "beta", all.Tenants[1].Tenant)
		require.InDelta(t, 1.0, all.Tenants[1].Amplification, 1e-9)
		require.Equal(t, int64(3), all.Tenants[1].Window.FirstAttempts)

		// A tenant this replica has not seen: an hour of zeros.
		status, none := getAmplification(t, m, operator, "?tenant=nobody")
		require.Equal(t, http.StatusOK, status)
		require.Len(t, none.Tenants, 1)
		require.Len(t, none.Tenants[0].Buckets, retrybudget.HistoryBuckets)
		for _, b := range none.Tenants[0].Buckets {
			require.Zero(t, b.FirstAttempts+b.Retries+b.Refused)
		}
		require.Zero(t, none.Tenants[0].Amplification)

		// Bad input and the wrong scope are problems.
		status, _ = getAmplification(t, m, operator, "?tenant=Not%20an%20id")
		require.Equal(t, http.StatusBadRequest, status)
		status, _ = getAmplification(t, m, ts.Token(t, "acme", "keys:read", "tenant:admin"), "")
		require.Equal(t, http.StatusForbidden, status)
	})
}

// TestRetryAmplificationPerReplica: two replicas on one database answer
// with their own counts, as openapi.yaml says: the replica that served the
// requests shows them, the other shows an hour of zeros and no tenant.
func TestRetryAmplificationPerReplica(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, backend string) {
		a := startBudgeted(t, backend, "", map[string]int{"acme": 10})
		b := startBudgeted(t, "", a.Config().DatabaseURL, nil)
		ca := newAttemptClient(t, a, "acme")
		for i := range 5 {
			require.Equal(t, http.StatusCreated, ca.claim(t, fmt.Sprintf("k-%d", i), "").status)
		}
		require.Equal(t, http.StatusCreated, ca.claim(t, "k-retry", "2;cause=network").status)

		status, got := getAmplification(t, newAPIClient(t, a), a.Token(t, "", "admin"), "")
		require.Equal(t, http.StatusOK, status)
		require.Len(t, got.Tenants, 1)
		require.Equal(t, int64(5), got.Tenants[0].Window.FirstAttempts)
		require.Equal(t, int64(1), got.Tenants[0].Window.Retries)
		require.InDelta(t, 6.0/5, got.Tenants[0].Amplification, 1e-9)

		other := newAPIClient(t, b)
		status, got = getAmplification(t, other, b.Token(t, "", "admin"), "")
		require.Equal(t, http.StatusOK, status)
		require.Empty(t, got.Tenants, "the other replica saw none of it")
		status, got = getAmplification(t, other, b.Token(t, "", "admin"), "?tenant=acme")
		require.Equal(t, http.StatusOK, status)
		for _, k := range got.Tenants[0].Buckets {
			require.Zero(t, k.FirstAttempts+k.Retries+k.Refused)
		}
	})
}
