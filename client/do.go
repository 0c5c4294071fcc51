package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"
)

// RenewalPoint is the recovery point the lease keeper saves when it renews
// a lease before the function's first checkpoint. Claim.RecoveryPoint hides
// it: a takeover of such a claim sees no recovery point.
const RenewalPoint = "idem:lease-renewal"

// Result is the outcome of Do.
type Result struct {
	// Response is the function's response, or the stored one on a replay.
	Response Response
	// Replayed is true when the key was already completed and the function
	// did not run.
	Replayed bool
	// Resumed is true when this run took over an orphaned claim.
	Resumed bool
	// Attempt and FencingToken are those of the claim the function ran
	// under (of the stored record on a replay).
	Attempt      int
	FencingToken int64
	// WaitApplied is the wait the server applied to the claim that got
	// this outcome (it held the claim while another request had the key);
	// zero when none. A front door answers it as Preference-Applied.
	WaitApplied time.Duration
}

// Claim is the handle the function run by Do receives: the claim's
// identity, the recovery point left by an earlier attempt, and Checkpoint.
type Claim struct {
	client  *Client
	key     string
	token   int64
	attempt int
	resumed bool
	lease   time.Duration // the lease asked for; 0 = the tenant default

	startPoint string
	startData  json.RawMessage

	// mu serialises checkpoints (the function's and the lease keeper's) so
	// that a renewal never sends an older recovery point after a newer one.
	mu    sync.Mutex
	point string
	data  json.RawMessage
	// renewed is when the lease was last known renewed.
	renewed time.Time
}

// Key returns the claimed key.
func (c *Claim) Key() string { return c.key }

// FencingToken returns the claim's fencing token, which every write on the
// key carries.
func (c *Claim) FencingToken() int64 { return c.token }

// Attempt returns the claim's attempt number: 1 for a fresh claim, more
// after takeovers.
func (c *Claim) Attempt() int { return c.attempt }

// Resumed reports whether this claim took over an orphaned one: an earlier
// attempt may have done part of the work, see RecoveryPoint.
func (c *Claim) Resumed() bool { return c.resumed }

// RecoveryPoint returns the last recovery point the earlier attempt saved
// before this claim began ("" when none).
func (c *Claim) RecoveryPoint() string {
	if c.startPoint == RenewalPoint {
		return ""
	}
	return c.startPoint
}

// RecoveryData returns the JSON saved with RecoveryPoint (nil when none).
func (c *Claim) RecoveryData() json.RawMessage {
	if c.startPoint == RenewalPoint {
		return nil
	}
	return c.startData
}

// Checkpoint saves a recovery point — a phase name and optional data that
// encodes to JSON — under the claim's fencing token, and renews the lease.
// Call it right after each external step, so that a takeover resumes after
// the step instead of repeating it. A stale token (someone took the key
// over) matches ErrLeaseLost.
func (c *Claim) Checkpoint(ctx context.Context, name string, data any) error {
	var raw json.RawMessage
	if data != nil {
		b, err := json.Marshal(data)
		if err != nil {
			return fmt.Errorf("checkpoint %q: encode data: %w", name, err)
		}
		raw = b
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.saveLocked(ctx, name, raw); err != nil {
		return fmt.Errorf("checkpoint %q: %w", name, err)
	}
	return nil
}

// renew re-saves the last recovery point to extend the lease.
func (c *Claim) renew(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	point := c.point
	if point == "" {
		point = RenewalPoint
	}
	return c.saveLocked(ctx, point, c.data)
}

// saveLocked checkpoints point and data, which renews the lease, and
// remembers them. c.mu must be held.
func (c *Claim) saveLocked(ctx context.Context, point string, data json.RawMessage) error {
	if _, err := c.client.Checkpoint(ctx, c.key, c.token, point, data, c.lease); err != nil {
		return err
	}
	c.point, c.data = point, data
	c.renewed = c.client.clock.Now()
	return nil
}

func (c *Claim) lastRenewed() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.renewed
}

