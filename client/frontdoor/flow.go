package frontdoor

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// This file is the one front-door flow of Go: the gateway (the server
// module's gateway package) and client/idemhttp are adapters of Serve. The
// rules the flow applies are the rest of this package; what differs
// between the two — the ledger they claim in (the store directly, or the
// idem API through the SDK), what runs under the claim (an upstream call,
// a handler) and how a refusal is answered and counted — is a Door.

// ClaimRequest is what Serve asks a Port to claim: the (scoped) key, the
// operation label and the fingerprint document of the request.
type ClaimRequest struct {
	Key       string
	Operation string
	Document  []byte
	// Attempt is the caller's Idem-Attempt (CallerAttempt): a Port that
	// claims through the idem API passes a retry on with the claim, so
	// idem's fleet retry budget counts it (rule 9).
	Attempt Attempt
}

// Stored is a response as a front door stores it: status, the allowlisted
// headers (StoredHeaders) and the body.
type Stored struct {
	Status  int
	Headers map[string]string
	Body    []byte
}

// Claimed is the outcome of a claim that let the request go on: a replay
// of the stored response (Replay not nil), or a claim the request runs
// under. Port fills the identity fields; Serve reads only Replay,
// WaitApplied and Lease.
type Claimed struct {
	Key     string
	Token   int64
	Attempt int
	// Takeover is true when the claim took over an orphaned one.
	Takeover bool
	// Lease is the claim's lease: Serve renews it every third of it
	// (Port.Checkpoint) while the request runs.
	Lease time.Duration
	// Replay is the stored response of a completed key.
	Replay *Stored
	// ReplayLeft is how much of Replay's replay window was left when the
	// ledger answered (replay_until less the ledger's clock then, less
	// any uncertainty of that clock): the replay cache keeps Replay no
	// longer. Zero: not cached.
	ReplayLeft time.Duration
	// WaitApplied is the wait the ledger held the claim for (Prefer:
	// wait=N), answered as Preference-Applied; a Port sets it on a refused
	// claim too (the wait ran out).
	WaitApplied time.Duration
	// Point and Data are the recovery point a renewal saves again (a
	// takeover's, or the Port's own); the Port decides.
	Point string
	Data  []byte
}

// ErrLeaseGone is what a Port's Checkpoint wraps when the claim is no
// longer the request's (the lease was lost, the key is gone or completed):
// renewing it is over.
var ErrLeaseGone = errors.New("frontdoor: the claim's lease is gone")

// ErrResponseTooLarge is what a Port's Complete wraps when the ledger
// refused the response as over its limit (the claim stays): Serve then
// stores it without its body (not replayable), so a retry is 409
// response_not_replayable instead of a second run once the lease is over.
var ErrResponseTooLarge = errors.New("frontdoor: the response is too large to store")

// Port is the ledger a front door claims in. Claim answers a claim that did
// not let the request go on with the error to answer (Door.Refuse), an
// *Error where it is a refusal of the front door. Complete, Release and
// Checkpoint record and log their own failures: the request has run, and
// its answer is sent all the same.
type Port interface {
	Claim(ctx context.Context, r *http.Request, req ClaimRequest) (*Claimed, error)
	Complete(ctx context.Context, c *Claimed, resp Stored) error
	Release(ctx context.Context, c *Claimed) error
	Checkpoint(ctx context.Context, c *Claimed) error
}

// Answer is what the protected work answered: Serve stores it (or releases
// the key) by the front-door rules, then sends it.
type Answer struct {
	Status int
	// Header is sent with the answer: it replaces the values already set
	// on the response (a handler's answer), or is added to them when
	// AddHeader is true (a proxy's).
	Header    http.Header
	AddHeader bool
	// Stored are the headers stored with it (StoredHeaders).
	Stored map[string]string
	// Body is the whole body, or its first part when TooLarge.
	Body []byte
	// TooLarge: the answer is over what the front door stores; it is
	// stored without its body, with HeaderNotReplayable set to
	// NotStoredNote. NotStoredNote is also the note when the ledger
	// refuses the whole answer as too large (ErrResponseTooLarge).
	TooLarge      bool
	NotStoredNote string
	// Rest, when not nil, is the rest of a TooLarge body, streamed after
	// Body and closed.
	Rest io.ReadCloser
}

// Unanswered is the error of a Door's Run when the work gave no answer to
// store: Serve releases the key (Release) or leaves the claim to become an
// orphan a retry takes over, and answers Problem.
type Unanswered struct {
	Problem *Error
	Release bool
}

