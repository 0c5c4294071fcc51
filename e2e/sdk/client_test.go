// Package sdk_test holds the tests of the Go SDK (module
// github.com/idem-dev/idem/client) that need a running idem server: the
// client against the real server wiring on both stores, through fault
// proxies, and the runnable examples. They live in the root module so the
// SDK module itself depends on nothing of the server; the middleware's
// such tests are in e2e/sdk/idemhttp.
package sdk_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/testkit/faultproxy"
	"github.com/idem-dev/idem/testkit/servertest"
)

var backends = []string{servertest.BackendSQLite, servertest.BackendPostgres}

type e2e struct {
	srv   *servertest.Server
	token string
}

func setupE2E(t *testing.T, backend string) e2e {
	t.Helper()
	srv := servertest.Start(t, servertest.Options{Backend: backend, Tenants: []string{"acme"}})
	return e2e{srv: srv, token: srv.Token(t, "acme", "keys:write", "tenant:admin")}
}

// fastPolicy keeps the real waits of the end-to-end tests short.
var fastPolicy = client.RetryPolicy{BaseDelay: 50 * time.Millisecond, RetryAfterJitter: 100 * time.Millisecond}

func (e e2e) client(t *testing.T, base string, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.New(base, append([]client.Option{client.WithToken(e.token), client.WithRetryPolicy(fastPolicy)}, opts...)...)
	require.NoError(t, err)
	return c
}

func forEachBackend(t *testing.T, test func(t *testing.T, e e2e)) {
	for _, b := range backends {
		t.Run(b, func(t *testing.T) {
			t.Parallel()
			test(t, setupE2E(t, b))
		})
	}
}

// waitState waits until the stored record of key is in state: a one-second
// lease runs out on the server's clock, which the test does not control.
func waitState(t *testing.T, c *client.Client, key string, state client.State) {
	t.Helper()
	require.Eventually(t, func() bool {
		rec, err := c.Get(context.Background(), key)
		return err == nil && rec.State == state
	}, 10*time.Second, 20*time.Millisecond, "key %s never became %s", key, state)
}

var confirmed = client.Response{Status: 201, Headers: map[string]string{"Content-Type": "application/json"}, Body: []byte(`{"id":"ord_1"}`)}

func TestE2EDroppedConnectionAfterComplete(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, e e2e) {
		ctx := context.Background()
		host := strings.TrimPrefix(e.srv.URL(), "http://")

		t.Run("retried inside Do", func(t *testing.T) {
			var once atomic.Bool
			proxy := faultproxy.Start(t, host, func(r *http.Request) bool {
				return strings.HasSuffix(r.URL.Path, "/complete") && once.CompareAndSwap(false, true)
			})
			c := e.client(t, proxy.URL())
			var ran atomic.Int64
			fn := func(ctx context.Context, claim *client.Claim) (client.Response, error) {
				ran.Add(1)
				return confirmed, nil
			}
			key, _ := client.Key("order-confirm", "drop-1")
			res, err := c.Do(ctx, key, client.Request{Operation: "POST /orders", Payload: map[string]any{"order": 1}}, fn)
			require.NoError(t, err)
			require.Equal(t, 1, proxy.Dropped(), "the server completed but the answer was lost")
			require.False(t, res.Replayed)
			res2, err := c.Do(ctx, key, client.Request{Operation: "POST /orders", Payload: map[string]any{"order": 1}}, fn)
			require.NoError(t, err)
			require.True(t, res2.Replayed)
			require.Equal(t, confirmed.Body, res2.Response.Body)
			require.Equal(t, confirmed.Status, res2.Response.Status)
			require.Equal(t, int64(1), ran.Load())
		})

		t.Run("caller retries Do", func(t *testing.T) {
			proxy := faultproxy.Start(t, host, func(r *http.Request) bool { return strings.HasSuffix(r.URL.Path, "/complete") })
			flaky := e.client(t, proxy.URL(), client.WithRetryPolicy(client.RetryPolicy{MaxAttempts: 1}))
			var ran atomic.Int64
			fn := func(ctx context.Context, claim *client.Claim) (client.Response, error) {
				ran.Add(1)
				return confirmed, nil
			}
			key, _ := client.Key("order-confirm", "drop-2")
			_, err := flaky.Do(ctx, key, client.Request{Payload: map[string]any{"order": 2}}, fn)
			require.Error(t, err, "the completion's answer was lost")
			require.Equal(t, client.CodeUnknown, client.ErrorCode(err))

			res, err := e.client(t, e.srv.URL()).Do(ctx, key, client.Request{Payload: map[string]any{"order": 2}}, fn)
			require.NoError(t, err)
			require.True(t, res.Replayed)
			require.Equal(t, confirmed.Body, res.Response.Body)
			require.Equal(t, int64(1), ran.Load())
		})
	})
}

