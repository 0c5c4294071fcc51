import { StoredResponse } from "./response.js";
/** The request header of the key, the replay marker and the request id. */
export declare const headerKey = "Idempotency-Key";
export declare const headerReplayed = "Idempotent-Replayed";
export declare const headerRequestId = "X-Request-Id";
/** Answers a request whose `Prefer: wait=N` idem honoured: `wait=<seconds applied>`. */
export declare const headerPreferenceApplied = "Preference-Applied";
/** The longest operation label idem accepts; longer labels are cut at a character boundary. */
export declare const maxOperationBytes = 128;
/** The codes a front door answers with. */
export type FrontDoorCode = "idempotency_key_missing" | "invalid_key" | "invalid_request" | "payload_too_large" | "request_in_flight" | "fingerprint_mismatch" | "store_unavailable" | "response_not_replayable" | "storage_quota_exceeded" | "tenant_unknown" | "outcome_review" | "retry_budget_exhausted" | "unauthenticated" | "method_not_allowed";
/** Status, title and retryability of every front-door problem. */
export declare const problems: Readonly<Record<FrontDoorCode, {
    status: number;
    title: string;
    retryable: boolean;
}>>;
/**
 * The detail of tenant_unknown, the same in every front door: idem refused
 * the claim because the middleware's own tenant (its token's) does not
 * exist or is disabled. Not retryable, unlike store_unavailable: the store
 * is up and refused, and no retry succeeds until an operator enables the
 * tenant.
 */
export declare const tenantUnknownDetail = "the idempotency service refused this service's tenant (it does not exist or is disabled): the request was not processed; it cannot succeed until an operator enables the tenant";
/**
 * The detail of the 409 request_in_flight answered for a key idem's
 * completer holds (outcome_unknown, docs/frontdoor.md rule 8), the same in
 * every front door: the caller's retry with the same key is right, the key
 * is being finished.
 */
export declare const outcomeUnknownDetail = "the first request with this idempotency key stopped before it answered, and the idempotency service is finding out whether it took effect; retry after Retry-After with the same key";
/**
 * The detail of outcome_review (rule 8), the same in every front door:
 * idem's completer gave up on the key, and a retry waits on a person, not
 * on time.
 */
export declare const outcomeReviewDetail = "the first request with this idempotency key stopped before it answered, and whether it took effect is unknown: a person must resolve the key (complete or release it) before a retry with it can succeed; this request was not processed";
/**
 * The answer to a claim idem refused because its completer holds the key
 * (rule 8), undefined for any other code: outcome_unknown is 409
 * request_in_flight with idem's Retry-After (the key is being finished;
 * the caller's retry is right), outcome_review 409 outcome_review, not
 * retryable (a person must resolve the key). Neither is a store failure.
 */
export declare function held(code: string, retryAfterMs?: number): FrontDoorError | undefined;
/**
 * The detail of storage_quota_exceeded, the same in every front door: idem
 * refused the claim of a new key because the tenant stores its
 * storage_quota_bytes or more. Not retryable, unlike store_unavailable: the
 * store is up, and only purged records or a higher quota free it.
 */
export declare const storageQuotaDetail = "the tenant's storage quota is used up: the request was not processed and nothing was stored; it cannot succeed until the tenant's stored records are purged or its storage quota is raised";
/**
 * The detail of response_not_replayable, the same in every front door and
 * for either reason a record is not replayable (a response too large to
 * store, or a status idem cannot store): it names both, so it never says
 * "too large" of an answer whose status was the reason.
 */
export declare const notReplayableDetail = "the request was completed, but its response could not be stored (too large, or a status outside 100-599) and cannot be replayed";
/**
 * The detail of fingerprint_mismatch, the same in every front door: it names
 * what the fingerprint covers, so a caller can find what changed.
 */
export declare const mismatchDetail = "the idempotency key was first used with a different request (method, route, query or body)";
/**
 * The detail of the 400 invalid_request for a request body that ended before
 * its Content-Length, or failed to read: the caller went away part way, or
 * the body was cut on the way. Nothing is claimed: claimed, the key would
 * hold the fingerprint of the bytes that happened to arrive and the answer of
 * a handler run on them, and the caller's real retry would get 422.
 */
export declare const cutBodyDetail = "the request body ended before its Content-Length";
/**
 * The header stored, in place of a body, on a record whose response was sent
 * but could not be kept (too large, or a status idem cannot store): a replay
 * of it answers 409 response_not_replayable instead of running the handler
 * again. Its value says why, for operators ("response of N bytes not
 * stored", "response of status N not stored (outside 100-599)").
 */
