// Package storetest is the conformance suite every idem.Driver must pass.
//
// A backend wires it up in one test:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T, now func() time.Time) idem.Driver {
//			s, err := mybackend.Open(t.Context(), dsn(t), mybackend.Options{Now: now})
//			require.NoError(t, err)
//			t.Cleanup(func() { _ = s.Close() })
//			return s
//		})
//	}
//
// Every subtest runs in parallel with a fresh, empty store of its own. Most
// tests drive the store with a fake Clock, so leases, replay windows and
// reaper thresholds pass without sleeping; one test opens the store with a
// nil now and proves that the database clock really expires a lease.
//
// The suite asserts the invariants of the claim state machine and the exact
// error codes of the contract (errors.Is against the idem sentinels and
// idem.ErrorCode), not only that calls succeed.
package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
)

// OpenFunc opens a fresh, empty store (no tenants, no keys) for one test.
// A nil now means the store uses its database clock; otherwise every time the
// store reads or writes comes from now. The function registers the store's
// Close with t.Cleanup.
type OpenFunc func(t *testing.T, now func() time.Time) idem.Driver

// Run runs the conformance suite against the store that open returns. Each
// subtest calls open for a store of its own.
func Run(t *testing.T, open func(t *testing.T, now func() time.Time) idem.Driver) {
	t.Helper()
	s := &suite{open: open}
	for _, g := range groups() {
		t.Run(g.name, func(t *testing.T) {
			t.Parallel()
			for _, tc := range g.tests {
				t.Run(tc.name, func(t *testing.T) {
					t.Parallel()
					tc.fn(t, s)
				})
			}
		})
	}
}

type testCase struct {
	name string
	fn   func(t *testing.T, s *suite)
}

type group struct {
	name  string
	tests []testCase
}

