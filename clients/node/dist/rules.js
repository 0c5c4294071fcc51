// The front-door rules (docs/frontdoor.md, testvectors/frontdoor/) for the Node
// middleware: Idempotency-Key parsing, method requirements, key scope,
// operation and fingerprint document, store policy, stored headers and
// problem bodies, the Prefer: wait=N preference (RFC 7240). Rules only: the
// protocol around a handler is frontdoor.ts, and the client core takes its
// two header helpers from here, not from the middleware.
import { createHash } from "node:crypto";
import { StoredResponse } from "./response.js";
import { headerRetryBudget } from "./retry.js";
/** The request header of the key, the replay marker and the request id. */
export const headerKey = "Idempotency-Key";
export const headerReplayed = "Idempotent-Replayed";
export const headerRequestId = "X-Request-Id";
/** Answers a request whose `Prefer: wait=N` idem honoured: `wait=<seconds applied>`. */
export const headerPreferenceApplied = "Preference-Applied";
/** The longest operation label idem accepts; longer labels are cut at a character boundary. */
export const maxOperationBytes = 128;
/** Status, title and retryability of every front-door problem. */
export const problems = {
    idempotency_key_missing: { status: 400, title: "Idempotency key missing", retryable: false },
    invalid_key: { status: 400, title: "Invalid idempotency key", retryable: false },
    invalid_request: { status: 400, title: "Invalid request", retryable: false },
    payload_too_large: { status: 413, title: "Payload too large", retryable: false },
    request_in_flight: { status: 409, title: "Request in flight", retryable: true },
    fingerprint_mismatch: { status: 422, title: "Idempotency key reused with another request", retryable: false },
    store_unavailable: { status: 503, title: "Idempotency store unavailable", retryable: true },
    response_not_replayable: { status: 409, title: "Response not replayable", retryable: false },
    storage_quota_exceeded: { status: 507, title: "Storage quota exceeded", retryable: false },
    tenant_unknown: { status: 403, title: "Tenant unknown", retryable: false },
    outcome_review: { status: 409, title: "Outcome under review", retryable: false },
    retry_budget_exhausted: { status: 429, title: "Retry budget exhausted", retryable: true },
    unauthenticated: { status: 401, title: "Unauthenticated", retryable: false },
    method_not_allowed: { status: 405, title: "Method not allowed", retryable: false },
};
/**
 * The detail of tenant_unknown, the same in every front door: idem refused
 * the claim because the middleware's own tenant (its token's) does not
 * exist or is disabled. Not retryable, unlike store_unavailable: the store
 * is up and refused, and no retry succeeds until an operator enables the
 * tenant.
 */
export const tenantUnknownDetail = "the idempotency service refused this service's tenant (it does not exist or is disabled): the request was not processed; it cannot succeed until an operator enables the tenant";
/**
 * The detail of the 409 request_in_flight answered for a key idem's
 * completer holds (outcome_unknown, docs/frontdoor.md rule 8), the same in
 * every front door: the caller's retry with the same key is right, the key
 * is being finished.
 */
export const outcomeUnknownDetail = "the first request with this idempotency key stopped before it answered, and the idempotency service is finding out whether it took effect; retry after Retry-After with the same key";
/**
 * The detail of outcome_review (rule 8), the same in every front door:
 * idem's completer gave up on the key, and a retry waits on a person, not
 * on time.
 */
export const outcomeReviewDetail = "the first request with this idempotency key stopped before it answered, and whether it took effect is unknown: a person must resolve the key (complete or release it) before a retry with it can succeed; this request was not processed";
/**
 * The answer to a claim idem refused because its completer holds the key
 * (rule 8), undefined for any other code: outcome_unknown is 409
 * request_in_flight with idem's Retry-After (the key is being finished;
 * the caller's retry is right), outcome_review 409 outcome_review, not
 * retryable (a person must resolve the key). Neither is a store failure.
 */
