package storetest

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
)

// The completer's side of a Driver (completer.go): registrations, the
// takeover of orphans, each attempt's outcome with its audit entry, the
// claim answers while the completer holds a key, the listings' filters.

func completerGroup() group {
	return group{"Completer", []testCase{
		{"Registrations", testCompleterRegistrations},
		{"PicksMatchingOrphansOnly", testCompleterPicksMatching},
		{"TakeoverFencesWorker", testCompleterTakeoverFences},
		{"DeadlineBeforePurge", testCompleterDeadlineBeforePurge},
		{"Completed", testCompleterCompleted},
		{"CompletedHeadersChecked", testCompleterCompletedHeadersChecked},
		{"NotDoneReleases", testCompleterNotDone},
		{"UnknownHoldsKey", testCompleterUnknownHolds},
		{"ReviewRefusesRetry", testCompleterReview},
		{"DeadAttemptTakenAgain", testCompleterDeadAttempt},
		{"PickRace", testCompleterPickRace},
		{"PickBoundedPerTenant", testCompleterPickPerTenant},
		{"UnknownWaitsOutExtendedLease", testCompleterUnknownWaitsOutLease},
		{"ListingFilters", testCompleterListing},
	}}
}

const completerLease = 10 * time.Second

var completerPolicy = idem.PickCompletionsParams{Limit: 100, Lease: completerLease, Deadline: time.Hour}

// completer registers a completer for tenant.
func (b *bundle) completer(t *testing.T, tenant, pattern string) idem.Completer {
	t.Helper()
	c, err := b.store.Completers().CreateCompleter(b.ctx, idem.Completer{
		TenantID: tenant, ID: idem.NewCompleterID(), URL: "https://resume.example/" + tenant,
		Secret: idem.NewWebhookSecret(), OperationPattern: pattern,
	})
	require.NoError(t, err)
	return c
}

// setupPicked opens a store with tenant acme, a completer of all its
// operations and an orphan k the completer has picked, and returns the
// pick.
func (s *suite) setupPicked(t *testing.T) (*bundle, idem.PickedCompletion) {
	t.Helper()
	b := s.setup(t, "acme")
	b.completer(t, "acme", "")
	b.orphan(t, "acme", "k")
	return b, b.pick(t)[0]
}

// pick picks and requires success.
func (b *bundle) pick(t *testing.T) []idem.PickedCompletion {
	t.Helper()
	picked, err := b.store.Completers().PickCompletions(b.ctx, completerPolicy)
	require.NoError(t, err)
	return picked
}

// finish finishes the attempt of pc with outcome.
func (b *bundle) finish(t *testing.T, pc idem.PickedCompletion, outcome idem.CompletionOutcome, resp *idem.Response, retry time.Duration) (idem.Record, error) {
	t.Helper()
	return b.store.Completers().FinishCompletion(b.ctx, idem.FinishCompletionParams{
		TenantID: pc.Record.TenantID, Key: pc.Record.Key, FencingToken: pc.Record.FencingToken,
		Attempt: pc.Record.Completion.Attempts, Outcome: outcome, Response: resp, RetryIn: retry,
		Note: "attempt " + string(outcome), CompleterID: pc.Completer.ID,
	})
}