export declare const headerNotReplayable = "Idem-Not-Replayable";
/** A refusal of the front door; {@link problemResponse} turns it into an RFC 9457 answer. */
/**
 * The response stored in place of one too large to keep: its status, no
 * body, marked (its replay answers 409 response_not_replayable); for one
 * whose status idem cannot store, {@link unstorableStatus} and the status sent.
 */
export declare function notReplayable(status: number, size: number): StoredResponse;
export declare class FrontDoorError extends Error {
    readonly code: FrontDoorCode;
    readonly detail: string;
    /** Retry-After in milliseconds for the retryable codes (0 → 1 s). */
    readonly retryAfterMs: number;
    readonly fields: {
        field: string;
        message: string;
    }[];
    constructor(code: FrontDoorCode, detail: string, 
    /** Retry-After in milliseconds for the retryable codes (0 → 1 s). */
    retryAfterMs?: number, fields?: {
        field: string;
        message: string;
    }[]);
    /** The tenant's fleet retry budget is spent: a retryable refusal carries `Idem-Retry-Budget: exhausted` (rule 9). */
    budgetSpent: boolean;
}
/**
 * Parses the Idempotency-Key field values of a request (one entry per
 * field line) into the key: null when there is no field; a
 * FrontDoorError(invalid_key) for two fields, an empty value, a malformed
 * RFC 8941 sf-string, a list, or a key that is not 1–255 bytes of 0x21–0x7E.
 * `"k"` and `k` are the same key.
 */
export declare function parseKey(values: readonly string[]): string | null;
/**
 * N of the first `wait=N` preference in the Prefer header fields (RFC 7240
 * §4.3), or -1. A preference is a hint: a malformed one is ignored, never
 * refused. The same parse as the Go front doors (the prefer_wait vectors);
 * the middleware caps N by its own limits.
 */
export declare function preferWait(fields: readonly string[]): number;
/**
 * scope with "%" written "%25" and ":" written "%3A", so that the first ":" of a scoped key ends the scope
 * (the scope "acct" with the key "b:k1" and the scope "acct:b" with the key "k1" must not be one record key).
 */
export declare function escapeScope(scope: string): string;
/**
 * The record key of key within scope: key itself when scope is empty, else escapeScope(scope) + ":" + key (still a valid key).
 * An unscoped key must not contain ":": every record key with one is a scoped key, and an unscoped "alice:sq" would be alice's "sq".
 */
export declare function scopedKey(scope: string | undefined, key: string): string;
/** What a front door does with a request of a method. */
export type Requirement = "required" | "optional" | "pass";
/** Which methods need a key: by default POST and PATCH required, every other unsafe method optional. */
export interface MethodRules {
    required?: string[];
    optional?: string[];
}
/** The requirement of method. Safe methods always pass. */
export declare function requirement(method: string, rules?: MethodRules): Requirement;
/** The operation label: METHOD + " " + route (the route pattern when known, else the path), cut at 128 bytes on a character boundary. */
export declare function operation(method: string, route: string): string;
/**
 * Reports whether s may stand in an operation label as it is: no control
 * character (C0, DEL, C1) and no lone surrogate, the rule of idem's
 * ValidateOperation but for the length, which {@link operation} cuts.
 */
export declare function validLabelText(s: string): boolean;
/**
 * A raw path with every byte outside printable ASCII 0x21-0x7E written as
 * %XX in upper-case hex and every other byte, '%' included, as it is.
 */
export declare function escapeLabel(rawPath: string): string;
/**
 * The route of a request no route pattern names, for {@link operation}
 * (testvectors/frontdoor/operations.json, the same in every front door):
 * path, the label this front door has always built (WHATWG URL's pathname),
 * as long as the raw path's own decoding (its percent-escapes to bytes, then
 * UTF-8) is valid label text; else the path as it arrived on the request
 * line (rawPath, as {@link splitTarget} reads it), every byte outside
 * printable ASCII escaped. /pay%00 or /pay%FF decode to a control character
 * or bytes that are not UTF-8; the Go and Python front doors, which label
 * the decoded path, take the raw path there too, so all agree. Every path
 * whose decoding is valid label text keeps its label, so a key claimed
 * before an upgrade matches its retry after (one on such a path with a
 * character sent raw, labelled in WHATWG's escaping before, answers 422
 * instead: never a second run).
 */
export declare function pathRoute(path: string, rawPath: string): string;
/** Reports whether a Content-Type names a JSON body: application/json or any * /*+json, parameters ignored, a malformed media type not. */
export declare function isJSON(contentType: string | undefined | null): boolean;
/**
 * The path and raw query of a request-target as it arrived (Node.js's
 * `req.url`): escapes kept as sent, nothing escaped that came raw, as the Go
 * and Python front doors read it (testvectors/frontdoor/targets.json). WHATWG
 * URL parsing (`new URL(...)`, a fetch `Request.url`) would escape ' " < >
 * in a query and more in a path, and the same request would have another
 * fingerprint than there. An absolute-form target loses its scheme and
 * authority.
 */