export function held(code, retryAfterMs = 0) {
    if (code === "outcome_unknown")
        return new FrontDoorError("request_in_flight", outcomeUnknownDetail, retryAfterMs);
    if (code === "outcome_review")
        return new FrontDoorError("outcome_review", outcomeReviewDetail);
    return undefined;
}
/**
 * The detail of storage_quota_exceeded, the same in every front door: idem
 * refused the claim of a new key because the tenant stores its
 * storage_quota_bytes or more. Not retryable, unlike store_unavailable: the
 * store is up, and only purged records or a higher quota free it.
 */
export const storageQuotaDetail = "the tenant's storage quota is used up: the request was not processed and nothing was stored; it cannot succeed until the tenant's stored records are purged or its storage quota is raised";
/**
 * The detail of response_not_replayable, the same in every front door and
 * for either reason a record is not replayable (a response too large to
 * store, or a status idem cannot store): it names both, so it never says
 * "too large" of an answer whose status was the reason.
 */
export const notReplayableDetail = "the request was completed, but its response could not be stored (too large, or a status outside 100-599) and cannot be replayed";
/**
 * The detail of fingerprint_mismatch, the same in every front door: it names
 * what the fingerprint covers, so a caller can find what changed.
 */
export const mismatchDetail = "the idempotency key was first used with a different request (method, route, query or body)";
/**
 * The detail of the 400 invalid_request for a request body that ended before
 * its Content-Length, or failed to read: the caller went away part way, or
 * the body was cut on the way. Nothing is claimed: claimed, the key would
 * hold the fingerprint of the bytes that happened to arrive and the answer of
 * a handler run on them, and the caller's real retry would get 422.
 */
export const cutBodyDetail = "the request body ended before its Content-Length";
/**
 * The header stored, in place of a body, on a record whose response was sent
 * but could not be kept (too large, or a status idem cannot store): a replay
 * of it answers 409 response_not_replayable instead of running the handler
 * again. Its value says why, for operators ("response of N bytes not
 * stored", "response of status N not stored (outside 100-599)").
 */
export const headerNotReplayable = "Idem-Not-Replayable";
/** A refusal of the front door; {@link problemResponse} turns it into an RFC 9457 answer. */
/**
 * The response stored in place of one too large to keep: its status, no
 * body, marked (its replay answers 409 response_not_replayable); for one
 * whose status idem cannot store, {@link unstorableStatus} and the status sent.
 */
export function notReplayable(status, size) {
    if (!storableStatus(status)) {
        return new StoredResponse(unstorableStatus, { [headerNotReplayable]: `response of status ${status} not stored (outside 100-599)` });
    }
    return new StoredResponse(status, { [headerNotReplayable]: `response of ${size} bytes not stored` });
}
export class FrontDoorError extends Error {
    code;
    detail;
    retryAfterMs;
    fields;
    constructor(code, detail, 
    /** Retry-After in milliseconds for the retryable codes (0 → 1 s). */
    retryAfterMs = 0, fields = []) {
        super(`frontdoor: ${code}: ${detail}`);
        this.code = code;
        this.detail = detail;
        this.retryAfterMs = retryAfterMs;
        this.fields = fields;
        this.name = "FrontDoorError";
    }
    /** The tenant's fleet retry budget is spent: a retryable refusal carries `Idem-Retry-Budget: exhausted` (rule 9). */
    budgetSpent = false;
}
const keyMax = 255;
function invalidKey(detail) {
    return new FrontDoorError("invalid_key", detail);
}
function checkRecordKey(key) {
    if (key === "")
        return "the key is empty";
    if (key.length > keyMax)
        return `the key is ${key.length} bytes long; at most ${keyMax} are allowed`;
    for (let i = 0; i < key.length; i++) {
        const c = key.charCodeAt(i);
        if (c < 0x21 || c > 0x7e)
            return `byte ${i} of the key is outside printable ASCII 0x21-0x7E`;
    }
    return null;
}
/**
 * Parses the Idempotency-Key field values of a request (one entry per
 * field line) into the key: null when there is no field; a
 * FrontDoorError(invalid_key) for two fields, an empty value, a malformed
 * RFC 8941 sf-string, a list, or a key that is not 1–255 bytes of 0x21–0x7E.
 * `"k"` and `k` are the same key.
 */