func TestE2EConcurrentDoOneExecution(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, e e2e) {
		c := e.client(t, e.srv.URL())
		const callers = 8
		var ran atomic.Int64
		results := make([]client.Result, callers)
		errs := make([]error, callers)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range callers {
			wg.Go(func() {
				<-start
				results[i], errs[i] = c.Do(context.Background(), "pay-7", client.Request{Operation: "POST /pay", Payload: map[string]int{"amount": 7}, Lease: 3 * time.Second},
					func(ctx context.Context, claim *client.Claim) (client.Response, error) {
						ran.Add(1)
						time.Sleep(200 * time.Millisecond)
						return confirmed, nil
					})
			})
		}
		close(start)
		wg.Wait()
		require.Equal(t, int64(1), ran.Load(), "one execution")
		executed := 0
		for i := range callers {
			require.NoError(t, errs[i])
			require.Equal(t, confirmed.Body, results[i].Response.Body)
			if !results[i].Replayed {
				executed++
			}
		}
		require.Equal(t, 1, executed, "one caller ran the function, the others got the replay")
		rec, err := c.Get(context.Background(), "pay-7")
		require.NoError(t, err)
		require.Equal(t, client.StateCompleted, rec.State)
		require.Equal(t, 1, rec.Attempt)
	})
}

func TestE2ECrashResumesFromCheckpoint(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, e e2e) {
		ctx := context.Background()
		c := e.client(t, e.srv.URL())
		var charges, emails atomic.Int64
		crash := errors.New("process crashed")
		req := client.Request{Operation: "POST /checkout", Payload: map[string]int{"cart": 9}, Lease: time.Second}
		step := func(crashAfterCharge bool) func(ctx context.Context, claim *client.Claim) (client.Response, error) {
			return func(ctx context.Context, claim *client.Claim) (client.Response, error) {
				chargeID := "ch_1"
				if claim.RecoveryPoint() == "charged" {
					var data struct{ Charge string }
					require.NoError(t, json.Unmarshal(claim.RecoveryData(), &data))
					chargeID = data.Charge
				} else {
					charges.Add(1) // the external step
					if err := claim.Checkpoint(ctx, "charged", map[string]string{"charge": chargeID}); err != nil {
						return client.Response{}, err
					}
				}
				if crashAfterCharge {
					return client.Response{}, crash
				}
				emails.Add(1)
				return client.Response{Status: 200, Body: []byte(chargeID)}, nil
			}
		}
		_, err := c.Do(ctx, "checkout-9", req, step(true))
		require.ErrorIs(t, err, crash)
		require.NotErrorIs(t, err, client.ErrLeaseLost)

		rec, err := c.Get(ctx, "checkout-9")
		require.NoError(t, err)
		require.Equal(t, client.StateInFlight, rec.State, "the claim is left, not completed with a made-up response")

		// The next Do waits the lease out and takes the key over.
		res, err := c.Do(ctx, "checkout-9", req, step(false))
		require.NoError(t, err)
		require.True(t, res.Resumed)
		require.Equal(t, 2, res.Attempt)
		require.Equal(t, "ch_1", string(res.Response.Body))
		require.Equal(t, int64(1), charges.Load(), "the step before the checkpoint is not repeated")
		require.Equal(t, int64(1), emails.Load())
	})
}

