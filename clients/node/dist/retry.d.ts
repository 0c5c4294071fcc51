import { IdemError } from "./errors.js";
/**
 * The retry policy of every call a {@link Client} makes. A field left out
 * takes its default, the same as the Go SDK's and the docs' retry contract.
 */
export interface RetryPolicy {
    /** Attempts of one call, the first included. Default 3; 1 disables retries. */
    maxAttempts?: number;
    /** Full-jitter backoff: the wait before retry n (n = 0, 1, …) is uniform in [0, min(maxDelayMs, baseDelayMs·2^n)). Default 1000. */
    baseDelayMs?: number;
    /** Cap of the backoff. Default 30000. */
    maxDelayMs?: number;
    /** Bound of one attempt (connect, send, read the whole answer), never past the call's deadline. Default 10000; 0 for none. */
    attemptTimeoutMs?: number;
    /** The least time an attempt is worth: no retry when the time left cannot fit the wait plus this. Default 100. */
    minAttemptTimeMs?: number;
    /** Spread added to a Retry-After wait, uniform in [0, this), so that a crowd told "1 second" does not return at once. Default 1000; 0 for none. */
    retryAfterJitterMs?: number;
    /** Retry HTTP 500 too. Off by default: a 500 says the server failed unexpectedly; repeating rarely helps. */
    retry500?: boolean;
    /** Longest total wait of `run` for another holder of the key (409 request_in_flight), never past the deadline. Default 60000; 0 for no waiting. */
    inFlightWaitMs?: number;
    /** Client-wide retry budget: a token bucket, full at start. Default 10; 0 switches the budget off. */
    budgetCapacity?: number;
    /** Tokens one retry costs. Default 1. */
    budgetRetryCost?: number;
    /** Tokens a sane answer (2xx, or a non-retryable 4xx) puts back, up to the capacity. Default 0.1. */
    budgetSuccessRefund?: number;
    /** Bounds one whole call (its attempts, waits and `run`'s in-flight waits) when the call gives no sooner deadline. Default 0: none. The presets set it. */
    callDeadlineMs?: number;
}
/** A {@link RetryPolicy} with every field filled in. */
export type EffectivePolicy = Required<RetryPolicy>;
/** The defaults of {@link RetryPolicy}. */
export declare const defaultRetryPolicy: Readonly<EffectivePolicy>;
/**
 * The preset for a call a person waits on (/docs/retries#presets): 10 s for
 * the whole call, 3 attempts of at most 3 s, waits of 0.2 s growing to 2 s,
 * at most 5 s waiting for another holder of the key, the per-process budget
 * as by default (10 retries, 0.1 back per success).
 */
export declare const interactive: Readonly<RetryPolicy>;
/**
 * The preset for a job nobody waits on: 10 minutes for the whole call, 10
 * attempts of at most 30 s, waits of 1 s growing to 60 s, up to 5 minutes
 * waiting for another holder of the key, a per-process budget of 100
 * retries (0.5 back per success).
 */
export declare const background: Readonly<RetryPolicy>;
/** The `Idem-Attempt` request header (/docs/retries#attempt): "1", "2;cause=timeout". */
export declare const headerAttempt = "Idem-Attempt";
/** Why the attempt before a retry failed: the `cause` of `Idem-Attempt`. */
export type AttemptCause = "timeout" | "network" | "unavailable" | "throttled" | "server-error" | "in-flight";
/** The attempts of one logical call across the HTTP calls that make it. @internal */
export interface LogicalCall {
    attempts: number;
    cause: AttemptCause | undefined;
    /** The first retryable failure's error. */
    original: IdemError | undefined;
}
/** The `Idem-Attempt` value of attempt n after a failure of cause. */
export declare function attemptHeader(n: number, cause?: AttemptCause): string;
/** The `Idem-Attempt` cause of a failed attempt. */
export declare function causeOf(err: IdemError): AttemptCause;
/**
 * The error of a call whose retry idem refused with 429
 * `retry_budget_exhausted`: the tenant's retries use its fleet retry
 * budget. No further attempt was sent. Its code, status and detail are the
 * original failure's (`original`: the 503, the timeout), so a caller
 * handles the outage as before; `attemptCause` names it, `refusal` is the
 * 429 (its `retryAfterMs` says when the budget has room again), or
 * undefined when no retry was sent at all because the failure's answer
 * said the budget is spent (`Idem-Retry-Budget: exhausted`).
 */