export function parseKey(values) {
    if (values.length === 0)
        return null;
    if (values.length > 1)
        throw invalidKey(`the request carries ${values.length} ${headerKey} fields; send exactly one`);
    const v = values[0].replace(/^[ \t]+|[ \t]+$/g, "");
    if (v === "")
        throw invalidKey(`the ${headerKey} field is empty`);
    let key = "";
    if (v[0] === '"') {
        let closed = false;
        for (let i = 1; i < v.length; i++) {
            const c = v.charCodeAt(i);
            if (c === 0x5c) {
                i++;
                if (i === v.length || (v[i] !== '"' && v[i] !== "\\"))
                    throw invalidKey(`the quoted ${headerKey} has a backslash that escapes neither '"' nor '\\'`);
                key += v[i];
            }
            else if (c === 0x22) {
                if (i !== v.length - 1)
                    throw invalidKey(`the quoted ${headerKey} has characters after its closing quote`);
                closed = true;
            }
            else if (c < 0x20 || c > 0x7e) {
                throw invalidKey(`byte ${i} of the quoted ${headerKey} is outside 0x20-0x7E`);
            }
            else {
                key += v[i];
            }
        }
        if (!closed)
            throw invalidKey(`the quoted ${headerKey} has no closing quote`);
    }
    else {
        for (let i = 0; i < v.length; i++) {
            const c = v.charCodeAt(i);
            if (c === 0x2c)
                throw invalidKey(`the ${headerKey} field holds a list (a comma); send one key`);
            if (c === 0x22)
                throw invalidKey(`byte ${i} of the ${headerKey} field is a stray quote; quote the whole key or none of it`);
            if (c < 0x21 || c > 0x7e)
                throw invalidKey(`byte ${i} of the ${headerKey} field is outside printable ASCII 0x21-0x7E`);
        }
        key = v;
    }
    const bad = checkRecordKey(key);
    if (bad)
        throw invalidKey(bad);
    return key;
}
const int64Max = 9223372036854775807n;
/**
 * N of the first `wait=N` preference in the Prefer header fields (RFC 7240
 * §4.3), or -1. A preference is a hint: a malformed one is ignored, never
 * refused. The same parse as the Go front doors (the prefer_wait vectors);
 * the middleware caps N by its own limits.
 */
export function preferWait(fields) {
    for (const f of fields) {
        for (const pref of f.split(",")) {
            const semi = pref.indexOf(";");
            const p = semi < 0 ? pref : pref.slice(0, semi);
            const eq = p.indexOf("=");
            if (eq < 0 || p.slice(0, eq).trim().toLowerCase() !== "wait")
                continue;
            const v = p.slice(eq + 1).trim().replace(/^"+|"+$/g, "");
            if (!/^[+-]?[0-9]+$/.test(v))
                return -1;
            const n = BigInt(v);
            return n < 0n || n > int64Max ? -1 : Number(n);
        }
    }
    return -1;
}
/**
 * scope with "%" written "%25" and ":" written "%3A", so that the first ":" of a scoped key ends the scope
 * (the scope "acct" with the key "b:k1" and the scope "acct:b" with the key "k1" must not be one record key).
 */
export function escapeScope(scope) {
    return scope.replace(/%/g, "%25").replace(/:/g, "%3A");
}
/**
 * The record key of key within scope: key itself when scope is empty, else escapeScope(scope) + ":" + key (still a valid key).
 * An unscoped key must not contain ":": every record key with one is a scoped key, and an unscoped "alice:sq" would be alice's "sq".
 */
