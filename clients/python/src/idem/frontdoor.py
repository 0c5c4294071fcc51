"""The front-door rules the idem middleware follow (docs/frontdoor.md; the same
rules as the Go package client/frontdoor, proven by the shared vectors in
testvectors/frontdoor): Idempotency-Key parsing, which requests need a key,
key scope, the operation label and fingerprint document, which answers are
stored and with which headers, the RFC 9457 problem bodies, and the
``Prefer: wait=N`` preference (RFC 7240).

The module decides, it does not store or do I/O; ``idem.asgi`` and
``idem.wsgi`` build on it."""

from __future__ import annotations

import hashlib
import json
import math
import re
import secrets
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from ._keys import key_problem

HEADER_KEY = "Idempotency-Key"
HEADER_REPLAYED = "Idempotent-Replayed"
HEADER_REQUEST_ID = "X-Request-Id"
#: Answers a request whose ``Prefer: wait=N`` idem honoured: "wait=<seconds applied>".
HEADER_PREFERENCE_APPLIED = "Preference-Applied"
MAX_OPERATION_BYTES = 128

KEY_MISSING = "idempotency_key_missing"
INVALID_KEY = "invalid_key"
INVALID_REQUEST = "invalid_request"
REQUEST_IN_FLIGHT = "request_in_flight"
FINGERPRINT_MISMATCH = "fingerprint_mismatch"
STORE_UNAVAILABLE = "store_unavailable"
#: idem refused the claim of a new key: the tenant stores its
#: storage_quota_bytes or more. Not retryable (the store is up; only purged
#: records or a higher quota free it), unlike store_unavailable.
STORAGE_QUOTA_EXCEEDED = "storage_quota_exceeded"
#: The detail of storage_quota_exceeded, the same in every front door.
STORAGE_QUOTA_DETAIL = ("the tenant's storage quota is used up: the request was not processed and nothing was stored; "
                        "it cannot succeed until the tenant's stored records are purged or its storage quota is raised")

#: idem refused the claim because the middleware's own tenant (its token's)
#: does not exist or is disabled. Not retryable: the store is up and refused,
#: and no retry succeeds until an operator enables the tenant.
TENANT_UNKNOWN = "tenant_unknown"
#: The detail of tenant_unknown, the same in every front door.
TENANT_UNKNOWN_DETAIL = ("the idempotency service refused this service's tenant (it does not exist or is disabled): "
                         "the request was not processed; it cannot succeed until an operator enables the tenant")

#: idem's completer holds the key (docs/frontdoor.md rule 8). outcome_unknown
#: (it is finding out what the first request did) is answered as a retryable
#: 409 request_in_flight with idem's Retry-After; outcome_review (it gave up,
#: a person must resolve the key) as 409 outcome_review, not retryable.
OUTCOME_UNKNOWN = "outcome_unknown"
OUTCOME_REVIEW = "outcome_review"
#: The detail of the request_in_flight answered for outcome_unknown, the same in every front door.
OUTCOME_UNKNOWN_DETAIL = ("the first request with this idempotency key stopped before it answered, and the idempotency "
                          "service is finding out whether it took effect; retry after Retry-After with the same key")
#: The detail of outcome_review, the same in every front door.
OUTCOME_REVIEW_DETAIL = ("the first request with this idempotency key stopped before it answered, and whether it took effect "
                         "is unknown: a person must resolve the key (complete or release it) before a retry with it can "
                         "succeed; this request was not processed")

#: The caller's retry refused by the tenant's fleet retry budget (rule 9): retryable later, but the caller should
#: stop retrying the call now.
RETRY_BUDGET_EXHAUSTED = "retry_budget_exhausted"
#: The detail of retry_budget_exhausted, the same in every front door.
RETRY_BUDGET_DETAIL = ("this request is a retry and the tenant's fleet retry budget is spent: it was not processed and the "
                       "idempotency key is as it was; stop retrying now and report the failure that made you retry "
                       "(Retry-After says when the budget has room again)")
#: The request field naming the attempt of a logical call, and the response field saying the fleet retry budget is
#: spent (its value RETRY_BUDGET_SPENT).
HEADER_ATTEMPT = "Idem-Attempt"
HEADER_RETRY_BUDGET = "Idem-Retry-Budget"
RETRY_BUDGET_SPENT = "exhausted"