func TestE2ENoSideEffectReleases(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, e e2e) {
		ctx := context.Background()
		c := e.client(t, e.srv.URL())
		declined := errors.New("card declined before charging")
		_, err := c.Do(ctx, "k-release", client.Request{}, func(ctx context.Context, claim *client.Claim) (client.Response, error) {
			return client.Response{}, errors.Join(client.ErrNoSideEffect, declined)
		})
		require.ErrorIs(t, err, declined)
		require.ErrorIs(t, err, client.ErrNoSideEffect)
		_, err = c.Get(ctx, "k-release")
		require.ErrorIs(t, err, client.ErrKeyNotFound)

		res, err := c.Do(ctx, "k-release", client.Request{}, func(ctx context.Context, claim *client.Claim) (client.Response, error) {
			return client.Response{Status: 204}, nil
		})
		require.NoError(t, err)
		require.False(t, res.Replayed)
		require.False(t, res.Resumed)
		require.Equal(t, 1, res.Attempt)
	})
}

func TestE2ELeaseKeeperAndLeaseLost(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, e e2e) {
		ctx := context.Background()
		c := e.client(t, e.srv.URL())
		other := e.client(t, e.srv.URL())

		// A function longer than its lease keeps the key: the keeper renews.
		// The function waits, on the stored record, until its first lease
		// (one second) has run out and a renewal moved the expiry past it.
		res, err := c.Do(ctx, "long", client.Request{Lease: time.Second}, func(ctx context.Context, claim *client.Claim) (client.Response, error) {
			first, err := c.Get(ctx, "long")
			require.NoError(t, err)
			require.Eventually(t, func() bool {
				rec, err := c.Get(ctx, "long")
				return err == nil && rec.State == client.StateInFlight &&
					rec.LeaseExpiresAt.After(first.LeaseExpiresAt) && time.Now().After(first.LeaseExpiresAt)
			}, 10*time.Second, 20*time.Millisecond, "the lease keeper renews the lease past its first expiry")
			_, err = other.Claim(ctx, "long", client.Request{})
			require.ErrorIs(t, err, client.ErrRequestInFlight, "the lease was renewed; no takeover")
			return confirmed, nil
		})
		require.NoError(t, err)
		require.False(t, res.Replayed)

		// A stale fencing token is ErrLeaseLost.
		first, err := c.Claim(ctx, "stale", client.Request{Lease: time.Second})
		require.NoError(t, err)
		waitState(t, c, "stale", client.StateOrphaned)
		second, err := other.Claim(ctx, "stale", client.Request{})
		require.NoError(t, err)
		require.True(t, second.Resumed)
		require.Greater(t, second.FencingToken, first.FencingToken)
		_, err = c.Complete(ctx, "stale", first.FencingToken, confirmed)
		require.ErrorIs(t, err, client.ErrLeaseLost)
		_, err = c.Checkpoint(ctx, "stale", first.FencingToken, "x", nil, 0)
		require.ErrorIs(t, err, client.ErrLeaseLost)
		require.ErrorIs(t, c.Release(ctx, "stale", first.FencingToken), client.ErrLeaseLost)
		_, err = other.Complete(ctx, "stale", second.FencingToken, confirmed)
		require.NoError(t, err)
		_, err = other.Complete(ctx, "stale", second.FencingToken, confirmed)
		require.NoError(t, err, "a repeated completion is a no-op")
		_, err = other.Complete(ctx, "stale", second.FencingToken, client.Response{Status: 500})
		require.ErrorIs(t, err, client.ErrAlreadyCompleted)
	})
}