func groups() []group {
	return []group{
		{"Claim", []testCase{
			{"AbsentCreates", testClaimAbsentCreates},
			{"UnknownTenant", testClaimUnknownTenant},
			{"InFlightRejected", testClaimInFlightRejected},
			{"InFlightMismatchCheckedFirst", testClaimInFlightMismatch},
			{"OrphanTakeover", testClaimOrphanTakeover},
			{"OrphanBoundary", testClaimOrphanBoundary},
			{"OrphanMismatch", testClaimOrphanMismatch},
			{"CompletedReplay", testClaimCompletedReplay},
			{"CompletedMismatch", testClaimCompletedMismatch},
			{"ExpiredCreatesAfresh", testClaimExpiredCreatesAfresh},
			{"ExpiredBoundary", testClaimExpiredBoundary},
			{"DatabaseClockLeaseExpiry", testClaimDatabaseClock},
			{"KeptRecordTakesNoToken", testClaimKeptRecordTakesNoToken},
		}},
		{"AttemptID", []testCase{
			{"SameAttemptRecovered", testAttemptRecovered},
			{"OtherAttemptRejected", testAttemptOtherRejected},
			{"TakeoverNewToken", testAttemptTakeoverNewToken},
		}},
		{"Concurrency", []testCase{
			{"ClaimRace", testRaceClaim},
			{"TakeoverRace", testRaceTakeover},
			{"CompleteRace", testRaceComplete},
			{"CompleteVersusTakeover", testRaceCompleteVersusTakeover},
			{"ReapRace", testRaceReap},
			{"ClaimsVersusComplete", testRaceClaimsVersusComplete},
			{"ClaimsVersusRelease", testRaceClaimsVersusRelease},
			{"ClaimsAtExpiry", testRaceClaimsAtExpiry},
			{"ReplaysVersusTenantDelete", testRaceReplaysVersusTenantDelete},
		}},
		{"Fencing", []testCase{
			{"TokensIncrease", testFencingTokensIncrease},
			{"StaleTokenRefused", testFencingStaleToken},
			{"AbsentKey", testFencingAbsentKey},
			{"LedgerSourceCoversTokens", testLedgerSourceCoversTokens},
			{"LedgerRollbackAcknowledged", testLedgerRollbackAcknowledged},
		}},
		{"Complete", []testCase{
			{"StoresResponse", testCompleteStoresResponse},
			{"AnswerIsTheStoredRecord", testCompleteAnswerIsStored},
			{"StatusOutsideTheAPIRefused", testCompleteStatusRange},
			{"AfterLeaseRanOut", testCompleteAfterLeaseRanOut},
			{"SameResponseIsNoop", testCompleteSameResponseNoop},
			{"DifferentResponse", testCompleteDifferentResponse},
			{"CompletedRefusesCheckpointAndRelease", testCompleteRefusesCheckpointRelease},
			{"RecordsKeepTheirWindows", testCompleteKeepsWindows},
		}},
		{"Checkpoint", []testCase{
			{"RenewsLeaseAndStoresRecovery", testCheckpointRenews},
			{"AfterLeaseRanOut", testCheckpointAfterLeaseRanOut},
		}},
		{"Release", []testCase{
			{"RemovesRecord", testReleaseRemoves},
			{"Orphaned", testReleaseOrphaned},
		}},
		{"Resolve", []testCase{
			{"Release", testResolveRelease},
			{"Complete", testResolveComplete},
			{"Review", testResolveReview},
			{"RequiresOrphan", testResolveRequiresOrphan},
			{"Refused", testResolveRefused},
			{"LateWorker", testResolveLateWorker},
			{"Race", testRaceResolutions},
			{"RaceWithWorker", testRaceResolveVersusWorker},
			{"AuditListing", testAuditListing},
		}},
		{"GetRecord", []testCase{
			{"AllFields", testGetRecordAllFields},
			{"APIStates", testGetRecordAPIStates},
		}},
		{"ListRecords", []testCase{
			{"NewestFirst", testListRecordsNewestFirst},
			{"StateFilter", testListRecordsStateFilter},
			{"Pagination", testListRecordsPagination},
			{"OmitRecoveryData", testListsOmitRecoveryData},
		}},
		{"Orphans", []testCase{
			{"ListAcrossTenants", testListOrphans},
			{"Pagination", testListOrphansPagination},
			{"Stats", testOrphanStats},
		}},
		{"Reap", []testCase{
			{"PastPurgeAfter", testReapPastPurgeAfter},
			{"Batches", testReapBatches},
			{"NeverDeletesRunningLease", testReapNeverDeletesRunningLease},
			{"PurgeTimes", testReapPurgeTimes},
			{"DisabledTenantKeepsRecords", testReapDisabledTenantKeepsRecords},
		}},
		{"Tenants", []testCase{
			{"CreateAndGet", testTenantCreateGet},
			{"Duplicate", testTenantDuplicate},
			{"NotFound", testTenantNotFound},
			{"ListOrderedByID", testTenantList},
			{"Update", testTenantUpdate},
			{"Delete", testTenantDelete},
			{"DeleteRacesClaims", testTenantDeleteRacesClaims},
			{"Ping", testPing},
		}},
		{"Quota", []testCase{
			{"CountsEveryWrite", testQuotaCountsEveryWrite},
			{"ConcurrentWrites", testQuotaConcurrentWrites},
			{"BackToZero", testQuotaBackToZero},
			{"RefusesNewRecords", testQuotaRefusesNewRecords},
			{"Race", testQuotaRace},
			{"CompleteBounded", testQuotaCompleteBounded},
			{"CheckpointBounded", testQuotaCheckpointBounded},
			{"ConcurrentCompletesBounded", testQuotaConcurrentCompletesBounded},
		}},
		{"KeyEvents", []testCase{
			{"CompleteReleaseReapDeleteWake", testEventsWake},
			{"Close", testEventsClose},
			{"ResolveWakes", testEventsResolve},
			{"Watch", testEventsWatch},
			{"WaiterRacesComplete", testEventsWaiterRacesComplete},
			{"WaiterAcrossReclaim", testEventsWaiterAcrossReclaim},
		}},
		{"Isolation", []testCase{
			{"SameKeyTwoTenants", testIsolationSameKey},
			{"OtherTenantNeverSeesKey", testIsolationInvisible},
		}},
		webhookGroup(),
		completerGroup(),
	}
}

// suite holds what every test needs to open its own store.
type suite struct {
	open OpenFunc
}

// bundle is one test's store and clock.
type bundle struct {
	store idem.Driver
	// clock drives the store; nil when the store uses the database clock.
	clock *Clock
	ctx   context.Context
}

// setup opens a fresh store driven by a fake clock, with the tenants
// named created with the default settings.
func (s *suite) setup(t *testing.T, tenants ...string) *bundle {
	t.Helper()
	clock := NewClock()
	store := s.open(t, clock.Now)
	require.NotNil(t, store, "open returned a nil store")
	b := &bundle{store: store, clock: clock, ctx: t.Context()}
	for _, id := range tenants {
		b.tenant(t, id)
	}
	return b
}

// setupDBClock opens a fresh store that uses the database clock.
func (s *suite) setupDBClock(t *testing.T) *bundle {
	t.Helper()
	store := s.open(t, nil)
	require.NotNil(t, store, "open returned a nil store")
	return &bundle{store: store, ctx: t.Context()}
}

