import type { CallOptions } from "./bounds.js";
import type { ResponseInit } from "./response.js";
import { StoredResponse } from "./response.js";
import { type Answer, type FingerprintRules, type MethodRules } from "./rules.js";
import type { Claim, RunOptions, RunResult } from "./run.js";
import type { ClaimRequest } from "./types.js";
import { type ReplayCache, type ReplayCacheOptions } from "./replaycache.js";
/** What a front door needs of the idem client: its {@link Client.run} and complete ({@link Client} is one). */
export interface FrontDoorPort {
    run(key: string, req: ClaimRequest, fn: (claim: Claim) => Promise<ResponseInit | StoredResponse> | ResponseInit | StoredResponse, opts?: RunOptions): Promise<RunResult>;
    complete(key: string, fencingToken: number, response: ResponseInit | StoredResponse, opts?: CallOptions): Promise<unknown>;
}
/** Configures a front door (the Express middleware and the fetch wrapper). */
export interface FrontDoorOptions {
    /** The idem client the claims go through. */
    client: FrontDoorPort;
    /** Which methods need a key (default POST and PATCH required, other unsafe methods optional). */
    methods?: MethodRules;
    /** Store 5xx answers (default true, Stripe's behaviour); false releases the key on a 5xx so that the retry runs the handler again. */
    storeServerErrors?: boolean;
    /** The response headers stored and replayed (default {@link defaultStoredHeaders}). */
    headers?: readonly string[];
    /** Fingerprint rules: JSON pointers to leave out, request headers that take part. */
    fingerprint?: FingerprintRules;
    /** The lease asked for, in seconds (default the tenant's). */
    leaseSeconds?: number;
    /** The largest response (body plus stored headers) stored for replay (default 1 MiB, the tenant's default max_response_bytes); a larger one is sent but stored without its body, and its replay answers 409 response_not_replayable. */
    maxStoredBytes?: number;
    /** The largest request body read (default 8 MiB, under the idem server's default request limit, as the Go and Python middleware); larger gets 413 payload_too_large. */
    maxBodyBytes?: number;
    /** Retry-After of the 503 sent when idem cannot be reached, in seconds (default 1). */
    unavailableRetryAfterSeconds?: number;
    /** Receives what goes wrong with idem (never a token or a body); default console.error. */
    log?: (message: string, err: unknown) => void;
    /**
     * Caps how long, in seconds, a request with `Prefer: wait=N` is held while
     * another request with its key is in flight (the claim's `wait_seconds` =
     * min(N, maxWaitSeconds)): it then gets that request's replay instead of
     * 409. Undefined (default): no cap of the middleware's own (the tenant's
     * `max_wait_seconds` and the attempt timeout less a second still apply);
     * 0 or less: Prefer is ignored, 409 at once.
     */
    maxWaitSeconds?: number;
    /**
     * The replay cache (docs/frontdoor.md, "The replay cache"): a replay idem
     * answered is kept in memory and a retry of exactly that request is
     * answered from it without a claim, for at most `maxAgeSeconds` (2) and
     * never past the record's replay_until. On by default (4096 entries, 8
     * MiB); `{ off: true }` turns it off. The client must stay with one
     * tenant (a token function that switches tenants needs it off).
     */
    replayCache?: ReplayCacheOptions;
}
/** What a front door needs of one request, whatever the framework. */
export interface FrontRequest {
    method: string;
    /** The route pattern when the framework knows it, else the path. */
    route: string;
    /** The request path as received, without the query. */
    path: string;
    query: string;
    /** The values of a request header, one per field line. */
    header(name: string): string[];
    /**
     * Reads the whole body; rejects with FrontDoorError(payload_too_large) over
     * the limit, FrontDoorError(invalid_request, {@link cutBodyDetail}) for a
     * body cut before its Content-Length (or failing to read).
     */
    body(limit: number): Promise<Uint8Array>;
    /**
     * The caller's key scope (e.g. the account id), if configured: the scope,
     * or a function that gives it, called once the request has a key. A
     * function that throws refuses the request: 400 invalid_key with the
     * error's message as detail, nothing claimed, the handler not run (as
     * client/idemhttp's Options.Scope returning an error).
     */
    scope?: string | undefined | (() => string | undefined);
    /**
     * Whether the front door scopes keys (its scope option is set): then an
     * unscoped request's key may hold no ":" (scopedKey), so that it can never
     * be a scoped caller's record key. A front door that never scopes keeps
     * such keys as they are, as before.
     */
    scoped?: boolean;
}
/** A handler's buffered answer. */
export interface HandlerAnswer {
    status: number;
    /** The header values by name (as the framework spells them). */
    header(name: string): string[];
    body: Uint8Array;
}
/** The outcome of {@link FrontDoor.serve}. */
export type Outcome = 
/** Not protected: run the handler as usual. */
{
    kind: "pass";
}
/** Send this answer (a replay or a refusal); the handler did not run. */
 | {
    kind: "answer";
    answer: Answer;
}
/** The handler ran; send its answer (it was stored unless logged otherwise), with these headers added (Preference-Applied). */
 | {
    kind: "ran";
    headers: [string, string][];
};
/**
 * The framework-independent front door: parses the key, builds the
 * fingerprint document, claims through {@link Client.run} without waiting,
 * runs the handler once on a new claim or takeover, stores its answer and
 * only then lets it be sent, replays completed keys, and maps every refusal
 * to its problem. A handler exception stores nothing (the claim expires
 * into an orphan) and propagates.
 */
export declare class FrontDoor {
    private readonly o;
    /** The replay cache; undefined: off. */
    readonly replayCache: ReplayCache | undefined;
    constructor(opts: FrontDoorOptions);
    /**
     * Serves one request. runHandler runs the handler once with the request
     * body and resolves to its buffered answer (or rejects with its exception).
     */
    serve(req: FrontRequest, runHandler: (body: Uint8Array) => Promise<HandlerAnswer>): Promise<Outcome>;
    /** The wait to ask idem for: the request's Prefer: wait=N within maxWaitSeconds (and a day), 0 without one or when maxWaitSeconds is 0 or less. */
    preferWait(fields: readonly string[]): number;
    /** The response to store for a handler's answer: the whole of it, or without its body (marked) when it is over maxStoredBytes. */
    private stored;
    /** What storing a handler's answer whole takes: its body and stored headers. */
    private size;
    /**
     * Maps a claim that did not let the handler run to its refusal; a
     * retryable one whose idem answer said the fleet retry budget is spent
     * says so too (rule 9).
     */
    private claimRefusal;
    /** The refusal of claimRefusal. */
    private refusal;
    /** The retryable 503 store_unavailable (fail closed), Retry-After the longer of unavailableRetryAfterSeconds and idem's hint. */
    private unavailable;
}