// Do runs fn under the idempotency protocol for key:
//
//  1. It claims the key. If the key was already completed, Do returns the
//     stored response with Replayed true and fn does not run.
//  2. If another caller holds the key (request_in_flight), Do waits for it,
//     for at most RetryPolicy.InFlightWait and never past ctx's deadline;
//     then it returns an error matching ErrRequestInFlight. Each claim asks
//     the server to hold it (wait_seconds: what the deadline, the attempt
//     timeout less a second and InFlightWait leave), so Do gets the replay
//     or the key the moment the holder finishes; when the server answers
//     409 anyway (its wait ran out, it holds too many), Do waits the
//     Retry-After it sent (plus RetryPolicy.RetryAfterJitter) and claims
//     again. req.NoWait skips the waiting.
//  3. It runs fn with a *Claim. After a takeover of a crashed attempt,
//     claim.Resumed() is true and claim.RecoveryPoint()/RecoveryData() tell
//     where the earlier attempt got to.
//  4. While fn runs, a lease keeper renews the lease every third of it
//     (checkpointing the last recovery point again). If the service says
//     the lease is lost, or no renewal succeeded for a whole lease, fn's
//     context is cancelled with a cause matching ErrLeaseLost.
//  5. If fn returns a response, Do completes the key with it and returns
//     it. If fn's error wraps ErrNoSideEffect, Do releases the key (the
//     next attempt starts afresh) and returns fn's error. Any other error
//     of fn leaves the claim as it is: fn may have had a side effect, so Do
//     neither stores a made-up response nor releases; the lease runs out
//     and the record becomes an orphan that the next Do with the key takes
//     over (resuming from the last checkpoint) and operators can see.
//  6. A stale fencing token anywhere (someone took the key over) is
//     returned as an error matching ErrLeaseLost.
//
// Complete and Release run after fn returned even when ctx is done or ends
// meanwhile, until ctx's deadline but at least RetryPolicy.AttemptTimeout
// from then: the outcome of work already done is worth recording.
func (c *Client) Do(ctx context.Context, key string, req Request, fn func(ctx context.Context, claim *Claim) (Response, error)) (Result, error) {
	if err := ValidateKey(key); err != nil {
		return Result{}, fmt.Errorf("do: %w", err)
	}
	cr, err := c.claimWaiting(ctx, key, req)
	if err != nil {
		return Result{}, fmt.Errorf("do %q: %w", key, err)
	}
	res := Result{Replayed: cr.Replayed, Resumed: cr.Resumed, Attempt: cr.Attempt, FencingToken: cr.FencingToken, WaitApplied: cr.WaitApplied}
	if cr.Replayed {
		if cr.Response != nil {
			res.Response = *cr.Response
		}
		return res, nil
	}

	claim := &Claim{
		client: c, key: key, token: cr.FencingToken, attempt: cr.Attempt, resumed: cr.Resumed, lease: req.Lease,
		startPoint: cr.RecoveryPoint, startData: cr.RecoveryData,
		point: cr.RecoveryPoint, data: cr.RecoveryData,
		renewed: c.clock.Now(),
	}
	leaseLen := req.Lease
	if leaseLen <= 0 {
		// The lease the server granted, on the server's clock (its answer's
		// Date): this host's clock may be off by more than a lease.
		// LeaseLeft may be up to a second more than the truth (the Date
		// has whole seconds): a third of it still renews in time, and no
		// renewal for all of it means the lease surely ran out.
		leaseLen = cr.LeaseLeft
		if leaseLen <= 0 {
			leaseLen = cr.LeaseExpiresAt.Sub(c.clock.Now())
		}
		if cr.LeaseExpiresAt.IsZero() || leaseLen <= 0 {
			leaseLen = 30 * time.Second
		}
	}

	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	keeperDone := make(chan struct{})
	stopKeeper := make(chan struct{})
	go func() {
		defer close(keeperDone)
		c.keepLease(fctx, claim, leaseLen, stopKeeper, cancel)
	}()
	stop := sync.OnceFunc(func() { close(stopKeeper); <-keeperDone })
	defer stop()

	resp, ferr := fn(fctx, claim)
	stop()
	lost := context.Cause(fctx)
	if !errors.Is(lost, ErrLeaseLost) {
		lost = nil
	}

	if ferr != nil {
		if errors.Is(ferr, ErrNoSideEffect) {
			rctx, rcancel := c.finishCtx(ctx)
			defer rcancel()
			if rerr := c.Release(rctx, key, claim.token); rerr != nil && !errors.Is(rerr, ErrKeyNotFound) {
				return res, errors.Join(ferr, fmt.Errorf("do %q: %w", key, rerr))
			}
			return res, ferr
		}
		if lost != nil {
			return res, fmt.Errorf("do %q: %w: %w", key, lost, ferr)
		}
		return res, fmt.Errorf("do %q: function failed; claim left to expire: %w", key, ferr)
	}
	cctx, ccancel := c.finishCtx(ctx)
	defer ccancel()
	if err := c.CompleteNoRecord(cctx, key, claim.token, resp); err != nil {
		return res, fmt.Errorf("do %q: %w", key, err)
	}
	res.Response = resp
	return res, nil
}

// finishCtx returns the context of the complete or release after fn ran:
// ctx's values without its cancellation and, when ctx has a deadline, until
// that deadline or one attempt timeout from now, whichever is later (without
// one, the policy's attempt cap bounds it as before). The outcome of work
// already done is worth recording: a caller that hangs up while the
// complete is on its way, or a deadline fn nearly used up, must not leave
// the key in flight for the next attempt to run fn again.
func (c *Client) finishCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	fctx := context.WithoutCancel(ctx)
	dl, ok := ctx.Deadline()
	if !ok {
		return context.WithCancel(fctx)
	}
	d := c.policy.AttemptTimeout
	if d <= 0 {
		d = DefaultAttemptTimeout
	}
	if end := time.Now().Add(d); end.After(dl) { // a context deadline runs on real time
		dl = end
	}
	return context.WithDeadline(fctx, dl)
}

