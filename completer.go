package idem

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idem-dev/idem/client/errcode"
)

// The completer drives orphans to an outcome without a person (issue 24;
// the wire protocol is the page "When a worker dies", web/docs/worker-dies,
// and the createCompleter callback of openapi.yaml). A tenant registers a resume endpoint
// (Completer); the completer job takes an orphan of that tenant over with
// a fresh fencing token, exactly as a retry's takeover would (attempt+1,
// the recovery point kept), calls the endpoint and applies its answer:
//
//   - completed: the key is completed with the endpoint's response and the
//     completer's token;
//   - not_done: the key is released (the next retry runs it);
//   - unknown (and every other answer, a timeout, an error): the key stays
//     held (CompletionUnknown) and is tried again after a full-jitter
//     backoff — when the endpoint gave no answer of the protocol, not
//     before the attempt's lease ran out, as it may still be at work
//     under the attempt's token — at most MaxAttempts times and until
//     the Deadline;
//   - review, or the attempts or the deadline run out: the key is flagged
//     for review (CompletionReview) until a person resolves it. It is never
//     released or completed on a guess.
//
// While the completer holds a key, a claim of it is answered with
// outcome_unknown (retryable, Retry-After = the next attempt), and once it
// is flagged for review with outcome_review (not retryable): a retry never
// takes such a key over, since the first attempt's work may have happened.
// Each attempt's outcome is written with its audit entry in one
// transaction (FinishCompletion).

// CompletionState is where the completer stands on a record it took over.
type CompletionState string

// The completion states. A record nobody's completer took has none.
const (
	// CompletionResuming: an attempt is running; the record's lease is the
	// completer's (the call's timeout and a margin). A replica that dies
	// mid-attempt leaves the record to be taken again once that lease ran
	// out, with a new fencing token, so the dead attempt's answer is never
	// applied.
	CompletionResuming CompletionState = "resuming"
	// CompletionUnknown: the last attempt did not learn the outcome; the
	// next is due at NextAttemptAt.
	CompletionUnknown CompletionState = "unknown"
	// CompletionReview: the completer gave up (the endpoint asked for a
	// person, or the attempts or the deadline ran out); the review flag
	// holds why. Only a person's resolution moves the record on.
	CompletionReview CompletionState = "review"
)

// Valid reports whether s is one of the three completion states.
func (s CompletionState) Valid() bool {
	return slices.Contains([]CompletionState{CompletionResuming, CompletionUnknown, CompletionReview}, s)
}

// Holds reports whether the completer holds the record in state s: an
// attempt runs or the next one is due (resuming, unknown).
func (s CompletionState) Holds() bool {
	return s == CompletionResuming || s == CompletionUnknown
}

// Completion is the completer's hold on a record (Record.Completion).
type Completion struct {
	State CompletionState
	// CompleterID is the completer whose endpoint the record was last
	// sent to.
	CompleterID string
	// Attempts counts the completer's attempts on the record, 1-based.
	Attempts int
	// NextAttemptAt is when the next attempt is due (CompletionUnknown).
	NextAttemptAt time.Time
	// Deadline is when the completer stops trying and flags the record
	// for review: the first takeover's instant plus the completer's
	// deadline, never past the record's purge time.
	Deadline time.Time
}

// RetryAt is when a retry of a record the completer holds may expect news:
// the next attempt (unknown) or the end of the running one (resuming), as
// seen at now; never less than a second.
func (c Completion) RetryAt(rec Record, now time.Time) time.Duration {
	at := rec.LeaseExpiresAt
	if c.State == CompletionUnknown {
		at = c.NextAttemptAt
	}
	return max(at.Sub(now), time.Second)
}

// Completer is a tenant's registered resume endpoint.
type Completer struct {
	TenantID string
	ID       string
	URL      string
	// Secret signs every call (Standard Webhooks, "whsec_…"); the API
	// shows it only when the completer is created.
	Secret string
	// OperationPattern limits the completer to the orphans whose operation
	// matches it (MatchOperation): "" matches every operation.
	OperationPattern string
	CreatedAt        time.Time
}

// MaxCompleters bounds a tenant's completers (the pick query tests each of
// them against an orphan's operation).
const MaxCompleters = 16

// MaxOperationPatternBytes bounds a completer's operation pattern.
const MaxOperationPatternBytes = 256