export function scopedKey(scope, key) {
    if (!scope) {
        const i = key.indexOf(":");
        if (i >= 0) {
            throw invalidKey(`byte ${i} of the unscoped key is ':', which only a scoped record key (scope:key) may hold: ` +
                "an unscoped key with ':' could be another caller's scoped key; use a key without ':' (a UUID, say)");
        }
        return key;
    }
    const k = escapeScope(scope) + ":" + key;
    const bad = checkRecordKey(k);
    if (bad)
        throw invalidKey(`the key scoped to the caller is invalid: ${bad}`);
    return k;
}
const safeMethods = new Set(["GET", "HEAD", "OPTIONS", "TRACE"]);
/** The requirement of method. Safe methods always pass. */
export function requirement(method, rules = {}) {
    const m = method.toUpperCase();
    if (safeMethods.has(m))
        return "pass";
    const req = rules.required ?? ["POST", "PATCH"];
    if (req.includes(m))
        return "required";
    if (rules.optional === undefined || rules.optional.includes(m))
        return "optional";
    return "pass";
}
/** The operation label: METHOD + " " + route (the route pattern when known, else the path), cut at 128 bytes on a character boundary. */
export function operation(method, route) {
    const op = method.toUpperCase() + " " + route;
    const bytes = Buffer.from(op, "utf8");
    if (bytes.length <= maxOperationBytes)
        return op;
    let cut = maxOperationBytes;
    while (cut > 0 && (bytes[cut] & 0xc0) === 0x80)
        cut--;
    return bytes.subarray(0, cut).toString("utf8");
}
/**
 * Reports whether s may stand in an operation label as it is: no control
 * character (C0, DEL, C1) and no lone surrogate, the rule of idem's
 * ValidateOperation but for the length, which {@link operation} cuts.
 */
export function validLabelText(s) {
    for (let i = 0; i < s.length; i++) {
        const c = s.charCodeAt(i);
        if (c < 0x20 || (c >= 0x7f && c <= 0x9f))
            return false;
        if (c >= 0xd800 && c <= 0xdbff) {
            const d = s.charCodeAt(i + 1);
            if (!(d >= 0xdc00 && d <= 0xdfff))
                return false;
            i++;
        }
        else if (c >= 0xdc00 && c <= 0xdfff)
            return false;
    }
    return true;
}
/** The bytes of a raw path (one character per byte, as on the request line; UTF-8 when it holds more). */
function rawBytes(rawPath) {
    return /[^\u0000-\u00ff]/.test(rawPath) ? Buffer.from(rawPath, "utf8") : Buffer.from(rawPath, "latin1");
}
/**
 * A raw path with every byte outside printable ASCII 0x21-0x7E written as
 * %XX in upper-case hex and every other byte, '%' included, as it is.
 */