func (u *Unanswered) Error() string { return u.Problem.Error() }

// Door is one protected request's front door: its Port and the hooks where
// the gateway and the middleware differ.
type Door interface {
	Port
	// Methods are the key requirements of the request's route.
	Methods() Methods
	// Pass serves a request that is not protected.
	Pass(w http.ResponseWriter, r *http.Request)
	// Scope is the caller's scope; scoped false keeps the key as it is.
	Scope(r *http.Request) (scope string, scoped bool, err error)
	// ReadBody reads the request body (ReadBody, within the door's limits).
	ReadBody(w http.ResponseWriter, r *http.Request) ([]byte, error)
	// Rules are the fingerprint rules of the request's route, and Route
	// the route of its operation label (Operation).
	Rules() Rules
	Route(r *http.Request) string
	// Run does the protected work under c with the request's body. ctx is
	// the request's values without the caller's cancellation (a started
	// run writes its whole answer, which the caller's retry is replayed);
	// it ends when the lease is lost if LeaseBound.
	Run(ctx context.Context, r *http.Request, c *Claimed, body []byte) (*Answer, error)
	// LeaseBound reports whether Run's context ends when the lease is
	// lost, or no renewal succeeded for a whole lease.
	LeaseBound() bool
	// Store5xx reports whether a 5xx answer is stored (StoreStatus) or
	// releases the key.
	Store5xx() bool
	// Refuse answers a request refused before it ran (Refuse, for most).
	Refuse(w http.ResponseWriter, r *http.Request, err error)
}

// Refuse answers err as a refusal: an *Error as it is, anything else as
// invalid_request.
func Refuse(w http.ResponseWriter, r *http.Request, err error) {
	var e *Error
	if !errors.As(err, &e) {
		e = Errorf(CodeInvalidRequest, "%v", err)
	}
	WriteProblem(w, r, e)
}

// Serve is the front-door flow (docs/frontdoor.md): the key and its scope,
// the body and the fingerprint document, the claim; then a replay, or the
// work run once under the claim with its lease renewed, its answer stored
// (or the key released) and only then sent.
func Serve(w http.ResponseWriter, r *http.Request, d Door) {
	key, protected, err := d.Methods().KeyFor(r)
	if err != nil {
		d.Refuse(w, r, err)
		return
	}
	if !protected {
		d.Pass(w, r)
		return
	}
	scope, scoped, err := d.Scope(r)
	if err != nil {
		d.Refuse(w, r, err)
		return
	}
	if scoped {
		if key, err = ScopedKey(scope, key); err != nil {
			d.Refuse(w, r, err)
			return
		}
	}
	// Rule 9: the caller's retry is a retry of its logical call. A door
	// that keeps the fleet retry budget itself decides it here, before the
	// body is read or anything claimed.
	attempt := CallerAttempt(r.Header.Values(HeaderAttempt))
	budget, keepsBudget := d.(Budget)
	if keepsBudget {
		if err := budget.Admit(r, attempt); err != nil {
			d.Refuse(w, r, err)
			return
		}
	}
	body, err := d.ReadBody(w, r)
	if err != nil {
		d.Refuse(w, r, err)
		return
	}
	path, query := Target(r)
	doc, err := Document(Parts{
		Path: path, Query: query, ContentType: r.Header.Get("Content-Type"), Body: body, Header: r.Header,
	}, d.Rules())
	if err != nil {
		d.Refuse(w, r, err)
		return
	}
	op := Operation(r.Method, d.Route(r))
	// A replay of exactly this request the door's cache holds is answered
	// without a claim (replaycache.go).
	cached := lookupFor(d, key, op, doc)
	if serveCached(w, r, d, cached) {
		return
	}
	cached.startClaim()
	// The caller going away stops the claim (and a Prefer: wait hold).
	c, err := d.Claim(r.Context(), r, ClaimRequest{Key: key, Operation: op, Document: doc, Attempt: attempt})
	if c != nil && c.WaitApplied > 0 {
		w.Header().Set(HeaderPreferenceApplied, "wait="+strconv.Itoa(int(c.WaitApplied/time.Second)))
	}
	if err != nil {
		cached.refused(err)
		if keepsBudget {
			markSpent(err, budget, r)
		}
		d.Refuse(w, r, err)
		return
	}
	if c.Replay != nil {
		cached.cacheReplay(c)
		WriteReplay(w, r, c.Replay.Status, c.Replay.Headers, c.Replay.Body)
		return
	}
	run(w, r, d, c, body)
}

