package storemw_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/storemw"
)

func TestStoreShareOf(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		pool     int
		fraction float64
		want     int
	}{
		{10, 0.5, 5}, {4, 0.5, 2}, {5, 0.5, 3}, {1, 0.5, 1}, {10, 0.3, 3}, {10, 0.01, 1}, {10, 1, 10}, {3, 0.7, 3},
	} {
		require.Equal(t, c.want, storemw.StoreShareOf(c.pool, c.fraction), "%d × %g", c.pool, c.fraction)
	}
}

// gateStore is a Store whose claims of tenant "slow" block until gate
// closes; the other calls answer at once. Only the share is under test.
type gateStore struct {
	idem.Store
	gate chan struct{}
	in   atomic.Int64 // claims of "slow" that reached the store
}

func (g *gateStore) Claim(ctx context.Context, p idem.ClaimParams) (idem.ClaimResult, error) {
	if p.TenantID == "slow" {
		g.in.Add(1)
		select {
		case <-g.gate:
		case <-ctx.Done():
			return idem.ClaimResult{}, ctx.Err()
		}
	}
	return idem.ClaimResult{}, nil
}

// TestWithTenantShare: past its share a tenant's call waits for one of its
// own, not for another tenant's; the wait ends with store_unavailable
// (retryable) at the caller's deadline, matches context.Canceled when the
// caller gave up, and is reported to observe either way; a later call
// gets its turn once the tenant's call ended. (TestTenantStoreShare in
// server/ shows calls waiting and getting their turn over real HTTP.)
func TestWithTenantShare(t *testing.T) {
	t.Parallel()
	g := &gateStore{gate: make(chan struct{})}
	var mu sync.Mutex
	var seen []error
	s := storemw.WithTenantShare(g, 2, 1, false, func(tenant string, err error) {
		require.Equal(t, "slow", tenant)
		mu.Lock()
		seen = append(seen, err)
		mu.Unlock()
	})
	ctx := t.Context()
	held := make(chan error, 1)
	go func() { _, err := s.Claim(ctx, idem.ClaimParams{TenantID: "slow", Key: "k"}); held <- err }()
	require.Eventually(t, func() bool {
		short, cancel := context.WithTimeout(ctx, time.Millisecond)
		defer cancel()
		_, err := s.Claim(short, idem.ClaimParams{TenantID: "slow", Key: "k2"})
		return idem.ErrorCode(err) == idem.CodeStoreUnavailable
	}, 10*time.Second, time.Millisecond, "the second call of the tenant should wait for its share and time out")

	_, err := s.Claim(ctx, idem.ClaimParams{TenantID: "other", Key: "k"})
	require.NoError(t, err, "another tenant is not held up by the slow one")

	canceled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = s.Claim(canceled, idem.ClaimParams{TenantID: "slow", Key: "k3"})
	require.ErrorIs(t, err, context.Canceled)

	waiting := make(chan error, 1)
	go func() { _, err := s.Claim(ctx, idem.ClaimParams{TenantID: "slow", Key: "k4"}); waiting <- err }()
	close(g.gate)
	require.NoError(t, <-held)
	require.NoError(t, <-waiting, "a later call gets its turn once the first ended")

	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, seen)
	var unavailable, canceledN int
	for _, err := range seen {
		switch {
		case err == nil:
		case errors.Is(err, context.Canceled):
			canceledN++
		default:
			require.Equal(t, idem.CodeStoreUnavailable, idem.ErrorCode(err))
			unavailable++
		}
	}
	require.Equal(t, 1, canceledN)
	require.Positive(t, unavailable)
}

// TestWithTenantShareNoAlloc: the share costs no allocation per call (it
// sits on every request's path).
func TestWithTenantShareNoAlloc(t *testing.T) {
	s := storemw.WithTenantShare(&gateStore{}, 10, 4, false, nil)
	ctx := context.Background()
	p := idem.ClaimParams{TenantID: "acme", Key: "k"}
	_, _ = s.Claim(ctx, p) // the tenant's slots are made once
	allocs := testing.AllocsPerRun(1000, func() { _, _ = s.Claim(ctx, p) })
	require.Zero(t, allocs)
}

// serialStore is a gateStore whose reads answer at once, for a share told
// that the store's writes take turns on one writer.
type serialStore struct{ gateStore }

func (g *serialStore) GetRecord(context.Context, idem.GetRecordParams) (idem.Record, error) {
	return idem.Record{}, nil
}