// now returns the fake clock's instant.
func (b *bundle) now() time.Time { return b.clock.Now() }

// advance moves the fake clock.
func (b *bundle) advance(d time.Duration) { b.clock.Advance(d) }

// tenant creates a tenant with the default settings.
func (b *bundle) tenant(t *testing.T, id string) idem.Tenant {
	t.Helper()
	return b.tenantWith(t, id, idem.DefaultSettings())
}

// tenantWith creates a tenant with the given settings.
func (b *bundle) tenantWith(t *testing.T, id string, st idem.Settings) idem.Tenant {
	t.Helper()
	return createTenant(t, b.store, id, st)
}

// CreateTenant creates tenant id with the default settings in store and
// requires success: the suite's tenant fixture, for backend tests too.
func CreateTenant(t *testing.T, store idem.Store, id string) idem.Tenant {
	t.Helper()
	return createTenant(t, store, id, idem.DefaultSettings())
}

func createTenant(t *testing.T, store idem.Store, id string, st idem.Settings) idem.Tenant {
	t.Helper()
	require.NoError(t, st.Validate())
	ten, err := store.CreateTenant(t.Context(), idem.CreateTenantParams{ID: id, Name: "Tenant " + id, Settings: st})
	require.NoError(t, err, "create tenant %s", id)
	return ten
}

// Defaults of the claims the suite makes.
const (
	defaultOperation       = "POST /v1/payments"
	defaultFingerprint     = "sha256:aaaa"
	defaultLease           = 30 * time.Second
	defaultReplayWindow    = 24 * time.Hour
	defaultReaperThreshold = 72 * time.Hour
)

// ClaimParams returns the suite's default claim of key in tenant. Backend
// tests that need more than the suite (several pools, engine faults) claim
// with it too.
func ClaimParams(tenant, key string) idem.ClaimParams {
	return idem.ClaimParams{
		TenantID:        tenant,
		Key:             key,
		Operation:       defaultOperation,
		Fingerprint:     defaultFingerprint,
		Lease:           defaultLease,
		ReplayWindow:    defaultReplayWindow,
		ReaperThreshold: defaultReaperThreshold,
	}
}

// claimTimed is ClaimParams with the given lease, replay window and reaper
// threshold: the three durations a test of the purge and replay times sets.
func claimTimed(tenant, key string, lease, window, threshold time.Duration) idem.ClaimParams {
	p := ClaimParams(tenant, key)
	p.Lease, p.ReplayWindow, p.ReaperThreshold = lease, window, threshold
	return p
}

// claim claims p and requires success.
func (b *bundle) claim(t *testing.T, p idem.ClaimParams) idem.ClaimResult {
	t.Helper()
	res, err := b.store.Claim(b.ctx, p)
	require.NoError(t, err, "claim %s/%s", p.TenantID, p.Key)
	return res
}

// create claims key in tenant with the default parameters and requires a
// fresh creation.
func (b *bundle) create(t *testing.T, tenant, key string) idem.Record {
	t.Helper()
	res := b.claim(t, ClaimParams(tenant, key))
	require.Equal(t, idem.ActionCreate, res.Action, "claim %s/%s", tenant, key)
	return res.Record
}

// complete completes key with token and requires success, and that the
// record Complete returned is the one stored (a store may build the answer's
// response from its input rather than read it back).
func (b *bundle) complete(t *testing.T, tenant, key string, token int64, resp idem.Response) idem.Record {
	t.Helper()
	rec, err := b.store.Complete(b.ctx, idem.CompleteParams{TenantID: tenant, Key: key, FencingToken: token, Response: resp})
	require.NoError(t, err, "complete %s/%s", tenant, key)
	requireSameRecord(t, rec, b.get(t, tenant, key))
	return rec
}

// checkpoint checkpoints key and requires success.
func (b *bundle) checkpoint(t *testing.T, p idem.CheckpointParams) idem.Record {
	t.Helper()
	rec, err := b.store.Checkpoint(b.ctx, p)
	require.NoError(t, err, "checkpoint %s/%s", p.TenantID, p.Key)
	return rec
}

// get reads key and requires success.
func (b *bundle) get(t *testing.T, tenant, key string) idem.Record {
	t.Helper()
	rec, err := b.store.GetRecord(b.ctx, idem.GetRecordParams{TenantID: tenant, Key: key})
	require.NoError(t, err, "get %s/%s", tenant, key)
	return rec
}