export function escapeLabel(rawPath) {
    let out = "";
    for (const b of rawBytes(rawPath)) {
        out += b >= 0x21 && b <= 0x7e ? String.fromCharCode(b) : "%" + b.toString(16).toUpperCase().padStart(2, "0");
    }
    return out;
}
const hexDigit = (b) => b === undefined ? -1 : b >= 0x30 && b <= 0x39 ? b - 0x30 : b >= 0x41 && b <= 0x46 ? b - 0x37 : b >= 0x61 && b <= 0x66 ? b - 0x57 : -1;
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
export function pathRoute(path, rawPath) {
    const raw = rawBytes(rawPath);
    const decoded = [];
    for (let i = 0; i < raw.length; i++) {
        const hi = raw[i] === 0x25 ? hexDigit(raw[i + 1]) : -1;
        const lo = hi >= 0 ? hexDigit(raw[i + 2]) : -1;
        if (lo >= 0) {
            decoded.push(hi * 16 + lo);
            i += 2;
        }
        else
            decoded.push(raw[i]);
    }
    let text;
    try {
        text = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true }).decode(Uint8Array.from(decoded));
    }
    catch {
        return escapeLabel(rawPath);
    }
    return validLabelText(text) && validLabelText(path) ? path : escapeLabel(rawPath);
}
const tokenRe = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;
/** Reports whether a Content-Type names a JSON body: application/json or any * /*+json, parameters ignored, a malformed media type not. */
export function isJSON(contentType) {
    if (!contentType)
        return false;
    const semi = contentType.indexOf(";");
    const mt = (semi < 0 ? contentType : contentType.slice(0, semi)).trim().toLowerCase();
    const slash = mt.indexOf("/");
    if (slash <= 0 || !tokenRe.test(mt.slice(0, slash)) || !tokenRe.test(mt.slice(slash + 1)))
        return false;
    // Parameters: ; name=value (token or quoted-string); trailing ';' allowed.
    let rest = semi < 0 ? "" : contentType.slice(semi);
    const param = /^\s*;\s*([!#$%&'*+.^_`|~0-9A-Za-z-]+)\s*=\s*(?:[!#$%&'*+.^_`|~0-9A-Za-z-]+|"(?:[^"\\]|\\.)*")/;
    const seen = new Set();
    while (rest.trim() !== "") {
        if (rest.trim() === ";")
            break;
        const m = param.exec(rest);
        if (!m)
            return false;
        const name = m[1].toLowerCase();
        if (seen.has(name))
            return false;
        seen.add(name);
        rest = rest.slice(m[0].length);
    }
    const sub = mt.slice(slash + 1);
    return mt === "application/json" || sub.endsWith("+json");
}
/**
 * The path and raw query of a request-target as it arrived (Node.js's
 * `req.url`): escapes kept as sent, nothing escaped that came raw, as the Go
 * and Python front doors read it (testvectors/frontdoor/targets.json). WHATWG
 * URL parsing (`new URL(...)`, a fetch `Request.url`) would escape ' " < >
 * in a query and more in a path, and the same request would have another
 * fingerprint than there. An absolute-form target loses its scheme and
 * authority.
 */
export function splitTarget(target) {
    let t = target;
    if (!t.startsWith("/")) {
        const i = t.indexOf("://");
        if (i >= 0) {
            const rest = t.slice(i + 3);
            const j = rest.search(/[/?]/);
            t = j < 0 ? "/" : rest.slice(j);
        }
    }
    const q = t.indexOf("?");
    const path = q < 0 ? t : t.slice(0, q);
    return { path: path || "/", query: q < 0 ? "" : t.slice(q + 1) };
}
function invalidRequest(what, at) {
    return new FrontDoorError("invalid_request", `the JSON body is not I-JSON: ${what} at byte ${at}`, 0, [{ field: "body", message: what }]);
}
/**
 * Checks that text is one I-JSON value (RFC 7493): well-formed, no lone
 * surrogate escapes, no duplicate member names, every number inside the
 * double range. JSON.parse accepts the last three silently, and two
 * parsers that repair differently would fingerprint one body two ways.
 */
export function checkIJSON(text) {
    let i = 0;
    const n = text.length;
    const ws = () => {
        while (i < n) {
            const c = text[i];
            if (c === " " || c === "\t" || c === "\n" || c === "\r")
                i++;
            else
                break;
        }
    };
    const hex4 = () => {
        const h = text.slice(i, i + 4);
        if (!/^[0-9A-Fa-f]{4}$/.test(h))
            throw invalidRequest("bad \\u escape", i);
        i += 4;
        return parseInt(h, 16);
    };
    const str = () => {
        i++;
        let out = "";
        while (i < n) {
            const c = text.charCodeAt(i);
            if (c === 0x22) {
                i++;
                return out;
            }
            if (c < 0x20)
                throw invalidRequest("control character in a string", i);
            if (c === 0x5c) {
                const e = text[i + 1];
                i += 2;
                switch (e) {
                    case '"':
                    case "\\":
                    case "/":
                        out += e;
                        break;
                    case "b":
                        out += "\b";
                        break;
                    case "f":
                        out += "\f";
                        break;
                    case "n":
                        out += "\n";
                        break;
                    case "r":
                        out += "\r";
                        break;
                    case "t":
                        out += "\t";
                        break;
                    case "u": {
                        const r = hex4();
                        if (r >= 0xd800 && r <= 0xdbff) {
                            if (text[i] !== "\\" || text[i + 1] !== "u")
                                throw invalidRequest("lone surrogate", i);
                            i += 2;
                            const lo = hex4();
                            if (lo < 0xdc00 || lo > 0xdfff)
                                throw invalidRequest("lone surrogate", i);
                            out += String.fromCharCode(r, lo);
                        }
                        else if (r >= 0xdc00 && r <= 0xdfff) {
                            throw invalidRequest("lone surrogate", i);
                        }
                        else {
                            out += String.fromCharCode(r);
                        }
                        break;
                    }
                    default:
                        throw invalidRequest(e === undefined ? "unexpected end" : "bad escape", i);
                }
                continue;
            }
            out += text[i];
            i++;
        }
        throw invalidRequest("unterminated string", i);
    };
    const num = () => {
        const m = /^-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?/.exec(text.slice(i, i + 1100));
        if (!m)
            throw invalidRequest("malformed number", i);
        const after = text[i + m[0].length];
        if (after !== undefined && /[0-9.eE+-]/.test(after))
            throw invalidRequest("malformed number", i);
        if (!Number.isFinite(Number(m[0])))
            throw invalidRequest("number outside the IEEE 754 double range", i);
        i += m[0].length;
    };
    // items reads the members of an object or the elements of an array (text[i]
    // is the opening bracket): item reads one, separated by commas, up to close.
    const items = (close, item) => {
        i++;
        ws();
        if (text[i] === close) {
            i++;
            return;
        }
        for (;;) {
            ws();
            item();
            ws();
            if (text[i] === ",") {
                i++;
                continue;
            }
            if (text[i] === close) {
                i++;
                return;
            }
            throw invalidRequest(`expected ',' or '${close}'`, i);
        }
    };
    const value = (depth) => {
        if (depth > 1000)
            throw invalidRequest("nesting too deep", i);
        if (i >= n)
            throw invalidRequest("unexpected end", i);
        const c = text[i];
        if (c === "{") {
            const seen = new Set();
            items("}", () => {
                if (text[i] !== '"')
                    throw invalidRequest("expected a member name", i);
                const name = str();
                if (seen.has(name))
                    throw invalidRequest(`duplicate member name ${JSON.stringify(name)}`, i);
                seen.add(name);
                ws();
                if (text[i] !== ":")
                    throw invalidRequest("expected ':'", i);
                i++;
                ws();
                value(depth + 1);
            });
            return;
        }
        if (c === "[") {
            items("]", () => value(depth + 1));
            return;
        }
        if (c === '"') {
            str();
            return;
        }
        if (c === "-" || (c >= "0" && c <= "9")) {
            num();
            return;
        }
        for (const lit of ["true", "false", "null"]) {
            if (text.startsWith(lit, i)) {
                i += lit.length;
                return;
            }
        }
        throw invalidRequest("unexpected character", i);
    };
    ws();
    value(0);
    ws();
    if (i !== n)
        throw invalidRequest("data after the JSON value", i);
}
const strictUtf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });
export function parsePointer(p) {
    if (p === "" || p[0] !== "/")
        throw new TypeError(`JSON pointer ${JSON.stringify(p)} must start with '/'`);
    return p.slice(1).split("/").map((t) => {
        if (/~(?![01])/.test(t))
            throw new TypeError(`JSON pointer ${JSON.stringify(p)} has a '~' not followed by 0 or 1`);
        return t.replaceAll("~1", "/").replaceAll("~0", "~");
    });
}
function removePointer(v, toks) {
    if (toks.length === 0)
        return v;
    const [head, ...rest] = toks;
    if (Array.isArray(v)) {
        if (!/^(?:0|[1-9]\d*)$/.test(head))
            return v;
        const idx = Number(head);
        if (idx >= v.length)
            return v;
        if (rest.length === 0)
            v.splice(idx, 1);
        else
            v[idx] = removePointer(v[idx], rest);
    }
    else if (v && typeof v === "object") {
        const o = v;
        if (!Object.hasOwn(o, head))
            return v;
        if (rest.length === 0)
            delete o[head];
        else
            o[head] = removePointer(o[head], rest);
    }
    return v;
}
/**
 * The fingerprint document of a request: {"path", "query", "body": <JSON value>}
 * for a non-empty JSON body, else {"path", "query", "body_sha256": <hex>}, with the
 * rules applied. Sent as the claim's `request`, the server fingerprints its
 * JCS form. A JSON body that is not I-JSON throws FrontDoorError(invalid_request).
 */