func testCompleterRegistrations(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	cs := b.store.Completers()
	a := b.completer(t, "acme", "")
	c := b.completer(t, "acme", "POST /orders*")
	got, err := cs.GetCompleter(b.ctx, idem.GetCompleterParams{TenantID: "acme", ID: c.ID})
	require.NoError(t, err)
	require.Equal(t, c.URL, got.URL)
	require.Equal(t, c.Secret, got.Secret)
	require.Equal(t, "POST /orders*", got.OperationPattern)
	list, err := cs.ListCompleters(b.ctx, idem.ListCompletersParams{TenantID: "acme"})
	require.NoError(t, err)
	require.ElementsMatch(t, []string{a.ID, c.ID}, []string{list[0].ID, list[1].ID})

	_, err = cs.GetCompleter(b.ctx, idem.GetCompleterParams{TenantID: "other", ID: c.ID})
	requireCode(t, err, idem.ErrCompleterNotFound)
	_, err = cs.CreateCompleter(b.ctx, idem.Completer{TenantID: "nobody", ID: idem.NewCompleterID(), URL: "https://x.example", Secret: idem.NewWebhookSecret()})
	requireCode(t, err, idem.ErrTenantUnknown)
	for range idem.MaxCompleters - 2 {
		b.completer(t, "acme", "")
	}
	_, err = cs.CreateCompleter(b.ctx, idem.Completer{TenantID: "acme", ID: idem.NewCompleterID(), URL: "https://x.example", Secret: idem.NewWebhookSecret()})
	require.Equal(t, idem.CodeCompleterLimitReached, idem.ErrorCode(err))

	require.NoError(t, cs.DeleteCompleter(b.ctx, idem.DeleteCompleterParams{TenantID: "acme", ID: c.ID}))
	requireCode(t, cs.DeleteCompleter(b.ctx, idem.DeleteCompleterParams{TenantID: "acme", ID: c.ID}), idem.ErrCompleterNotFound)
}

func testCompleterPicksMatching(t *testing.T, s *suite) {
	b := s.setup(t, "acme", "bare")
	b.completer(t, "acme", "POST /orders*")
	exact := b.completer(t, "acme", "POST /orders/refund")

	p := ClaimParams("acme", "order")
	p.Operation = "POST /orders"
	b.claim(t, p)
	p = ClaimParams("acme", "refund")
	p.Operation = "POST /orders/refund"
	b.claim(t, p)
	p = ClaimParams("acme", "other")
	p.Operation = "POST /payments"
	b.claim(t, p)
	b.create(t, "bare", "k") // no completer
	b.create(t, "acme", "running")
	b.create(t, "acme", "flagged")
	require.Empty(t, b.pick(t), "nothing is orphaned yet")
	b.advance(defaultLease)
	b.claim(t, ClaimParams("acme", "running")) // a retry took it over first
	rec := b.get(t, "acme", "flagged")
	b.resolve(t, resolution("acme", "flagged", idem.ResolveReview, rec.FencingToken))

	picked := b.pick(t)
	keys := map[string]idem.PickedCompletion{}
	for _, pc := range picked {
		keys[pc.Record.Key] = pc
	}
	require.Len(t, keys, 2, "only acme's orphans of a matching operation, not flagged by a person: %v", keys)
	require.Contains(t, keys, "order")
	require.Contains(t, keys, "refund")
	require.True(t, keys["refund"].Matched)
	require.Equal(t, exact.ID, keys["refund"].Completer.ID, "the most specific pattern wins")
	require.Empty(t, b.pick(t), "a taken record is not picked again while the completer's lease runs")
}

func testCompleterTakeoverFences(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	b.completer(t, "acme", "")
	worker := b.create(t, "acme", "k")
	b.checkpoint(t, idem.CheckpointParams{TenantID: "acme", Key: "k", FencingToken: worker.FencingToken, RecoveryPoint: "charged", Data: []byte(`{"charge":"ch_1"}`), Lease: defaultLease})
	b.advance(defaultLease)
	at := b.now()
	picked := b.pick(t)
	require.Len(t, picked, 1)
	rec := picked[0].Record
	require.Greater(t, rec.FencingToken, worker.FencingToken)
	require.Equal(t, 2, rec.Attempt)
	require.Equal(t, "charged", rec.RecoveryPoint)
	requireBytes(t, []byte(`{"charge":"ch_1"}`), rec.RecoveryData, "RecoveryData")
	require.NotNil(t, rec.Completion)
	require.Equal(t, idem.CompletionResuming, rec.Completion.State)
	require.Equal(t, 1, rec.Completion.Attempts)
	requireTime(t, at.Add(completerLease), rec.LeaseExpiresAt, "LeaseExpiresAt")
	requireTime(t, at.Add(time.Hour), rec.Completion.Deadline, "Deadline")

	_, err := b.store.Complete(b.ctx, idem.CompleteParams{TenantID: "acme", Key: "k", FencingToken: worker.FencingToken, Response: response(1)})
	requireCode(t, err, idem.ErrLeaseLost, "the late worker is fenced off")
	requireCode(t, b.store.Release(b.ctx, idem.ReleaseParams{TenantID: "acme", Key: "k", FencingToken: worker.FencingToken}), idem.ErrLeaseLost)
	_, err = b.store.Claim(b.ctx, ClaimParams("acme", "k"))
	requireCode(t, err, idem.ErrOutcomeUnknown, "a retry never takes a record the completer holds")
	require.Equal(t, completerLease, err.(*idem.Error).RetryAfter)
	// The resume endpoint may checkpoint with the completer's token.
	b.checkpoint(t, idem.CheckpointParams{TenantID: "acme", Key: "k", FencingToken: rec.FencingToken, RecoveryPoint: "shipped", Lease: defaultLease})
}

