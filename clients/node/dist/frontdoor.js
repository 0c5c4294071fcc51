// The framework-independent front-door protocol around a handler for the
// Node middleware (Express, fetch): the flow of docs/frontdoor.md over the
// rules of rules.ts, claiming through a narrow port (FrontDoorPort) that the
// idem Client satisfies, so the flow does not import the client core.
import { randomBytes } from "node:crypto";
import { Codes, IdemError, NoSideEffect, isIdemError } from "./errors.js";
import { FleetBudgetError, headerAttempt } from "./retry.js";
import { StoredResponse } from "./response.js";
import { budgetRefusal, callerAttempt, spentBudget, defaultStoredHeaders, fingerprintDocument, FrontDoorError, headerKey, headerNotReplayable, headerPreferenceApplied, headerReplayed, headerRequestId, held, mismatchDetail, notReplayable, notReplayableDetail, operation, parseKey, parsePointer, preferWait, problemResponse, requirement, scopedKey, storableStatus, storageQuotaDetail, storedHeaders, storeStatus, tenantUnknownDetail, validRequestId } from "./rules.js";
import { CacheLookup, newReplayCache } from "./replaycache.js";
/** Preference-Applied: wait=<seconds> when idem held the claim (RFC 7240: only an honoured preference is named), else nothing. */
function applied(seconds) {
    return seconds > 0 ? [[headerPreferenceApplied, `wait=${seconds}`]] : [];
}
/**
 * The scope of a request: a scope option's value, or its function's. A
 * scope function that throws (a repeated or missing account header, say:
 * docs/frontdoor.md rule 3) is a request that cannot be scoped, refused
 * 400 invalid_key with its message, never the app's own 500: the error
 * does not escape the middleware, and nothing is claimed.
 */
function scopeOf(scope) {
    if (typeof scope !== "function")
        return scope;
    try {
        return scope();
    }
    catch (err) {
        if (err instanceof FrontDoorError)
            throw err;
        const message = err instanceof Error ? err.message : String(err);
        throw new FrontDoorError("invalid_key", message || "the key cannot be scoped to the caller");
    }
}
/** The answer of a replay: the stored status, headers and body, marked Idempotent-Replayed (the same from idem and from the replay cache). */
function replay(r, waitApplied) {
    const headers = Object.entries(r.headers);
    headers.push([headerReplayed, "true"], ["Content-Length", String(r.body.length)], ...applied(waitApplied));
    return { kind: "answer", answer: { status: r.status || 200, headers, body: r.body } };
}
/** A 5xx answer released under storeServerErrors: false. */
class Released extends NoSideEffect {
}
/**
 * The framework-independent front door: parses the key, builds the
 * fingerprint document, claims through {@link Client.run} without waiting,
 * runs the handler once on a new claim or takeover, stores its answer and
 * only then lets it be sent, replays completed keys, and maps every refusal
 * to its problem. A handler exception stores nothing (the claim expires
 * into an orphan) and propagates.
 */