// MatchOperation reports whether operation matches pattern: "" matches
// everything, a pattern ending in "*" matches the operations that start
// with what precedes it, any other pattern only itself. The stores' pick
// queries test the same rule in SQL (db/queries/*/completers.sql).
func MatchOperation(pattern, operation string) bool {
	if pattern == "" {
		return true
	}
	if prefix, ok := strings.CutSuffix(pattern, "*"); ok {
		return strings.HasPrefix(operation, prefix)
	}
	return pattern == operation
}

// PickCompleter returns the completer for an orphan of operation: the one
// with the longest matching pattern (the most specific), the oldest first
// among equals; ok false when none matches.
func PickCompleter(cs []Completer, operation string) (c Completer, ok bool) {
	for _, x := range cs {
		if !MatchOperation(x.OperationPattern, operation) {
			continue
		}
		if !ok || len(x.OperationPattern) > len(c.OperationPattern) {
			c, ok = x, true
		}
	}
	return c, ok
}

// ValidateOperationPattern checks a completer's operation pattern: at most
// MaxOperationPatternBytes of UTF-8, a "*" only at its end.
func ValidateOperationPattern(p string) error {
	switch {
	case len(p) > MaxOperationPatternBytes:
		return invalidField("operation_pattern", fmt.Sprintf("must be at most %d bytes", MaxOperationPatternBytes))
	case !utf8.ValidString(p):
		return invalidField("operation_pattern", "must be valid UTF-8")
	case strings.Contains(strings.TrimSuffix(p, "*"), "*"):
		return invalidField("operation_pattern", `may hold "*" only as its last character (a prefix match)`)
	}
	return nil
}

// NewCompleterID returns a fresh completer id ("cmp_" and 22 random
// characters).
func NewCompleterID() string {
	return NewID("cmp_")
}

// CompletionOutcome is what an attempt learnt: the endpoint's answer, or
// unknown for anything else.
type CompletionOutcome string

// The outcomes of an attempt (the protocol's "outcome" values).
const (
	OutcomeCompleted CompletionOutcome = "completed"
	OutcomeNotDone   CompletionOutcome = "not_done"
	OutcomeUnknown   CompletionOutcome = "unknown"
	OutcomeReview    CompletionOutcome = "review"
)

// The audit actions of the completer's attempts, one entry per attempt,
// written with its outcome (AuditEntry.Action, beside a person's
// resolutions).
const (
	AuditCompleterCompleted ResolveAction = "completer_completed"
	AuditCompleterReleased  ResolveAction = "completer_released"
	AuditCompleterUnknown   ResolveAction = "completer_unknown"
	AuditCompleterReview    ResolveAction = "completer_review"
)

// CompleterActor is the actor of the completer's audit entries.
func CompleterActor(tenantID, completerID string) Actor {
	return Actor{Subject: "completer:" + completerID, Tenant: tenantID, Scope: "completer"}
}

// PickCompletionsParams are the inputs of CompleterStore.PickCompletions.
type PickCompletionsParams struct {
	// Limit bounds the records taken.
	Limit int
	// PerTenant bounds the records of one tenant taken (its oldest leases
	// first); zero means Limit. SkipTenants are not picked from at all.
	// The job passes its per-tenant share of its attempts, and the
	// tenants whose share is in use, so one tenant's backlog behind a
	// hanging endpoint never holds every slot while another's orphan
	// waits.
	PerTenant   int
	SkipTenants []string
	// Lease is the completer's lease on a record it takes: one attempt's
	// timeout and the time to record it.
	Lease time.Duration
	// Deadline is the completer's deadline (from the first takeover to the
	// last attempt), set on a record's first takeover, never past the
	// record's purge time.
	Deadline time.Duration
}

// PickedCompletion is a record the completer took over, with the
// completer whose endpoint to call (ok false: none matches any more, and
// the record goes to review).
type PickedCompletion struct {
	// Record is the record as the takeover left it: the new fencing token
	// and attempt, the completer's lease, Completion resuming with the
	// attempt's number. Its RecoveryData is set.
	Record    Record
	Completer Completer
	Matched   bool
}

