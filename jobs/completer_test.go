package jobs_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/jobs"
	"github.com/idem-dev/idem/postgres"
	"github.com/idem-dev/idem/sqlite"
	"github.com/idem-dev/idem/testkit/pgtest"
)

// forEachRealClock runs fn against both stores on their own clocks (the
// completer job reckons the database's time from the pick's instant and
// the time its call took, so a frozen test clock would mislead it).
func forEachRealClock(t *testing.T, fn func(t *testing.T, s idem.Driver)) {
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		s, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "idem.db"), sqlite.Options{})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		fn(t, s)
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		s, err := postgres.Open(context.Background(), pgtest.URL(t), postgres.Options{})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		fn(t, s)
	})
}

// Unknown attempts are bounded by attempts and the deadline, the pause is a
// full jitter under the doubling ceiling, never under the endpoint's
// retry_after.
func TestCompleterNextAttempt(t *testing.T) {
	t.Parallel()
	p := jobs.CompleterConfig{MaxAttempts: 4, BackoffBase: time.Second, BackoffCap: 8 * time.Second}
	now := time.Date(2026, 12, 1, 23, 0, 0, 0, time.UTC)
	deadline := now.Add(time.Hour)
	for attempt := 1; attempt < 4; attempt++ {
		for range 100 {
			wait, review := p.NextAttempt(attempt, now, deadline, 0)
			require.False(t, review)
			require.Positive(t, wait)
			require.LessOrEqual(t, wait, time.Second<<(attempt-1)+time.Millisecond)
		}
	}
	_, review := p.NextAttempt(4, now, deadline, 0)
	require.True(t, review, "the attempts are used up")
	wait, review := p.NextAttempt(1, now, deadline, 30*time.Second)
	require.False(t, review)
	require.GreaterOrEqual(t, wait, 30*time.Second, "retry_after lengthens the pause")
	_, review = p.NextAttempt(1, now, now.Add(10*time.Millisecond), 0)
	_, review2 := p.NextAttempt(1, now, now, 0)
	require.True(t, review || review2, "the next attempt would fall past the deadline")
}

// A resume endpoint that is still at work when the completer's call times
// out (the SDKs' handlers keep running the function until the call's
// lease_expires_at) must not be called again, under a new token, before
// that lease ran out: the next attempt is due no sooner, whatever the
// backoff, so two runs of the work never overlap.
func TestCompleterTimedOutAttemptWaitsOutItsLease(t *testing.T) {
	t.Parallel()
	forEachRealClock(t, func(t *testing.T, s idem.Driver) {
		ctx := context.Background()
		createTenant(t, s, "acme")
		release := make(chan struct{})
		var mu sync.Mutex
		var calls []time.Time // each call's lease_expires_at
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var call struct {
				LeaseExpiresAt time.Time `json:"lease_expires_at"`
			}
			_ = json.NewDecoder(r.Body).Decode(&call)
			mu.Lock()
			calls = append(calls, call.LeaseExpiresAt)
			mu.Unlock()
			<-release // the function is still running after the completer hung up
		}))
		t.Cleanup(srv.Close)
		t.Cleanup(func() { close(release) })
		_, err := s.Completers().CreateCompleter(ctx, idem.Completer{
			TenantID: "acme", ID: idem.NewCompleterID(), URL: srv.URL + "/resume", Secret: idem.NewWebhookSecret(),
		})
		require.NoError(t, err)
		_, err = s.Claim(ctx, idem.ClaimParams{
			TenantID: "acme", Key: "k", Operation: "POST /v1/payments", Fingerprint: "fp-k",
			Lease: time.Millisecond, ReplayWindow: time.Minute, ReaperThreshold: time.Hour,
		})
		require.NoError(t, err)

		job := jobs.NewCompleter(s.Completers(), s, jobs.CompleterConfig{
			Timeout: 200 * time.Millisecond, Lease: time.Minute, StoreTimeout: 5 * time.Second,
			BackoffBase: time.Millisecond, BackoffCap: time.Millisecond, AllowPrivate: true,
		}, nil, nil)
		// Wait for the claim's 1 ms lease to run out: the first pass that
		// picks the orphan calls the endpoint, gives up after the timeout
		// and records the outcome unknown.
		require.Eventually(t, func() bool {
			n, err := job.RunOnce(ctx)
			require.NoError(t, err)
			return n == 1
		}, 10*time.Second, 10*time.Millisecond)

		mu.Lock()
		require.Len(t, calls, 1)
		leaseEnd := calls[0]
		mu.Unlock()
		rec, err := s.GetRecord(ctx, idem.GetRecordParams{TenantID: "acme", Key: "k"})
		require.NoError(t, err)
		require.NotNil(t, rec.Completion)
		require.Equal(t, idem.CompletionUnknown, rec.Completion.State)
		require.False(t, rec.Completion.NextAttemptAt.Before(leaseEnd),
			"the next attempt (%s) waits out the timed-out attempt's lease (%s)", rec.Completion.NextAttemptAt, leaseEnd)
		n, err := job.RunOnce(ctx)
		require.NoError(t, err)
		require.Zero(t, n, "no second attempt beside the first")
		mu.Lock()
		require.Len(t, calls, 1, "one call while the first may still run")
		mu.Unlock()
	})
}

