import type { Bounds, CallOptions } from "./bounds.js";
import { IdemError, type GiveUpReason } from "./errors.js";
import { StoredResponse, type ResponseInit } from "./response.js";
import { type Clock, type EffectivePolicy, type RetryPolicy } from "./retry.js";
import { type Claim, type RunOptions, type RunResult } from "./run.js";
import type { ClaimRequest, ClaimResult, KeyPage, KeyRecord, State, Tenant } from "./types.js";
export type { Bounds, CallOptions };
/** Describes one attempt of a call, as passed to {@link ClientOptions.onAttempt}. Never holds a token. */
export interface AttemptInfo {
    /** The call, e.g. `claim` or `complete`. */
    call: string;
    method: string;
    path: string;
    /** Counts from 1. */
    attempt: number;
    /** The HTTP status, 0 when no answer arrived. */
    status: number;
    /** The attempt's error, undefined on success. */
    error: IdemError | undefined;
    /** Whether another attempt follows, and the wait chosen before it. */
    retry: boolean;
    waitMs: number;
    /** Why no retry follows a retryable failure. */
    giveUp: GiveUpReason | undefined;
    /** The client's retry budget after this attempt (Infinity when off). */
    budgetLeft: number;
}
/** Configures a {@link Client}. */
export interface ClientOptions {
    /** The service's base URL, e.g. `https://idem.example.com` (a path prefix is kept). */
    baseUrl: string;
    /** A bearer token, or a function returning one per attempt (for tokens that rotate; its failure ends the call without retry). */
    token?: string | (() => string | Promise<string>);
    /** The retry policy; missing fields take the defaults. */
    retry?: RetryPolicy;
    /** Called after every attempt of every call (metrics, logs, tests). */
    onAttempt?: (info: AttemptInfo) => void;
    /** The fetch to use (default the global fetch). */
    fetch?: typeof fetch;
    /** The time source of the retry loop (tests). */
    clock?: Clock;
    /** The random source of the jitter, uniform in [0, 1) (tests). */
    random?: () => number;
    /** The User-Agent header. */
    userAgent?: string;
    /**
     * Send a random `attempt_id` with every claim, the same for all retries
     * of one logical claim (and all claims of one `run`), so that a claim
     * whose answer was lost gets its own attempt back (201, same fencing
     * token) instead of waiting out the lease behind 409 request_in_flight.
     * Default true; false for a server older than `attempt_id`.
     */
    attemptIds?: boolean;
}
/** Options of a claim. */
export interface ClaimOptions extends CallOptions {
    /** The attempt id of this logical claim (default: a random one when the client sends attempt ids). */
    attemptId?: string;
    /**
     * Asks the server to hold the claim while another request holds the key,
     * until that one completes (the replay), releases or loses its lease (this
     * claim gets the key): at most this many seconds, rounded down (under 1:
     * not sent), capped by the tenant's `max_wait_seconds`. Keep it below the
     * attempt timeout. {@link run} sets it itself.
     */
    waitSeconds?: number;
}
/**
 * A client of one idem service. Every call runs in one retry loop: the
 * allowlist (connection refused/reset, timeouts, 408, 429, 502, 503, 504),
 * full jitter (1 s base, 30 s cap) or the server's Retry-After, at most 3
 * attempts, one overall deadline, and a retry budget shared by all calls of
 * the client. Safe for concurrent use.
 */
