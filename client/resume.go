package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/idem-dev/idem/client/resumecall"
	"github.com/idem-dev/idem/client/stdwebhooks"
)

// The resume endpoint of idem's completer (the page "When a worker dies",
// /docs/worker-dies/; the createCompleter callback of openapi.yaml). When a worker dies holding a
// key, idem takes the key over with a fresh fencing token and calls the
// tenant's registered resume endpoint (POST /v1/completers). ResumeHandler
// is that endpoint: it checks the call's signature, hands the application
// a *Claim — the very handle the function run by Do gets, under the
// completer's token, with the dead attempt's recovery point — and answers
// with the function's outcome. So the resume of a multi-step request runs
// the code path of the original Do, from its last checkpoint.

// ResumeTolerance is how far a call's webhook-timestamp may be from now
// (the Standard Webhooks tolerance); older or newer calls are refused.
const ResumeTolerance = stdwebhooks.Tolerance

// MaxResumeCallBytes bounds the body of a call the handler reads (the
// recovery data is at most the tenant's max_response_bytes).
const MaxResumeCallBytes = 16 << 20

// ResumeCall is the completer's call as the handler decoded it.
type ResumeCall struct {
	Tenant    string
	Key       string
	Operation string
	// Attempt is this resume attempt, 1-based, of MaxAttempts.
	Attempt     int
	MaxAttempts int
	// FencingToken is the token idem took the key over with; the Claim
	// carries it.
	FencingToken   int64
	RecoveryPoint  string
	RecoveryData   json.RawMessage
	LeaseExpiresAt time.Time
	// Deadline is when idem stops asking and flags the key for review.
	Deadline time.Time
}

// ResumeFunc resumes the work of a key whose worker died. claim is a Do
// function's claim: call the same function Do ran (it sees Resumed() true
// and the RecoveryPoint() the dead attempt saved, and may Checkpoint). Its
// outcome is the answer idem applies:
//
//   - a response, nil: the work is done; idem completes the key with it;
//   - an error wrapping ErrNoSideEffect (as Do releases on it): nothing
//     happened; idem releases the key and the next retry runs it;
//   - NeedsReview(note): a person must look; idem flags the key for review
//     with the note;
//   - any other error (RetryLater(d) to ask for a pause): the outcome is
//     unknown; idem keeps the key held and asks again later, up to its
//     bounded attempts, then flags it for review. idem never releases or
//     completes a key on a guess.
type ResumeFunc func(ctx context.Context, call ResumeCall, claim *Claim) (Response, error)

// NeedsReview returns the error a ResumeFunc returns when a person must
// decide (the outcome "review"); note is kept with the key.
func NeedsReview(note string) error { return &reviewError{note: note} }

type reviewError struct{ note string }

func (e *reviewError) Error() string { return "needs review: " + e.note }

// RetryLater returns the error a ResumeFunc returns when it cannot tell yet
// and wants idem to ask again no sooner than after d (the outcome
// "unknown" with retry_after_seconds).
func RetryLater(d time.Duration, cause error) error { return &retryLaterError{d: d, cause: cause} }

type retryLaterError struct {
	d     time.Duration
	cause error
}

func (e *retryLaterError) Error() string {
	if e.cause == nil {
		return fmt.Sprintf("retry later (%s)", e.d)
	}
	return fmt.Sprintf("retry later (%s): %v", e.d, e.cause)
}
func (e *retryLaterError) Unwrap() error { return e.cause }

// ResumeHandler returns the http.Handler of a resume endpoint signed with
// secret (the whsec_… the completer's create answered). A call whose
// signature does not verify, or whose timestamp is more than
// ResumeTolerance from now, is refused with 401 and fn does not run; so
// is a call whose webhook-id the handler already verified (a signed call
// replayed within the tolerance: idem sends each attempt with a new id),
// remembered for twice the tolerance, at most MaxSeenResumeIDs of them.
//
// fn's context is not the request's: it runs until the completer's lease
// on the key ends (the call's lease_expires_at), even when the completer
// hangs up first (it timed out, or its replica died). Work that made an
// external call then still gets to its checkpoint, which the next attempt
// resumes from, instead of being cut between the two and done again; once
// the lease ends the next attempt takes the key with a new fencing token,
// and a write of this one gets lease_lost. A panic of fn answers unknown.
// An error or a panic is answered with a fixed note ("the resume function
// returned an error", "… panicked"), never its text, which may hold a
// secret; the function logs what it needs itself.
func (c *Client) ResumeHandler(secret string, fn ResumeFunc) http.Handler {
	key, keyErr := stdwebhooks.DecodeSecret(secret)
	seen := &seenIDs{at: map[string]time.Time{}}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if keyErr != nil || len(key) == 0 {
			http.Error(w, "resume endpoint misconfigured: the secret is not whsec_<base64>", http.StatusInternalServerError)
			return
		}
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			http.Error(w, "POST only", http.StatusMethodNotAllowed)
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, MaxResumeCallBytes+1))
		if err != nil || len(body) > MaxResumeCallBytes {
			http.Error(w, "unreadable or too large call", http.StatusBadRequest)
			return
		}
		if err := VerifySignature(key, r.Header, body, c.clock.Now()); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		if !seen.add(r.Header.Get("webhook-id"), c.clock.Now()) {
			http.Error(w, "the call's webhook-id was already seen: a replay", http.StatusUnauthorized)
			return
		}
		call, err := decodeResumeCall(body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		ctx := context.WithoutCancel(r.Context())
		if !call.LeaseExpiresAt.IsZero() {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, call.LeaseExpiresAt)
			defer cancel()
		}
		writeResumeAnswer(w, c.resume(ctx, call, fn))
	})
}

