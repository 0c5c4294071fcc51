// Package client is the Go SDK of the idem idempotency service: typed calls
// for every endpoint of the HTTP contract, a retry policy that is on by
// default, the lifecycle helper Do that runs the whole claim → work →
// checkpoint → complete protocol around a function, and key helpers.
// Package idemhttp (client/idemhttp) builds net/http middleware on top of
// it that gives any handler Stripe-style Idempotency-Key semantics.
//
// The SDK is its own module, github.com/idem-dev/idem/client (go get
// github.com/idem-dev/idem/client): it depends on the standard library only
// and on nothing of the server, so a program that uses it resolves none of
// the server's dependencies (e2e/sdk checks that with a throwaway module).
// Its error codes mirror the contract; a test of the server's module keeps
// them equal to openapi.yaml. Its tests that need a running server live in
// the server's module, in e2e/sdk.
//
// # Quick start
//
//	c, err := client.New("https://idem.example.com", client.WithToken(token))
//	key, err := client.Key("order-confirm", orderID) // event-derived, never random per attempt
//	res, err := c.Do(ctx, key, client.Request{Operation: "POST /orders/confirm", Payload: order},
//		func(ctx context.Context, claim *client.Claim) (client.Response, error) {
//			if claim.RecoveryPoint() != "charged" {
//				if err := charge(ctx, order); err != nil {
//					return client.Response{}, err
//				}
//				if err := claim.Checkpoint(ctx, "charged", nil); err != nil {
//					return client.Response{}, err
//				}
//			}
//			return client.Response{Status: 201, Body: []byte(`{"ok":true}`)}, nil
//		})
//
// # Retry policy (the defaults)
//
// Every call runs in one retry loop configured by RetryPolicy
// (WithRetryPolicy; zero fields take these defaults):
//
//   - Allowlist only. Retried: connection refused, connection reset
//     (including a connection closed before the answer arrived: EOF, broken
//     pipe), timeouts (a net.Error whose Timeout() is true, or the
//     per-attempt timeout), and HTTP 408, 429, 502, 503 and 504. HTTP 500 is
//     not retried (RetryPolicy.Retry500 turns it on). Every other 4xx, every
//     auth error, an error of the token source, and every local error
//     (encoding, invalid key) is returned at once.
//   - Attempts: at most 3 per call, the first included (MaxAttempts).
//   - Backoff: full jitter, the wait before retry n (n = 0, 1, ...) drawn
//     uniformly from [0, min(30 s, 1 s·2^n)) (BaseDelay 1 s, MaxDelay 30 s).
//     DecorrelatedJitter draws min(30 s, uniform[1 s, 3·previous wait)).
//   - Retry-After (delay-seconds or HTTP-date) replaces the backoff: the wait
//     is Retry-After plus uniform [0, 1 s) of spread (RetryAfterJitter), so
//     that a crowd told "1 second" does not come back in the same instant.
//     Retry-After is not capped by MaxDelay — the server knows best — but
//     it never pushes past the deadline (below).
//   - One overall deadline, the context's, never reset per attempt. Each
//     attempt has its own timeout of 10 s (AttemptTimeout), cut to the time
//     left. Both bound the whole attempt on the wall clock — connect,
//     write, and the read of every byte of the answer — so a server that
//     drips its answer cannot stretch them. The loop stops early, without sleeping, when the time left
//     cannot fit the next wait plus 100 ms (MinAttemptTime); the error then
//     wraps ErrDeadlineTooClose and the last attempt's error.
//   - A client-wide retry budget, a token bucket shared by every call of
//     one Client but the finishing writes (below): capacity 10 tokens, full at start; each retry costs 1
//     token and is not made when less than 1 is left (the error then wraps
//     ErrRetryBudgetExhausted and the last attempt's error); each attempt
//     that gets a sane answer (2xx, or a non-retryable 4xx) puts back 0.1
//     up to the capacity. Under a sustained outage one Client thus sends at
//     most its callers' first attempts plus 10 retries, then about one
//     retry per 10 successes — it does not multiply the load on a
//     struggling service.
//   - Every attempt carries the Idem-Attempt header (HeaderAttempt): its
//     number within the logical call and, for a retry, why the attempt
//     before failed ("2;cause=unavailable"; Do's claims after an
//     in-flight wait say cause=in-flight). idem holds each tenant's
//     retries to its retry_budget_percent of the first attempts of the
//     same kind of call (a claim's of the claims), fleet-wide;
//     a retry it refuses (429 retry_budget_exhausted) ends the call at
//     once with a *FleetBudgetError wrapping ErrFleetBudgetExhausted and
//     the original error, so ErrorCode sees the original cause. A
//     failure whose answer says Idem-Retry-Budget: exhausted
//     (HeaderRetryBudget: the budget is spent) ends the call the same
//     way before any retry is sent (Refusal nil), in Do's in-flight
//     waits too: a retry idem would refuse is still an attempt reaching it.
//     Not for the writes that finish a claim (Checkpoint, Complete,
//     Release, and Do's): idem's budget does not cover them, and given up
//     they would leave work that ran unrecorded, to run again after the
//     lease. The client ignores the header for them, and retries an older
//     server's 429 retry_budget_exhausted of one after its Retry-After.
//     Nor does the client-wide budget cover them: their retries neither
//     spend it nor stop when it is empty (an outage's failed claims empty
//     it); the policy (attempts, backoff, deadline) still bounds them.
//   - Two presets: Interactive (InteractivePolicy: 10 s for the whole
//     call, 3 attempts of at most 3 s, in-flight waits up to 5 s) and
//     Background (BackgroundPolicy: 10 minutes, 10 attempts of at most
//     30 s, waits up to 60 s, a per-process budget of 100 retries).
//   - Every attempt is reported to the hook (WithAttemptHook) and the
//     logger (WithLogger): call, attempt number, status, error, whether a
//     retry follows, the wait chosen, why the loop gave up, and the budget
//     left.
//
// The calls are safe to retry: a repeated complete with the same token and
// response is a no-op; a repeated checkpoint saves the same point. A claim
// carries a random attempt_id, one per Claim or Do call and the same in
// all its retries, so a claim whose answer was lost (a timeout, a reset)
// gets its own attempt back at the retry — the same fencing token, not a
// 409 and a wait for its own lease. WithAttemptIDs(false) turns that off
// (for a server older than attempt_id); the retry then finds the key in
// flight and Do waits the lost claim out until the next claim takes it
// over.
//
// A claim answer the client cannot act on — a 2xx that is not JSON, a 201
// without state in_flight, a fencing token or an attempt, a 200 "replay"
// without a stored response whose status is 100–599, any other 2xx —
// matches ErrInvalidAnswer: it is not retried, Do does not run its
// function and replays nothing (idemhttp answers 503 store_unavailable).
//
// # Connections
//
// A Client made without WithHTTPClient has a transport of its own
// (NewTransport): http.DefaultTransport's settings with up to
// DefaultMaxIdleConnsPerHost (128) idle keep-alive connections to the
// service instead of 2, so a Client shared by many goroutines reuses its
// connections instead of opening one for most calls. Make one Client and
// share it; with WithHTTPClient, give the transport the same limits.
//
// # Lifecycle helper
//
// Do claims, replays, waits for other holders, hands the recovery point of
// a crashed attempt to the function, keeps the lease alive, completes or
// releases, and reports a stale fencing token as ErrLeaseLost; see Do for
// the details. A function error that wraps ErrNoSideEffect releases the
// key; any other function error leaves the claim to expire into an orphan
// (visible to operators, taken over by the next Do), because the function
// may have done part of its work.
//
// # Errors
//
// An error answer of the service is an *Error carrying Status, Code,
// Title, Detail, Retryable, RetryAfter and RequestID. errors.Is matches it
// against the sentinels by code (errors.Is(err, ErrRequestInFlight),
// ErrFingerprintMismatch, ErrLeaseLost, ...) and errors.As reaches it.
//
// idem makes retries safe within one tenant and the tenant's replay window;
// it does not make a side effect happen exactly once on its own: the
// function must checkpoint after each external step for a takeover to skip
// it.
package client
