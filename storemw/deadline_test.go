package storemw_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/sqlite"
	"github.com/idem-dev/idem/storemw"
)

// TestWithDeadline runs WithDeadline over a real SQLite store whose write
// lock another connection holds: a write past the deadline is
// store_unavailable in about the deadline (the store alone would wait out
// its 10 s busy timeout), a call whose caller cancelled matches
// context.Canceled, and a domain answer passes through unchanged.
func TestWithDeadline(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "idem.db")
	raw, err := sqlite.Open(ctx, path, sqlite.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = raw.Close() })
	const d = 300 * time.Millisecond
	s := storemw.WithDeadline(raw, d)
	_, err = s.CreateTenant(ctx, idem.CreateTenantParams{ID: "acme", Name: "acme", Settings: idem.DefaultSettings()})
	require.NoError(t, err)

	_, err = s.GetRecord(ctx, idem.GetRecordParams{TenantID: "acme", Key: "none"})
	require.ErrorIs(t, err, idem.ErrKeyNotFound, "a domain answer passes through")

	holder, err := sql.Open("sqlite", "file:"+path)
	require.NoError(t, err)
	t.Cleanup(func() { _ = holder.Close() })
	conn, err := holder.Conn(ctx)
	require.NoError(t, err)
	_, err = conn.ExecContext(ctx, "BEGIN IMMEDIATE")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = conn.ExecContext(ctx, "ROLLBACK"); _ = conn.Close() })

	claim := idem.ClaimParams{TenantID: "acme", Key: "k", Operation: "op", Lease: time.Minute,
		ReplayWindow: time.Hour, ReaperThreshold: 2 * time.Hour}
	start := time.Now()
	_, err = s.Claim(ctx, claim)
	elapsed := time.Since(start)
	require.ErrorIs(t, err, idem.ErrStoreUnavailable)
	require.Less(t, elapsed, 5*time.Second, "the deadline, not the busy timeout, ended the call")
	require.GreaterOrEqual(t, elapsed, d)

	// With a long deadline, only the caller's cancel ends the wait.
	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(50*time.Millisecond, cancel)
	_, err = storemw.WithDeadline(raw, time.Minute).Claim(cctx, claim)
	require.True(t, errors.Is(err, context.Canceled), "a cancelled call matches context.Canceled: %v", err)
	require.False(t, errors.Is(err, idem.ErrStoreUnavailable), "a cancelled call is not the store's failure: %v", err)

	require.Equal(t, raw, storemw.WithDeadline(raw, 0), "no deadline leaves the store as it is")
}

// TestWebhookWithDeadline: a webhook write held by another connection's
// write lock is store_unavailable in about the deadline; a domain answer
// passes through.
func TestWebhookWithDeadline(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "idem.db")
	raw, err := sqlite.Open(ctx, path, sqlite.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = raw.Close() })
	const d = 300 * time.Millisecond
	ws := storemw.WebhookWithDeadline(raw, d)
	_, err = ws.GetWebhookEndpoint(ctx, idem.GetWebhookEndpointParams{TenantID: "acme", ID: "ep_none"})
	require.ErrorIs(t, err, idem.ErrWebhookNotFound, "a domain answer passes through")

	holder, err := sql.Open("sqlite", "file:"+path)
	require.NoError(t, err)
	t.Cleanup(func() { _ = holder.Close() })
	conn, err := holder.Conn(ctx)
	require.NoError(t, err)
	_, err = conn.ExecContext(ctx, "BEGIN IMMEDIATE")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = conn.ExecContext(ctx, "ROLLBACK"); _ = conn.Close() })

	start := time.Now()
	_, err = ws.EmitOrphanEvents(ctx, idem.EmitOrphanEventsParams{Limit: 10})
	require.ErrorIs(t, err, idem.ErrStoreUnavailable)
	require.Less(t, time.Since(start), 5*time.Second, "the deadline, not the busy timeout, ended the call")
	require.Equal(t, idem.WebhookStore(raw), storemw.WebhookWithDeadline(raw, 0))
}

// BenchmarkDeadlineCall is what WithDeadline adds to one store call made
// under a request's context (a cancelable context carrying values, as
// net/http's is), over a store that answers at once after registering
// with its context as pgx does (context.AfterFunc): "bare" is the same
// call without WithDeadline.
func BenchmarkDeadlineCall(b *testing.B) {
	for _, bc := range []struct {
		name string
		s    idem.Store
	}{
		{"bare", afterFuncStore{}},
		{"WithDeadline", storemw.WithDeadline(afterFuncStore{}, 5*time.Second)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				ctx, cancel := context.WithCancel(context.WithValue(context.Background(), benchKey{}, 1))
				if _, err := bc.s.GetTenant(ctx, idem.GetTenantParams{ID: "acme"}); err != nil {
					b.Fatal(err)
				}
				cancel()
			}
		})
	}
}

type benchKey struct{}

// afterFuncStore answers GetTenant at once after watching its context the
// way pgx does.
type afterFuncStore struct{ idem.Store }

func (afterFuncStore) GetTenant(ctx context.Context, p idem.GetTenantParams) (idem.Tenant, error) {
	stop := context.AfterFunc(ctx, func() {})
	stop()
	return idem.Tenant{ID: p.ID}, nil
}
