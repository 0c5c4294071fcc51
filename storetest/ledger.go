package storetest

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
)

// ledger returns the store's idem.LedgerRollbacks side; every backend has
// one.
func (b *bundle) ledger(t *testing.T) idem.LedgerRollbacks {
	t.Helper()
	l, ok := b.store.(idem.LedgerRollbacks)
	require.True(t, ok, "the store implements idem.LedgerRollbacks")
	return l
}

// testLedgerSourceCoversTokens: the token source is at least every token
// a claim returned, concurrent claims included, on a fresh store 0 — what
// the server's rollback check relies on to raise no false alarm.
func testLedgerSourceCoversTokens(t *testing.T, s *suite) {
	b := s.setup(t)
	l := b.ledger(t)
	st, err := l.LedgerState(b.ctx)
	require.NoError(t, err)
	require.Equal(t, idem.LedgerState{}, st, "a fresh ledger: no token issued, no rollback")

	b.tenant(t, "acme")
	var mu sync.Mutex
	var highest int64
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := b.store.Claim(b.ctx, ClaimParams("acme", "k"+string(rune('a'+i))))
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			highest = max(highest, res.Record.FencingToken)
			mu.Unlock()
		}()
	}
	wg.Wait()
	st, err = l.LedgerState(b.ctx)
	require.NoError(t, err)
	require.GreaterOrEqual(t, st.SourceToken, highest, "the source is at least every token issued")
	require.Zero(t, st.OpenRollbacks)
}

// testLedgerRollbackAcknowledged: a recorded rollback is open until
// acknowledged; the acknowledgement names who, moves the source past the
// seen token (the next claim's token is above it) and leaves nothing open.
func testLedgerRollbackAcknowledged(t *testing.T, s *suite) {
	b := s.setup(t)
	l := b.ledger(t)
	b.tenant(t, "acme")
	first := b.create(t, "acme", "k1")

	rec, err := l.RecordLedgerRollback(b.ctx, "replica-a", first.FencingToken+100, first.FencingToken)
	require.NoError(t, err)
	require.NotZero(t, rec.ID)
	require.Equal(t, "replica-a", rec.Replica)
	require.Equal(t, first.FencingToken+100, rec.SeenToken)
	require.Equal(t, first.FencingToken, rec.SourceToken)
	require.False(t, rec.DetectedAt.IsZero())
	require.True(t, rec.AcknowledgedAt.IsZero())
	_, err = l.RecordLedgerRollback(b.ctx, "replica-b", first.FencingToken+50, first.FencingToken)
	require.NoError(t, err)

	st, err := l.LedgerState(b.ctx)
	require.NoError(t, err)
	require.Equal(t, idem.LedgerState{SourceToken: first.FencingToken, OpenRollbacks: 2, OpenSeenToken: first.FencingToken + 100}, st)

	acked, source, err := l.AcknowledgeLedgerRollbacks(b.ctx, "ops@example")
	require.NoError(t, err)
	require.Len(t, acked, 2)
	for _, a := range acked {
		require.Equal(t, "ops@example", a.AcknowledgedBy)
		require.False(t, a.AcknowledgedAt.IsZero())
	}
	require.GreaterOrEqual(t, source, first.FencingToken+100)
	st, err = l.LedgerState(b.ctx)
	require.NoError(t, err)
	require.Equal(t, idem.LedgerState{SourceToken: source}, st, "nothing open after the acknowledgement")
	next := b.create(t, "acme", "k2")
	require.Greater(t, next.FencingToken, first.FencingToken+100, "no token seen before the rollback is issued again")

	acked, again, err := l.AcknowledgeLedgerRollbacks(b.ctx, "ops@example")
	require.NoError(t, err)
	require.Empty(t, acked, "nothing left to acknowledge")
	require.Equal(t, next.FencingToken, again, "acknowledging nothing moves nothing")
}