// run does the work under c, stores its answer and sends it.
func run(w http.ResponseWriter, r *http.Request, d Door, c *Claimed, body []byte) {
	// Not the caller's cancellation: the work may already be under way,
	// and its answer is what the caller's retry will be replayed.
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(r.Context()))
	defer cancel(nil)
	stop := keepLease(ctx, d, c, cancel)
	defer stop()
	a, err := d.Run(ctx, r, c, body)
	stop()
	// Completing and releasing outlive a lost lease: the ledger says so.
	sctx := context.WithoutCancel(ctx)
	if err != nil {
		var u *Unanswered
		if !errors.As(err, &u) {
			u = &Unanswered{Problem: Errorf(CodeInvalidRequest, "%v", err)}
		}
		if u.Release {
			_ = d.Release(sctx, c)
		}
		WriteProblem(w, r, u.Problem)
		return
	}
	switch {
	case !StorableStatus(a.Status):
		// A status idem cannot store: sent as it is, recorded as not
		// replayable whatever Store5xx says. The work ran; released, the
		// key would run it again.
		status, headers := Unstorable(a.Status)
		_ = d.Complete(sctx, c, Stored{Status: status, Headers: headers})
	case !StoreStatus(a.Status, d.Store5xx()):
		// A 5xx with Store5xx off: released, whatever its size (nothing
		// of it is stored, so the limit does not apply).
		_ = d.Release(sctx, c)
	case a.TooLarge:
		_ = d.Complete(sctx, c, notReplayable(a))
	default:
		if err := d.Complete(sctx, c, Stored{Status: a.Status, Headers: a.Stored, Body: a.Body}); errors.Is(err, ErrResponseTooLarge) {
			// Stored without its body, as one over the front door's own
			// limit, so the retry is 409 response_not_replayable instead
			// of a second run once the claim's lease is over.
			_ = d.Complete(sctx, c, notReplayable(a))
		}
	}
	send(w, a)
}

// notReplayable is the response stored in place of a too large one: its
// status, no body, marked HeaderNotReplayable.
func notReplayable(a *Answer) Stored {
	return Stored{Status: a.Status, Headers: map[string]string{HeaderNotReplayable: a.NotStoredNote}}
}

// send writes a to w.
func send(w http.ResponseWriter, a *Answer) {
	h := w.Header()
	for k, vs := range a.Header {
		if a.AddHeader {
			for _, v := range vs {
				h.Add(k, v)
			}
		} else {
			h[k] = vs
		}
	}
	if a.Rest != nil {
		// Streamed through: what was read, then the rest.
		defer a.Rest.Close()
		w.WriteHeader(a.Status)
		_, _ = w.Write(a.Body)
		_, _ = io.Copy(w, a.Rest)
		return
	}
	h.Set("Content-Length", strconv.Itoa(len(a.Body)))
	w.WriteHeader(a.Status)
	_, _ = w.Write(a.Body)
}

// leaseLostError is the cancellation cause of a LeaseBound run.
type leaseLostError struct{ err error }

func (e *leaseLostError) Error() string { return "lease lost: " + e.err.Error() }
func (e *leaseLostError) Unwrap() error { return e.err }

// keepLease renews c's lease every third of it while the work runs, so a
// long run is not taken over by a retry. A lease that is gone ends the
// renewals (and, LeaseBound, the run). It returns the function that stops
// it.
func keepLease(ctx context.Context, d Door, c *Claimed, cancel context.CancelCauseFunc) func() {
	lease := c.Lease
	interval := max(lease/3, 100*time.Millisecond)
	bound := d.LeaseBound()
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTimer(interval)
		defer t.Stop()
		renewed := time.Now()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			rctx, rcancel := context.WithTimeout(ctx, interval)
			err := d.Checkpoint(rctx, c)
			rcancel()
			switch {
			case err == nil:
				renewed = time.Now()
			case errors.Is(err, ErrLeaseGone):
				if bound {
					cancel(&leaseLostError{err: err})
				}
				return
			case bound && time.Since(renewed) >= lease:
				cancel(&leaseLostError{err: err})
				return
			}
			t.Reset(interval)
		}
	}()
	return sync.OnceFunc(func() { close(stop); <-done })
}