func testCompleterCompleted(t *testing.T, s *suite) {
	b, pc := s.setupPicked(t)
	resp := response(7)
	rec, err := b.finish(t, pc, idem.OutcomeCompleted, &resp, 0)
	require.NoError(t, err)
	require.Equal(t, idem.StateCompleted, rec.State)
	require.Nil(t, rec.Completion)
	got := b.get(t, "acme", "k")
	requireResponse(t, resp, got.Response)
	require.Equal(t, pc.Record.FencingToken, got.FencingToken, "completed with the completer's token")
	res := b.claim(t, ClaimParams("acme", "k"))
	require.Equal(t, idem.ActionReplay, res.Action)
	_, err = b.finish(t, pc, idem.OutcomeCompleted, &resp, 0)
	requireCode(t, err, idem.ErrAlreadyCompleted, "an outcome is applied once")

	entries := b.audit(t, "acme", "k")
	require.Len(t, entries, 1)
	require.Equal(t, idem.AuditCompleterCompleted, entries[0].Action)
	require.Equal(t, pc.Record.FencingToken, entries[0].FencingToken)
	require.Equal(t, idem.CompleterActor("acme", pc.Completer.ID), entries[0].Actor)
}

func testCompleterNotDone(t *testing.T, s *suite) {
	b, pc := s.setupPicked(t)
	_, err := b.finish(t, pc, idem.OutcomeNotDone, nil, 0)
	require.NoError(t, err)
	b.requireAbsent(t, "acme", "k")
	require.Equal(t, idem.ActionCreate, b.claim(t, ClaimParams("acme", "k")).Action, "the next retry runs it")
	entries := b.audit(t, "acme", "k")
	require.Len(t, entries, 1)
	require.Equal(t, idem.AuditCompleterReleased, entries[0].Action)
}

