package storemw_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/metrics"
	"github.com/idem-dev/idem/storemw"
)

// testDriver is a Store with a driver's capabilities: a pool of pool
// connections and a webhook side whose calls answer at once.
type testDriver struct {
	idem.Store
	pool int64
}

func (d testDriver) Webhooks() idem.WebhookStore  { return gateWebhooks{} }
func (d testDriver) KeyEvents() idem.KeyEvents    { return nil }
func (d testDriver) PoolStats() idem.PoolStats    { return idem.PoolStats{MaxConns: d.pool} }
func (d testDriver) SerialWrites() bool           { return false }
func (d testDriver) Ledger() idem.LedgerRollbacks { return nil }
func (d testDriver) Listener() idem.Listener      { return nil }

func (d testDriver) Completers() idem.CompleterStore { return nil }
func (d testDriver) Durability(context.Context) (idem.Durability, error) {
	return idem.Durability{Mode: idem.DurabilityUnknown}, nil
}

// storeCalls returns how many calls of op ending in result
// idem_store_operation_duration_seconds counted.
func storeCalls(t *testing.T, reg *prometheus.Registry, op, result string) uint64 {
	t.Helper()
	return histogramCount(t, reg, "idem_store_operation_duration_seconds", map[string]string{"op": op, "result": result})
}

// histogramCount returns the count of the histogram (or the value of the
// counter) name with labels, 0 when it has no such series.
func histogramCount(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			for k, v := range labels {
				if got[k] != v {
					continue next
				}
			}
			if h := m.GetHistogram(); h != nil {
				return h.GetSampleCount()
			}
			return uint64(m.GetCounter().GetValue())
		}
	}
	return 0
}

// stuckStore is a gateStore whose claims of tenant "slow" hold their call
// until gate closes, whatever their context: a call stuck in the
// database, holding its connection.
type stuckStore struct{ *gateStore }

func (s stuckStore) Claim(ctx context.Context, p idem.ClaimParams) (idem.ClaimResult, error) {
	if p.TenantID == "slow" {
		s.in.Add(1)
		<-s.gate
	}
	return idem.ClaimResult{}, nil
}

// TestWrapOrder: a call of a tenant whose share is full waits for it no
// longer than the store deadline (the deadline is outside the share), and
// the metrics (outermost) count it once, as unavailable — the deadline's
// verdict — with the wait in its time; the wait itself is counted as a
// share wait that ended unavailable.
func TestWrapOrder(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	g := &gateStore{gate: make(chan struct{})}
	defer close(g.gate)
	const timeout = 200 * time.Millisecond
	s := storemw.Wrap(testDriver{stuckStore{g}, 2}, storemw.Options{Timeout: timeout, TenantShare: 0.5, Metrics: m})
	ctx := t.Context()
	go func() { _, _ = s.Claim(ctx, idem.ClaimParams{TenantID: "slow", Key: "k"}) }()
	require.Eventually(t, func() bool { return g.in.Load() == 1 }, 10*time.Second, time.Millisecond)

	bound, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	start := time.Now()
	_, err := s.Claim(bound, idem.ClaimParams{TenantID: "slow", Key: "k2"})
	took := time.Since(start)
	require.Equal(t, idem.CodeStoreUnavailable, idem.ErrorCode(err), "the share wait ends at the store deadline: %v", err)
	require.GreaterOrEqual(t, took, timeout)
	require.Less(t, took, 5*time.Second)
	require.Equal(t, uint64(1), storeCalls(t, reg, "claim", metrics.StoreUnavailable), "the metrics count the call the deadline ended")
	require.Equal(t, uint64(1), histogramCount(t, reg, "idem_tenant_store_share_waits_total",
		map[string]string{"tenant": "slow", "result": metrics.StoreUnavailable}), "the share counts its wait")

	_, err = s.Claim(ctx, idem.ClaimParams{TenantID: "other", Key: "k"})
	require.NoError(t, err, "another tenant's call within its share starts")
	require.Equal(t, uint64(1), storeCalls(t, reg, "claim", metrics.StoreOK))
}