// requireAbsent requires that key does not exist in tenant.
func (b *bundle) requireAbsent(t *testing.T, tenant, key string) {
	t.Helper()
	_, err := b.store.GetRecord(b.ctx, idem.GetRecordParams{TenantID: tenant, Key: key})
	requireCode(t, err, idem.ErrKeyNotFound)
}

// response returns a distinct, valid response numbered n.
func response(n int) idem.Response {
	return idem.Response{
		Status: 201,
		Headers: map[string]string{
			"Content-Type": "application/json",
			"X-Order":      fmt.Sprintf("ord_%d", n),
		},
		Body:         fmt.Appendf(nil, `{"id":"ord_%d", "amount": 1000}`, n),
		BodyEncoding: idem.BodyEncodingUTF8,
	}
}

// binaryResponse returns a response whose body is every byte value once,
// stored with base64 encoding.
func binaryResponse() idem.Response {
	body := make([]byte, 256)
	for i := range body {
		body[i] = byte(i)
	}
	return idem.Response{
		Status:       503,
		Headers:      map[string]string{"Content-Type": "application/octet-stream", "Retry-After": "7"},
		Body:         body,
		BodyEncoding: idem.BodyEncodingBase64,
	}
}

// requireCode requires err to be an *idem.Error with the code of sentinel,
// both by errors.Is and by idem.ErrorCode.
func requireCode(t *testing.T, err error, sentinel *idem.Error, msgAndArgs ...any) {
	t.Helper()
	require.Error(t, err, msgAndArgs...)
	require.Equal(t, sentinel.Code, idem.ErrorCode(err), append([]any{"error %v"}, err))
	require.ErrorIs(t, err, sentinel, msgAndArgs...)
}

// requireTime requires two instants to be equal.
func requireTime(t *testing.T, want, got time.Time, field string) {
	t.Helper()
	require.Truef(t, want.Equal(got), "%s: want %s, got %s", field, want.UTC().Format(time.RFC3339Nano), got.UTC().Format(time.RFC3339Nano))
}

// requireBytes requires two byte strings to be equal, treating nil and empty
// alike.
func requireBytes(t *testing.T, want, got []byte, field string) {
	t.Helper()
	require.Truef(t, bytes.Equal(want, got), "%s: want %q, got %q", field, want, got)
}

// requireResponse requires got to be exactly want: status, headers, body
// bytes and body encoding.
func requireResponse(t *testing.T, want idem.Response, got *idem.Response) {
	t.Helper()
	require.NotNil(t, got, "response")
	require.Equal(t, want.Status, got.Status, "response status")
	require.Truef(t, maps.Equal(want.Headers, got.Headers), "response headers: want %v, got %v", want.Headers, got.Headers)
	requireBytes(t, want.Body, got.Body, "response body")
	require.Equal(t, want.BodyEncoding, got.BodyEncoding, "response body encoding")
}

// requireSameRecord requires two observations of one record to agree on
// every stored field (ObservedAt aside).
func requireSameRecord(t *testing.T, want, got idem.Record) {
	t.Helper()
	require.Equal(t, want.TenantID, got.TenantID, "TenantID")
	require.Equal(t, want.Key, got.Key, "Key")
	require.Equal(t, want.State, got.State, "State")
	require.Equal(t, want.Operation, got.Operation, "Operation")
	require.Equal(t, want.Fingerprint, got.Fingerprint, "Fingerprint")
	require.Equal(t, want.FencingToken, got.FencingToken, "FencingToken")
	require.Equal(t, want.Attempt, got.Attempt, "Attempt")
	requireTime(t, want.LeaseExpiresAt, got.LeaseExpiresAt, "LeaseExpiresAt")
	require.Equal(t, want.RecoveryPoint, got.RecoveryPoint, "RecoveryPoint")
	requireBytes(t, want.RecoveryData, got.RecoveryData, "RecoveryData")
	if want.Response == nil {
		require.Nil(t, got.Response, "Response")
	} else {
		requireResponse(t, *want.Response, got.Response)
	}
	require.Equal(t, want.ReplayWindow, got.ReplayWindow, "ReplayWindow")
	require.Equal(t, want.ReaperThreshold, got.ReaperThreshold, "ReaperThreshold")
	requireTime(t, want.CreatedAt, got.CreatedAt, "CreatedAt")
	requireTime(t, want.UpdatedAt, got.UpdatedAt, "UpdatedAt")
	requireTime(t, want.CompletedAt, got.CompletedAt, "CompletedAt")
	requireTime(t, want.ReplayUntil, got.ReplayUntil, "ReplayUntil")
	requireTime(t, want.PurgeAfter, got.PurgeAfter, "PurgeAfter")
}