#: code -> (status, title, retryable)
PROBLEMS: dict[str, tuple[int, str, bool]] = {
    KEY_MISSING: (400, "Idempotency key missing", False),
    INVALID_KEY: (400, "Invalid idempotency key", False),
    INVALID_REQUEST: (400, "Invalid request", False),
    "payload_too_large": (413, "Payload too large", False),
    REQUEST_IN_FLIGHT: (409, "Request in flight", True),
    OUTCOME_REVIEW: (409, "Outcome under review", False),
    FINGERPRINT_MISMATCH: (422, "Idempotency key reused with another request", False),
    RETRY_BUDGET_EXHAUSTED: (429, "Retry budget exhausted", True),
    STORE_UNAVAILABLE: (503, "Idempotency store unavailable", True),
    "response_not_replayable": (409, "Response not replayable", False),
    STORAGE_QUOTA_EXCEEDED: (507, "Storage quota exceeded", False),
    TENANT_UNKNOWN: (403, "Tenant unknown", False),
    # The resume endpoint's own refusals (idem._resume): a call whose webhook
    # signature does not verify, a method other than POST. Titles as the
    # idem server's table (api/problem.go).
    "unauthenticated": (401, "Unauthenticated", False),
    "method_not_allowed": (405, "Method not allowed", False),
}

#: The header stored, in place of a body, on a record whose response was sent
#: but could not be kept (too large, or a status idem cannot store); a replay
#: of such a record answers 409 response_not_replayable instead of running
#: the handler again. Its value says why, for operators ("response of N
#: bytes not stored", "response of status N not stored (outside 100-599)").
HEADER_NOT_REPLAYABLE = "Idem-Not-Replayable"
PAYLOAD_TOO_LARGE = "payload_too_large"
RESPONSE_NOT_REPLAYABLE = "response_not_replayable"
#: The detail of response_not_replayable, the same in every front door and
#: for either reason a record is not replayable: it names both, so it never
#: says "too large" of an answer whose status was the reason.
NOT_REPLAYABLE_DETAIL = ("the request was completed, but its response could not be stored "
                         "(too large, or a status outside 100-599) and cannot be replayed")

#: The detail of fingerprint_mismatch, the same in every front door: it names
#: what the fingerprint covers, so a caller can find what changed.
MISMATCH_DETAIL = "the idempotency key was first used with a different request (method, route, query or body)"

#: The response headers stored with a response unless configured otherwise: those that describe the
#: representation, and the CORS answer headers with Vary (a browser refuses a replay without them);
#: never Set-Cookie.
DEFAULT_STORED_HEADERS = ("Content-Type", "Content-Language", "Content-Disposition", "Content-Encoding",
                          "Location", "ETag", "Last-Modified", "Cache-Control",
                          "Access-Control-Allow-Origin", "Access-Control-Allow-Credentials",
                          "Access-Control-Expose-Headers", "Vary")

DEFAULT_REQUIRED = ("POST", "PATCH")
_SAFE = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})


@dataclass
class FrontDoorError(Exception):
    """A refusal of the front door, answered as a problem."""

    code: str
    detail: str = ""
    retry_after: float = 0.0
    fields: list[dict[str, str]] = field(default_factory=list)
    #: The tenant's fleet retry budget is spent: a retryable refusal carries Idem-Retry-Budget: exhausted (rule 9).
    budget_spent: bool = False

    def __post_init__(self) -> None:
        super().__init__(f"frontdoor: {self.code}: {self.detail}")


def _invalid_key(detail: str) -> FrontDoorError:
    return FrontDoorError(INVALID_KEY, detail)


# -- rule 1: the header ----------------------------------------------------

def validate_record_key(key: str) -> None:
    """Raise invalid_key unless key is 1-255 bytes of 0x21-0x7E."""
    problem = key_problem(key)
    if problem is not None:
        raise _invalid_key(problem)


def parse_key(values: Sequence[str]) -> str | None:
    """Parse the values of every Idempotency-Key field of a request: None
    when there is none; the key of the RFC 8941 sf-string or bare (Stripe)
    form, which are the same key; FrontDoorError invalid_key otherwise."""
    if not values:
        return None
    if len(values) > 1:
        raise _invalid_key(f"the request carries {len(values)} {HEADER_KEY} fields; send exactly one")
    v = values[0].strip(" \t")
    if not v:
        raise _invalid_key(f"the {HEADER_KEY} field is empty")
    if v[0] == '"':
        key = _sf_string(v)
    else:
        for i, ch in enumerate(v.encode("utf-8", "surrogatepass")):
            if ch == 0x2C:
                raise _invalid_key(f"the {HEADER_KEY} field holds a list (a comma); send one key")
            if ch == 0x22:
                raise _invalid_key(f"byte {i} of the {HEADER_KEY} field is a stray quote; quote the whole key or none of it")
            if ch < 0x21 or ch > 0x7E:
                raise _invalid_key(f"byte {i} of the {HEADER_KEY} field (0x{ch:02X}) is outside printable ASCII 0x21-0x7E")
        key = v
    validate_record_key(key)
    return key