export declare class FleetBudgetError extends IdemError {
    readonly original: IdemError;
    readonly refusal: IdemError | undefined;
    readonly attemptCause: AttemptCause | undefined;
    constructor(call: string, attempts: number, attemptCause: AttemptCause | undefined, original: IdemError, refusal: IdemError | undefined);
}
/** The response header by which idem says, on a retryable failure, that the tenant's fleet retry budget is spent. */
export declare const headerRetryBudget = "Idem-Retry-Budget";
/** Whether an `Idem-Retry-Budget` value says the budget is spent (the RFC 9651 Token `exhausted`; parameters ignored). */
export declare function budgetSpent(value: string | null): boolean;
/** Fills the missing fields of p with the defaults. */
export declare function withDefaults(p?: RetryPolicy): EffectivePolicy;
/**
 * The ceiling of the full-jitter wait before retry n (0 for the first
 * retry): min(maxDelayMs, baseDelayMs·2^n). The wait itself is uniform in
 * [0, ceiling).
 */
export declare function backoffCeilingMs(p: Pick<EffectivePolicy, "baseDelayMs" | "maxDelayMs">, n: number): number;
/** The full-jitter wait before retry n, drawn with random (default Math.random). */
export declare function backoffMs(p: Pick<EffectivePolicy, "baseDelayMs" | "maxDelayMs">, n: number, random?: () => number): number;
/** The wait for an answer that carried Retry-After: the server's delay plus the policy's spread. */
export declare function retryAfterWaitMs(p: Pick<EffectivePolicy, "retryAfterJitterMs">, retryAfterMs: number, random?: () => number): number;
/** Reports whether an HTTP status is on the retry allowlist: 408, 429, 502, 503, 504 (and 500 with retry500). */
export declare function retryableStatus(status: number, retry500?: boolean): boolean;
/** Parses an HTTP-date to epoch milliseconds; NaN when it is none. */
export declare function parseHttpDate(v: string): number;
/**
 * Reads a Retry-After header: delay-seconds or an HTTP-date (relative to
 * nowMs). Returns the delay in milliseconds, 0 for a date in the past or a
 * zero delay, and null when absent or unreadable.
 */
export declare function parseRetryAfter(value: string | null | undefined, nowMs?: number): number | null;
/** The client-wide token bucket of retries. */
export declare class RetryBudget {
    private readonly capacity;
    private readonly cost;
    private readonly refund;
    private tokens;
    private readonly off;
    constructor(capacity: number, cost: number, refund: number);
    /** Spends the cost of one retry; false when the bucket cannot pay it. */
    take(): boolean;
    /** Puts back the refund of a sane answer, up to the capacity. */
    success(): void;
    /** The tokens left (Infinity when the budget is off). */
    left(): number;
}
/**
 * The time source of a client: `now` for deadlines, `sleep` for the waits
 * between attempts. Tests inject a fake one to run the retry loop without
 * real sleeps.
 */
export interface Clock {
    now(): number;
    /** Waits ms or until signal aborts; rejects with the signal's reason then. */
    sleep(ms: number, signal?: AbortSignal): Promise<void>;
}
/** The real clock. A wait past a timer's range (a Retry-After of weeks) is slept in steps, never cut to 1 ms. */
export declare const realClock: Clock;
/**
 * Reports whether an error of fetch (no HTTP answer, or an answer cut
 * short) is on the allowlist: connection refused, connection reset or
 * closed before the answer, and timeouts.
 */
export declare function retryableTransportError(err: unknown): boolean;