func testCompleterUnknownHolds(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	b.completer(t, "acme", "")
	b.orphan(t, "acme", "k")
	tokens := map[int64]bool{}
	for attempt := 1; attempt <= 3; attempt++ {
		picked := b.pick(t)
		require.Len(t, picked, 1, "attempt %d", attempt)
		pc := picked[0]
		require.Equal(t, attempt, pc.Record.Completion.Attempts)
		require.False(t, tokens[pc.Record.FencingToken], "every attempt takes a new token")
		tokens[pc.Record.FencingToken] = true
		rec, err := b.finish(t, pc, idem.OutcomeUnknown, nil, time.Minute)
		require.NoError(t, err)
		require.Equal(t, idem.CompletionUnknown, rec.Completion.State)
		requireTime(t, b.now().Add(time.Minute), rec.Completion.NextAttemptAt, "NextAttemptAt")
		require.Equal(t, idem.StateOrphaned, rec.APIState(), "the lease is not a retry's")

		_, err = b.store.Claim(b.ctx, ClaimParams("acme", "k"))
		requireCode(t, err, idem.ErrOutcomeUnknown)
		require.Equal(t, time.Minute, err.(*idem.Error).RetryAfter, "Retry-After is the next attempt")
		require.Empty(t, b.pick(t), "not before the next attempt is due")
		b.advance(time.Minute)
	}
	entries := b.audit(t, "acme", "k")
	require.Len(t, entries, 3, "one audit entry per attempt")
	for _, e := range entries {
		require.Equal(t, idem.AuditCompleterUnknown, e.Action)
	}
	stats, err := b.store.Completers().CompletionStats(b.ctx)
	require.NoError(t, err)
	require.Len(t, stats, 1)
	require.Equal(t, idem.CompletionUnknown, stats[0].State)
	require.EqualValues(t, 1, stats[0].Count)

	// A person flags it meanwhile: the completer leaves it to the person,
	// and a retry is told so.
	rec := b.get(t, "acme", "k")
	b.resolve(t, resolution("acme", "k", idem.ResolveReview, rec.FencingToken))
	require.Empty(t, b.pick(t), "the completer does not take up a key a person flagged")
	_, err = b.store.Claim(b.ctx, ClaimParams("acme", "k"))
	requireCode(t, err, idem.ErrOutcomeReview)
}

// A resume endpoint's response is checked as a worker's complete is: a
// header no front door could replay (CR or LF in the value, a name that is
// no HTTP token) is refused, and the record is left as the attempt took it.
func testCompleterCompletedHeadersChecked(t *testing.T, s *suite) {
	b := s.setup(t)
	b.tenant(t, "acme")
	b.completer(t, "acme", "")
	b.orphan(t, "acme", "k")
	pc := b.pick(t)[0]
	for _, h := range []map[string]string{
		{"X-Order": "1\r\nSet-Cookie: session=stolen"},
		{"X Order": "1"},
	} {
		_, err := b.finish(t, pc, idem.OutcomeCompleted, &idem.Response{Status: 201, Headers: h, BodyEncoding: idem.BodyEncodingUTF8}, 0)
		requireCode(t, err, idem.ErrInvalidRequest, "%v", h)
		rec := b.get(t, "acme", "k")
		require.Equal(t, idem.StateInFlight, rec.State)
		require.Equal(t, idem.CompletionResuming, rec.Completion.State, "the attempt still holds it")
	}
	require.Empty(t, b.audit(t, "acme", "k"), "nothing recorded")
	rec, err := b.finish(t, pc, idem.OutcomeCompleted, &idem.Response{Status: 201, Headers: map[string]string{"X-Order": "1"}, BodyEncoding: idem.BodyEncodingUTF8}, 0)
	require.NoError(t, err)
	require.Equal(t, idem.StateCompleted, rec.State)
}

func testCompleterReview(t *testing.T, s *suite) {
	b, pc := s.setupPicked(t)
	rec, err := b.finish(t, pc, idem.OutcomeReview, nil, 0)
	require.NoError(t, err)
	require.Equal(t, idem.CompletionReview, rec.Completion.State)
	require.NotNil(t, rec.Review)
	require.Equal(t, "attempt review", rec.Review.Note)
	_, err = b.store.Claim(b.ctx, ClaimParams("acme", "k"))
	requireCode(t, err, idem.ErrOutcomeReview)
	b.advance(time.Hour)
	require.Empty(t, b.pick(t), "the completer never takes a record up again once it gave up")

	// A person resolves it: the key is released and runs again.
	b.resolve(t, resolution("acme", "k", idem.ResolveRelease, rec.FencingToken))
	require.Equal(t, idem.ActionCreate, b.claim(t, ClaimParams("acme", "k")).Action)
	entries := b.audit(t, "acme", "k")
	require.Len(t, entries, 2)
	require.Equal(t, idem.ResolveRelease, entries[0].Action)
	require.Equal(t, idem.AuditCompleterReview, entries[1].Action)
}

