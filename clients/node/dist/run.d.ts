import type { Bounds, CallOptions } from "./bounds.js";
import { StoredResponse, type ResponseInit } from "./response.js";
import { type Clock, type EffectivePolicy } from "./retry.js";
import type { ResumeCall } from "./types.js";
import type { ClaimRequest, ClaimResult } from "./types.js";
/**
 * The recovery point the lease keeper saves when it renews a lease before
 * the function's first checkpoint. {@link Claim.recoveryPoint} hides it: a
 * takeover of such a claim sees no recovery point.
 */
export declare const renewalPoint = "idem:lease-renewal";
/**
 * What {@link run} and {@link Claim} need of the idem client: its policy,
 * clock and the bounded calls of the lifecycle. {@link Client} is one; the
 * helper names this port instead of importing the client core, which
 * imports the helper.
 */
export interface RunPort {
    readonly policy: EffectivePolicy;
    readonly clock: Clock;
    readonly random: () => number;
    bounds(o?: CallOptions): Bounds;
    newAttemptId(): string | undefined;
    fits(b: Bounds, waitMs: number): boolean;
    attemptTimeoutMs(b: Bounds): number;
    claimWithin(key: string, req: ClaimRequest, b: Bounds, attemptId: string | undefined, waitSeconds?: number, seed?: {
        number: number;
        cause?: string | undefined;
    }): Promise<ClaimResult>;
    checkpointWithin(key: string, fencingToken: number, recoveryPoint: string, data: unknown, leaseSeconds: number | undefined, b: Bounds): Promise<unknown>;
    completeWithin(key: string, fencingToken: number, response: ResponseInit | StoredResponse, b: Bounds): Promise<unknown>;
    releaseWithin(key: string, fencingToken: number, b: Bounds): Promise<void>;
}
/** Options of {@link run}. */
export interface RunOptions extends CallOptions {
    /** Throw `request_in_flight` at once instead of waiting for another holder of the key (with `waitSeconds`, once the server held the claim that long). */
    noWait?: boolean;
    /**
     * With `noWait`: ask the server to hold the claim this many seconds while
     * another request holds the key (a front door passing on a caller's
     * `Prefer: wait=N`), within the attempt timeout less a second.
     * `RunResult` / `IdemError.waitAppliedSeconds` say what it applied.
     */
    waitSeconds?: number;
    /** The attempt id of this logical call (default: a random one when the client sends attempt ids). */
    attemptId?: string;
    /**
     * The call continues a logical call that began before this process (a
     * front door passing on its caller's `Idem-Attempt`): the first claim
     * says attempt `number` after `cause`, and its retries count on from it,
     * so idem's fleet retry budget counts the caller's retry.
     */
    attempt?: {
        number: number;
        cause?: string | undefined;
    };
}
/** The outcome of {@link run}. */
export interface RunResult {
    /** The function's response, or the stored one on a replay. */
    response: StoredResponse;
    /** The key was already completed; the function did not run. */
    replayed: boolean;
    /** This run took over an orphaned claim. */
    resumed: boolean;
    /** The attempt and fencing token of the claim the function ran under (of the stored record on a replay). */
    attempt: number;
    fencingToken: number;
    /** The wait, in whole seconds, the server applied to the claim that got this outcome; a front door answers it as `Preference-Applied`. */
    waitAppliedSeconds: number;
    /** On a replay, {@link ClaimResult.replayLeftMs} of the claim that got it; 0 otherwise. */
    replayLeftMs?: number;
}
/**
 * The handle the function run by {@link run} receives: the claim's
 * identity, the recovery point an earlier attempt left, checkpoint, and a
 * signal that aborts when the lease is lost.
 */
export declare class Claim {
    private readonly client;
    readonly key: string;
    /** The claim's fencing token, which every write on the key carries. */
    readonly fencingToken: number;
    /** 1 for a fresh claim, more after takeovers; in a resume (see {@link Claim.resume}) the completer's attempt, 1-based. */
    readonly attempt: number;
    /** This claim took over an orphaned one: an earlier attempt may have done part of the work, see recoveryPoint. */
    readonly resumed: boolean;
    private readonly leaseSeconds;
    /**
     * Set when the claim is idem's completer resuming an orphaned key (a
     * resume handler, resume.ts): the call's key, operation, attempt,
     * deadline. The claim's fencing token is the one idem took the key over
     * with; `run` never sets it, so a function can tell the two apart,
     * though it seldom needs to: the recovery point says what is done.
     */
    readonly resume?: ResumeCall | undefined;
    /** Aborts with a `lease_lost` IdemError when the lease is lost, or with the caller's reason. */
    readonly signal: AbortSignal;
    private readonly startPoint;
    private readonly startData;
    private point;
    private data;
    private chain;
    /** When the lease was last known renewed (clock ms). @internal */
    renewedAt: number;
    /** @internal */
    constructor(client: RunPort, key: string, 
    /** The claim's fencing token, which every write on the key carries. */
    fencingToken: number, 
    /** 1 for a fresh claim, more after takeovers; in a resume (see {@link Claim.resume}) the completer's attempt, 1-based. */
    attempt: number, 
    /** This claim took over an orphaned one: an earlier attempt may have done part of the work, see recoveryPoint. */
    resumed: boolean, leaseSeconds: number | undefined, recoveryPoint: string, recoveryData: unknown, signal: AbortSignal, 
    /**
     * Set when the claim is idem's completer resuming an orphaned key (a
     * resume handler, resume.ts): the call's key, operation, attempt,
     * deadline. The claim's fencing token is the one idem took the key over
     * with; `run` never sets it, so a function can tell the two apart,
     * though it seldom needs to: the recovery point says what is done.
     */
    resume?: ResumeCall | undefined);
    /** The last recovery point the earlier attempt saved before this claim began ("" when none). */
    get recoveryPoint(): string;
    /** The JSON saved with recoveryPoint (undefined when none). */
    get recoveryData(): unknown;
    /**
     * Saves a recovery point — a phase name and optional JSON data — under
     * the claim's fencing token, and renews the lease. Call it right after
     * each external step, so that a takeover resumes after the step instead
     * of repeating it. A stale token throws `lease_lost`.
     */
    checkpoint(name: string, data?: unknown, opts?: CallOptions): Promise<void>;
    /** Re-saves the last recovery point to extend the lease. @internal */
    renew(b: Bounds): Promise<void>;
    /** Runs checkpoints one at a time, so that a renewal never sends an older point after a newer one. */
    private serial;
    private save;
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
export declare function run(client: RunPort, key: string, req: ClaimRequest, fn: (claim: Claim) => Promise<ResponseInit | StoredResponse> | ResponseInit | StoredResponse, opts?: RunOptions): Promise<RunResult>;
