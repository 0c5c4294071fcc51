package webhooks_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/postgres"
	"github.com/idem-dev/idem/postgres/pgtest"
	"github.com/idem-dev/idem/sqlite"
	"github.com/idem-dev/idem/webhooks"
)

// store is a store under test and a way to open another handle (replica)
// on the same database. Both run on the database clock: the deliverer's
// retries wait in real (short) time.
type store interface {
	idem.Store
	idem.WebhookStore
}

func forEachBackend(t *testing.T, fn func(t *testing.T, open func(t *testing.T) store)) {
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "idem.db")
		fn(t, func(t *testing.T) store {
			s, err := sqlite.Open(context.Background(), path, sqlite.Options{})
			require.NoError(t, err)
			t.Cleanup(func() { _ = s.Close() })
			return s
		})
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		url := pgtest.URL(t)
		fn(t, func(t *testing.T) store {
			s, err := postgres.Open(context.Background(), url, postgres.Options{})
			require.NoError(t, err)
			t.Cleanup(func() { _ = s.Close() })
			return s
		})
	})
}

// verify checks a Standard Webhooks request the way a receiver would,
// written apart from webhooks.Sign: the secret's base64 key, HMAC-SHA256 of
// "id.timestamp.body", any of the space-separated "v1,<base64>" entries,
// and a timestamp within five minutes.
func verify(secret string, h http.Header, body []byte) error {
	id, ts, sigs := h.Get("Webhook-Id"), h.Get("Webhook-Timestamp"), h.Get("Webhook-Signature")
	if id == "" || ts == "" || sigs == "" {
		return fmt.Errorf("missing webhook headers")
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("bad timestamp %q", ts)
	}
	if d := time.Since(time.Unix(sec, 0)); d > 5*time.Minute || d < -5*time.Minute {
		return fmt.Errorf("timestamp %s too far from now", ts)
	}
	key, err := base64.StdEncoding.DecodeString(secret[len("whsec_"):])
	if err != nil {
		return err
	}
	mac := hmac.New(sha256.New, key)
	fmt.Fprintf(mac, "%s.%s.%s", id, ts, body)
	want := mac.Sum(nil)
	for _, s := range strings.Fields(sigs) {
		v, b64, ok := strings.Cut(s, ",")
		if !ok || v != "v1" {
			continue
		}
		got, err := base64.StdEncoding.DecodeString(b64)
		if err == nil && hmac.Equal(got, want) {
			return nil
		}
	}
	return fmt.Errorf("no valid signature")
}

// receiver is a loopback webhook receiver that verifies every request and
// answers per a script: the n-th request (from 0) gets script(n).
type receiver struct {
	*httptest.Server
	secret string
	mu     sync.Mutex
	// byID counts requests per webhook-id; acked counts 2xx answers.
	byID  map[string]int
	acked map[string]int
	bad   []error
	n     int
}

// answer is what the receiver does with one request.
type answer struct {
	status int
	// hang holds the request this long before answering (a timeout).
	hang time.Duration
}

func newReceiver(t *testing.T, script func(n int) answer) *receiver {
	r := &receiver{byID: map[string]int{}, acked: map[string]int{}}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		n := r.n
		r.n++
		id := req.Header.Get("Webhook-Id")
		r.byID[id]++
		if err := verify(r.secret, req.Header, body); err != nil {
			r.bad = append(r.bad, err)
		}
		r.mu.Unlock()
		a := script(n)
		if a.hang > 0 {
			select {
			case <-time.After(a.hang):
			case <-req.Context().Done():
				return
			}
		}
		if a.status/100 == 2 {
			r.mu.Lock()
			r.acked[id]++
			r.mu.Unlock()
		}
		w.WriteHeader(a.status)
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *receiver) snapshot() (byID, acked map[string]int, total int, bad []error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	byID, acked = map[string]int{}, map[string]int{}
	for k, v := range r.byID {
		byID[k] = v
	}
	for k, v := range r.acked {
		acked[k] = v
	}
	return byID, acked, r.n, append([]error(nil), r.bad...)
}