def _sf_string(v: str) -> str:
    out: list[str] = []
    i = 1
    while i < len(v):
        c = v[i]
        if c == "\\":
            i += 1
            if i == len(v) or v[i] not in '"\\':
                raise _invalid_key(f"the quoted {HEADER_KEY} has a backslash that escapes neither '\"' nor '\\'")
            out.append(v[i])
        elif c == '"':
            if i != len(v) - 1:
                raise _invalid_key(f"the quoted {HEADER_KEY} has characters after its closing quote")
            return "".join(out)
        elif not 0x20 <= ord(c) <= 0x7E:
            raise _invalid_key(f"byte {i} of the quoted {HEADER_KEY} is outside 0x20-0x7E")
        else:
            out.append(c)
        i += 1
    raise _invalid_key(f"the quoted {HEADER_KEY} has no closing quote")


# -- rules 2 and 3: which requests, key scope --------------------------------

def requirement(method: str, required: Sequence[str] | None = None, optional: Sequence[str] | None = None) -> str:
    """"required", "optional" (protected when it carries a key) or "pass"
    for a method. required defaults to POST and PATCH; optional None means
    every other unsafe method."""
    m = method.upper()
    if m in _SAFE:
        return "pass"
    if m in (DEFAULT_REQUIRED if required is None else [r.upper() for r in required]):
        return "required"
    if optional is None or m in [o.upper() for o in optional]:
        return "optional"
    return "pass"


def escape_scope(scope: str) -> str:
    """scope with "%" written "%25" and ":" written "%3A", so that the first
    ":" of a scoped key ends the scope (the scope "acct" with the key "b:k1"
    and the scope "acct:b" with the key "k1" must not be one record key)."""
    return scope.replace("%", "%25").replace(":", "%3A")


def scoped_key(scope: str | None, key: str) -> str:
    """The record key of key within scope: key itself without a scope,
    else escape_scope(scope) + ":" + key, which must still be a valid key.

    An unscoped key must not contain ":": every record key with one is a
    scoped key, and an unscoped "alice:sq" would be alice's "sq"."""
    if not scope:
        i = key.find(":")
        if i >= 0:
            raise _invalid_key(f"byte {i} of the unscoped key is ':', which only a scoped record key (scope:key) may hold: "
                               "an unscoped key with ':' could be another caller's scoped key; use a key without ':' (a UUID, say)")
        return key
    k = escape_scope(scope) + ":" + key
    try:
        validate_record_key(k)
    except FrontDoorError as e:
        raise _invalid_key(f"the key scoped to the caller is invalid: {e.detail}") from None
    return k


# -- rule 4: operation and fingerprint document --------------------------------

def operation(method: str, route: str) -> str:
    """METHOD + " " + route (the route pattern, else the path), cut to 128
    bytes at a character boundary."""
    op = method.upper() + " " + route
    raw = op.encode("utf-8")
    if len(raw) <= MAX_OPERATION_BYTES:
        return op
    return raw[:MAX_OPERATION_BYTES].decode("utf-8", "ignore")


def valid_label_text(s: str) -> bool:
    """Whether s may stand in an operation label as it is: no control
    character (C0, DEL, C1) and no lone surrogate (a str always is UTF-8
    otherwise), the rule of idem's ValidateOperation but for the length,
    which operation() cuts."""
    return not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F or 0xD800 <= ord(c) <= 0xDFFF for c in s)


def escape_label(raw_path: str) -> str:
    """A raw path (one character per byte, as read from the request line)
    with every byte outside printable ASCII 0x21-0x7E written as %XX in
    upper-case hex and every other byte, '%' included, as it is."""
    out = []
    for c in raw_path:
        if 0x21 <= ord(c) <= 0x7E:
            out.append(c)
        else:
            out.extend(f"%{b:02X}" for b in (c.encode("latin-1") if ord(c) <= 0xFF else c.encode("utf-8")))
    return "".join(out)


