package jobs_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/jobs"
	"github.com/idem-dev/idem/metrics"
	"github.com/idem-dev/idem/postgres"
	"github.com/idem-dev/idem/sqlite"
	"github.com/idem-dev/idem/storetest"
	"github.com/idem-dev/idem/testkit/pgtest"
)

// bundle is one backend under test: a store, its clock, and a way to open
// a second handle on the same database (another "replica").
type bundle struct {
	store idem.Driver
	clock *storetest.Clock
	open  func(t *testing.T) idem.Driver
}

// forEachBackend runs fn against SQLite (a temporary file) and PostgreSQL
// (an isolated schema; skipped without TEST_DATABASE_URL unless
// IDEM_REQUIRE_POSTGRES=1).
func forEachBackend(t *testing.T, fn func(t *testing.T, b *bundle)) {
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "idem.db")
		clk := storetest.NewClock()
		open := func(t *testing.T) idem.Driver {
			s, err := sqlite.Open(context.Background(), path, sqlite.Options{Now: clk.Now})
			require.NoError(t, err)
			t.Cleanup(func() { _ = s.Close() })
			return s
		}
		fn(t, &bundle{store: open(t), clock: clk, open: open})
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		url := pgtest.URL(t)
		clk := storetest.NewClock()
		open := func(t *testing.T) idem.Driver {
			s, err := postgres.Open(context.Background(), url, postgres.Options{Now: clk.Now})
			require.NoError(t, err)
			t.Cleanup(func() { _ = s.Close() })
			return s
		}
		fn(t, &bundle{store: open(t), clock: clk, open: open})
	})
}

// Test tenant settings: short windows so a small clock jump expires things.
var testSettings = idem.Settings{
	ReplayWindowSeconds:    5,
	ReaperThresholdSeconds: 10,
	LeaseSecondsDefault:    1,
	LeaseSecondsMax:        10,
	MaxResponseBytes:       1 << 16,
}

func createTenant(t *testing.T, s idem.Store, id string) {
	t.Helper()
	_, err := s.CreateTenant(context.Background(), idem.CreateTenantParams{ID: id, Name: id, Settings: testSettings})
	require.NoError(t, err)
}

func claim(ctx context.Context, s idem.Store, tenant, key string) (idem.ClaimResult, error) {
	return s.Claim(ctx, idem.ClaimParams{
		TenantID: tenant, Key: key, Operation: "POST /v1/payments", Fingerprint: "fp-" + key,
		Lease:           time.Second,
		ReplayWindow:    time.Duration(testSettings.ReplayWindowSeconds) * time.Second,
		ReaperThreshold: time.Duration(testSettings.ReaperThresholdSeconds) * time.Second,
	})
}

func mustClaim(t *testing.T, s idem.Store, tenant, key string) idem.ClaimResult {
	t.Helper()
	res, err := claim(context.Background(), s, tenant, key)
	require.NoError(t, err)
	return res
}

// logSink captures JSON logs for assertions.
type logSink struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logSink) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logSink) logger() *slog.Logger {
	return slog.New(slog.NewJSONHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// entries returns the decoded log lines whose msg is msg.
func (l *logSink) entries(t *testing.T, msg string) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(l.buf.Bytes()))
	for sc.Scan() {
		var m map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &m))
		if m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// TestReaperDeletesInBatchesWhileClaimsFlow fills the ledger with records