// register creates tenant "acme" (if needed) and an endpoint at r.
func register(t *testing.T, s store, r *receiver) idem.WebhookEndpoint {
	t.Helper()
	ctx := context.Background()
	if _, err := s.GetTenant(ctx, "acme"); err != nil {
		_, err := s.CreateTenant(ctx, idem.CreateTenantParams{ID: "acme", Name: "acme", Settings: idem.DefaultSettings()})
		require.NoError(t, err)
	}
	e, err := s.CreateWebhookEndpoint(ctx, idem.WebhookEndpoint{
		TenantID: "acme", ID: idem.NewWebhookEndpointID(), URL: r.URL + "/hook", Secret: idem.NewWebhookSecret(), Enabled: true,
	})
	require.NoError(t, err)
	r.secret = e.Secret
	return e
}

// testEvent queues one test event for e and returns its webhook-id.
func testEvent(t *testing.T, s store, e idem.WebhookEndpoint) string {
	t.Helper()
	ev, err := idem.NewEvent(e.TenantID, idem.EventWebhookTest, time.Now(), map[string]int{"n": 1})
	require.NoError(t, err)
	_, err = s.SendTestEvent(context.Background(), e.ID, ev)
	require.NoError(t, err)
	return ev.ID
}

// fastConfig retries within milliseconds and allows loopback.
func fastConfig() webhooks.Config {
	return webhooks.Config{
		Interval: 20 * time.Millisecond, Timeout: 300 * time.Millisecond, Lease: 2 * time.Second,
		RetryBase: 20 * time.Millisecond, RetryCap: 100 * time.Millisecond, MaxAge: time.Hour,
		AllowPrivate: true,
	}
}

// run runs a deliverer until the test ends.
func run(t *testing.T, d *webhooks.Deliverer) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = d.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// logOf returns the endpoint's delivery log.
func logOf(t *testing.T, s store, e idem.WebhookEndpoint) []idem.WebhookDelivery {
	t.Helper()
	ds, err := s.ListWebhookDeliveries(context.Background(), idem.ListWebhookDeliveriesParams{TenantID: e.TenantID, EndpointID: e.ID, Limit: 1000})
	require.NoError(t, err)
	return ds
}

// A receiver that fails twice, times out once and then recovers gets the
// event four times, every time with the same webhook-id and a valid
// signature, and the log says delivered after four attempts.
func TestDeliveryRetriesUntilReceiverRecovers(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) store) {
		s := open(t)
		r := newReceiver(t, func(n int) answer {
			switch n {
			case 0:
				return answer{status: 500}
			case 1:
				return answer{status: 503}
			case 2:
				return answer{status: 200, hang: 2 * time.Second} // past the 300 ms timeout
			}
			return answer{status: 204}
		})
		e := register(t, s, r)
		id := testEvent(t, s, e)
		run(t, webhooks.New(s, fastConfig(), nil))

		require.Eventually(t, func() bool { return logOf(t, s, e)[0].State == idem.DeliveryDelivered }, 20*time.Second, 20*time.Millisecond)
		byID, acked, total, bad := r.snapshot()
		require.Empty(t, bad, "every request carries a valid signature")
		require.Equal(t, map[string]int{id: 4}, byID, "same webhook-id on every attempt")
		require.Equal(t, 4, total)
		require.Equal(t, 1, acked[id])
		log := logOf(t, s, e)[0]
		require.Equal(t, 4, log.Attempts)
		require.Equal(t, 204, log.LastStatus)
	})
}