// requireNoBody requires a listed record to carry no response body.
func requireNoBody(t *testing.T, r idem.Record) {
	t.Helper()
	require.Truef(t, r.Response == nil || len(r.Response.Body) == 0,
		"record %s/%s was listed with a response body", r.TenantID, r.Key)
}

// race runs fn(i) for i in [0, n) on n goroutines released at once, and
// waits for all of them.
func race(n int, fn func(i int)) {
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			fn(i)
		})
	}
	close(start)
	wg.Wait()
}

// raceEach runs fn(i) for every i in [0, n) at once, as race does, and
// returns each call's result and error.
func raceEach[T any](n int, fn func(i int) (T, error)) ([]T, []error) {
	results, errs := make([]T, n), make([]error, n)
	race(n, func(i int) { results[i], errs[i] = fn(i) })
	return results, errs
}

// eachKeyInFlight runs fn for eight keys of acme in turn ("ka", "kb", …),
// each just created (rec) and k its index: a race that may fall either way
// is tried eight times.
func (b *bundle) eachKeyInFlight(t *testing.T, fn func(k int, key string, rec idem.Record)) {
	t.Helper()
	for k := range 8 {
		key := "k" + string(rune('a'+k))
		fn(k, key, b.create(t, "acme", key))
	}
}

// raceClaims makes racers claims of key in tenant at once, with the
// default parameters, and returns each one's result and error.
func (b *bundle) raceClaims(tenant, key string) ([]idem.ClaimResult, []error) {
	return raceEach(racers, func(int) (idem.ClaimResult, error) {
		return b.store.Claim(b.ctx, ClaimParams(tenant, key))
	})
}

// raceClaimsWith makes racers claims of key in tenant and one call of
// other all at once, and returns each claim's result and error.
func (b *bundle) raceClaimsWith(tenant, key string, other func()) ([]idem.ClaimResult, []error) {
	results, errs := make([]idem.ClaimResult, racers), make([]error, racers)
	race(racers+1, func(i int) {
		if i == racers {
			other()
			return
		}
		results[i], errs[i] = b.store.Claim(b.ctx, ClaimParams(tenant, key))
	})
	return results, errs
}

// soleWinner walks the errors of a race in which at most one call may
// succeed: it fails with twoWon ("two claims created the key") when a
// second one does, hands every failure to lost, and returns the winner's
// index, or -1 when every call failed.
func soleWinner(t *testing.T, errs []error, twoWon string, lost func(i int, err error)) int {
	t.Helper()
	winner := -1
	for i, err := range errs {
		if err != nil {
			lost(i, err)
			continue
		}
		require.Equal(t, -1, winner, twoWon+": racers %d and %d", winner, i)
		winner = i
	}
	return winner
}

// soleClaim is soleWinner for a race of claims in which every loser is
// refused as in flight: the winner, if any, got action (else the test fails
// with wrongAction, a format of the racer's index). It returns the winner's
// index, or -1.
func soleClaim(t *testing.T, results []idem.ClaimResult, errs []error, action idem.ClaimAction, twoWon, wrongAction string) int {
	t.Helper()
	winner := soleWinner(t, errs, twoWon, func(i int, err error) {
		requireCode(t, err, idem.ErrRequestInFlight, "racer %d", i)
	})
	if winner != -1 {
		require.Equal(t, action, results[winner].Action, wrongAction, winner)
	}
	return winner
}

// requireReplays checks a race of claims of a completed key: every claim
// replays done or is refused with refusal.
func requireReplays(t *testing.T, results []idem.ClaimResult, errs []error, done idem.Record, refusal *idem.Error) {
	t.Helper()
	for i, err := range errs {
		if err != nil {
			requireCode(t, err, refusal, "racer %d", i)
			continue
		}
		require.Equal(t, idem.ActionReplay, results[i].Action, "racer %d", i)
		requireSameRecord(t, done, results[i].Record)
	}
}

// retryAfter returns the RetryAfter of an *idem.Error.
func retryAfter(t *testing.T, err error) time.Duration {
	t.Helper()
	var e *idem.Error
	require.True(t, errors.As(err, &e), "error %v is not an *idem.Error", err)
	return e.RetryAfter
}

// keysOf returns the keys of records, in order.
func keysOf(recs []idem.Record) []string {
	keys := make([]string, len(recs))
	for i, r := range recs {
		keys[i] = r.Key
	}
	return keys
}