export function fingerprintDocument(p, rules = {}) {
    const doc = { path: p.path, query: p.query };
    if (p.body.length > 0 && isJSON(p.contentType)) {
        let text;
        try {
            text = strictUtf8.decode(p.body);
        }
        catch {
            throw new FrontDoorError("invalid_request", "the JSON body is not valid UTF-8", 0, [{ field: "body", message: "not valid UTF-8" }]);
        }
        checkIJSON(text);
        let v = JSON.parse(text, (_k, x) => (Object.is(x, -0) ? 0 : x)); // JCS writes -0 as 0
        for (const ptr of rules.exclude ?? [])
            v = removePointer(v, parsePointer(ptr));
        doc.body = v;
    }
    else {
        doc.body_sha256 = createHash("sha256").update(p.body).digest("hex");
    }
    if (rules.headers && rules.headers.length > 0) {
        const hs = {};
        for (const name of rules.headers) {
            const vals = p.header?.(name) ?? [];
            if (vals.length > 0)
                hs[name.toLowerCase()] = vals.join(", ");
        }
        doc.headers = hs;
    }
    return doc;
}
/** Whether an answer of status is stored (and replayed) or the key released: all are stored unless store5xx is false. */
export function storeStatus(status, store5xx = true) {
    return status < 500 || store5xx;
}
/**
 * Whether idem can store an answer of status: its complete takes 100–599,
 * while Node.js sends any status from 100 to 999. The handler of such an
 * answer has run: it is sent as it is and stored as not replayable (status
 * {@link unstorableStatus}, {@link headerNotReplayable}), as one too large to
 * store, so that a retry is 409 response_not_replayable instead of a second
 * run; {@link storeStatus} does not apply to it.
 */
