import { Codes, IdemError, isIdemError, isNoSideEffect } from "./errors.js";
import { validateKey } from "./keys.js";
import { StoredResponse } from "./response.js";
import { retryAfterWaitMs } from "./retry.js";
/**
 * The recovery point the lease keeper saves when it renews a lease before
 * the function's first checkpoint. {@link Claim.recoveryPoint} hides it: a
 * takeover of such a claim sees no recovery point.
 */
export const renewalPoint = "idem:lease-renewal";
/**
 * The handle the function run by {@link run} receives: the claim's
 * identity, the recovery point an earlier attempt left, checkpoint, and a
 * signal that aborts when the lease is lost.
 */
export class Claim {
    client;
    key;
    fencingToken;
    attempt;
    resumed;
    leaseSeconds;
    resume;
    /** Aborts with a `lease_lost` IdemError when the lease is lost, or with the caller's reason. */
    signal;
    startPoint;
    startData;
    point;
    data;
    chain = Promise.resolve();
    /** When the lease was last known renewed (clock ms). @internal */
    renewedAt;
    /** @internal */
    constructor(client, key, 
    /** The claim's fencing token, which every write on the key carries. */
    fencingToken, 
    /** 1 for a fresh claim, more after takeovers; in a resume (see {@link Claim.resume}) the completer's attempt, 1-based. */
    attempt, 
    /** This claim took over an orphaned one: an earlier attempt may have done part of the work, see recoveryPoint. */
    resumed, leaseSeconds, recoveryPoint, recoveryData, signal, 
    /**
     * Set when the claim is idem's completer resuming an orphaned key (a
     * resume handler, resume.ts): the call's key, operation, attempt,
     * deadline. The claim's fencing token is the one idem took the key over
     * with; `run` never sets it, so a function can tell the two apart,
     * though it seldom needs to: the recovery point says what is done.
     */
    resume) {
        this.client = client;
        this.key = key;
        this.fencingToken = fencingToken;
        this.attempt = attempt;
        this.resumed = resumed;
        this.leaseSeconds = leaseSeconds;
        this.resume = resume;
        this.startPoint = this.point = recoveryPoint;
        this.startData = this.data = recoveryData;
        this.signal = signal;
        this.renewedAt = client.clock.now();
    }
    /** The last recovery point the earlier attempt saved before this claim began ("" when none). */
    get recoveryPoint() {
        return this.startPoint === renewalPoint ? "" : this.startPoint;
    }
    /** The JSON saved with recoveryPoint (undefined when none). */
    get recoveryData() {
        return this.startPoint === renewalPoint || this.startData === null ? undefined : this.startData;
    }
    /**
     * Saves a recovery point — a phase name and optional JSON data — under
     * the claim's fencing token, and renews the lease. Call it right after
     * each external step, so that a takeover resumes after the step instead
     * of repeating it. A stale token throws `lease_lost`.
     */
    checkpoint(name, data, opts = {}) {
        return this.serial(() => this.save(name, data, this.client.bounds(opts)));
    }
    /** Re-saves the last recovery point to extend the lease. @internal */
    renew(b) {
        return this.serial(() => this.save(this.point || renewalPoint, this.data, b));
    }
    /** Runs checkpoints one at a time, so that a renewal never sends an older point after a newer one. */
    serial(fn) {
        const next = this.chain.then(fn, fn);
        this.chain = next.catch(() => undefined);
        return next;
    }
    async save(point, data, b) {
        await this.client.checkpointWithin(this.key, this.fencingToken, point, data, this.leaseSeconds, b);
        this.point = point;
        this.data = data;
        this.renewedAt = this.client.clock.now();
    }
}
/**
 * Runs fn under the idempotency protocol for key:
 *
 * 1. It claims the key. A completed key is a replay: the stored response
 *    comes back with `replayed` true and fn does not run.
 * 2. While another caller holds the key (409 request_in_flight) it waits
 *    for it, for at most `inFlightWaitMs` and never past the deadline; then
 *    it throws `request_in_flight`. Each claim asks the server to hold it
 *    (`wait_seconds`: what `inFlightWaitMs`, the attempt timeout less a
 *    second and the deadline leave, in whole seconds), so run gets the
 *    replay or the key as soon as the holder finishes; when the server
 *    answers 409 anyway (its wait ran out, it holds too many), run waits the
 *    Retry-After it sent (plus the policy's spread) and claims again.
 *    `noWait` skips the waiting.
 * 3. It runs fn with a {@link Claim}. After a takeover of a crashed
 *    attempt, `claim.resumed` is true and `claim.recoveryPoint` /
 *    `recoveryData` tell where that attempt got to.
 * 4. While fn runs, a lease keeper renews the lease every third of it. If
 *    the service says the lease is lost, or no renewal succeeded for a whole
 *    lease, `claim.signal` aborts with a `lease_lost` error.
 * 5. If fn returns a response, run completes the key with it and returns
 *    it. If fn throws a {@link NoSideEffect} (anywhere in the cause chain),
 *    run releases the key and rethrows. Any other error leaves the claim
 *    as it is — fn may have had a side effect — to expire into an orphan
 *    that the next run takes over (resuming from the last checkpoint) and
 *    operators can see; the error is rethrown.
 *
 * Complete and release run after fn returned even when the caller's signal
 * fired or fires meanwhile, until the deadline but at least one attempt
 * timeout from then: the outcome of work already done is worth recording.
 */