export declare class Client {
    /** The effective retry policy, defaults filled in. */
    readonly policy: EffectivePolicy;
    /** The logical call of each run's claim that got 409 request_in_flight, by its bounds, until its next claim. */
    private readonly waitingClaims;
    /** @internal */
    readonly clock: Clock;
    /** @internal */
    readonly random: () => number;
    /** @internal */
    readonly attemptIds: boolean;
    private readonly base;
    private readonly token;
    private readonly budget;
    private readonly onAttempt;
    private readonly fetchFn;
    private readonly userAgent;
    constructor(opts: ClientOptions);
    /** The tokens left in the client-wide retry budget (Infinity when off). */
    retryBudgetLeft(): number;
    /** Resolves the bounds of a call. @internal */
    bounds(o?: CallOptions): Bounds;
    /**
     * Runs fn under the idempotency protocol for key — claim, fn, checkpoint,
     * complete, with a lease keeper, replays and release on a declared
     * {@link NoSideEffect}; see {@link run}.
     */
    run(key: string, req: ClaimRequest, fn: (claim: Claim) => Promise<ResponseInit | StoredResponse> | ResponseInit | StoredResponse, opts?: RunOptions): Promise<RunResult>;
    /**
     * Claims key for a request (POST /v1/keys/{key}/claim): a fresh claim or
     * a takeover (201), or the replay of a completed request (200, `replayed`
     * true, the stored response decoded). A held key throws `request_in_flight`
     * (with `retryAfterMs` = lease left), another request under the key
     * `fingerprint_mismatch`. Most callers want {@link run} instead.
     */
    claim(key: string, req: ClaimRequest, opts?: ClaimOptions): Promise<ClaimResult>;
    /** A fresh attempt id when the client sends them. @internal */
    newAttemptId(): string | undefined;
    /** @internal */
    claimWithin(key: string, req: ClaimRequest, b: Bounds, attemptId: string | undefined, waitSeconds?: number, seed?: {
        number: number;
        cause?: string | undefined;
    }): Promise<ClaimResult>;
    /**
     * Saves a recovery point (a phase name and optional JSON data) on a
     * claimed key and renews its lease (POST /v1/keys/{key}/checkpoint). A
     * stale token throws `lease_lost`.
     */
    checkpoint(key: string, fencingToken: number, recoveryPoint: string, data?: unknown, opts?: CallOptions & {
        leaseSeconds?: number;
    }): Promise<KeyRecord>;
    /** @internal */
    checkpointWithin(key: string, fencingToken: number, recoveryPoint: string, data: unknown, leaseSeconds: number | undefined, b: Bounds): Promise<KeyRecord>;
    /**
     * Stores the response of a claimed key and ends the claim (POST
     * /v1/keys/{key}/complete). Repeating it with the same token and response
     * is a no-op, which makes it safe to retry; another response throws
     * `already_completed`, a stale token `lease_lost`, a response over the
     * tenant's limit `payload_too_large` (the claim stays).
     */
    complete(key: string, fencingToken: number, response: ResponseInit | StoredResponse, opts?: CallOptions): Promise<KeyRecord>;
    /** @internal */
    completeWithin(key: string, fencingToken: number, response: ResponseInit | StoredResponse, b: Bounds): Promise<KeyRecord>;
    /**
     * Removes a claimed key whose attempt left no side effect, so that the
     * next claim starts afresh (POST /v1/keys/{key}/release). A stale token
     * throws `lease_lost`; an absent key `key_not_found`.
     */
    release(key: string, fencingToken: number, opts?: CallOptions): Promise<void>;
    /** @internal */
    releaseWithin(key: string, fencingToken: number, b: Bounds): Promise<void>;
    /** Returns the full record of key (GET /v1/keys/{key}); an absent key throws `key_not_found`. */
    get(key: string, opts?: CallOptions): Promise<KeyRecord>;
    /** Returns one page of the tenant's records, newest first (GET /v1/keys). */
    list(opts?: CallOptions & {
        state?: State;
        limit?: number;
        cursor?: string;
    }): Promise<KeyPage>;
    /** Returns the caller's own tenant (GET /v1/tenant). */
    getTenant(opts?: CallOptions): Promise<Tenant>;
    /** Runs one call under the retry policy. */
    private call;
    /** Reports whether a wait plus a minimal attempt fits before the deadline. @internal */
    fits(b: Bounds, waitMs: number): boolean;
    /** The policy's per-attempt timeout cut to the time left before the deadline, in ms (Infinity for none). @internal */
    attemptTimeoutMs(b: Bounds): number;
    /** Sends one HTTP request and reads the whole answer within the attempt's timeout. */
    private attempt;
    /** Turns a non-2xx answer into an IdemError. */
    private problem;
    private report;
}