// Events the store queued with state changes (a refused stale write) go
// out signed, with the Standard Webhooks payload.
func TestDeliveryOfLeaseLost(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) store) {
		s := open(t)
		var mu sync.Mutex
		var bodies []string
		r := newReceiver(t, func(int) answer { return answer{status: 200} })
		inner := r.Config.Handler
		r.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			body, _ := io.ReadAll(req.Body)
			mu.Lock()
			bodies = append(bodies, string(body))
			mu.Unlock()
			req.Body = io.NopCloser(strings.NewReader(string(body)))
			inner.ServeHTTP(w, req)
		})
		e := register(t, s, r)
		ctx := context.Background()
		rec, err := s.Claim(ctx, idem.ClaimParams{TenantID: "acme", Key: "k", Operation: "op", Fingerprint: "fp", Lease: time.Minute, ReplayWindow: time.Hour, ReaperThreshold: time.Hour})
		require.NoError(t, err)
		err = s.Release(ctx, idem.ReleaseParams{TenantID: "acme", Key: "k", FencingToken: rec.Record.FencingToken - 1})
		require.ErrorIs(t, err, idem.ErrLeaseLost)
		run(t, webhooks.New(s, fastConfig(), nil))
		require.Eventually(t, func() bool { return logOf(t, s, e)[0].State == idem.DeliveryDelivered }, 10*time.Second, 20*time.Millisecond)
		_, _, _, bad := r.snapshot()
		require.Empty(t, bad)
		mu.Lock()
		defer mu.Unlock()
		require.Len(t, bodies, 1)
		require.Contains(t, bodies[0], `"type":"key.lease_lost"`)
		require.Contains(t, bodies[0], `"write":"release"`)
	})
}

// Without AllowPrivate nothing is sent to a loopback receiver, even though
// the URL got into the store: the address is checked at connect time.
func TestDeliveryRefusesPrivateTarget(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) store) {
		s := open(t)
		r := newReceiver(t, func(int) answer { return answer{status: 200} })
		e := register(t, s, r)
		testEvent(t, s, e)
		cfg := fastConfig()
		cfg.AllowPrivate = false
		d := webhooks.New(s, cfg, nil)
		n, err := d.DeliverOnce(context.Background())
		require.NoError(t, err)
		require.Equal(t, 1, n)
		_, _, total, _ := r.snapshot()
		require.Zero(t, total, "the loopback receiver was reached")
		log := logOf(t, s, e)[0]
		require.Equal(t, idem.DeliveryPending, log.State)
		require.Contains(t, log.LastError, "private address")
		require.NotContains(t, log.LastError, r.URL, "the log holds no URL")
	})
}

// An endpoint whose attempts keep failing is disabled once the streak is
// long and old enough, and gets nothing more.
func TestDeliveryDisablesFailingEndpoint(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) store) {
		s := open(t)
		r := newReceiver(t, func(int) answer { return answer{status: 500} })
		e := register(t, s, r)
		testEvent(t, s, e)
		cfg := fastConfig()
		cfg.DisableAfter, cfg.DisableMinFailures = time.Millisecond, 3
		run(t, webhooks.New(s, cfg, nil))
		require.Eventually(t, func() bool {
			got, err := s.GetWebhookEndpoint(context.Background(), "acme", e.ID)
			require.NoError(t, err)
			return !got.Enabled
		}, 10*time.Second, 20*time.Millisecond)
		got, err := s.GetWebhookEndpoint(context.Background(), "acme", e.ID)
		require.NoError(t, err)
		require.Equal(t, "sustained_failure", got.DisabledReason)
		require.GreaterOrEqual(t, got.ConsecutiveFailures, 3)
		_, _, before, _ := r.snapshot()
		time.Sleep(300 * time.Millisecond) // several poll intervals
		_, _, after, _ := r.snapshot()
		require.Equal(t, before, after, "a disabled endpoint got more attempts")
	})
}

// Two replicas' deliverers on one PostgreSQL database deliver each of many
// events exactly once when nothing fails (SKIP LOCKED claims).
func TestTwoReplicasDeliverEachEventOnce(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	open := func() store {
		s, err := postgres.Open(context.Background(), url, postgres.Options{})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	a, b := open(), open()
	r := newReceiver(t, func(int) answer { return answer{status: 200} })
	e := register(t, a, r)
	const events = 200
	ids := map[string]bool{}
	for range events {
		ids[testEvent(t, a, e)] = true
	}
	cfg := fastConfig()
	cfg.BatchSize = 5
	run(t, webhooks.New(a, cfg, nil))
	run(t, webhooks.New(b, cfg, nil))
	require.Eventually(t, func() bool {
		_, acked, _, _ := r.snapshot()
		return len(acked) == events
	}, 30*time.Second, 20*time.Millisecond)
	byID, _, total, bad := r.snapshot()
	require.Empty(t, bad)
	require.Equal(t, events, total, "some event was delivered twice")
	for id, n := range byID {
		require.True(t, ids[id])
		require.Equal(t, 1, n)
	}
}