// claimWaiting claims key, waiting out request_in_flight answers.
func (c *Client) claimWaiting(ctx context.Context, key string, req Request) (ClaimResult, error) {
	req.AttemptID = c.attemptID(req) // one for the whole call, waits included
	p := c.policy
	if p.CallDeadline > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.CallDeadline)
		defer cancel()
	}
	// One logical call, waits included: a claim after a wait says it is
	// a retry of cause in-flight.
	ctx, lc := withLogicalCall(ctx, true)
	var waited time.Duration
	for {
		switch {
		case !req.NoWait && p.InFlightWait >= 0:
			req.Wait = c.serverWait(ctx, p.InFlightWait-waited)
		case req.NoWait && req.Wait > 0:
			// The caller's own wait (a front door's Prefer: wait=N), kept
			// within the attempt timeout so the held answer comes back.
			req.Wait = c.serverWait(ctx, req.Wait)
		}
		start := c.clock.Now()
		cr, err := c.Claim(ctx, key, req)
		if err == nil {
			return cr, nil
		}
		waited += c.clock.Now().Sub(start) // the server may have held the claim
		var e *Error
		if !errors.As(err, &e) || e.Code != CodeRequestInFlight || req.NoWait || p.InFlightWait < 0 {
			return ClaimResult{}, err
		}
		lc.cause = CauseInFlight
		if lc.original == nil {
			lc.original = err
		}
		if e.FleetBudgetSpent {
			// No retry after a wait either: idem says the tenant's fleet
			// retry budget is spent.
			return ClaimResult{}, &FleetBudgetError{Call: "claim", Attempts: lc.attempts, Cause: lc.cause, Original: lc.original}
		}
		ra := e.RetryAfter
		if ra <= 0 {
			ra = p.BaseDelay
		}
		wait := p.retryAfterWait(ra)
		if wait > p.InFlightWait-waited {
			return ClaimResult{}, fmt.Errorf("waited %s for the other holder of the key: %w", waited, err)
		}
		if !c.fits(ctx, wait) {
			return ClaimResult{}, fmt.Errorf("%w: %w", ErrDeadlineTooClose, err)
		}
		if c.logger != nil {
			c.logger.DebugContext(ctx, "idem key in flight elsewhere; waiting", "key_len", len(key), "wait", wait)
		}
		if serr := c.clock.Sleep(ctx, wait); serr != nil {
			return ClaimResult{}, fmt.Errorf("waiting for the other holder of the key: %w: %w", serr, err)
		}
		waited += wait
	}
}

// ServerWait is the wait a claim may ask the server to hold it for while
// another request holds the key, given the caller's own wish (a front
// door passing Prefer: wait=N, as Do does with Request.NoWait): within the
// next attempt's timeout less a second, so that the held answer comes
// back, in whole seconds; 0 when not even one fits.
func (c *Client) ServerWait(ctx context.Context, wait time.Duration) time.Duration {
	if wait <= 0 {
		return 0
	}
	return c.serverWait(ctx, wait)
}

// serverWait returns how long a claim may ask the server to hold it while
// another request holds the key: what is left of the in-flight budget,
// within the next attempt's timeout (and so the deadline) less a second for
// the answer to come back, in whole seconds; 0 when not even one fits.
func (c *Client) serverWait(ctx context.Context, budget time.Duration) time.Duration {
	d := budget
	if at := c.attemptTimeout(ctx); at > 0 {
		d = min(d, at-time.Second)
	}
	if d < time.Second {
		return 0
	}
	return d.Truncate(time.Second)
}

// leaseLostError is the cancellation cause of fn's context.
type leaseLostError struct{ err error }

func (e *leaseLostError) Error() string { return "lease lost: " + e.err.Error() }
func (e *leaseLostError) Unwrap() error { return e.err }
func (e *leaseLostError) Is(target error) bool {
	return target == ErrLeaseLost
}

// keepLease renews the claim's lease every third of it until stop closes.
// It runs on real time: the lease runs on the service's clock.
func (c *Client) keepLease(ctx context.Context, claim *Claim, lease time.Duration, stop <-chan struct{}, cancel context.CancelCauseFunc) {
	interval := max(lease/3, 100*time.Millisecond)
	t := time.NewTimer(interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rctx, rcancel := context.WithTimeout(ctx, interval)
		err := claim.renew(rctx)
		rcancel()
		switch {
		case err == nil:
		case errors.Is(err, ErrLeaseLost), errors.Is(err, ErrKeyNotFound):
			cancel(&leaseLostError{err: err})
			return
		default:
			if c.clock.Now().Sub(claim.lastRenewed()) >= lease {
				cancel(&leaseLostError{err: fmt.Errorf("no lease renewal succeeded for %s: %w", lease, err)})
				return
			}
		}
		t.Reset(interval)
	}
}