// resumeAnswer is the protocol's answer.
type resumeAnswer struct {
	Outcome           string    `json:"outcome"`
	Response          *Response `json:"response,omitempty"`
	RetryAfterSeconds float64   `json:"retry_after_seconds,omitempty"`
	Note              string    `json:"note,omitempty"`
}

// resume runs fn on the call's claim and says what happened.
func (c *Client) resume(ctx context.Context, call ResumeCall, fn ResumeFunc) (a resumeAnswer) {
	defer func() {
		if p := recover(); p != nil {
			// A fixed note: the panic value may hold a secret, a token,
			// a customer's data, and the note leaves the app.
			a = resumeAnswer{Outcome: "unknown", Note: "the resume function panicked"}
		}
	}()
	claim := &Claim{
		client: c, key: call.Key, token: call.FencingToken, attempt: call.Attempt, resumed: true,
		startPoint: call.RecoveryPoint, startData: call.RecoveryData,
		point: call.RecoveryPoint, data: call.RecoveryData, renewed: c.clock.Now(),
	}
	resp, err := fn(ctx, call, claim)
	var review *reviewError
	var later *retryLaterError
	switch {
	case err == nil:
		return resumeAnswer{Outcome: "completed", Response: &resp}
	case errors.Is(err, ErrNoSideEffect):
		return resumeAnswer{Outcome: "not_done"}
	case errors.As(err, &review):
		return resumeAnswer{Outcome: "review", Note: review.note}
	case errors.As(err, &later):
		return resumeAnswer{Outcome: "unknown", RetryAfterSeconds: later.d.Seconds(), Note: "the resume function asked to retry later"}
	}
	// Never err.Error(): an error may carry a secret (a PSP's message with
	// a key, a DSN), and the note leaves the app for idem.
	return resumeAnswer{Outcome: "unknown", Note: "the resume function returned an error"}
}

func writeResumeAnswer(w http.ResponseWriter, a resumeAnswer) {
	b, err := json.Marshal(a)
	if err != nil {
		// A response that does not encode: the outcome stays unknown.
		b, _ = json.Marshal(resumeAnswer{Outcome: "unknown", Note: "the response could not be encoded"})
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
}

// VerifySignature checks a Standard Webhooks signature: the
// webhook-signature header holds, among space-separated "v1,<base64>"
// entries, the HMAC-SHA256 keyed by key of "<webhook-id>.<webhook-timestamp>.<body>",
// and the timestamp is within ResumeTolerance of now. It returns why not.
func VerifySignature(key []byte, h http.Header, body []byte, now time.Time) error {
	return stdwebhooks.Verify(key, h, body, now)
}

// decodeResumeCall decodes and checks a call's body.
func decodeResumeCall(body []byte) (ResumeCall, error) {
	var w resumecall.Body
	if err := json.Unmarshal(body, &w); err != nil {
		return ResumeCall{}, fmt.Errorf("the call is not JSON: %w", err)
	}
	if w.Type != resumecall.Type || w.Key == "" || w.FencingToken <= 0 {
		return ResumeCall{}, errors.New("not a key.resume call")
	}
	call := ResumeCall{
		Tenant: w.Tenant, Key: w.Key, Operation: w.Operation, Attempt: w.Attempt, MaxAttempts: w.MaxAttempts,
		FencingToken: w.FencingToken, LeaseExpiresAt: w.LeaseExpiresAt, Deadline: w.Deadline,
	}
	if w.RecoveryPoint != nil {
		call.RecoveryPoint = *w.RecoveryPoint
	}
	if len(w.RecoveryData) > 0 && string(w.RecoveryData) != "null" {
		call.RecoveryData = w.RecoveryData
	}
	return call, nil
}

// MaxSeenResumeIDs bounds the webhook-ids a ResumeHandler remembers to
// refuse a replayed call (idem sends each attempt with a new id). Past it
// the oldest are forgotten first.
const MaxSeenResumeIDs = 4096

// seenIDs remembers the webhook-ids of the verified calls for twice the
// signature tolerance, so a signed call replayed while its timestamp is
// still accepted is refused (401) rather than run again.
type seenIDs struct {
	mu    sync.Mutex
	at    map[string]time.Time // id → until when it is remembered
	order []string             // oldest first
}

// add reports whether id is new at now, and remembers it.
func (s *seenIDs) add(id string, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.order) > 0 && (len(s.order) >= MaxSeenResumeIDs || !s.at[s.order[0]].After(now)) {
		delete(s.at, s.order[0])
		s.order = s.order[1:]
	}
	if _, ok := s.at[id]; ok {
		return false
	}
	s.at[id] = now.Add(2 * ResumeTolerance)
	s.order = append(s.order, id)
	return true
}