// TestWithTenantShareSerialWriter: on a store whose writes queue for one
// writer without a connection (SQLite), a tenant whose writes fill their
// share still reads: its reads have a share of their own.
func TestWithTenantShareSerialWriter(t *testing.T) {
	t.Parallel()
	g := &serialStore{gateStore{gate: make(chan struct{})}}
	defer close(g.gate)
	s := storemw.WithTenantShare(g, 2, 1, true, nil)
	ctx := t.Context()
	go func() { _, _ = s.Claim(ctx, idem.ClaimParams{TenantID: "slow", Key: "k"}) }()
	require.Eventually(t, func() bool {
		short, cancel := context.WithTimeout(ctx, time.Millisecond)
		defer cancel()
		_, err := s.Claim(short, idem.ClaimParams{TenantID: "slow", Key: "k2"})
		return idem.ErrorCode(err) == idem.CodeStoreUnavailable
	}, 10*time.Second, time.Millisecond, "the tenant's writes should fill their share")
	short, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err := s.GetRecord(short, idem.GetRecordParams{TenantID: "slow", Key: "k"})
	require.NoError(t, err, "the tenant's read has its own share")
}

// TestWithTenantShareBorrows: past its share a tenant's calls still start
// while the pool keeps ShareReserve connections free (a tenant alone uses
// the pool), no further; another tenant's call within its share starts
// whatever the first holds.
func TestWithTenantShareBorrows(t *testing.T) {
	t.Parallel()
	const pool = 4
	g := &gateStore{gate: make(chan struct{})}
	defer close(g.gate)
	s := storemw.WithTenantShare(g, pool, 1, false, nil)
	ctx := t.Context()
	for i := range pool - storemw.ShareReserve {
		go func() { _, _ = s.Claim(ctx, idem.ClaimParams{TenantID: "slow", Key: fmt.Sprint(i)}) }()
	}
	require.Eventually(t, func() bool { return g.in.Load() == pool-storemw.ShareReserve }, 10*time.Second, time.Millisecond,
		"a tenant alone starts calls past its share up to the pool less the reserve")
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err := s.Claim(short, idem.ClaimParams{TenantID: "slow", Key: "over"})
	require.Equal(t, idem.CodeStoreUnavailable, idem.ErrorCode(err), "no call past the share takes the reserve")
	require.Equal(t, int64(pool-storemw.ShareReserve), g.in.Load())
	_, err = s.Claim(ctx, idem.ClaimParams{TenantID: "other", Key: "k"})
	require.NoError(t, err, "another tenant's call within its share starts")
}

// gateWebhooks is a WebhookStore whose calls all answer at once.
type gateWebhooks struct{ idem.WebhookStore }

func (gateWebhooks) ListWebhookEndpoints(context.Context, idem.ListWebhookEndpointsParams) ([]idem.WebhookEndpoint, error) {
	return nil, nil
}

func (gateWebhooks) ClaimWebhookDeliveries(context.Context, idem.ClaimWebhookDeliveriesParams) ([]idem.WebhookDelivery, error) {
	return nil, nil
}

// TestWebhooksWithTenantShare: a tenant's webhook calls take its slots
// and count with its store calls (they hold the same connections); the
// deliverer's calls, which name no tenant, and another tenant's pass.
func TestWebhooksWithTenantShare(t *testing.T) {
	t.Parallel()
	g := &gateStore{gate: make(chan struct{})}
	defer close(g.gate)
	s := storemw.WithTenantShare(g, 2, 1, false, nil)
	w := storemw.WebhooksWithTenantShare(s, gateWebhooks{})
	ctx := t.Context()
	go func() { _, _ = s.Claim(ctx, idem.ClaimParams{TenantID: "slow", Key: "k"}) }()
	require.Eventually(t, func() bool { return g.in.Load() == 1 }, 10*time.Second, time.Millisecond)
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err := w.ListWebhookEndpoints(short, idem.ListWebhookEndpointsParams{TenantID: "slow"})
	require.Equal(t, idem.CodeStoreUnavailable, idem.ErrorCode(err), "the tenant's webhook call waits for its share")
	_, err = w.ListWebhookEndpoints(ctx, idem.ListWebhookEndpointsParams{TenantID: "other"})
	require.NoError(t, err)
	_, err = w.ClaimWebhookDeliveries(ctx, idem.ClaimWebhookDeliveriesParams{Limit: 8, PerTenant: 8, Served: nil, Lease: time.Minute})
	require.NoError(t, err, "the deliverer is not held to a share")
	require.Equal(t, gateWebhooks{}, storemw.WebhooksWithTenantShare(g, gateWebhooks{}), "no share: the webhook store itself")
}