export async function run(client, key, req, fn, opts = {}) {
    const invalid = validateKey(key);
    if (invalid)
        throw invalid;
    const b = client.bounds(opts);
    const attemptId = opts.attemptId ?? client.newAttemptId();
    const cr = await claimWaiting(client, key, req, b, attemptId, opts.noWait === true, opts.waitSeconds ?? 0, opts.attempt);
    if (cr.replayed) {
        return { response: cr.response ?? new StoredResponse(200), replayed: true, resumed: false, attempt: cr.attempt, fencingToken: cr.fencingToken,
            waitAppliedSeconds: cr.waitAppliedSeconds, replayLeftMs: cr.replayLeftMs };
    }
    const lost = new AbortController();
    const signal = b.signal ? AbortSignal.any([b.signal, lost.signal]) : lost.signal;
    const claim = new Claim(client, key, cr.fencingToken, cr.attempt, cr.resumed, req.leaseSeconds, cr.record.recovery_point ?? "", cr.record.recovery_data ?? undefined, signal);
    let leaseMs = (req.leaseSeconds ?? 0) * 1000;
    if (!(leaseMs > 0) && cr.leaseLeftMs > 0) {
        // The lease the server granted, on its own clock (its answer's Date):
        // this host's clock may be off by more than a lease. Up to a second
        // more than the truth, a third of it still renews in time.
        leaseMs = cr.leaseLeftMs;
    }
    if (!(leaseMs > 0)) {
        const exp = cr.record.lease_expires_at ? Date.parse(cr.record.lease_expires_at) : NaN;
        leaseMs = Number.isFinite(exp) && exp > Date.now() ? exp - Date.now() : 30_000;
    }
    const keeper = keepLease(client, claim, leaseMs, lost);
    let response;
    try {
        response = StoredResponse.from(await fn(claim));
    }
    catch (err) {
        await keeper.stop();
        if (isNoSideEffect(err)) {
            try {
                await client.releaseWithin(key, claim.fencingToken, finishBounds(client, b));
            }
            catch (rerr) {
                if (!isIdemError(rerr, Codes.keyNotFound))
                    throw new AggregateError([err, rerr], `idem: run ${key}: the function declared no side effect but the release failed`);
            }
        }
        throw err;
    }
    await keeper.stop();
    await client.completeWithin(key, claim.fencingToken, response, finishBounds(client, b));
    return { response, replayed: false, resumed: cr.resumed, attempt: cr.attempt, fencingToken: cr.fencingToken, waitAppliedSeconds: cr.waitAppliedSeconds };
}
/**
 * The bounds of complete/release after fn ran: never the caller's signal
 * (a caller that hangs up while the complete is on its way must not lose
 * the outcome of work already done: the key would stay in flight and the
 * next run would run fn again), and the call's deadline but at least one
 * attempt timeout from now.
 */