// FinishCompletionParams record the outcome of one attempt
// (CompleterStore.FinishCompletion).
type FinishCompletionParams struct {
	TenantID string
	Key      string
	// FencingToken and Attempt name the attempt: the outcome applies only
	// while the record is still resuming under them.
	FencingToken int64
	Attempt      int
	Outcome      CompletionOutcome
	// Response is the response to store (OutcomeCompleted).
	Response *Response
	// RetryIn is the pause before the next attempt (OutcomeUnknown).
	RetryIn time.Duration
	// WaitOutLease: the endpoint gave no answer of the protocol (a
	// timeout, a hang-up), so it may still be at work under the attempt's
	// token; the next attempt is then due no sooner than the record's
	// lease as the store holds it, which the attempt's own checkpoints
	// may have extended past the completer's (NextAttemptAt).
	WaitOutLease bool
	// Note is the audit note: why the attempt was unknown, the endpoint's
	// review note, or why the completer gave up.
	Note        string
	CompleterID string
	// StorageQuotaBytes is the tenant's, checked as a worker's complete
	// checks it (CompleteParams.StorageQuotaBytes).
	StorageQuotaBytes int64
}

// Validate checks what a store trusts in a finish: a known outcome, a
// response exactly for a completion, one idem can replay (a status the API
// serves, and headers a worker's complete could store: the resume
// endpoint's answer is no more trusted than the API's input, and a header
// with a CR or LF would break a front door's replay), and the note
// (ValidateNote, cut to MaxNoteBytes by the caller).
func (p FinishCompletionParams) Validate() error {
	switch p.Outcome {
	case OutcomeCompleted, OutcomeNotDone, OutcomeUnknown, OutcomeReview:
	default:
		return invalidField("outcome", "must be completed, not_done, unknown or review")
	}
	if (p.Outcome == OutcomeCompleted) != (p.Response != nil) {
		return invalidField("response", "is sent exactly with a completed outcome")
	}
	if err := ValidateNote(p.Note); err != nil {
		return err
	}
	if p.Response != nil {
		if err := ValidateResponseStatus(p.Response.Status); err != nil {
			return err
		}
		return ValidateResponseHeaders(p.Response.Headers)
	}
	return nil
}

// AuditAction is the audit action of an attempt with this outcome.
func (p FinishCompletionParams) AuditAction() ResolveAction {
	switch p.Outcome {
	case OutcomeCompleted:
		return AuditCompleterCompleted
	case OutcomeNotDone:
		return AuditCompleterReleased
	case OutcomeReview:
		return AuditCompleterReview
	}
	return AuditCompleterUnknown
}

// NextAttemptAt is when the next attempt of an unknown finish p on the
// stored record is due, at now: after RetryIn, and with WaitOutLease not
// before the record's lease ends (a function still running under the
// attempt's token and checkpointing must not get a second attempt beside
// it). The store reads stored in the finish's transaction.
func (p FinishCompletionParams) NextAttemptAt(stored Record, now time.Time) time.Time {
	at := now.Add(p.RetryIn)
	if p.WaitOutLease && stored.LeaseExpiresAt.After(at) {
		at = stored.LeaseExpiresAt
	}
	return at
}

// CheckFinishCompletion returns the error for a finish on the stored
// record (nil when absent): key_not_found, or lease_lost when the record
// moved on since the attempt took it (another replica took it again after
// this attempt's lease ran out, a person resolved it). Nil means the
// outcome may apply.
func CheckFinishCompletion(stored *Record, p FinishCompletionParams) error {
	if err := CheckWrite(stored, p.FencingToken); err != nil {
		return err
	}
	c := stored.Completion
	if c == nil || c.State != CompletionResuming || c.Attempts != p.Attempt {
		return &Error{Code: CodeLeaseLost, Detail: "key '" + stored.Key + "' is no longer held by this completer attempt"}
	}
	return nil
}

// CompletionFilter selects records by the completer's hold in a listing
// (ListRecordsParams.Completion, ListOrphansParams.Completion).
type CompletionFilter string

// The completion filters.
const (
	// FilterAnyCompletion: no filter.
	FilterAnyCompletion CompletionFilter = ""
	// FilterUnknown: the completer holds the record (resuming or unknown).
	FilterUnknown CompletionFilter = "unknown"
	// FilterReview: the completer flagged the record for review.
	FilterReview CompletionFilter = "review"
)

// Valid reports whether f is a known filter.
func (f CompletionFilter) Valid() bool {
	return slices.Contains([]CompletionFilter{FilterAnyCompletion, FilterUnknown, FilterReview}, f)
}

// CompletionStat is the completer's summary of one tenant, for the
// idem_orphans{state} gauges.
type CompletionStat struct {
	TenantID string
	State    CompletionState
	Count    int64
	// Oldest is the earliest update among them (when the completer last
	// touched the oldest one).
	Oldest     time.Time
	ObservedAt time.Time
}