func TestE2ETypedCalls(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, e e2e) {
		ctx := context.Background()
		c := e.client(t, e.srv.URL())

		_, err := c.Do(ctx, "typed-1", client.Request{Operation: "POST /a", Payload: map[string]int{"n": 1}}, func(ctx context.Context, claim *client.Claim) (client.Response, error) {
			return client.Response{Status: 200, Body: []byte{0xff, 0xfe}}, nil
		})
		require.NoError(t, err)
		_, err = c.Do(ctx, "typed-1", client.Request{Operation: "POST /a", Payload: map[string]int{"n": 2}}, func(ctx context.Context, claim *client.Claim) (client.Response, error) {
			t.Error("a mismatched request must not run")
			return client.Response{}, nil
		})
		require.ErrorIs(t, err, client.ErrFingerprintMismatch)
		var pe *client.Error
		require.ErrorAs(t, err, &pe)
		require.Equal(t, http.StatusUnprocessableEntity, pe.Status)
		require.False(t, pe.Retryable)

		rec, err := c.Get(ctx, "typed-1")
		require.NoError(t, err)
		require.Equal(t, client.StateCompleted, rec.State)
		require.Equal(t, "POST /a", rec.Operation)
		require.Equal(t, []byte{0xff, 0xfe}, rec.Response.Body, "binary bodies travel as base64")
		require.False(t, rec.ReplayUntil.IsZero())

		// A key with characters that need path escaping.
		odd := "a/b?c#d%e"
		cr, err := c.Claim(ctx, odd, client.Request{Fingerprint: "fp-1"})
		require.NoError(t, err)
		got, err := c.Get(ctx, odd)
		require.NoError(t, err)
		require.Equal(t, odd, got.Key)
		require.Equal(t, cr.FencingToken, got.FencingToken)

		page, err := c.List(ctx, client.ListOptions{State: client.StateInFlight, Limit: 10})
		require.NoError(t, err)
		require.Len(t, page.Items, 1)
		require.Equal(t, odd, page.Items[0].Key)

		tn, err := c.GetTenant(ctx)
		require.NoError(t, err)
		require.Equal(t, "acme", tn.ID)
		require.Equal(t, idem.DefaultSettings().LeaseSecondsDefault, tn.Settings.LeaseSecondsDefault)
		tn, err = c.UpdateTenant(ctx, client.TenantPatch{Settings: &client.SettingsPatch{LeaseSecondsDefault: client.Ptr(45)}})
		require.NoError(t, err)
		require.Equal(t, 45, tn.Settings.LeaseSecondsDefault)
		_, err = c.UpdateTenant(ctx, client.TenantPatch{Settings: &client.SettingsPatch{LeaseSecondsDefault: client.Ptr(-1)}})
		require.ErrorIs(t, err, client.ErrInvalidRequest)
		require.ErrorAs(t, err, &pe)
		require.NotEmpty(t, pe.Fields)

		// Operator endpoints.
		admin, err := client.New(e.srv.URL(), client.WithToken(e.srv.Token(t, "", "admin")))
		require.NoError(t, err)
		created, err := admin.CreateTenant(ctx, client.NewTenant{ID: "globex", Name: "Globex", Settings: &client.SettingsPatch{ReplayWindowSeconds: client.Ptr(60)}})
		require.NoError(t, err)
		require.Equal(t, 60, created.Settings.ReplayWindowSeconds)
		_, err = admin.CreateTenant(ctx, client.NewTenant{ID: "globex"})
		require.ErrorIs(t, err, client.ErrTenantExists)
		all, err := admin.ListTenants(ctx)
		require.NoError(t, err)
		require.Len(t, all, 2)
		upd, err := admin.AdminUpdateTenant(ctx, "globex", client.TenantPatch{Name: client.Ptr("Globex Corp")})
		require.NoError(t, err)
		require.Equal(t, "Globex Corp", upd.Name)
		require.NoError(t, admin.DisableTenant(ctx, "globex"))
		got2, err := admin.AdminGetTenant(ctx, "globex")
		require.NoError(t, err)
		require.True(t, got2.Disabled)
		_, err = admin.AdminGetTenant(ctx, "nope")
		require.ErrorIs(t, err, client.ErrTenantNotFound)
		require.NoError(t, admin.DeleteTenant(ctx, "globex"))
		_, err = admin.AdminGetTenant(ctx, "globex")
		require.ErrorIs(t, err, client.ErrTenantNotFound)
		require.ErrorIs(t, admin.DeleteTenant(ctx, "globex"), client.ErrTenantNotFound)

		_, err = c.Claim(ctx, "orphan-1", client.Request{Lease: time.Second})
		require.NoError(t, err)
		waitState(t, c, "orphan-1", client.StateOrphaned)
		orphans, err := admin.ListOrphans(ctx, client.OrphanListOptions{Tenant: "acme"})
		require.NoError(t, err)
		keys := []string{}
		for _, o := range orphans.Items {
			require.Equal(t, "acme", o.Tenant)
			keys = append(keys, o.Key)
		}
		require.Contains(t, keys, "orphan-1")

		// Auth errors are not retried.
		bad, err := client.New(e.srv.URL(), client.WithToken("not-a-jwt"))
		require.NoError(t, err)
		_, err = bad.Get(ctx, "x")
		require.ErrorIs(t, err, client.ErrUnauthenticated)
	})
}

