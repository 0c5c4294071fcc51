import type { IncomingMessage, ServerResponse } from "node:http";
import type { Client } from "./client.js";
import { type Answer } from "./rules.js";
import { StoredResponse, type ResponseInit } from "./response.js";
import { Claim } from "./run.js";
import type { ResumeCall } from "./types.js";
/** The body `type` of a completer call. */
export declare const resumeEventType = "key.resume";
/** The Standard Webhooks tolerance: a call whose timestamp is further than this from now is refused. */
export declare const signatureToleranceSeconds = 300;
export type { ResumeCall } from "./types.js";
declare const answerMark: unique symbol;
/**
 * An answer of a resume function other than "completed" (which is a
 * response): {@link ResumeAnswer.notDone}, {@link ResumeAnswer.unknown},
 * {@link ResumeAnswer.review}.
 */
export declare class ResumeAnswer {
    readonly outcome: "not_done" | "unknown" | "review";
    /** With `unknown`: when to ask again, whole seconds (undefined: idem's backoff). */
    readonly retryAfterSeconds?: number | undefined;
    /** With `review`: what the person should look at. */
    readonly note?: string | undefined;
    readonly [answerMark] = true;
    private constructor();
    /** Nothing happened (no external effect took place): idem releases the key and the client's next retry runs it afresh. */
    static notDone(): ResumeAnswer;
    /** The outcome is not known yet (the PSP is down, say): idem keeps the key held and asks again, after retryAfterSeconds if given. */
    static unknown(opts?: {
        retryAfterSeconds?: number;
    }): ResumeAnswer;
    /** A person must decide (note says what to check): idem marks the key for review. */
    static review(note: string): ResumeAnswer;
    /** The protocol's answer object. @internal */
    toWire(): Record<string, unknown>;
}
/**
 * What a resume function returns: a response (status, headers, body) when
 * the work is done — idem completes the key with it — or a
 * {@link ResumeAnswer}. Throwing {@link NoSideEffect} is `not_done`, as it
 * releases the key in `run`; any other exception is `unknown`, never
 * `not_done` or `completed`.
 */
export type ResumeResult = ResponseInit | StoredResponse | ResumeAnswer;
/**
 * The application's resume function: the same function `run` runs, given a
 * {@link Claim} under idem's fencing token whose `recoveryPoint` /
 * `recoveryData` are the last checkpoint's, so that it skips the steps
 * already done; `call` holds the rest of the completer's call.
 */
export type ResumeFunction = (claim: Claim, call: ResumeCall) => Promise<ResumeResult> | ResumeResult;
/** Options of {@link ResumeHandler}, {@link expressResumeHandler} and {@link fetchResumeHandler}. */
export interface ResumeOptions {
    /** The idem client the claim's checkpoints go through. */
    client: Client;
    /** The endpoint's signing secret (`whsec_<base64>`), or several while rotating one: a call signed with any verifies. */
    secret: string | readonly string[];
    resume: ResumeFunction;
    /** The largest call body read (default 8 MiB); larger: 413 payload_too_large. */
    maxBodyBytes?: number;
    /** Receives the resume function's exceptions (answered `unknown`) and bad answers (never a secret or a body); default console.error. */
    log?: (message: string, err: unknown) => void;
    /** The clock the timestamp is checked against, ms since the epoch (tests). */
    now?: () => number;
}
/** What the resume handler needs of one HTTP request, whatever the framework. */
export interface ResumeRequest {
    method: string;
    /** A request header's value (fields of one name joined), undefined when absent. */
    header(name: string): string | undefined;
    /** Reads the whole body within limit; rejects with FrontDoorError payload_too_large or invalid_request. */
    body(limit: number): Promise<Uint8Array>;
    /**
     * Aborts when the completer's call goes away. The handler does not pass
     * it on: the resume function runs until the completer's lease on the key
     * ends (the call's `leaseExpiresAt`), as in the Go and Python SDKs, so a
     * hang-up never cuts its work between an external call and its
     * checkpoint.
     */
    signal?: AbortSignal;
}
/**
 * Verifies a Standard Webhooks signature: one of the space-separated
 * `v1,<base64>` values of `signature` must be the HMAC-SHA256, keyed by one
 * of the secrets, of `id.timestamp.body` (compared in constant time), and
 * `timestamp` (unix seconds) within {@link signatureToleranceSeconds} of
 * nowMs. Returns why it refuses, or undefined when it verifies.
 */