def path_route(decoded: str, raw_path: str) -> str:
    """The route of a request no route pattern names, for operation()
    (testvectors/frontdoor/operations.json, the same in every front door):
    the decoded path the framework gives, the label front doors have always
    built, as long as that is valid label text and so is the raw path's
    own decoding (its percent-escapes to bytes, then UTF-8); else the path
    as it arrived on the request line (raw_path, as request_path reads it),
    every byte outside printable ASCII escaped. /pay%00, /pay%0A or /pay%FF
    decode to a control character or bytes that are not UTF-8, which idem
    refuses in an operation: such a request could never be served (the
    answer used to be a retryable 503), and a server's lossy decoding
    (U+FFFD) must not decide the label. Every path whose decoding is valid
    label text keeps its label, so a key claimed before an upgrade matches
    its retry after (one on /pay%FF, labelled with U+FFFD by uvicorn
    before, answers 422 instead: never a second run)."""
    try:
        raw = raw_path.encode("latin-1")
    except UnicodeEncodeError:
        raw = raw_path.encode("utf-8")
    try:
        canonical = urllib.parse.unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        canonical = None
    if canonical is not None and valid_label_text(canonical) and valid_label_text(decoded):
        return decoded
    return escape_label(raw_path)


_TSPECIALS = set('()<>@,;:\\"/[]?=')


def _token(s: str) -> bool:
    return bool(s) and all(0x20 < ord(c) < 0x7F and c not in _TSPECIALS for c in s)


def is_json(content_type: str | None) -> bool:
    """Whether a Content-Type names a JSON body: application/json or any
    */*+json, parameters ignored; a malformed media type is not JSON."""
    if not content_type:
        return False
    parts = content_type.split(";")
    mt = parts[0].strip().lower()
    typ, slash, sub = mt.partition("/")
    if not slash or not _token(typ) or not _token(sub):
        return False
    for i, p in enumerate(parts[1:], start=1):
        p = p.strip()
        if not p:
            if i == len(parts) - 1:
                continue
            return False
        name, eq, value = p.partition("=")
        if not eq or not _token(name.strip()):
            return False
        value = value.strip()
        if not (_token(value) or (len(value) >= 2 and value[0] == value[-1] == '"')):
            return False
    return mt == "application/json" or sub.endswith("+json")


def parse_ijson(body: bytes) -> Any:
    """Parse a JSON body that must be I-JSON (RFC 7493): valid UTF-8, one
    value, no duplicate member names, no lone surrogates, numbers inside
    the double range; FrontDoorError invalid_request otherwise."""
    def fail(what: str) -> FrontDoorError:
        return FrontDoorError(INVALID_REQUEST, f"the JSON body is not I-JSON: {what}", fields=[{"field": "body", "message": what}])

    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise FrontDoorError(INVALID_REQUEST, "the JSON body is not valid UTF-8") from None

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in items:
            if k in out:
                raise fail(f"duplicate member name {k!r}")
            out[k] = v
        return out

    def num(s: str) -> float:
        f = float(s)
        if math.isinf(f):
            raise fail("number outside the IEEE 754 double range")
        return f

    def integer(s: str) -> int:
        if math.isinf(float(s)):
            raise fail("number outside the IEEE 754 double range")
        return int(s)

    def const(s: str) -> Any:
        raise fail(f"{s} is not JSON")

    try:
        value = json.loads(text, object_pairs_hook=pairs, parse_float=num, parse_int=integer, parse_constant=const)
    except FrontDoorError:
        raise
    except (ValueError, RecursionError) as e:
        raise fail(str(e).split(":")[0]) from None
    _check_strings(value, fail)
    return value


def _check_strings(v: Any, fail: Callable[[str], FrontDoorError]) -> None:
    stack = [v]
    while stack:
        x = stack.pop()
        if isinstance(x, str):
            strs = [x]
        elif isinstance(x, dict):
            strs = list(x.keys())
            stack.extend(x.values())
        elif isinstance(x, list):
            strs = []
            stack.extend(x)
        else:
            continue
        for s in strs:
            try:
                s.encode("utf-8")
            except UnicodeEncodeError:
                raise fail("lone surrogate") from None


def _pointer(p: str) -> list[str]:
    if not p or p[0] != "/":
        raise ValueError(f"JSON pointer {p!r} must start with '/'")
    return [t.replace("~1", "/").replace("~0", "~") for t in p[1:].split("/")]