// TestE2ELostClaimAnswerRecovered: the claim's answer is lost (the fault
// proxy swallows it after the server claimed the key). Do retries the
// claim with the same random attempt_id and gets its own attempt back at
// once — attempt 1, not a takeover, well inside a lease it would otherwise
// have to wait out. With attempt ids off the same retry is 409.
func TestE2ELostClaimAnswerRecovered(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, e e2e) {
		ctx := context.Background()
		host := strings.TrimPrefix(e.srv.URL(), "http://")
		dropFirstClaim := func() *faultproxy.Proxy {
			var once atomic.Bool
			return faultproxy.Start(t, host, func(r *http.Request) bool {
				return strings.HasSuffix(r.URL.Path, "/claim") && once.CompareAndSwap(false, true)
			})
		}
		const lease = 30 * time.Second
		req := client.Request{Operation: "POST /orders", Payload: map[string]any{"order": 9}, Lease: lease, NoWait: true}

		proxy := dropFirstClaim()
		var ran atomic.Int64
		var token int64
		start := time.Now()
		res, err := e.client(t, proxy.URL()).Do(ctx, "lost-claim-1", req, func(ctx context.Context, claim *client.Claim) (client.Response, error) {
			ran.Add(1)
			require.Equal(t, 1, claim.Attempt(), "the lost attempt itself, not a takeover")
			require.False(t, claim.Resumed())
			token = claim.FencingToken()
			return confirmed, nil
		})
		require.NoError(t, err)
		require.Less(t, time.Since(start), lease/2, "recovered without waiting out the lease")
		require.Equal(t, 1, proxy.Dropped(), "the first claim's answer was lost")
		require.False(t, res.Replayed)
		require.Equal(t, int64(1), ran.Load())
		rec, err := e.client(t, e.srv.URL()).Get(ctx, "lost-claim-1")
		require.NoError(t, err)
		require.Equal(t, client.StateCompleted, rec.State)
		require.Equal(t, 1, rec.Attempt)
		require.Equal(t, token, rec.FencingToken, "completed with the fencing token the lost answer carried")

		// Without attempt ids the retry finds its own claim in flight.
		proxy = dropFirstClaim()
		ran.Store(0)
		_, err = e.client(t, proxy.URL(), client.WithAttemptIDs(false)).Do(ctx, "lost-claim-2", req, func(ctx context.Context, claim *client.Claim) (client.Response, error) {
			ran.Add(1)
			return confirmed, nil
		})
		require.ErrorIs(t, err, client.ErrRequestInFlight)
		require.Equal(t, 1, proxy.Dropped())
		require.Zero(t, ran.Load())
	})
}