// past purge_after (orphans and completed ones), then reaps in small
// batches while other goroutines keep claiming fresh keys. Every expired
// record must go, every fresh claim must succeed and survive, and every
// deleted orphan must be logged with its details and counted.
func TestReaperDeletesInBatchesWhileClaimsFlow(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b *bundle) {
		ctx := context.Background()
		s := b.store
		createTenant(t, s, "acme")
		createTenant(t, s, "beta")

		const nOrphans, nCompleted = 14, 9
		for i := range nOrphans {
			tenant := "acme"
			if i%2 == 1 {
				tenant = "beta"
			}
			mustClaim(t, s, tenant, fmt.Sprintf("orphan-%02d", i))
		}
		for i := range nCompleted {
			key := fmt.Sprintf("done-%02d", i)
			res := mustClaim(t, s, "acme", key)
			_, err := s.Complete(ctx, idem.CompleteParams{TenantID: "acme", Key: key, FencingToken: res.Record.FencingToken,
				Response: idem.Response{Status: 201, Headers: map[string]string{}, Body: []byte(`{"ok":true}`), BodyEncoding: idem.BodyEncodingUTF8}})
			require.NoError(t, err)
		}
		// One orphan with history: taken over once, then checkpointed.
		b.clock.Advance(2 * time.Second)
		res := mustClaim(t, s, "acme", "orphan-00")
		require.Equal(t, idem.ActionTakeover, res.Action)
		_, err := s.Checkpoint(ctx, idem.CheckpointParams{TenantID: "acme", Key: "orphan-00",
			FencingToken: res.Record.FencingToken, RecoveryPoint: "charge_created", Data: json.RawMessage(`{"charge":"ch_1"}`), Lease: time.Second})
		require.NoError(t, err)

		// Everything above is now past purge_after.
		b.clock.Advance(time.Hour)

		sink := &logSink{}
		reg := prometheus.NewRegistry()
		m := metrics.New(reg)
		const batch = 4
		r := jobs.New(s, jobs.Config{ReapBatchSize: batch}, sink.logger(), m)

		// Claims keep flowing while the reaper runs.
		const writers, perWriter = 3, 8
		var wg sync.WaitGroup
		claimErrs := make(chan error, writers*perWriter)
		start := make(chan struct{})
		for w := range writers {
			wg.Go(func() {
				<-start
				for i := range perWriter {
					res, err := claim(ctx, s, "acme", fmt.Sprintf("fresh-%d-%d", w, i))
					if err == nil && res.Action != idem.ActionCreate {
						err = fmt.Errorf("fresh claim: action %v, want create", res.Action)
					}
					claimErrs <- err
				}
			})
		}
		close(start)
		got, err := r.ReapOnce(ctx)
		wg.Wait()
		close(claimErrs)
		require.NoError(t, err)
		for err := range claimErrs {
			require.NoError(t, err, "a claim failed while the reaper ran")
		}

		total := nOrphans + nCompleted
		require.Equal(t, total, got.Deleted)
		require.Equal(t, nOrphans, got.Orphans)
		require.Equal(t, nOrphans, got.ByState[idem.StateOrphaned])
		require.Equal(t, nCompleted, got.ByState[idem.StateExpired])
		require.Equal(t, total/batch+1, got.Batches, "batches of %d until a short one", batch)

		// The expired records are gone; the fresh ones are untouched.
		for i := range nOrphans {
			tenant := map[bool]string{true: "acme", false: "beta"}[i%2 == 0]
			_, err := s.GetRecord(ctx, idem.GetRecordParams{TenantID: tenant, Key: fmt.Sprintf("orphan-%02d", i)})
			require.ErrorIs(t, err, idem.ErrKeyNotFound)
		}
		fresh, err := s.ListRecords(ctx, idem.ListRecordsParams{TenantID: "acme", Limit: 1000})
		require.NoError(t, err)
		require.Len(t, fresh, writers*perWriter)

		// Each deleted orphan is logged once with the fields a human needs.
		logs := sink.entries(t, "reaper deleted orphan")
		require.Len(t, logs, nOrphans)
		byKey := map[string]map[string]any{}
		for _, e := range logs {
			for _, f := range []string{"tenant", "key", "operation", "attempt", "recovery_point", "age"} {
				require.Contains(t, e, f)
			}
			require.Equal(t, "WARN", e["level"])
			byKey[e["tenant"].(string)+"/"+e["key"].(string)] = e
		}
		require.Len(t, byKey, nOrphans)
		h := byKey["acme/orphan-00"]
		require.NotNil(t, h)
		require.Equal(t, "POST /v1/payments", h["operation"])
		require.EqualValues(t, 2, h["attempt"])
		require.Equal(t, "charge_created", h["recovery_point"])
		// age = time since the lease expired: 1 hour minus the 1 s lease.
		require.EqualValues(t, (time.Hour - time.Second).Nanoseconds(), h["age"])
		require.Equal(t, "", byKey["beta/orphan-01"]["recovery_point"])

		// And counted.
		require.Equal(t, float64(nOrphans/2), testutil.ToFloat64(mVec(t, reg, "idem_reaper_orphans_deleted_total", "acme")))
		require.Equal(t, float64(nOrphans), sumCounter(t, reg, "idem_reaper_orphans_deleted_total"))
		require.Equal(t, float64(total), sumCounter(t, reg, "idem_reaper_deleted_total"))

		// A second pass finds nothing.
		again, err := r.ReapOnce(ctx)
		require.NoError(t, err)
		require.Zero(t, again.Deleted)
		require.Equal(t, 1, again.Batches)
	})
}

// TestReaperSafeWithReplicas runs two runners on two store handles of the
// same database at once: every record is deleted, and each orphan is
// logged by exactly one of them.
func TestReaperSafeWithReplicas(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b *bundle) {
		ctx := context.Background()
		createTenant(t, b.store, "acme")
		const n = 30
		for i := range n {
			mustClaim(t, b.store, "acme", fmt.Sprintf("k-%02d", i))
		}
		b.clock.Advance(time.Hour)

		other := b.open(t)
		sinks := []*logSink{{}, {}}
		runners := []*jobs.Runner{
			jobs.New(b.store, jobs.Config{ReapBatchSize: 3}, sinks[0].logger(), nil),
			jobs.New(other, jobs.Config{ReapBatchSize: 3}, sinks[1].logger(), nil),
		}
		results := make([]jobs.ReapResult, 2)
		errs := make([]error, 2)
		var wg sync.WaitGroup
		for i, r := range runners {
			wg.Go(func() { results[i], errs[i] = r.ReapOnce(ctx) })
		}
		wg.Wait()
		require.NoError(t, errs[0])
		require.NoError(t, errs[1])
		require.Equal(t, n, results[0].Deleted+results[1].Deleted, "every record deleted exactly once")

		seen := map[string]int{}
		for _, s := range sinks {
			for _, e := range s.entries(t, "reaper deleted orphan") {
				seen[e["key"].(string)]++
			}
		}
		require.Len(t, seen, n)
		for k, c := range seen {
			require.Equal(t, 1, c, "orphan %s logged %d times", k, c)
		}
	})
}

