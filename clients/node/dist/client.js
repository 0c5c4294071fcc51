import { randomUUID } from "node:crypto";
import { Codes, IdemError } from "./errors.js";
import { validateKey } from "./keys.js";
import { StoredResponse } from "./response.js";
import { FleetBudgetError, budgetSpent, headerRetryBudget, RetryBudget, attemptHeader, backoffMs, causeOf, headerAttempt, parseRetryAfter, realClock, retryAfterWaitMs, retryableStatus, retryableTransportError, withDefaults, } from "./retry.js";
import { headerPreferenceApplied, preferWait } from "./rules.js";
import { run } from "./run.js";
/**
 * The calls that finish a claim. idem's fleet retry budget does not cover
 * them, and the client ignores it for them: `Idem-Retry-Budget: exhausted`
 * is no reason to stop, and an older server's 429 `retry_budget_exhausted`
 * is retried after its `Retry-After`, within the deadline and the policy
 * (attempts, backoff). Nor do they spend or meet the client's own retry
 * budget: failed claims empty it in an outage. Given up, a complete would
 * leave work that ran unrecorded and its key in flight, to run again after
 * the lease; each admitted claim has one of them, so their retries stay
 * bounded (/docs/retries#finishing).
 */
const finishingCalls = new Set(["checkpoint", "complete", "release"]);
function keyPath(key, suffix = "") {
    return "/v1/keys/" + encodeURIComponent(key) + suffix;
}
/**
 * A client of one idem service. Every call runs in one retry loop: the
 * allowlist (connection refused/reset, timeouts, 408, 429, 502, 503, 504),
 * full jitter (1 s base, 30 s cap) or the server's Retry-After, at most 3
 * attempts, one overall deadline, and a retry budget shared by all calls of
 * the client. Safe for concurrent use.
 */