// TestE2EDoWaitsOnTheServer: Do on a key another holder has (lease 60 s,
// so the SDK's own Retry-After wait would take a minute) sends
// wait_seconds and is answered with the replay as soon as the holder
// completes: the server held the claim, the SDK did not poll.
func TestE2EDoWaitsOnTheServer(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, e e2e) {
		c := e.client(t, e.srv.URL())
		req := client.Request{Operation: "POST /pay", Payload: map[string]int{"amount": 9}, Lease: time.Minute}
		holder, err := c.Claim(context.Background(), "pay-9", req)
		require.NoError(t, err)

		type outcome struct {
			res client.Result
			err error
		}
		done := make(chan outcome, 1)
		var ran atomic.Int64
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			res, err := c.Do(ctx, "pay-9", req, func(context.Context, *client.Claim) (client.Response, error) {
				ran.Add(1)
				return confirmed, nil
			})
			done <- outcome{res, err}
		}()
		require.Eventually(t, func() bool { return e.srv.Server().Waiting() == 1 }, 10*time.Second, 5*time.Millisecond,
			"the SDK's claim is held by the server")
		_, err = c.Complete(context.Background(), "pay-9", holder.FencingToken, confirmed)
		require.NoError(t, err)
		select {
		case o := <-done:
			require.NoError(t, o.err)
			require.True(t, o.res.Replayed)
			require.Equal(t, confirmed.Body, o.res.Response.Body)
		case <-time.After(10 * time.Second):
			require.FailNow(t, "Do was not answered when the holder completed")
		}
		require.Zero(t, ran.Load(), "the function never ran")
	})
}

// cancelOnComplete is a transport to the real server that, when Do sends
// the complete, first runs cancel (the caller's context ends: its client
// hung up, its deadline hit) and then forwards the request as it is.
type cancelOnComplete struct {
	cancel func()
	next   http.RoundTripper
}

func (c cancelOnComplete) RoundTrip(r *http.Request) (*http.Response, error) {
	if strings.HasSuffix(r.URL.Path, "/complete") {
		c.cancel()
	}
	return c.next.RoundTrip(r)
}

// TestE2ECompleteOutlivesTheCaller: once fn has run, its response is
// stored even when the caller's context ends while the complete is on its
// way (a front door's client hangs up, a deadline hits), or when fn
// returns with less time left than the complete needs. Before, the
// complete was cut short: the response was lost, the key stayed in flight
// and the next Do after the lease ran fn a second time.
func TestE2ECompleteOutlivesTheCaller(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, e e2e) {
		t.Run("cancelled during the complete", func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			c := e.client(t, e.srv.URL(), client.WithHTTPClient(&http.Client{Transport: cancelOnComplete{cancel, http.DefaultTransport}}))
			var ran atomic.Int64
			fn := func(ctx context.Context, claim *client.Claim) (client.Response, error) {
				ran.Add(1)
				return confirmed, nil
			}
			key, _ := client.Key("order-confirm", "cancelled-complete")
			req := client.Request{Operation: "POST /orders", Payload: map[string]any{"order": 7}}
			res, err := c.Do(ctx, key, req, fn)
			require.NoError(t, err, "the work ran: its response is stored")
			require.Equal(t, confirmed.Body, res.Response.Body)
			rec, err := e.client(t, e.srv.URL()).Get(context.Background(), key)
			require.NoError(t, err)
			require.Equal(t, client.StateCompleted, rec.State)

			res, err = e.client(t, e.srv.URL()).Do(context.Background(), key, req, fn)
			require.NoError(t, err)
			require.True(t, res.Replayed)
			require.Equal(t, int64(1), ran.Load(), "fn ran once")
		})

		t.Run("deadline nearly spent", func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			dl, _ := ctx.Deadline()
			// The complete meets a slow network: it needs longer than the
			// time fn leaves.
			slow := roundTripFunc(func(r *http.Request) (*http.Response, error) {
				if strings.HasSuffix(r.URL.Path, "/complete") {
					time.Sleep(150 * time.Millisecond)
				}
				return http.DefaultTransport.RoundTrip(r)
			})
			c := e.client(t, e.srv.URL(), client.WithHTTPClient(&http.Client{Transport: slow}))
			fn := func(ctx context.Context, claim *client.Claim) (client.Response, error) {
				time.Sleep(time.Until(dl) - 20*time.Millisecond)
				return confirmed, nil
			}
			key, _ := client.Key("order-confirm", "late-complete")
			_, err := c.Do(ctx, key, client.Request{Operation: "POST /orders", Payload: map[string]any{"order": 8}}, fn)
			require.NoError(t, err, "the work ran: its response is stored")
			rec, err := e.client(t, e.srv.URL()).Get(context.Background(), key)
			require.NoError(t, err)
			require.Equal(t, client.StateCompleted, rec.State)
		})
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// skewedClock is this host's wall clock off the server's by skew; it
// sleeps on real time.
type skewedClock struct{ skew time.Duration }