// TestOrphanWatchReportsCountAndOldestAge checks the gauges, and that a
// tenant whose orphans are gone disappears from them.
func TestOrphanWatchReportsCountAndOldestAge(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b *bundle) {
		ctx := context.Background()
		s := b.store
		createTenant(t, s, "acme")
		createTenant(t, s, "beta")
		reg := prometheus.NewRegistry()
		m := metrics.New(reg)
		r := jobs.New(s, jobs.Config{}, nil, m)

		require.NoError(t, r.WatchOnce(ctx))
		require.Equal(t, 0, testutil.CollectAndCount(reg, "idem_orphans"))

		// acme: two orphans whose leases expire at t0+1s; beta: one at t0+31s.
		t0 := b.clock.Now()
		mustClaim(t, s, "acme", "a1")
		mustClaim(t, s, "acme", "a2")
		b.clock.Advance(30 * time.Second)
		beta := mustClaim(t, s, "beta", "b1")
		// A live claim is not an orphan.
		b.clock.Advance(5 * time.Second) // now = t0+35s
		mustClaim(t, s, "acme", "live")

		require.NoError(t, r.WatchOnce(ctx))
		require.Equal(t, 2, testutil.CollectAndCount(reg, "idem_orphans"))
		require.Equal(t, 2.0, testutil.ToFloat64(gVec(t, reg, "idem_orphans", "acme")))
		require.Equal(t, 34.0, testutil.ToFloat64(gVec(t, reg, "idem_oldest_orphan_age_seconds", "acme")))
		require.Equal(t, 1.0, testutil.ToFloat64(gVec(t, reg, "idem_orphans", "beta")))
		require.Equal(t, 4.0, testutil.ToFloat64(gVec(t, reg, "idem_oldest_orphan_age_seconds", "beta")))
		require.Equal(t, t0.Add(35*time.Second), b.clock.Now(), "ages are counted at the store clock")

		// beta's orphan is taken over: beta has none left.
		res := mustClaim(t, s, "beta", "b1")
		require.Equal(t, idem.ActionTakeover, res.Action)
		require.Greater(t, res.Record.FencingToken, beta.Record.FencingToken)
		require.NoError(t, r.WatchOnce(ctx))
		require.Equal(t, 1, testutil.CollectAndCount(reg, "idem_orphans"))
		require.Equal(t, 2.0, testutil.ToFloat64(gVec(t, reg, "idem_orphans", "acme")))
		require.NotContains(t, m.OrphanTenants(), "beta")
	})
}

// TestRunStopsWithContext runs the loops for real and checks that they
// set the orphan gauges and return once the context ends.
func TestRunStopsWithContext(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b *bundle) {
		createTenant(t, b.store, "acme")
		mustClaim(t, b.store, "acme", "k")
		b.clock.Advance(2 * time.Second)
		reg := prometheus.NewRegistry()
		r := jobs.New(b.store, jobs.Config{ReapInterval: 10 * time.Millisecond, OrphanWatchInterval: 10 * time.Millisecond}, nil, metrics.New(reg))
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		require.Eventually(t, func() bool { return testutil.CollectAndCount(reg, "idem_orphans") == 1 }, 5*time.Second, 10*time.Millisecond)
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(5 * time.Second):
			t.Fatal("Run did not return after cancel")
		}
	})
}

// gVec / mVec return a collector holding only the series of one tenant, for
// testutil.ToFloat64.
func gVec(t *testing.T, g prometheus.Gatherer, name, tenant string) prometheus.Collector {
	return seriesCollector(t, g, name, tenant)
}

func mVec(t *testing.T, g prometheus.Gatherer, name, tenant string) prometheus.Collector {
	return seriesCollector(t, g, name, tenant)
}

func seriesCollector(t *testing.T, g prometheus.Gatherer, name, tenant string) prometheus.Collector {
	t.Helper()
	mfs, err := g.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, mt := range mf.GetMetric() {
			for _, l := range mt.GetLabel() {
				if l.GetName() == "tenant" && l.GetValue() == tenant {
					v := mt.GetGauge().GetValue() + mt.GetCounter().GetValue()
					return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "x", Help: "x"}, func() float64 { return v })
				}
			}
		}
	}
	t.Fatalf("no %s series for tenant %s", name, tenant)
	return nil
}

func sumCounter(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	require.NoError(t, err)
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, mt := range mf.GetMetric() {
				sum += mt.GetCounter().GetValue()
			}
		}
	}
	return sum
}