export class Client {
    /** The effective retry policy, defaults filled in. */
    policy;
    /** The logical call of each run's claim that got 409 request_in_flight, by its bounds, until its next claim. */
    waitingClaims = new WeakMap();
    /** @internal */
    clock;
    /** @internal */
    random;
    /** @internal */
    attemptIds;
    base;
    token;
    budget;
    onAttempt;
    fetchFn;
    userAgent;
    constructor(opts) {
        const u = new URL(opts.baseUrl);
        if (u.protocol !== "http:" && u.protocol !== "https:") {
            throw new TypeError(`idem base URL ${opts.baseUrl}: the scheme must be http or https`);
        }
        this.base = opts.baseUrl.replace(/\/+$/, "");
        const tok = opts.token;
        this.token = typeof tok === "string" ? () => tok : tok;
        this.policy = withDefaults(opts.retry);
        this.budget = new RetryBudget(this.policy.budgetCapacity, this.policy.budgetRetryCost, this.policy.budgetSuccessRefund);
        this.onAttempt = opts.onAttempt;
        this.fetchFn = opts.fetch ?? globalThis.fetch;
        this.clock = opts.clock ?? realClock;
        this.random = opts.random ?? Math.random;
        this.userAgent = opts.userAgent ?? "idem-node-client/0.1";
        this.attemptIds = opts.attemptIds ?? true;
    }
    /** The tokens left in the client-wide retry budget (Infinity when off). */
    retryBudgetLeft() {
        return this.budget.left();
    }
    /** Resolves the bounds of a call. @internal */
    bounds(o = {}) {
        let deadline = o.deadline ?? Infinity;
        if (o.timeoutMs !== undefined)
            deadline = Math.min(deadline, this.clock.now() + o.timeoutMs);
        if (this.policy.callDeadlineMs > 0)
            deadline = Math.min(deadline, this.clock.now() + this.policy.callDeadlineMs);
        return { signal: o.signal, deadline };
    }
    /**
     * Runs fn under the idempotency protocol for key — claim, fn, checkpoint,
     * complete, with a lease keeper, replays and release on a declared
     * {@link NoSideEffect}; see {@link run}.
     */
    run(key, req, fn, opts = {}) {
        return run(this, key, req, fn, opts);
    }
    /**
     * Claims key for a request (POST /v1/keys/{key}/claim): a fresh claim or
     * a takeover (201), or the replay of a completed request (200, `replayed`
     * true, the stored response decoded). A held key throws `request_in_flight`
     * (with `retryAfterMs` = lease left), another request under the key
     * `fingerprint_mismatch`. Most callers want {@link run} instead.
     */
    async claim(key, req, opts = {}) {
        return this.claimWithin(key, req, this.bounds(opts), opts.attemptId ?? this.newAttemptId(), opts.waitSeconds);
    }
    /** A fresh attempt id when the client sends them. @internal */
    newAttemptId() {
        return this.attemptIds ? randomUUID() : undefined;
    }
    /** @internal */
    async claimWithin(key, req, b, attemptId, waitSeconds, seed) {
        checkKey("claim", key);
        const body = {};
        if (req.operation !== undefined)
            body.operation = req.operation;
        if (req.fingerprint !== undefined)
            body.fingerprint = req.fingerprint;
        if (req.request !== undefined)
            body.request = req.request;
        if (req.leaseSeconds !== undefined && req.leaseSeconds > 0)
            body.lease_seconds = Math.ceil(req.leaseSeconds);
        if (attemptId !== undefined)
            body.attempt_id = attemptId;
        if (waitSeconds !== undefined && waitSeconds >= 1)
            body.wait_seconds = Math.floor(waitSeconds);
        // run's claims after a 409 request_in_flight (same bounds) continue
        // one logical call: Idem-Attempt counts on, cause in-flight.
        // A front door's seed (its caller's Idem-Attempt): the claim is that
        // attempt, and its retries count on from it.
        const lc = this.waitingClaims.get(b) ??
            (seed && seed.number > 1 ? { attempts: seed.number - 1, cause: seed.cause, original: undefined }
                : { attempts: 0, cause: undefined, original: undefined });
        this.waitingClaims.delete(b);
        let res;
        try {
            res = await this.call({ name: "claim", method: "POST", path: keyPath(key, "/claim"), body }, b, lc);
        }
        catch (err) {
            if (err instanceof IdemError && err.code === Codes.requestInFlight) {
                lc.cause = "in-flight";
                lc.original ??= err;
                // No claim after a wait either when idem says the budget is spent.
                if (err.fleetBudgetSpent)
                    throw new FleetBudgetError("claim", lc.attempts, "in-flight", lc.original, undefined);
                this.waitingClaims.set(b, lc);
            }
            throw err;
        }
        checkClaimAnswer(res.status, res.headers, res.data);
        const record = res.data;
        const replayed = res.status === 200;
        let response;
        if (replayed) {
            try {
                response = StoredResponse.fromWire(record.response);
            }
            catch (err) {
                throw new IdemError({ status: res.status, code: Codes.invalidAnswer, title: "Invalid answer", call: "claim",
                    detail: `the replayed response cannot be decoded: ${err instanceof IdemError ? err.detail : String(err)}`, cause: err });
            }
        }
        return {
            record,
            replayed,
            resumed: record.resumed === true,
            fencingToken: record.fencing_token,
            attempt: record.attempt,
            response,
            waitAppliedSeconds: waitApplied(res.headers),
            leaseLeftMs: leaseLeftMs(record.lease_expires_at, res.headers.get("Date")),
            replayLeftMs: replayed ? Math.max(leaseLeftMs(record.replay_until, res.headers.get("Date")) - 1000, 0) : 0,
        };
    }
    /**
     * Saves a recovery point (a phase name and optional JSON data) on a
     * claimed key and renews its lease (POST /v1/keys/{key}/checkpoint). A
     * stale token throws `lease_lost`.
     */
    async checkpoint(key, fencingToken, recoveryPoint, data, opts = {}) {
        return this.checkpointWithin(key, fencingToken, recoveryPoint, data, opts.leaseSeconds, this.bounds(opts));
    }
    /** @internal */
    async checkpointWithin(key, fencingToken, recoveryPoint, data, leaseSeconds, b) {
        checkKey("checkpoint", key);
        const body = { fencing_token: fencingToken, recovery_point: recoveryPoint };
        if (data !== undefined)
            body.data = data;
        if (leaseSeconds !== undefined && leaseSeconds > 0)
            body.lease_seconds = Math.ceil(leaseSeconds);
        const res = await this.call({ name: "checkpoint", method: "POST", path: keyPath(key, "/checkpoint"), body }, b);
        return res.data;
    }
    /**
     * Stores the response of a claimed key and ends the claim (POST
     * /v1/keys/{key}/complete). Repeating it with the same token and response
     * is a no-op, which makes it safe to retry; another response throws
     * `already_completed`, a stale token `lease_lost`, a response over the
     * tenant's limit `payload_too_large` (the claim stays).
     */
    async complete(key, fencingToken, response, opts = {}) {
        return this.completeWithin(key, fencingToken, response, this.bounds(opts));
    }
    /** @internal */
    async completeWithin(key, fencingToken, response, b) {
        checkKey("complete", key);
        const body = { fencing_token: fencingToken, response: StoredResponse.from(response).toWire() };
        const res = await this.call({ name: "complete", method: "POST", path: keyPath(key, "/complete"), body }, b);
        return res.data;
    }
    /**
     * Removes a claimed key whose attempt left no side effect, so that the
     * next claim starts afresh (POST /v1/keys/{key}/release). A stale token
     * throws `lease_lost`; an absent key `key_not_found`.
     */
    async release(key, fencingToken, opts = {}) {
        return this.releaseWithin(key, fencingToken, this.bounds(opts));
    }
    /** @internal */
    async releaseWithin(key, fencingToken, b) {
        checkKey("release", key);
        await this.call({ name: "release", method: "POST", path: keyPath(key, "/release"), body: { fencing_token: fencingToken } }, b);
    }
    /** Returns the full record of key (GET /v1/keys/{key}); an absent key throws `key_not_found`. */
    async get(key, opts = {}) {
        checkKey("get key", key);
        const res = await this.call({ name: "get key", method: "GET", path: keyPath(key) }, this.bounds(opts));
        return res.data;
    }
    /** Returns one page of the tenant's records, newest first (GET /v1/keys). */
    async list(opts = {}) {
        const q = new URLSearchParams();
        if (opts.state)
            q.set("state", opts.state);
        if (opts.limit && opts.limit > 0)
            q.set("limit", String(opts.limit));
        if (opts.cursor)
            q.set("cursor", opts.cursor);
        const res = await this.call({ name: "list keys", method: "GET", path: "/v1/keys", query: q }, this.bounds(opts));
        return res.data;
    }
    /** Returns the caller's own tenant (GET /v1/tenant). */
    async getTenant(opts = {}) {
        const res = await this.call({ name: "get tenant", method: "GET", path: "/v1/tenant" }, this.bounds(opts));
        return res.data;
    }
    /** Runs one call under the retry policy. */
    async call(ac, b, lc = { attempts: 0, cause: undefined, original: undefined }) {
        const p = this.policy;
        const payload = ac.body === undefined ? undefined : JSON.stringify(ac.body);
        let target = this.base + ac.path;
        const qs = ac.query?.toString();
        if (qs)
            target += "?" + qs;
        // A write that finishes a claim is outside idem's fleet retry budget
        // (finishingCalls): given up, it would leave work that ran unrecorded.
        const finishing = finishingCalls.has(ac.name);
        for (let attempt = 1;; attempt++) {
            lc.attempts++;
            const { result, error } = await this.attempt(ac, target, payload, b, attemptHeader(lc.attempts, lc.cause));
            const info = {
                call: ac.name, method: ac.method, path: ac.path, attempt, status: result?.status ?? error?.status ?? 0,
                error, retry: false, waitMs: 0, giveUp: undefined, budgetLeft: 0,
            };
            if (!error) {
                this.budget.success();
                info.budgetLeft = this.budget.left();
                this.report(info);
                return result;
            }
            error.call = ac.name;
            if (error.code === Codes.retryBudgetExhausted && !finishing) {
                // idem's fleet budget refused this retry: stop now, and report
                // what failed before, not the refusal.
                info.giveUp = "fleet_budget";
                info.budgetLeft = this.budget.left();
                this.report(info);
                if (lc.original)
                    throw new FleetBudgetError(ac.name, lc.attempts, lc.cause, lc.original, error);
                throw error.finish(attempt, undefined);
            }
            // (An older server's 429 retry_budget_exhausted of a finishing write
            // is a 429 like any other: retried after its Retry-After.)
            const retryable = !b.signal?.aborted && (error.status === 0 ? error.retryable : retryableStatus(error.status, p.retry500));
            if (!retryable) {
                // The service answered sensibly: it is healthy.
                if (error.status > 0 && error.status < 500)
                    this.budget.success();
                info.budgetLeft = this.budget.left();
                this.report(info);
                throw error.finish(attempt, b.signal?.aborted ? "aborted" : undefined);
            }
            lc.cause = causeOf(error);
            lc.original ??= error;
            if (error.fleetBudgetSpent && !finishing) {
                // idem says the fleet budget is spent: a retry would only be
                // refused (an attempt reaching idem all the same), so stop now as
                // for the refusal, with the original cause.
                info.giveUp = "fleet_signal";
                info.budgetLeft = this.budget.left();
                this.report(info);
                throw new FleetBudgetError(ac.name, lc.attempts, lc.cause, lc.original, undefined);
            }
            const wait = error.retryAfterMs > 0 ? retryAfterWaitMs(p, error.retryAfterMs, this.random) : backoffMs(p, attempt - 1, this.random);
            let giveUp;
            if (attempt >= p.maxAttempts)
                giveUp = "attempts";
            else if (!this.fits(b, wait))
                giveUp = "deadline";
            else if (!finishing && !this.budget.take())
                giveUp = "budget";
            info.giveUp = giveUp;
            info.retry = giveUp === undefined;
            info.waitMs = info.retry ? wait : 0;
            info.budgetLeft = this.budget.left();
            this.report(info);
            if (giveUp)
                throw error.finish(attempt, giveUp);
            try {
                await this.clock.sleep(wait, b.signal);
            }
            catch {
                throw error.finish(attempt, "aborted");
            }
        }
    }
    /** Reports whether a wait plus a minimal attempt fits before the deadline. @internal */
    fits(b, waitMs) {
        return b.deadline - this.clock.now() >= waitMs + this.policy.minAttemptTimeMs;
    }
    /** The policy's per-attempt timeout cut to the time left before the deadline, in ms (Infinity for none). @internal */
    attemptTimeoutMs(b) {
        const timeout = this.policy.attemptTimeoutMs > 0 ? this.policy.attemptTimeoutMs : Infinity;
        return Math.min(timeout, b.deadline - this.clock.now());
    }
    /** Sends one HTTP request and reads the whole answer within the attempt's timeout. */
    async attempt(ac, target, payload, b, attempt) {
        if (b.signal?.aborted) {
            return { error: new IdemError({ code: Codes.network, title: "Aborted", detail: "the call was aborted", cause: b.signal.reason }) };
        }
        const timeout = this.attemptTimeoutMs(b);
        const signals = [];
        if (b.signal)
            signals.push(b.signal);
        if (Number.isFinite(timeout))
            signals.push(AbortSignal.timeout(Math.max(1, Math.ceil(timeout))));
        const signal = signals.length === 0 ? undefined : signals.length === 1 ? signals[0] : AbortSignal.any(signals);
        const headers = {
            Accept: "application/json, application/problem+json",
            "User-Agent": this.userAgent,
            [headerAttempt]: attempt,
        };
        if (payload !== undefined)
            headers["Content-Type"] = "application/json";
        if (this.token) {
            let tok;
            try {
                tok = await this.token();
            }
            catch (err) {
                return { error: new IdemError({ code: Codes.unknown, title: "Token source failed", detail: "the token source failed", cause: err }) };
            }
            if (tok)
                headers.Authorization = `Bearer ${tok}`;
        }
        let resp;
        try {
            resp = await this.fetchFn(target, { method: ac.method, headers, body: payload, signal: signal ?? null });
        }
        catch (err) {
            return { error: networkError(err, b) };
        }
        let text;
        try {
            text = await resp.text();
        }
        catch (err) {
            // An answer arrived but could not be read whole: retry only what the
            // status would have allowed.
            const e = networkError(err, b);
            const retryable = e.retryable && retryableStatus(resp.status, this.policy.retry500);
            return { error: new IdemError({ status: 0, code: Codes.network, title: "Answer cut short", detail: `the ${resp.status} answer could not be read`, retryable, cause: err }) };
        }
        if (resp.status >= 200 && resp.status < 300) {
            let data = null;
            if (text) {
                try {
                    data = JSON.parse(text);
                }
                catch (err) {
                    return { error: new IdemError({ status: resp.status, code: Codes.invalidAnswer, title: "Invalid answer", detail: "the answer is not JSON", cause: err }) };
                }
            }
            return { result: { status: resp.status, headers: resp.headers, data } };
        }
        return { error: this.problem(resp, text) };
    }
    /** Turns a non-2xx answer into an IdemError. */
    problem(resp, text) {
        let pd = {};
        try {
            const v = JSON.parse(text);
            if (v && typeof v === "object" && !Array.isArray(v))
                pd = v;
        }
        catch {
            // not a problem document: a proxy's page, say
        }
        const str = (k) => (typeof pd[k] === "string" ? pd[k] : undefined);
        return new IdemError({
            status: resp.status,
            code: str("code") || Codes.unknown,
            type: str("type"),
            title: str("title") ?? (resp.statusText || `HTTP ${resp.status}`),
            detail: str("detail"),
            retryable: typeof pd.retryable === "boolean" ? pd.retryable : retryableStatus(resp.status, this.policy.retry500),
            retryAfterMs: parseRetryAfter(resp.headers.get("Retry-After"), this.clock.now()) ?? 0,
            requestId: resp.headers.get("X-Request-Id") ?? "",
            waitAppliedSeconds: waitApplied(resp.headers),
            fleetBudgetSpent: budgetSpent(resp.headers.get(headerRetryBudget)),
            fields: Array.isArray(pd.errors) ? pd.errors : [],
        });
    }
    report(info) {
        if (!this.onAttempt)
            return;
        try {
            this.onAttempt(info);
        }
        catch {
            // a hook must not break the call
        }
    }
}
/** Wraps a fetch failure: retryable when it is on the transport allowlist and the caller did not abort. */
function networkError(err, b) {
    const aborted = b.signal?.aborted === true;
    const retryable = !aborted && retryableTransportError(err);
    const cause = err instanceof Error && err.cause instanceof Error ? err.cause : err;
    return new IdemError({ code: Codes.network, title: "No answer", detail: cause instanceof Error ? cause.message : String(cause), retryable, cause: err });
}
function positiveInt(v) {
    return typeof v === "number" && Number.isSafeInteger(v) && v >= 1;
}
/**
 * Throws IdemError(invalid_answer) unless a claim's answer is one the
 * client can act on: a claim (201, state in_flight, a fencing token and an
 * attempt) or a replay (200, state completed, a response whose status idem
 * can have stored). Running the function on a claim without a fencing
 * token, or replaying a response the server did not send, would do what
 * idempotency prevents; such an answer comes from something that is not an
 * idem server speaking the contract (a misrouted proxy, say).
 */