// TestWrapWebhooks: the webhook side gets the same layers as the rest —
// timed by the metrics (it never was before), held to the tenant's share
// with its other calls — and the driver's own capabilities pass through.
func TestWrapWebhooks(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	g := &gateStore{gate: make(chan struct{})}
	defer close(g.gate)
	d := testDriver{g, 2}
	s := storemw.Wrap(d, storemw.Options{Timeout: time.Minute, TenantShare: 0.5, Metrics: metrics.New(reg)})
	ctx := t.Context()

	_, err := s.Webhooks().ListWebhookEndpoints(ctx, idem.ListWebhookEndpointsParams{TenantID: "acme"})
	require.NoError(t, err)
	_, err = s.Webhooks().ClaimWebhookDeliveries(ctx, idem.ClaimWebhookDeliveriesParams{Limit: 8, PerTenant: 8, Served: nil, Lease: time.Minute})
	require.NoError(t, err)
	require.Equal(t, uint64(1), storeCalls(t, reg, "list_webhook_endpoints", metrics.StoreOK), "the API's webhook calls are timed")
	require.Equal(t, uint64(1), storeCalls(t, reg, "claim_webhook_deliveries", metrics.StoreOK), "the deliverer's are too")

	go func() { _, _ = s.Claim(ctx, idem.ClaimParams{TenantID: "slow", Key: "k"}) }()
	require.Eventually(t, func() bool { return g.in.Load() == 1 }, 10*time.Second, time.Millisecond)
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err = s.Webhooks().ListWebhookEndpoints(short, idem.ListWebhookEndpointsParams{TenantID: "slow"})
	require.Equal(t, idem.CodeStoreUnavailable, idem.ErrorCode(err), "a tenant's webhook call waits for its share")

	require.Equal(t, d.PoolStats(), s.PoolStats())
	require.Nil(t, s.KeyEvents())
	require.False(t, s.SerialWrites())
}

// TestWrapNothing: options that ask for no layer leave the calls to the
// driver, and a driver without a webhook side gives none.
func TestWrapNothing(t *testing.T) {
	t.Parallel()
	g := &gateStore{gate: make(chan struct{})}
	close(g.gate)
	d := testDriver{g, 2}
	s := storemw.Wrap(d, storemw.Options{})
	require.Equal(t, idem.Store(d), s.Store)
	require.Equal(t, gateWebhooks{}, s.Webhooks())
}

// interruptedStore is a Store whose claims wait for their context to end
// and then fail in the driver's own words, as SQLite's do ("interrupted"):
// an internal error, not store_unavailable.
type interruptedStore struct{ idem.Store }

func (interruptedStore) Claim(ctx context.Context, _ idem.ClaimParams) (idem.ClaimResult, error) {
	<-ctx.Done()
	return idem.ClaimResult{}, errors.New("interrupted (9)")
}

// TestWrapCountsTimeouts: a call the store deadline ended is counted as
// unavailable, the deadline's verdict, not as the driver's internal error:
// the metrics sit outside the deadline. (The gateway put them inside it
// before, and counted such calls as errors.)
func TestWrapCountsTimeouts(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	s := storemw.Wrap(testDriver{interruptedStore{}, 0}, storemw.Options{Timeout: 50 * time.Millisecond, Metrics: metrics.New(reg)})
	_, err := s.Claim(t.Context(), idem.ClaimParams{TenantID: "acme", Key: "k"})
	require.Equal(t, idem.CodeStoreUnavailable, idem.ErrorCode(err), "%v", err)
	require.Equal(t, uint64(1), storeCalls(t, reg, "claim", metrics.StoreUnavailable))
	require.Zero(t, storeCalls(t, reg, "claim", metrics.StoreError))
}