// CompleterStore is the completer's side of a Driver: registrations, and
// the records it takes over. Both stores implement it.
type CompleterStore interface {
	// CreateCompleter stores c (ID and Secret set by the caller). It
	// returns ErrTenantUnknown for an unknown tenant and
	// completer_limit_reached when the tenant has MaxCompleters.
	CreateCompleter(ctx context.Context, c Completer) (Completer, error)
	// GetCompleter returns ErrCompleterNotFound.
	GetCompleter(ctx context.Context, p GetCompleterParams) (Completer, error)
	// ListCompleters returns a tenant's completers, oldest first.
	ListCompleters(ctx context.Context, p ListCompletersParams) ([]Completer, error)
	// DeleteCompleter returns ErrCompleterNotFound. The records it holds
	// go to review at their next pick (no completer matches them).
	DeleteCompleter(ctx context.Context, p DeleteCompleterParams) error

	// PickCompletions takes over at most p.Limit records for the
	// completer: orphans (the lease ran out) not flagged for review by a
	// person, of tenants with a completer matching their operation, and
	// the records the completer holds whose next attempt is due or whose
	// attempt's lease ran out (its replica died). Each is taken as a
	// retry's takeover takes it — a new fencing token, attempt+1, the
	// recovery point kept, the attempt id cleared — with the lease
	// p.Lease, Completion resuming and its attempt counted, in one
	// statement or transaction: concurrent callers on several replicas
	// never take the same record (FOR UPDATE SKIP LOCKED on PostgreSQL,
	// the single writer on SQLite), and a claim that took a fresh orphan
	// over first wins.
	PickCompletions(ctx context.Context, p PickCompletionsParams) ([]PickedCompletion, error)
	// FinishCompletion applies one attempt's outcome (CheckFinishCompletion
	// first: lease_lost when the record moved on) and writes its audit
	// entry in the same transaction: completed stores the response under
	// the attempt's token (the quota as Complete applies it), not_done
	// deletes the record, unknown keeps it held until p.RetryIn from now
	// (the lease ends now: the record shows as orphaned), review flags it
	// with p.Note. It returns the record as it left it (as it was, for
	// not_done).
	FinishCompletion(ctx context.Context, p FinishCompletionParams) (Record, error)
	// CompletionStats counts, per tenant and state, the records the
	// completer holds or flagged for review.
	CompletionStats(ctx context.Context) ([]CompletionStat, error)
}

// GetCompleterParams are the inputs of CompleterStore.GetCompleter.
type GetCompleterParams struct {
	TenantID string
	ID       string
}

// ListCompletersParams are the inputs of CompleterStore.ListCompleters.
type ListCompletersParams struct {
	TenantID string
}

// DeleteCompleterParams are the inputs of CompleterStore.DeleteCompleter.
type DeleteCompleterParams struct {
	TenantID string
	ID       string
}

// CodeCompleterNotFound: no completer with this id for the tenant.
const CodeCompleterNotFound = errcode.CompleterNotFound

// ErrCompleterNotFound matches any completer_not_found error.
var ErrCompleterNotFound = &Error{Code: CodeCompleterNotFound}

// CompleterNotFound returns the error of a missing completer.
func CompleterNotFound(id string) *Error {
	return Errorf(CodeCompleterNotFound, "no completer %q", id)
}

// CodeCompleterLimitReached: the tenant has MaxCompleters completers.
const CodeCompleterLimitReached = errcode.CompleterLimitReached

// CompleterLimitReached is the completer_limit_reached error.
func CompleterLimitReached() *Error {
	return Errorf(CodeCompleterLimitReached, "the tenant has %d completers, the most it may have: delete one first", MaxCompleters)
}

// CodeOutcomeUnknown: the claimed key's first attempt died and the
// completer is finding out what happened (retryable: Retry-After is the
// next completer attempt).
const CodeOutcomeUnknown = errcode.OutcomeUnknown

// CodeOutcomeReview: the claimed key's outcome is unknown and the
// completer gave up; a person must resolve it (release or complete) before
// a retry can get anywhere. Not retryable.
const CodeOutcomeReview = errcode.OutcomeReview

// ErrOutcomeUnknown and ErrOutcomeReview match the two codes.
var (
	ErrOutcomeUnknown = &Error{Code: CodeOutcomeUnknown}
	ErrOutcomeReview  = &Error{Code: CodeOutcomeReview}
)

// PerTenantLimit is PerTenant, or Limit when it is zero.
func (p PickCompletionsParams) PerTenantLimit() int {
	if p.PerTenant > 0 {
		return p.PerTenant
	}
	return p.Limit
}
