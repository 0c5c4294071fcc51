/**
 * The stable, machine-readable error codes of the idem HTTP contract (the
 * `code` member of a problem+json body), plus the SDK's own `unknown` (an
 * answer without a code, e.g. a proxy's 502 page), `network` (no answer
 * at all: connection refused or reset, timeout) and `invalid_answer` (a 2xx
 * answer the client cannot interpret: not JSON, or a claim answer without a
 * fencing token and state, or a "replay" without a stored response; never
 * retried, and `run` never runs its function on it).
 */
export const Codes = {
    invalidRequest: "invalid_request",
    invalidKey: "invalid_key",
    unauthenticated: "unauthenticated",
    forbidden: "forbidden",
    tenantUnknown: "tenant_unknown",
    keyNotFound: "key_not_found",
    tenantNotFound: "tenant_not_found",
    requestInFlight: "request_in_flight",
    /** 409, retryable after Retry-After: the key's first attempt died and idem's completer holds it while it finds out what happened. */
    outcomeUnknown: "outcome_unknown",
    /** 409, not retryable: the completer gave up; a person must resolve the key. */
    outcomeReview: "outcome_review",
    leaseLost: "lease_lost",
    alreadyCompleted: "already_completed",
    tenantExists: "tenant_exists",
    payloadTooLarge: "payload_too_large",
    unsupportedMediaType: "unsupported_media_type",
    fingerprintMismatch: "fingerprint_mismatch",
    rateLimited: "rate_limited",
    /** 429: the tenant's fleet retry budget refused this retry; the client stops retrying the call at once and reports the original cause. */
    retryBudgetExhausted: "retry_budget_exhausted",
    storeUnavailable: "store_unavailable",
    serverBusy: "server_busy",
    /** 507, never retried: the tenant stores its storage_quota_bytes or more; a claim of a new key was refused before anything ran. */
    storageQuotaExceeded: "storage_quota_exceeded",
    webhookNotFound: "webhook_not_found",
    webhookDisabled: "webhook_disabled",
    webhookLimitReached: "webhook_limit_reached",
    completerNotFound: "completer_not_found",
    completerLimitReached: "completer_limit_reached",
    notFound: "not_found",
    methodNotAllowed: "method_not_allowed",
    internal: "internal",
    unknown: "unknown",
    network: "network",
    invalidAnswer: "invalid_answer",
};
/**
 * An error of the idem service or of the way to it: the RFC 9457 problem
 * details of an HTTP error answer plus the status, `Retry-After` and request
 * id; or, with `status` 0 and code `network`, a failure that got no answer
 * (the transport error is the `cause`). Match it by `code`.
 */
export class IdemError extends Error {
    /** The HTTP status, 0 when no answer arrived. */
    status;
    /** The contract's code (`unknown` when the answer carried none). */
    code;
    type;
    title;
    detail;
    /** Whether the same request may be sent again unchanged. */
    retryable;
    /** The answer's `Retry-After` in milliseconds, 0 when absent. */
    retryAfterMs;
    /** The `X-Request-Id` of the answer; quote it when reporting a problem. */
    requestId;
    /**
     * How long, in whole seconds, the server held a claim that asked to wait
     * before this answer (its `Preference-Applied`); 0 when it held none (it
     * may refuse to: its waiter limit, a shutdown).
     */
    waitAppliedSeconds;
    /**
     * Whether the answer carried `Idem-Retry-Budget: exhausted`: the tenant's
     * fleet retry budget is spent, so the client sent no retry (it threw a
     * {@link FleetBudgetError} with this error as the original).
     */
    fleetBudgetSpent;
    /** The invalid fields of an `invalid_request`. */
    fields;
    /** The call that failed, e.g. `claim`. */
    call;
    /** How many attempts the call made (set by the retry loop). */
    attempts = 0;
    /** Why retrying stopped, when the failure was retryable. */
    giveUp;
    constructor(init) {
        super("", init.cause === undefined ? undefined : { cause: init.cause });
        this.name = "IdemError";
        this.status = init.status ?? 0;
        this.code = init.code;
        this.type = init.type ?? "";
        this.title = init.title ?? "";
        this.detail = init.detail ?? "";
        this.retryable = init.retryable ?? false;
        this.retryAfterMs = init.retryAfterMs ?? 0;
        this.requestId = init.requestId ?? "";
        this.waitAppliedSeconds = init.waitAppliedSeconds ?? 0;
        this.fleetBudgetSpent = init.fleetBudgetSpent ?? false;
        this.fields = init.fields ?? [];
        this.call = init.call ?? "";
        this.message = this.describe();
    }
    /** Records how the retry loop ended and updates the message. @internal */
    finish(attempts, giveUp) {
        this.attempts = attempts;
        this.giveUp = giveUp;
        this.message = this.describe();
        return this;
    }
    /** A one-line description: call, status, code, detail, request id, why retrying stopped. */
    describe() {
        let s = "idem: ";
        if (this.call)
            s += `${this.call}: `;
        if (this.status)
            s += `${this.status} `;
        s += this.code;
        const text = this.detail || this.title || (this.cause instanceof Error ? this.cause.message : "");
        if (text)
            s += `: ${text}`;
        if (this.requestId)
            s += ` (request id ${this.requestId})`;
        if (this.giveUp)
            s += ` [gave up after ${this.attempts} attempt(s): ${this.giveUp}]`;
        return s;
    }
}
/** Reports whether err is an {@link IdemError} of one of codes. */
export function isIdemError(err, ...codes) {
    return err instanceof IdemError && (codes.length === 0 || codes.includes(err.code));
}
const noSideEffectMark = Symbol.for("idem.noSideEffect");
/**
 * The error a function run by {@link Client.run} throws to declare that it
 * failed before touching anything external. `run` then releases the key,
 * so that the next attempt with the same key starts afresh, and rethrows
 * it. Wrap the real error as the cause: `throw new NoSideEffect("card
 * declined", { cause: err })`. Any other error leaves the claim to expire
 * into an orphan, because the function may have done part of its work.
 */
export class NoSideEffect extends Error {
    [noSideEffectMark] = true;
    constructor(message = "the attempt left no side effect", options) {
        super(message, options);
        this.name = "NoSideEffect";
    }
}
/**
 * Reports whether err declares that it left no side effect: a
 * {@link NoSideEffect} (from any copy of this package) anywhere in its
 * cause chain.
 */
export function isNoSideEffect(err) {
    for (let e = err, depth = 0; e && typeof e === "object" && depth < 16; e = e.cause, depth++) {
        if (e[noSideEffectMark] === true)
            return true;
    }
    return false;
}