function checkClaimAnswer(status, headers, data) {
    const bad = (why) => new IdemError({ status, code: Codes.invalidAnswer, title: "Invalid answer", call: "claim", detail: `the ${status} answer to a claim ${why}` });
    if (status !== 200 && status !== 201)
        throw bad("is neither a claim (201) nor a replay (200)");
    if (data === null || typeof data !== "object" || Array.isArray(data))
        throw bad("is not a JSON object");
    const d = data;
    if (status === 201) {
        if (headers.get("Idempotent-Replayed") === "true")
            throw bad("is marked Idempotent-Replayed");
        if (d.state !== "in_flight")
            throw bad(`has state ${JSON.stringify(d.state)}, not in_flight`);
        if (!positiveInt(d.fencing_token))
            throw bad("has no fencing token");
        if (!positiveInt(d.attempt))
            throw bad("has no attempt");
        return;
    }
    if (d.state !== "completed")
        throw bad(`has state ${JSON.stringify(d.state)}, not completed`);
    const r = d.response;
    if (r === null || typeof r !== "object" || Array.isArray(r))
        throw bad("replays no stored response");
    const st = r.status;
    if (!(typeof st === "number" && Number.isInteger(st) && st >= 100 && st <= 599))
        throw bad(`replays a response of status ${JSON.stringify(st)}`);
}
/** The wait the server says it applied to a claim (`Preference-Applied: wait=N`), 0 when none. */
function waitApplied(h) {
    const v = h.get(headerPreferenceApplied);
    return v === null ? 0 : Math.max(preferWait([v]), 0);
}
function checkKey(call, key) {
    const err = validateKey(key);
    if (err) {
        err.call = call;
        throw err.finish(0, undefined);
    }
}
/** A time of the record (lease_expires_at, replay_until) less the answer's Date, in ms; 0 when either is missing or unreadable. */
function leaseLeftMs(expires, date) {
    const exp = expires ? Date.parse(expires) : NaN;
    const at = date ? Date.parse(date) : NaN;
    return Number.isFinite(exp) && Number.isFinite(at) ? Math.max(exp - at, 0) : 0;
}