export class FrontDoor {
    o;
    /** The replay cache; undefined: off. */
    replayCache;
    constructor(opts) {
        this.o = {
            storeServerErrors: true,
            headers: defaultStoredHeaders,
            maxBodyBytes: 8 << 20,
            maxStoredBytes: 1 << 20,
            unavailableRetryAfterSeconds: 1,
            log: (message, err) => console.error(`idem: ${message}:`, err instanceof Error ? err.message : err),
            ...opts,
        };
        for (const p of opts.fingerprint?.exclude ?? [])
            parsePointer(p);
        this.replayCache = newReplayCache(opts.replayCache);
    }
    /**
     * Serves one request. runHandler runs the handler once with the request
     * body and resolves to its buffered answer (or rejects with its exception).
     */
    async serve(req, runHandler) {
        const rid = req.header(headerRequestId)[0];
        const requestId = validRequestId(rid) ? rid : randomBytes(16).toString("hex");
        const refuse = (e) => ({ kind: "answer", answer: problemResponse(e, requestId) });
        const need = requirement(req.method, this.o.methods);
        if (need === "pass")
            return { kind: "pass" };
        let k;
        let body;
        let doc;
        try {
            k = parseKey(req.header(headerKey));
            if (k === null) {
                if (need === "required")
                    throw new FrontDoorError("idempotency_key_missing", `${req.method.toUpperCase()} requires an ${headerKey} header`);
                return { kind: "pass" };
            }
            if (req.scope || req.scoped)
                k = scopedKey(scopeOf(req.scope), k);
            body = await req.body(this.o.maxBodyBytes);
            doc = fingerprintDocument({ path: req.path, query: req.query, contentType: req.header("Content-Type")[0], body, header: req.header }, this.o.fingerprint);
        }
        catch (err) {
            if (err instanceof FrontDoorError)
                return refuse(err);
            throw err;
        }
        const wait = this.preferWait(req.header("Prefer"));
        const op = operation(req.method, req.route);
        // A replay of exactly this request the cache holds is answered without a claim (replaycache.ts).
        const cached = new CacheLookup(this.replayCache, k, op, doc);
        const hit = cached.cached(wait);
        if (hit)
            return replay(hit, 0);
        // Rule 9: the caller's retry goes on with the claim, so idem's fleet retry budget counts it.
        const attempt = callerAttempt(req.header(headerAttempt));
        let ran = false;
        let token = 0;
        let answer;
        let result;
        try {
            result = await this.o.client.run(k, { operation: op, request: doc, ...(this.o.leaseSeconds ? { leaseSeconds: this.o.leaseSeconds } : {}) }, async (claim) => {
                ran = true;
                token = claim.fencingToken;
                const a = await runHandler(body);
                answer = a;
                // The handler ran: an answer idem cannot store is recorded as not replayable, never released.
                if (!storableStatus(a.status))
                    return notReplayable(a.status, 0);
                if (!storeStatus(a.status, this.o.storeServerErrors))
                    throw new Released("handler answered 5xx; key released");
                return this.stored(a);
            }, { noWait: true, ...(wait > 0 ? { waitSeconds: wait } : {}), ...(attempt.number > 1 ? { attempt } : {}) });
        }
        catch (err) {
            if (ran) {
                if (err instanceof Released)
                    return { kind: "ran", headers: [] };
                if (answer && isIdemError(err, Codes.payloadTooLarge)) {
                    // The tenant's max_response_bytes is under maxStoredBytes: store
                    // the answer without its body, as one over maxStoredBytes, so that
                    // the retry is 409 response_not_replayable instead of a second
                    // run once the claim's lease is over.
                    try {
                        await this.o.client.complete(k, token, notReplayable(answer.status, this.size(answer)));
                        return { kind: "ran", headers: [] };
                    }
                    catch (cerr) {
                        err = cerr;
                    }
                }
                if (err instanceof IdemError) {
                    this.o.log("the handler ran but its response was not stored", err);
                    return { kind: "ran", headers: [] };
                }
                throw err; // the handler's exception: the claim is left to expire
            }
            cached.refused(err);
            const out = refuse(this.claimRefusal(err));
            if (out.kind === "answer")
                out.answer.headers.push(...applied(err instanceof IdemError ? err.waitAppliedSeconds : 0));
            return out;
        }
        if (!result.replayed)
            return { kind: "ran", headers: applied(result.waitAppliedSeconds) };
        if (Object.hasOwn(result.response.headers, headerNotReplayable)) {
            return refuse(new FrontDoorError("response_not_replayable", notReplayableDetail));
        }
        cached.replayed(result);
        return replay(result.response, result.waitAppliedSeconds);
    }
    /** The wait to ask idem for: the request's Prefer: wait=N within maxWaitSeconds (and a day), 0 without one or when maxWaitSeconds is 0 or less. */
    preferWait(fields) {
        const n = preferWait(fields);
        const cap = this.o.maxWaitSeconds;
        if (n <= 0 || (cap !== undefined && cap <= 0))
            return 0;
        const wait = Math.min(n, 24 * 3600);
        return cap === undefined ? wait : Math.min(wait, cap);
    }
    /** The response to store for a handler's answer: the whole of it, or without its body (marked) when it is over maxStoredBytes. */
    stored(a) {
        const size = this.size(a);
        if (size <= this.o.maxStoredBytes)
            return new StoredResponse(a.status, storedHeaders(a.header, this.o.headers), a.body);
        return notReplayable(a.status, size);
    }
    /** What storing a handler's answer whole takes: its body and stored headers. */
    size(a) {
        let size = a.body.length;
        for (const [k, v] of Object.entries(storedHeaders(a.header, this.o.headers)))
            size += Buffer.byteLength(k) + Buffer.byteLength(v);
        return size;
    }
    /**
     * Maps a claim that did not let the handler run to its refusal; a
     * retryable one whose idem answer said the fleet retry budget is spent
     * says so too (rule 9).
     */
    claimRefusal(err) {
        const e = this.refusal(err);
        return spentBudget(e, err instanceof IdemError && err.fleetBudgetSpent);
    }
    /** The refusal of claimRefusal. */
    refusal(err) {
        // idem's fleet retry budget (rule 9): a claim stopped after a failure
        // of its own (its retry refused, or the failure saying the budget is
        // spent) is that failure's answer, saying the budget is spent; the
        // caller's retry refused is 429 retry_budget_exhausted.
        if (err instanceof FleetBudgetError)
            return spentBudget(this.claimRefusal(err.original), true);
        if (err instanceof IdemError && err.code === Codes.retryBudgetExhausted)
            return budgetRefusal(err.retryAfterMs);
        if (err instanceof IdemError) {
            if (err.code === Codes.requestInFlight)
                return new FrontDoorError("request_in_flight", "a request with this idempotency key is being processed; retry later", err.retryAfterMs);
            // idem's completer holds the key (rule 8): in flight while it finds
            // out what the first request did, a refusal for a person once it
            // gave up; never the retryable 503 (idem is up and answered).
            const h = held(err.code, err.retryAfterMs);
            if (h)
                return h;
            if (err.code === Codes.fingerprintMismatch)
                return new FrontDoorError("fingerprint_mismatch", mismatchDetail);
            if (err.code === Codes.invalidKey)
                return new FrontDoorError("invalid_key", err.detail);
            if (err.code === Codes.payloadTooLarge) {
                // The server's request limit (IDEM_MAX_BODY_BYTES) is under maxBodyBytes: a retry cannot succeed.
                return new FrontDoorError("payload_too_large", "the request body is too large for the idempotency service to fingerprint");
            }
            // idem is up and refused a new record: 503 would have the caller retry what cannot succeed.
            if (err.code === Codes.storageQuotaExceeded)
                return new FrontDoorError("storage_quota_exceeded", storageQuotaDetail);
            if (err.code === Codes.tenantUnknown) {
                // idem is up and refused the middleware's tenant (disabled or
                // deleted): no retry succeeds until an operator enables it, so not
                // the retryable 503 (issue 21, hole 2's class).
                this.o.log("the idempotency service refused the middleware's tenant (it does not exist or is disabled)", err);
                return new FrontDoorError("tenant_unknown", tenantUnknownDetail);
            }
            if (err.code === Codes.unauthenticated || err.code === Codes.forbidden) {
                // idem refused the middleware's own token (expired, a rotated
                // secret, a deleted tenant's, without keys:write): a fault of this
                // service's credentials that a rotation fixes, not of the caller's
                // request. Fail closed with the retryable 503 (nothing was claimed,
                // so the retry is safe), never a 401 or 403 that would blame the
                // caller's own credentials.
                this.o.log("the idempotency service refused the middleware's token (check its expiry, tenant and the keys:write scope); failing closed", err);
                return this.unavailable(err);
            }
            if (err.code === Codes.invalidRequest && err.fields[0]?.field === "request") {
                return new FrontDoorError("invalid_request", `the request body cannot be fingerprinted: ${err.fields[0].message}`);
            }
            if (err.code === Codes.invalidRequest) {
                // idem refused the claim itself (an operation from a route function
                // it does not accept, say): the same claim is refused again, so not
                // the retryable 503.
                this.o.log("the idempotency service refused the claim", err);
                return new FrontDoorError("invalid_request", `the idempotency service refused the claim of this request: ${err.detail}`, 0, err.fields.map((f) => ({ field: f.field, message: f.message })));
            }
        }
        this.o.log("the idempotency service is unavailable; failing closed", err);
        return this.unavailable(err);
    }
    /** The retryable 503 store_unavailable (fail closed), Retry-After the longer of unavailableRetryAfterSeconds and idem's hint. */
    unavailable(err) {
        const ra = Math.max(this.o.unavailableRetryAfterSeconds * 1000, err instanceof IdemError ? err.retryAfterMs : 0);
        return new FrontDoorError("store_unavailable", "the request was not processed; retry later with the same idempotency key", ra);
    }
}