// One tenant's backlog of orphans behind a hanging resume endpoint must
// not starve another tenant: the other tenant's single orphan is resumed
// while every call to the hanging endpoint is still open, and the hanging
// tenant never holds more than its share of the replica's attempts.
func TestCompleterTenantBacklogDoesNotStarveOthers(t *testing.T) {
	t.Parallel()
	forEachRealClock(t, func(t *testing.T, s idem.Driver) {
		ctx, cancel := context.WithCancel(context.Background())
		createTenant(t, s, "hog")
		createTenant(t, s, "calm")
		var mu sync.Mutex
		open, maxOpen := 0, 0
		stop := make(chan struct{})
		hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			open++
			maxOpen = max(maxOpen, open)
			mu.Unlock()
			select { // hangs until the completer hangs up or the test ends
			case <-r.Context().Done():
			case <-stop:
			}
			mu.Lock()
			open--
			mu.Unlock()
		}))
		t.Cleanup(hang.Close)
		t.Cleanup(func() { close(stop) })
		fine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"outcome":"completed","response":{"status":201,"headers":{},"body":"ok"}}`))
		}))
		t.Cleanup(fine.Close)
		for tenant, url := range map[string]string{"hog": hang.URL, "calm": fine.URL} {
			_, err := s.Completers().CreateCompleter(ctx, idem.Completer{
				TenantID: tenant, ID: idem.NewCompleterID(), URL: url + "/resume", Secret: idem.NewWebhookSecret(),
			})
			require.NoError(t, err)
		}
		orphan := func(tenant, key string) {
			_, err := s.Claim(ctx, idem.ClaimParams{
				TenantID: tenant, Key: key, Operation: "POST /v1/payments", Fingerprint: "fp-" + key,
				Lease: time.Millisecond, ReplayWindow: time.Minute, ReaperThreshold: time.Hour,
			})
			require.NoError(t, err)
		}
		// The hog's orphans have the oldest leases: an oldest-first pick
		// without a per-tenant bound takes only them.
		for i := range 20 {
			orphan("hog", fmt.Sprintf("h%02d", i))
		}
		orphan("calm", "c")

		const concurrency = 4
		job := jobs.NewCompleter(s.Completers(), s, jobs.CompleterConfig{
			Concurrency: concurrency, Interval: 10 * time.Millisecond,
			Timeout: 10 * time.Minute, Lease: 20 * time.Minute, StoreTimeout: 5 * time.Second, AllowPrivate: true,
		}, nil, nil)
		done := make(chan struct{})
		go func() { defer close(done); _ = job.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })

		require.Eventually(t, func() bool {
			rec, err := s.GetRecord(ctx, idem.GetRecordParams{TenantID: "calm", Key: "c"})
			require.NoError(t, err)
			return rec.State == idem.StateCompleted
		}, 30*time.Second, 10*time.Millisecond, "the calm tenant's orphan is resumed while the hog's calls hang")
		rec, err := s.GetRecord(ctx, idem.GetRecordParams{TenantID: "calm", Key: "c"})
		require.NoError(t, err)
		require.Equal(t, "ok", string(rec.Response.Body), "one full stored answer")
		mu.Lock()
		defer mu.Unlock()
		require.LessOrEqual(t, maxOpen, concurrency/2, "the hog holds at most its share of the attempts")
	})
}