export function storableStatus(status) {
    return Number.isInteger(status) && status >= 100 && status <= 599;
}
/** The status recorded for an answer whose own status idem cannot store (see {@link storableStatus}). */
export const unstorableStatus = 502;
/** The response headers stored and replayed by default; Set-Cookie and other per-caller headers never. */
export const defaultStoredHeaders = Object.freeze([
    "Content-Type", "Content-Language", "Content-Disposition", "Content-Encoding",
    "Location", "ETag", "Last-Modified", "Cache-Control",
    "Access-Control-Allow-Origin", "Access-Control-Allow-Credentials", "Access-Control-Expose-Headers", "Vary",
]);
/**
 * The headers to store: those named in allow (default
 * {@link defaultStoredHeaders}), looked up case-insensitively and kept
 * under the name as allow spells it, several values joined with ", ".
 */
export function storedHeaders(get, allow = defaultStoredHeaders) {
    const out = {};
    for (const name of allow) {
        if (name.toLowerCase() === "set-cookie")
            continue;
        const v = get(name);
        if (v.length > 0)
            out[name] = v.join(", ");
    }
    return out;
}
/** Reports whether a caller's X-Request-Id may be kept: 1–128 characters of [A-Za-z0-9._-]. */
export function validRequestId(id) {
    return !!id && id.length <= 128 && /^[A-Za-z0-9._-]+$/.test(id);
}
/** The RFC 9457 answer of a refusal, with Retry-After for the retryable codes and the request id as instance. */
export function problemResponse(e, requestId) {
    const info = problems[e.code];
    const body = {
        type: "urn:idem:problem:" + e.code,
        title: info.title,
        status: info.status,
        detail: e.detail || info.title,
        code: e.code,
        retryable: info.retryable,
        instance: "urn:idem:request:" + requestId,
    };
    if (e.fields.length > 0)
        body.errors = e.fields;
    const headers = [
        ["Content-Type", "application/problem+json"],
        ["Cache-Control", "no-store"],
        [headerRequestId, requestId],
    ];
    if (info.retryable)
        headers.push(["Retry-After", String(Math.max(1, Math.ceil(e.retryAfterMs / 1000)))]);
    if (info.retryable && e.budgetSpent)
        headers.push([headerRetryBudget, "exhausted"]);
    return { status: info.status, headers, body: new TextEncoder().encode(JSON.stringify(body)) };
}
// -- rule 9: the caller's Idem-Attempt and the fleet retry budget ----------
/** The detail of retry_budget_exhausted, the same in every front door. */
export const retryBudgetDetail = "this request is a retry and the tenant's fleet retry budget is spent: it was not processed and the idempotency key is as it was; " +
    "stop retrying now and report the failure that made you retry (Retry-After says when the budget has room again)";