export declare function verifySignature(secrets: string | readonly string[], id: string | undefined, timestamp: string | undefined, signature: string | undefined, body: Uint8Array, nowMs?: number): string | undefined;
/**
 * Decodes a completer call's body strictly: one I-JSON object of type
 * key.resume, every member the protocol names present with its type (a
 * valid key, positive safe integers, RFC 3339 times). Members it does not
 * name are ignored, as Standard Webhooks receivers do, so that a newer idem
 * that adds one does not turn every resume into "unknown". Throws
 * FrontDoorError invalid_request.
 */
export declare function decodeResumeCall(webhookId: string, body: Uint8Array): ResumeCall;
/** The most webhook-ids a {@link ResumeHandler} remembers to refuse a replayed call; past it the oldest are forgotten first. */
export declare const maxSeenResumeIds = 4096;
/**
 * The resume endpoint, framework-free: {@link expressResumeHandler} and
 * {@link fetchResumeHandler} mount it. A call whose signature does not
 * verify, or is older or newer than five minutes, or whose webhook-id the
 * handler already verified (a replay; the last {@link maxSeenResumeIds}
 * ids are remembered for ten minutes), is 401 unauthenticated
 * (problem+json) and the resume function does not run; a body that is not
 * a valid call is 400 invalid_request. A verified call runs the resume
 * function with a {@link Claim} under the call's fencing token (its
 * checkpoints renew idem's lease and move the recovery point on; no lease
 * keeper runs: the completer holds the key until `call.leaseExpiresAt`),
 * and answers 200 with the outcome. `claim.signal` aborts at
 * `call.leaseExpiresAt`, not when idem hangs up: the function runs until
 * the completer's lease ends even after a timed-out call, so work that
 * made its external call still reaches its checkpoint. The outcomes:
 *
 * - a response → `completed` with it (a body that is not UTF-8 as base64);
 * - {@link ResumeAnswer.notDone} or a thrown {@link NoSideEffect} → `not_done`;
 * - {@link ResumeAnswer.unknown} → `unknown` (with `retry_after_seconds`);
 * - {@link ResumeAnswer.review} → `review` with the note;
 * - any other exception, or a value that is none of these → `unknown`
 *   (logged): the function may have done part of the work, so it is never
 *   reported as `not_done` or `completed`.
 */
export declare class ResumeHandler {
    private readonly o;
    private readonly seen;
    constructor(opts: ResumeOptions);
    /** Serves one call of the completer. */
    handle(req: ResumeRequest): Promise<Answer>;
    /** Runs the resume function for a verified call and maps what it did to the protocol's answer. */
    private run;
}
type Next = (err?: unknown) => void;
/**
 * The resume endpoint as an Express handler (see {@link ResumeHandler}):
 *
 *     app.post("/idem/resume", expressResumeHandler({ client, secret: process.env.IDEM_RESUME_SECRET!, resume }));
 *
 * It reads the raw body itself: register it before body parsers (or have
 * them keep `req.rawBody`), and before `expressMiddleware` when that is
 * `app.use`d (the completer's call carries no Idempotency-Key).
 */
export declare function expressResumeHandler(opts: ResumeOptions): (req: IncomingMessage, res: ServerResponse, next: Next) => void;
/**
 * The resume endpoint as a fetch-style handler (Hono, Next.js route
 * handlers; see {@link ResumeHandler}):
 *
 *     const resumeEndpoint = fetchResumeHandler({ client, secret, resume });
 *     app.post("/idem/resume", (c) => resumeEndpoint(c.req.raw));   // Hono
 */
export declare function fetchResumeHandler(opts: ResumeOptions): (req: Request) => Promise<Response>;