func (s skewedClock) Now() time.Time { return time.Now().Add(s.skew) }
func (s skewedClock) Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestE2ELeaseKeeperIgnoresClockSkew: the lease keeper of a Do under the
// tenant's default lease (1 s here) renews it in time even when this host's
// clock is off the server's. Before, the lease was read as lease_expires_at
// less this host's time: 10 s behind, a 2 s lease looked like 12 s, the
// first renewal came after the lease had run out, and another request took
// the key over and ran the work a second time (10 s ahead, it looked spent
// and was taken for 30 s).
func TestE2ELeaseKeeperIgnoresClockSkew(t *testing.T) {
	t.Parallel()
	for _, backend := range backends {
		// Behind only: the injected clock also times the attempts against the
		// contexts' real deadlines, which a clock ahead would cut short (a
		// host's own clock is one clock; the fallback that a clock ahead of
		// the server hit, 30 s, is the same line).
		for _, skew := range []time.Duration{-10 * time.Second} {
			t.Run(fmt.Sprintf("%s/%s", backend, skew), func(t *testing.T) {
				t.Parallel()
				srv := servertest.Start(t, servertest.Options{Backend: backend})
				two := 2
				srv.CreateTenant(t, "brief", idem.SettingsPatch{LeaseSecondsDefault: &two})
				tok := srv.Token(t, "brief", "keys:write")
				skewed, err := client.New(srv.URL(), client.WithToken(tok), client.WithRetryPolicy(fastPolicy), client.WithClock(skewedClock{skew}))
				require.NoError(t, err)
				other, err := client.New(srv.URL(), client.WithToken(tok), client.WithRetryPolicy(fastPolicy))
				require.NoError(t, err)

				key, _ := client.Key("report", "skew")
				req := client.Request{Operation: "POST /reports", Payload: map[string]any{"n": 1}}
				var runs atomic.Int64
				started := make(chan struct{})
				done := make(chan error, 1)
				go func() {
					_, err := skewed.Do(context.Background(), key, req, func(ctx context.Context, _ *client.Claim) (client.Response, error) {
						runs.Add(1)
						close(started)
						time.Sleep(5 * time.Second) // the work outlasts the 2 s lease twice over
						return confirmed, nil
					})
					done <- err
				}()
				<-started
				time.Sleep(3 * time.Second) // past the lease unless it was renewed
				_, err = other.Claim(context.Background(), key, client.Request{Operation: req.Operation, Payload: req.Payload, NoWait: true})
				require.ErrorIs(t, err, client.ErrRequestInFlight, "the keeper renewed the lease: no takeover")
				require.NoError(t, <-done)
				require.Equal(t, int64(1), runs.Load())
			})
		}
	}
}