const sfKey = /^[a-z*][a-z0-9_\-.*]*$/;
const sfToken = /^[A-Za-z*][A-Za-z0-9!#$%&'*+\-.^_`|~:/]*$/;
const sfNumber = /^-?(?:[0-9]{1,15}|[0-9]{1,12}\.[0-9]{1,3})$/;
/**
 * The attempt a caller's Idem-Attempt field lines name: an RFC 9651 Item,
 * an Integer of 1 or more with an optional cause Token parameter. A missing
 * field, or one that is not such an Item (two lines, a list, a decimal,
 * junk), is a first attempt, never a refusal; a cause that is not a Token
 * is none; other parameters are ignored (the reading of the Go and Python
 * front doors and the idem server, proven by the attempts vectors).
 */
export function callerAttempt(fields) {
    const first = { number: 1, cause: undefined };
    if (fields.length !== 1)
        return first;
    const parts = fields[0].replace(/^[ \t]+|[ \t]+$/g, "").split(";");
    if (!/^[0-9]{1,15}$/.test(parts[0]))
        return first;
    const n = Number(parts[0]);
    if (n < 1)
        return first;
    let cause;
    for (const p of parts.slice(1)) {
        const q = p.replace(/^ +/, "");
        const eq = q.indexOf("=");
        const name = eq < 0 ? q : q.slice(0, eq);
        const value = eq < 0 ? undefined : q.slice(eq + 1);
        if (!sfKey.test(name))
            return first;
        if (value !== undefined && !(sfToken.test(value) || sfNumber.test(value) || value === "?0" || value === "?1" ||
            (value.length >= 2 && value.startsWith('"') && value.endsWith('"'))))
            return first;
        if (name === "cause" && n > 1 && value !== undefined && sfToken.test(value))
            cause = value;
    }
    return { number: n, cause };
}
/** The answer to a retry the fleet retry budget refused: 429 retry_budget_exhausted with Retry-After and Idem-Retry-Budget: exhausted. */
export function budgetRefusal(retryAfterMs = 0) {
    const e = new FrontDoorError("retry_budget_exhausted", retryBudgetDetail, retryAfterMs);
    e.budgetSpent = true;
    return e;
}
/** e saying the fleet retry budget is spent when spent and e is retryable: a refusal nobody retries never carries it. */
export function spentBudget(e, spent) {
    if (spent && problems[e.code].retryable)
        e.budgetSpent = true;
    return e;
}