def _remove(v: Any, toks: list[str]) -> Any:
    if not toks:
        return v
    t, last = toks[0], len(toks) == 1
    if isinstance(v, dict):
        if t in v:
            if last:
                del v[t]
            else:
                v[t] = _remove(v[t], toks[1:])
    elif isinstance(v, list):
        if t.isdigit() and not (len(t) > 1 and t[0] == "0") and int(t) < len(v):
            if last:
                del v[int(t)]
            else:
                v[int(t)] = _remove(v[int(t)], toks[1:])
    return v


def document(query: str, content_type: str | None, body: bytes, *, path: str, exclude: Sequence[str] = (),
             header_names: Sequence[str] = (), headers: Mapping[str, Sequence[str]] | None = None) -> dict[str, Any]:
    """The fingerprint document of a request: {"path", "query", "body"} for
    a non-empty JSON body, else {"path", "query", "body_sha256"}; path is
    the request path as received, without the query (one key on /orders/7
    and /orders/8 is two requests); exclude removes JSON pointers from the
    body, header_names adds "headers". The middleware send it as the
    claim's request and the server fingerprints it (JCS + SHA-256)."""
    doc: dict[str, Any] = {"path": path, "query": query}
    if body and is_json(content_type):
        value = parse_ijson(body)
        for p in exclude:
            value = _remove(value, _pointer(p))
        doc["body"] = value
    else:
        doc["body_sha256"] = hashlib.sha256(body).hexdigest()
    if header_names:
        lower = {k.lower(): list(v) for k, v in (headers or {}).items()}
        hs: dict[str, str] = {}
        for name in header_names:
            vals = lower.get(name.lower())
            if vals:
                hs[name.lower()] = ", ".join(vals)
        doc["headers"] = hs
    return doc


# -- rules 5 and 6: what is stored ---------------------------------------------------

def store_status(status: int, store_5xx: bool = True) -> bool:
    """Whether a handler's answer is stored (else the key is released)."""
    return status < 500 or store_5xx


#: The status recorded for an answer whose own status idem cannot store (see storable_status).
UNSTORABLE_STATUS = 502


def storable_status(status: int) -> bool:
    """Whether idem can store an answer of status: its complete takes
    100-599, while a WSGI or ASGI server sends what it is given. The handler
    of such an answer has run: it is sent as it is and stored as not
    replayable (status UNSTORABLE_STATUS, HEADER_NOT_REPLAYABLE), as one too
    large to store, so that a retry is 409 response_not_replayable instead of
    a second run; store_status does not apply to it."""
    return 100 <= status <= 599


def stored_headers(headers: Iterable[tuple[str, str]], allow: Sequence[str] | None = None) -> dict[str, str]:
    """The response headers stored with a response: the allowlist (default
    DEFAULT_STORED_HEADERS) looked up case-insensitively and named as
    configured, several values joined with ", "; never Set-Cookie."""
    values: dict[str, list[str]] = {}
    for k, v in headers:
        values.setdefault(k.lower(), []).append(v)
    out: dict[str, str] = {}
    for name in DEFAULT_STORED_HEADERS if allow is None else allow:
        if name.lower() == "set-cookie":
            continue
        if name.lower() in values:
            out[name] = ", ".join(values[name.lower()])
    return out


# -- rule 5: Prefer: wait=N ----------------------------------------------------------

_INT = re.compile(r"[+-]?[0-9]+")
_INT_MAX = (1 << 63) - 1


def prefer_wait(fields: Sequence[str]) -> int:
    """N of the first ``wait=N`` preference in the Prefer header fields
    (RFC 7240 section 4.3), or -1. A preference is a hint: a malformed one
    is ignored, never refused. The middleware caps N by its own limits
    (the same parse as the Go front doors, proven by the prefer_wait
    vectors)."""
    for f in fields:
        for pref in f.split(","):
            name, eq, value = pref.split(";", 1)[0].partition("=")
            if not eq or name.strip().lower() != "wait":
                continue
            v = value.strip().strip('"')
            if not _INT.fullmatch(v):
                return -1
            n = int(v)
            return n if 0 <= n <= _INT_MAX else -1
    return -1


# -- rule 7: problems -------------------------------------------------------------

def valid_request_id(rid: str | None) -> bool:
    """A caller's X-Request-Id is used when it is 1-128 of [A-Za-z0-9._-]."""
    return bool(rid) and len(rid or "") <= 128 and all(c.isascii() and (c.isalnum() or c in "._-") for c in rid or "")