func testCompleterDeadAttempt(t *testing.T, s *suite) {
	b, dead := s.setupPicked(t)
	b.advance(completerLease) // the replica died mid-attempt
	again := b.pick(t)
	require.Len(t, again, 1)
	require.Greater(t, again[0].Record.FencingToken, dead.Record.FencingToken)
	require.Equal(t, 2, again[0].Record.Completion.Attempts)
	resp := response(3)
	_, err := b.finish(t, dead, idem.OutcomeCompleted, &resp, 0)
	requireCode(t, err, idem.ErrLeaseLost, "the dead attempt's answer is never applied")
	_, err = b.finish(t, again[0], idem.OutcomeNotDone, nil, 0)
	require.NoError(t, err)
	require.Len(t, b.audit(t, "acme", "k"), 1, "the dead attempt wrote nothing")
}

func testCompleterPickRace(t *testing.T, s *suite) {
	b := s.setupDBClock(t)
	b.tenant(t, "acme")
	b.completer(t, "acme", "")
	const n = 40
	for i := range n {
		p := ClaimParams("acme", fmt.Sprintf("k%d", i))
		p.Lease = time.Millisecond
		b.claim(t, p)
	}
	require.Eventually(t, func() bool {
		st, err := b.store.OrphanStats(b.ctx)
		return err == nil && len(st) == 1 && st[0].Count == n
	}, 10*time.Second, 5*time.Millisecond)
	var mu sync.Mutex
	seen := map[string]int{}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 20 {
				picked, err := b.store.Completers().PickCompletions(b.ctx, idem.PickCompletionsParams{Limit: 3, Lease: time.Hour, Deadline: time.Hour})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				for _, pc := range picked {
					seen[pc.Record.Key]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	require.Len(t, seen, n, "every orphan is taken")
	for k, c := range seen {
		require.Equal(t, 1, c, "%s taken %d times", k, c)
	}
}

func testCompleterListing(t *testing.T, s *suite) {
	b := s.setup(t, "acme")
	b.completer(t, "acme", "")
	b.orphan(t, "acme", "unknown")
	pc := b.pick(t)[0]
	_, err := b.finish(t, pc, idem.OutcomeUnknown, nil, time.Minute)
	require.NoError(t, err)
	b.orphan(t, "acme", "review")
	pc = b.pick(t)[0]
	_, err = b.finish(t, pc, idem.OutcomeReview, nil, 0)
	require.NoError(t, err)
	b.create(t, "acme", "plain")

	keys := func(recs []idem.Record) []string {
		out := []string{}
		for _, r := range recs {
			out = append(out, r.Key)
		}
		return out
	}
	for filter, want := range map[idem.CompletionFilter][]string{idem.FilterUnknown: {"unknown"}, idem.FilterReview: {"review"}} {
		recs, err := b.store.ListRecords(b.ctx, idem.ListRecordsParams{TenantID: "acme", Completion: filter, Limit: 10})
		require.NoError(t, err)
		require.Equal(t, want, keys(recs), "records %s", filter)
		require.Equal(t, idem.CompletionState(filter), recs[0].Completion.State)
		recs, err = b.store.ListOrphans(b.ctx, idem.ListOrphansParams{Completion: filter, Limit: 10})
		require.NoError(t, err)
		require.Equal(t, want, keys(recs), "orphans %s", filter)
	}
	stats, err := b.store.Completers().CompletionStats(b.ctx)
	require.NoError(t, err)
	require.Len(t, stats, 2)
}

// A pick takes at most PerTenant records of one tenant, its oldest leases
// first, and none of SkipTenants: one tenant's backlog never takes every
// slot of the completer while another tenant's orphan waits.
func testCompleterPickPerTenant(t *testing.T, s *suite) {
	b := s.setup(t)
	b.tenant(t, "hog")
	b.tenant(t, "calm")
	b.completer(t, "hog", "")
	b.completer(t, "calm", "")
	for i := range 5 {
		b.orphan(t, "hog", fmt.Sprintf("h%d", i))
	}
	b.orphan(t, "calm", "c")
	p := completerPolicy
	p.Limit, p.PerTenant, p.SkipTenants = 3, 2, nil
	picked, err := b.store.Completers().PickCompletions(b.ctx, p)
	require.NoError(t, err)
	per := map[string]int{}
	for _, pc := range picked {
		per[pc.Record.TenantID]++
	}
	require.Equal(t, map[string]int{"hog": 2, "calm": 1}, per, "at most PerTenant of the hog, and the calm tenant's orphan")

	// Skipping a tenant leaves the others' orphans to be picked (on
	// SQLite a skip list bound its values over the query's numbered
	// parameters, and a tenant at its share stopped every pick).
	b.orphan(t, "calm", "c2")
	p.PerTenant, p.SkipTenants = 5, []string{"hog"}
	picked, err = b.store.Completers().PickCompletions(b.ctx, p)
	require.NoError(t, err)
	keys := map[string]bool{}
	for _, pc := range picked {
		require.Equal(t, "calm", pc.Record.TenantID, "nothing of a skipped tenant")
		keys[pc.Record.Key] = true
	}
	require.True(t, keys["c2"], "the calm tenant's new orphan is picked beside the skipped tenant")
	p.SkipTenants = []string{"hog", "calm"}
	picked, err = b.store.Completers().PickCompletions(b.ctx, p)
	require.NoError(t, err)
	require.Empty(t, picked, "nothing of skipped tenants")
	p.SkipTenants = nil
	picked, err = b.store.Completers().PickCompletions(b.ctx, p)
	require.NoError(t, err)
	require.Len(t, picked, 3, "the hog's other orphans once it is not skipped")
	for _, pc := range picked {
		require.Equal(t, "hog", pc.Record.TenantID)
	}
}

// An attempt without an answer (a timeout) whose function checkpointed
// under the attempt's token, extending the lease past the completer's:
// the next attempt is due no sooner than that lease, so it never runs
// beside the function; with an answer (WaitOutLease false) the backoff
// alone decides.
func testCompleterUnknownWaitsOutLease(t *testing.T, s *suite) {
	b := s.setup(t)
	b.tenant(t, "acme")
	b.completer(t, "acme", "")
	for _, wait := range []bool{true, false} {
		key := fmt.Sprintf("k-%v", wait)
		b.orphan(t, "acme", key)
		picked := b.pick(t)
		require.Len(t, picked, 1)
		pc := picked[0]
		// The resume function checkpoints while the completer's call times out.
		b.checkpoint(t, idem.CheckpointParams{
			TenantID: "acme", Key: key, FencingToken: pc.Record.FencingToken,
			RecoveryPoint: "charged", Lease: time.Hour,
		})
		leaseEnd := b.get(t, "acme", key).LeaseExpiresAt
		rec, err := b.store.Completers().FinishCompletion(b.ctx, idem.FinishCompletionParams{
			TenantID: "acme", Key: key, FencingToken: pc.Record.FencingToken, Attempt: pc.Record.Completion.Attempts,
			Outcome: idem.OutcomeUnknown, RetryIn: time.Minute, WaitOutLease: wait,
			Note: "outcome unknown: timeout", CompleterID: pc.Completer.ID,
		})
		require.NoError(t, err)
		require.Equal(t, idem.CompletionUnknown, rec.Completion.State)
		if wait {
			requireTime(t, leaseEnd, rec.Completion.NextAttemptAt, "NextAttemptAt waits out the extended lease")
			b.advance(time.Minute)
			require.Empty(t, b.pick(t), "no second attempt while the function's lease runs")
			b.advance(time.Hour)
			again := b.pick(t)
			require.Len(t, again, 1, "taken again once the lease ran out")
			require.Equal(t, "charged", again[0].Record.RecoveryPoint)
			_, err := b.finish(t, again[0], idem.OutcomeReview, nil, 0)
			require.NoError(t, err)
		} else {
			requireTime(t, b.now().Add(time.Minute), rec.Completion.NextAttemptAt, "an answered unknown: the backoff alone")
		}
	}
}