export declare function splitTarget(target: string): {
    path: string;
    query: string;
};
/** Per-route fingerprint options: JSON pointers removed from a JSON body, request headers that take part. */
export interface FingerprintRules {
    exclude?: string[];
    headers?: string[];
}
/** The parts of a request the fingerprint document is built from. */
export interface RequestParts {
    /** The request path as received, without the query: one key on /orders/7 and /orders/8 is two requests. */
    path: string;
    /** The raw query string without "?", "" when none. */
    query: string;
    contentType?: string | undefined;
    body: Uint8Array;
    /** The values of a request header (one per field line), for rules.headers. */
    header?: (name: string) => string[];
}
/**
 * Checks that text is one I-JSON value (RFC 7493): well-formed, no lone
 * surrogate escapes, no duplicate member names, every number inside the
 * double range. JSON.parse accepts the last three silently, and two
 * parsers that repair differently would fingerprint one body two ways.
 */
export declare function checkIJSON(text: string): void;
export declare function parsePointer(p: string): string[];
/**
 * The fingerprint document of a request: {"path", "query", "body": <JSON value>}
 * for a non-empty JSON body, else {"path", "query", "body_sha256": <hex>}, with the
 * rules applied. Sent as the claim's `request`, the server fingerprints its
 * JCS form. A JSON body that is not I-JSON throws FrontDoorError(invalid_request).
 */
export declare function fingerprintDocument(p: RequestParts, rules?: FingerprintRules): Record<string, unknown>;
/** Whether an answer of status is stored (and replayed) or the key released: all are stored unless store5xx is false. */
export declare function storeStatus(status: number, store5xx?: boolean): boolean;
/**
 * Whether idem can store an answer of status: its complete takes 100–599,
 * while Node.js sends any status from 100 to 999. The handler of such an
 * answer has run: it is sent as it is and stored as not replayable (status
 * {@link unstorableStatus}, {@link headerNotReplayable}), as one too large to
 * store, so that a retry is 409 response_not_replayable instead of a second
 * run; {@link storeStatus} does not apply to it.
 */
export declare function storableStatus(status: number): boolean;
/** The status recorded for an answer whose own status idem cannot store (see {@link storableStatus}). */
export declare const unstorableStatus = 502;
/** The response headers stored and replayed by default; Set-Cookie and other per-caller headers never. */
export declare const defaultStoredHeaders: readonly string[];
/**
 * The headers to store: those named in allow (default
 * {@link defaultStoredHeaders}), looked up case-insensitively and kept
 * under the name as allow spells it, several values joined with ", ".
 */
export declare function storedHeaders(get: (name: string) => string[], allow?: readonly string[]): Record<string, string>;
/** Reports whether a caller's X-Request-Id may be kept: 1–128 characters of [A-Za-z0-9._-]. */
export declare function validRequestId(id: string | null | undefined): boolean;
/** An answer the front door sends: status, header list, body. */
export interface Answer {
    status: number;
    headers: [string, string][];
    body: Uint8Array;
}
/** The RFC 9457 answer of a refusal, with Retry-After for the retryable codes and the request id as instance. */
export declare function problemResponse(e: FrontDoorError, requestId: string): Answer;
/** The detail of retry_budget_exhausted, the same in every front door. */
export declare const retryBudgetDetail: string;
/** What a caller's Idem-Attempt says: the 1-based attempt and, for a retry, the cause it named. */
export interface CallerAttempt {
    number: number;
    cause: string | undefined;
}
/**
 * The attempt a caller's Idem-Attempt field lines name: an RFC 9651 Item,
 * an Integer of 1 or more with an optional cause Token parameter. A missing
 * field, or one that is not such an Item (two lines, a list, a decimal,
 * junk), is a first attempt, never a refusal; a cause that is not a Token
 * is none; other parameters are ignored (the reading of the Go and Python
 * front doors and the idem server, proven by the attempts vectors).
 */
export declare function callerAttempt(fields: readonly string[]): CallerAttempt;
/** The answer to a retry the fleet retry budget refused: 429 retry_budget_exhausted with Retry-After and Idem-Retry-Budget: exhausted. */
export declare function budgetRefusal(retryAfterMs?: number): FrontDoorError;
/** e saying the fleet retry budget is spent when spent and e is retryable: a refusal nobody retries never carries it. */
export declare function spentBudget(e: FrontDoorError, spent: boolean): FrontDoorError;