def request_id(caller: str | None) -> str:
    """The caller's request id when valid, else a new one."""
    return caller if caller and valid_request_id(caller) else secrets.token_hex(16)


def held(code: str, retry_after: float = 0.0) -> FrontDoorError | None:
    """The answer to a claim idem refused because its completer holds the
    key (rule 8), None for any other code: outcome_unknown is 409
    request_in_flight with idem's Retry-After (the key is being finished;
    the caller's retry is right), outcome_review 409 outcome_review, not
    retryable (a person must resolve the key). Neither is a store failure."""
    if code == OUTCOME_UNKNOWN:
        return FrontDoorError(REQUEST_IN_FLIGHT, OUTCOME_UNKNOWN_DETAIL, retry_after=retry_after)
    if code == OUTCOME_REVIEW:
        return FrontDoorError(OUTCOME_REVIEW, OUTCOME_REVIEW_DETAIL)
    return None


def problem(err: FrontDoorError, rid: str) -> tuple[int, list[tuple[str, str]], bytes]:
    """The answer of a refusal: status, headers and the problem+json body."""
    status, title, retryable = PROBLEMS[err.code]
    doc: dict[str, Any] = {"type": "urn:idem:problem:" + err.code, "title": title, "status": status,
                           "detail": err.detail or title, "code": err.code, "retryable": retryable,
                           "instance": "urn:idem:request:" + rid}
    if err.fields:
        doc["errors"] = err.fields
    body = json.dumps(doc).encode("utf-8")
    headers = [("Content-Type", "application/problem+json"), ("Cache-Control", "no-store"),
               (HEADER_REQUEST_ID, rid), ("Content-Length", str(len(body)))]
    if retryable:
        headers.append(("Retry-After", str(max(math.ceil(err.retry_after), 1))))
        if err.budget_spent:
            headers.append((HEADER_RETRY_BUDGET, RETRY_BUDGET_SPENT))
    return status, headers, body


# -- rule 9: the caller's Idem-Attempt and the fleet retry budget ---------------------

_DIGITS = re.compile(r"[0-9]{1,15}")
_SF_KEY = re.compile(r"[a-z*][a-z0-9_\-.*]*")
_SF_TOKEN = re.compile(r"[A-Za-z*][A-Za-z0-9!#$%&'*+\-.^_`|~:/]*")
_SF_NUMBER = re.compile(r"-?(?:[0-9]{1,15}|[0-9]{1,12}\.[0-9]{1,3})")


def caller_attempt(fields: Sequence[str]) -> tuple[int, str | None]:
    """The attempt a caller's Idem-Attempt field lines name: (number, cause).
    An RFC 9651 Item, an Integer of 1 or more with an optional cause Token
    parameter ("2;cause=timeout"). A missing field, or one that is not such
    an Item (two lines, a list, a decimal, junk), is a first attempt, never
    a refusal; a cause that is not a Token is none; other parameters are
    ignored (the same reading as the Go front doors and the idem server,
    proven by the attempts vectors)."""
    if len(fields) != 1:
        return 1, None
    parts = fields[0].strip(" \t").split(";")
    if not _DIGITS.fullmatch(parts[0]) or int(parts[0]) < 1:
        return 1, None
    n, cause = int(parts[0]), None
    for p in parts[1:]:
        name, eq, value = p.lstrip(" ").partition("=")
        if not _SF_KEY.fullmatch(name) or (eq and not _sf_bare_item(value)):
            return 1, None
        if name == "cause" and n > 1 and _SF_TOKEN.fullmatch(value):
            cause = value
    return n, (cause if n > 1 else None)


def _sf_bare_item(v: str) -> bool:
    return bool(_SF_TOKEN.fullmatch(v) or _SF_NUMBER.fullmatch(v) or v in ("?0", "?1")
                or (len(v) >= 2 and v[0] == '"' and v[-1] == '"'))


def budget_refusal(retry_after: float = 0.0) -> FrontDoorError:
    """The answer to a retry the fleet retry budget refused: 429
    retry_budget_exhausted with Retry-After and Idem-Retry-Budget: exhausted."""
    return FrontDoorError(RETRY_BUDGET_EXHAUSTED, RETRY_BUDGET_DETAIL, retry_after=retry_after, budget_spent=True)


def spent_budget(err: FrontDoorError, spent: bool) -> FrontDoorError:
    """err saying the fleet retry budget is spent when spent and err is
    retryable: a refusal nobody retries never carries it."""
    if spent and PROBLEMS[err.code][2]:
        err.budget_spent = True
    return err
