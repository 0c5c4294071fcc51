package storetest

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
)

// racers is how many goroutines fight over one key.
const racers = 64

func testRaceClaim(t *testing.T, s *suite) {
	b := s.setup(t, "acme")

	results, errs := b.raceClaims("acme", "k")

	winner := soleClaim(t, results, errs, idem.ActionCreate, "two claims created the key", "racer %d")
	require.NotEqual(t, -1, winner, "no claim created the key")
	inFlight := 0
	for _, err := range errs {
		if err != nil {
			inFlight++
		}
	}
	require.Equal(t, racers-1, inFlight)

	got := b.get(t, "acme", "k")
	require.Equal(t, 1, got.Attempt)
	require.Equal(t, results[winner].Record.FencingToken, got.FencingToken, "the stored token is not the winner's")
	requireSameRecord(t, results[winner].Record, got)
}

func testRaceTakeover(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	first := b.create(t, "acme", "k")
	b.advance(time.Hour)

	results, errs := b.raceClaims("acme", "k")

	winner := soleClaim(t, results, errs, idem.ActionTakeover, "two claims took the orphan over", "racer %d")
	require.NotEqual(t, -1, winner, "nobody took the orphan over")

	got := b.get(t, "acme", "k")
	require.Equal(t, 2, got.Attempt)
	require.Greater(t, got.FencingToken, first.FencingToken)
	require.Equal(t, results[winner].Record.FencingToken, got.FencingToken, "the stored token is not the winner's")
}

func testRaceComplete(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	rec := b.create(t, "acme", "k")

	results, errs := raceEach(racers, func(i int) (idem.Record, error) {
		return b.store.Complete(b.ctx, idem.CompleteParams{
			TenantID: "acme", Key: "k", FencingToken: rec.FencingToken, Response: response(i),
		})
	})

	winner := soleWinner(t, errs, "two different responses were accepted", func(i int, err error) {
		requireCode(t, err, idem.ErrAlreadyCompleted, "racer %d", i)
	})
	require.NotEqual(t, -1, winner, "no response was stored")
	requireResponse(t, response(winner), results[winner].Response)

	got := b.get(t, "acme", "k")
	require.Equal(t, idem.StateCompleted, got.State)
	requireResponse(t, response(winner), got.Response)

	res := b.claim(t, ClaimParams("acme", "k"))
	require.Equal(t, idem.ActionReplay, res.Action)
	requireResponse(t, response(winner), res.Record.Response)
}

// testRaceCompleteVersusTakeover races the old holder's late complete with
// a takeover of its orphaned key: either the completion lands and the claim
// replays it, or the takeover lands and the completion is refused. Never
// both.
func testRaceCompleteVersusTakeover(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	const keys = 24
	tokens := make([]int64, keys)
	for i := range keys {
		tokens[i] = b.create(t, "acme", fmt.Sprintf("k-%02d", i)).FencingToken
	}
	b.advance(time.Hour)

	claims := make([]idem.ClaimResult, keys)
	claimErrs := make([]error, keys)
	completeErrs := make([]error, keys)
	race(2*keys, func(i int) {
		k := i / 2
		key := fmt.Sprintf("k-%02d", k)
		if i%2 == 0 {
			_, completeErrs[k] = b.store.Complete(b.ctx, idem.CompleteParams{
				TenantID: "acme", Key: key, FencingToken: tokens[k], Response: response(k),
			})
			return
		}
		claims[k], claimErrs[k] = b.store.Claim(b.ctx, ClaimParams("acme", key))
	})

	for k := range keys {
		key := fmt.Sprintf("k-%02d", k)
		require.NoError(t, claimErrs[k], key)
		got := b.get(t, "acme", key)
		switch claims[k].Action {
		case idem.ActionReplay:
			require.NoError(t, completeErrs[k], "%s: the claim replayed but the completion failed", key)
			requireResponse(t, response(k), claims[k].Record.Response)
			require.Equal(t, idem.StateCompleted, got.State, key)
			requireResponse(t, response(k), got.Response)
		case idem.ActionTakeover:
			requireCode(t, completeErrs[k], idem.ErrLeaseLost, "%s: the old holder completed a key that was taken over", key)
			require.Equal(t, idem.StateInFlight, got.State, key)
			require.Nil(t, got.Response, key)
			require.Equal(t, 2, got.Attempt, key)
			require.Equal(t, claims[k].Record.FencingToken, got.FencingToken, key)
		default:
			t.Fatalf("%s: unexpected claim action %s", key, claims[k].Action)
		}
	}
}

func testRaceReap(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	const n = 40
	for i := range n {
		b.create(t, "acme", fmt.Sprintf("k-%02d", i))
	}
	b.advance(defaultReaperThreshold + 2*defaultLease)

	const reapers = 8
	deleted := make([][]string, reapers)
	errs := make([]error, reapers)
	race(reapers, func(i int) {
		for {
			recs, err := b.store.Reap(b.ctx, idem.ReapParams{Limit: 3})
			if err != nil {
				errs[i] = err
				return
			}
			if len(recs) > 3 {
				errs[i] = fmt.Errorf("reap returned %d records with limit 3", len(recs))
				return
			}
			if len(recs) == 0 {
				return
			}
			deleted[i] = append(deleted[i], keysOf(recs)...)
		}
	})
	var all []string
	for i := range reapers {
		require.NoError(t, errs[i], "reaper %d", i)
		all = append(all, deleted[i]...)
	}
	slices.Sort(all)
	want := make([]string, n)
	for i := range n {
		want[i] = fmt.Sprintf("k-%02d", i)
	}
	require.Equal(t, want, all, "every record must be reported deleted by exactly one reaper")

	recs, err := b.store.ListRecords(b.ctx, idem.ListRecordsParams{TenantID: "acme", Limit: 100})
	require.NoError(t, err)
	require.Empty(t, recs)
}
