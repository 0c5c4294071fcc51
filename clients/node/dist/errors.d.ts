/**
 * The stable, machine-readable error codes of the idem HTTP contract (the
 * `code` member of a problem+json body), plus the SDK's own `unknown` (an
 * answer without a code, e.g. a proxy's 502 page), `network` (no answer
 * at all: connection refused or reset, timeout) and `invalid_answer` (a 2xx
 * answer the client cannot interpret: not JSON, or a claim answer without a
 * fencing token and state, or a "replay" without a stored response; never
 * retried, and `run` never runs its function on it).
 */
export declare const Codes: {
    readonly invalidRequest: "invalid_request";
    readonly invalidKey: "invalid_key";
    readonly unauthenticated: "unauthenticated";
    readonly forbidden: "forbidden";
    readonly tenantUnknown: "tenant_unknown";
    readonly keyNotFound: "key_not_found";
    readonly tenantNotFound: "tenant_not_found";
    readonly requestInFlight: "request_in_flight";
    /** 409, retryable after Retry-After: the key's first attempt died and idem's completer holds it while it finds out what happened. */
    readonly outcomeUnknown: "outcome_unknown";
    /** 409, not retryable: the completer gave up; a person must resolve the key. */
    readonly outcomeReview: "outcome_review";
    readonly leaseLost: "lease_lost";
    readonly alreadyCompleted: "already_completed";
    readonly tenantExists: "tenant_exists";
    readonly payloadTooLarge: "payload_too_large";
    readonly unsupportedMediaType: "unsupported_media_type";
    readonly fingerprintMismatch: "fingerprint_mismatch";
    readonly rateLimited: "rate_limited";
    /** 429: the tenant's fleet retry budget refused this retry; the client stops retrying the call at once and reports the original cause. */
    readonly retryBudgetExhausted: "retry_budget_exhausted";
    readonly storeUnavailable: "store_unavailable";
    readonly serverBusy: "server_busy";
    /** 507, never retried: the tenant stores its storage_quota_bytes or more; a claim of a new key was refused before anything ran. */
    readonly storageQuotaExceeded: "storage_quota_exceeded";
    readonly webhookNotFound: "webhook_not_found";
    readonly webhookDisabled: "webhook_disabled";
    readonly webhookLimitReached: "webhook_limit_reached";
    readonly completerNotFound: "completer_not_found";
    readonly completerLimitReached: "completer_limit_reached";
    readonly notFound: "not_found";
    readonly methodNotAllowed: "method_not_allowed";
    readonly internal: "internal";
    readonly unknown: "unknown";
    readonly network: "network";
    readonly invalidAnswer: "invalid_answer";
};
/** One of {@link Codes}, or a code a newer server sends. */
export type Code = (typeof Codes)[keyof typeof Codes] | (string & {});
/** Names one invalid field of an `invalid_request` problem. */
export interface FieldError {
    field: string;
    message: string;
}
/**
 * Why a call stopped retrying a failure that was itself retryable:
 * `attempts` (the attempt cap), `budget` (the client's retry budget is
 * empty), `deadline` (the time left cannot fit the wait plus an attempt),
 * `aborted` (the caller's signal fired), `in_flight_wait` (the wait for
 * another holder of the key ran out), `fleet_budget` (idem refused the
 * retry: 429 `retry_budget_exhausted`), `fleet_signal` (the failure said
 * `Idem-Retry-Budget: exhausted`, so no retry was sent).
 */
export type GiveUpReason = "attempts" | "budget" | "deadline" | "aborted" | "in_flight_wait" | "fleet_budget" | "fleet_signal";
/** The fields an {@link IdemError} is built from. */
export interface IdemErrorInit {
    status?: number;
    code: Code;
    type?: string;
    title?: string;
    detail?: string;
    retryable?: boolean;
    retryAfterMs?: number;
    waitAppliedSeconds?: number;
    fleetBudgetSpent?: boolean;
    requestId?: string;
    fields?: FieldError[];
    call?: string;
    cause?: unknown;
}
/**
 * An error of the idem service or of the way to it: the RFC 9457 problem
 * details of an HTTP error answer plus the status, `Retry-After` and request
 * id; or, with `status` 0 and code `network`, a failure that got no answer
 * (the transport error is the `cause`). Match it by `code`.
 */
export declare class IdemError extends Error {
    /** The HTTP status, 0 when no answer arrived. */
    readonly status: number;
    /** The contract's code (`unknown` when the answer carried none). */
    readonly code: Code;
    readonly type: string;
    readonly title: string;
    readonly detail: string;
    /** Whether the same request may be sent again unchanged. */
    readonly retryable: boolean;
    /** The answer's `Retry-After` in milliseconds, 0 when absent. */
    readonly retryAfterMs: number;
    /** The `X-Request-Id` of the answer; quote it when reporting a problem. */
    readonly requestId: string;
    /**
     * How long, in whole seconds, the server held a claim that asked to wait
     * before this answer (its `Preference-Applied`); 0 when it held none (it
     * may refuse to: its waiter limit, a shutdown).
     */
    readonly waitAppliedSeconds: number;
    /**
     * Whether the answer carried `Idem-Retry-Budget: exhausted`: the tenant's
     * fleet retry budget is spent, so the client sent no retry (it threw a
     * {@link FleetBudgetError} with this error as the original).
     */
    readonly fleetBudgetSpent: boolean;
    /** The invalid fields of an `invalid_request`. */
    readonly fields: FieldError[];
    /** The call that failed, e.g. `claim`. */
    call: string;
    /** How many attempts the call made (set by the retry loop). */
    attempts: number;
    /** Why retrying stopped, when the failure was retryable. */
    giveUp: GiveUpReason | undefined;
    constructor(init: IdemErrorInit);
    /** Records how the retry loop ended and updates the message. @internal */
    finish(attempts: number, giveUp: GiveUpReason | undefined): this;
    /** A one-line description: call, status, code, detail, request id, why retrying stopped. */
    describe(): string;
}
/** Reports whether err is an {@link IdemError} of one of codes. */
export declare function isIdemError(err: unknown, ...codes: Code[]): err is IdemError;
declare const noSideEffectMark: unique symbol;
/**
 * The error a function run by {@link Client.run} throws to declare that it
 * failed before touching anything external. `run` then releases the key,
 * so that the next attempt with the same key starts afresh, and rethrows
 * it. Wrap the real error as the cause: `throw new NoSideEffect("card
 * declined", { cause: err })`. Any other error leaves the claim to expire
 * into an orphan, because the function may have done part of its work.
 */
export declare class NoSideEffect extends Error {
    readonly [noSideEffectMark] = true;
    constructor(message?: string, options?: {
        cause?: unknown;
    });
}
/**
 * Reports whether err declares that it left no side effect: a
 * {@link NoSideEffect} (from any copy of this package) anywhere in its
 * cause chain.
 */
export declare function isNoSideEffect(err: unknown): boolean;
export {};