function finishBounds(client, b) {
    return { signal: undefined, deadline: Math.max(b.deadline, client.clock.now() + (client.policy.attemptTimeoutMs || 10_000)) };
}
/**
 * Claims key, waiting for another holder within the deadline and
 * inFlightWaitMs: held by the server (wait_seconds), else by sleeping the
 * Retry-After of its 409. The time the server held a claim counts as waited.
 * With noWait only the caller's own waitSeconds is asked for, once.
 */
async function claimWaiting(client, key, req, b, attemptId, noWait, ownWaitSeconds, seed) {
    const p = client.policy;
    let waited = 0;
    for (;;) {
        const start = client.clock.now();
        try {
            const wait = noWait ? (ownWaitSeconds > 0 ? serverWaitSeconds(client, b, ownWaitSeconds * 1000) : 0)
                : p.inFlightWaitMs <= 0 ? 0 : serverWaitSeconds(client, b, p.inFlightWaitMs - waited);
            return await client.claimWithin(key, req, b, attemptId, wait, seed);
        }
        catch (err) {
            waited += client.clock.now() - start; // the server may have held the claim
            if (!(err instanceof IdemError) || err.code !== Codes.requestInFlight || noWait || p.inFlightWaitMs <= 0)
                throw err;
            const wait = retryAfterWaitMs(p, err.retryAfterMs > 0 ? err.retryAfterMs : p.baseDelayMs, client.random);
            if (waited + wait > p.inFlightWaitMs)
                throw err.finish(err.attempts, "in_flight_wait");
            if (!client.fits(b, wait))
                throw err.finish(err.attempts, "deadline");
            try {
                await client.clock.sleep(wait, b.signal);
            }
            catch {
                throw err.finish(err.attempts, "aborted");
            }
            waited += wait;
        }
    }
}
/**
 * How long a claim may ask the server to hold it while another request holds
 * the key: what is left of the in-flight budget, within the next attempt's
 * timeout (and so the deadline) less a second for the answer to come back,
 * in whole seconds; 0 (not sent) when not even one fits.
 */
function serverWaitSeconds(client, b, budgetMs) {
    const ms = Math.min(budgetMs, client.attemptTimeoutMs(b) - 1000);
    return ms >= 1000 ? Math.floor(ms / 1000) : 0;
}
/** Renews the claim's lease every third of it until stopped; on loss aborts the claim's signal. Runs on real time: the lease runs on the service's clock. */
function keepLease(client, claim, leaseMs, lost) {
    const interval = Math.max(Math.floor(leaseMs / 3), 100);
    let stopped = false;
    let timer;
    let inflight = Promise.resolve();
    const stopSignal = new AbortController();
    const tick = () => {
        if (stopped)
            return;
        inflight = (async () => {
            try {
                await claim.renew({ signal: stopSignal.signal, deadline: client.clock.now() + interval });
            }
            catch (err) {
                if (stopped)
                    return;
                if (isIdemError(err, Codes.leaseLost, Codes.keyNotFound)) {
                    lost.abort(leaseLost(err));
                    stopped = true;
                    return;
                }
                if (client.clock.now() - claim.renewedAt >= leaseMs) {
                    lost.abort(leaseLost(err, `no lease renewal succeeded for ${leaseMs} ms`));
                    stopped = true;
                    return;
                }
            }
            if (!stopped) {
                timer = setTimeout(tick, interval);
                timer.unref();
            }
        })();
    };
    timer = setTimeout(tick, interval);
    timer.unref();
    return {
        async stop() {
            stopped = true;
            if (timer)
                clearTimeout(timer);
            stopSignal.abort();
            await inflight;
        },
    };
}
function leaseLost(cause, detail) {
    const e = new IdemError({ code: Codes.leaseLost, title: "Lease lost", detail: detail ?? "the claim's lease was lost", cause });
    e.call = "lease keeper";
    return e.finish(0, undefined);
}
