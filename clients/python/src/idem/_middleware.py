"""What the ASGI and WSGI middleware share: the request side of the front
door (key, operation, document) and the mapping of idem's answers to the
caller's."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Sequence
from urllib.parse import quote

from . import frontdoor
from ._errors import FORBIDDEN, UNAUTHENTICATED, FleetBudgetExhausted, IdemError, NoSideEffect, ProblemError
from ._types import Response, RunResult
from .frontdoor import FrontDoorError

log = logging.getLogger("idem.middleware")


@dataclass(frozen=True)
class Options:
    """The configuration of a middleware (see idem.asgi / idem.wsgi)."""

    #: Methods that require a key (default POST, PATCH) and that are protected when they carry one (None: every other unsafe method).
    required_methods: Sequence[str] | None = None
    optional_methods: Sequence[str] | None = None
    #: A request header whose value scopes the key (escape_scope(scope) + ":" + key), e.g. the caller's account.
    scope_header: str | None = None
    #: Store 5xx answers too (default, Stripe's behaviour); False releases the key instead.
    store_5xx: bool = True
    #: Response headers stored with a response (None: frontdoor.DEFAULT_STORED_HEADERS).
    stored_headers: Sequence[str] | None = None
    #: The lease asked for (None: the tenant's default); a keeper renews it while the handler runs.
    lease: float | None = None
    #: The overall deadline of the idem calls of one request, seconds.
    timeout: float | None = 10.0
    #: The largest request body read for the fingerprint (default 8 MiB, under the idem server's limit); larger: 413.
    max_body_bytes: int = 8 << 20
    #: The largest response (body plus stored headers) stored for replay (default 1 MiB, the tenant's default
    #: max_response_bytes); a larger one is sent but stored without its body, and its replay answers 409
    #: response_not_replayable instead of running the handler again.
    max_stored_bytes: int = 1 << 20
    #: Caps how long, in seconds, a request with ``Prefer: wait=N`` is held while another request with its key is
    #: in flight (the claim's wait_seconds = min(N, max_wait)): it then gets that request's replay instead of 409.
    #: None: no cap of the middleware's own (the tenant's max_wait_seconds and the attempt timeout less a second
    #: still apply); 0 or less: Prefer is ignored, 409 at once.
    max_wait: float | None = None


@dataclass(frozen=True)
class Protected:
    """A request the middleware protects."""

    key: str
    operation: str
    document: dict[str, Any]
    #: The wait the claim asks for (the request's Prefer: wait=N within max_wait), seconds; 0 for none.
    wait: float = 0.0
    #: The caller's Idem-Attempt (rule 9): (number, cause), passed on with the claim when a retry.
    attempt: tuple[int, str | None] = (1, None)


@dataclass
class Answer:
    """A complete HTTP answer."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes


def request_path(raw: bytes | str | None, decoded: str | bytes) -> str:
    """The request path as received, without the query (part of the
    fingerprint document): the server's raw request target when it gives
    one (an absolute-form target without its scheme and authority, as the Go
    and Node front doors read it), else the decoded path escaped back."""
    if raw:
        text = (raw.decode("latin-1") if isinstance(raw, bytes) else raw).split("?", 1)[0]
        if not text.startswith("/") and "://" in text:
            rest = text.split("://", 1)[1]
            text = rest[rest.index("/"):] if "/" in rest else "/"
        return text or "/"
    return quote(decoded, safe="/:@!$&'()*+,;=~%")


#: The detail of the 400 invalid_request for a request body that ended
#: before its Content-Length (or could not be read).
CUT_BODY_DETAIL = "the request body ended before its Content-Length"


def prepare(opts: Options, method: str, route: str, query: str, headers: list[tuple[str, str]],
            body: bytes, *, path: str, cut: bool = False) -> Protected | None:
    """Decide about a request: None to pass it through, Protected to run it
    under a claim; FrontDoorError for a refusal. cut says that body is not
    the whole body the caller sent (it ended before its Content-Length, or
    reading it failed): the caller went away or the body was cut on the
    way, so a protected request is refused 400 invalid_request before
    anything is claimed. Claimed, the key would hold the fingerprint of the
    bytes that happened to arrive and the answer of a handler run on them,
    and the caller's real retry would get 422 fingerprint_mismatch."""
    need = frontdoor.requirement(method, opts.required_methods, opts.optional_methods)
    if need == "pass":
        return None
    key = frontdoor.parse_key([v for k, v in headers if k.lower() == "idempotency-key"])
    if key is None:
        if need == "required":
            raise FrontDoorError(frontdoor.KEY_MISSING, f"{method.upper()} requires an {frontdoor.HEADER_KEY} header")
        return None
    if opts.scope_header:
        key = frontdoor.scoped_key(scope_of(opts.scope_header, headers), key)
    if cut:
        raise FrontDoorError(frontdoor.INVALID_REQUEST, CUT_BODY_DETAIL)
    if len(body) > opts.max_body_bytes:
        raise FrontDoorError(frontdoor.PAYLOAD_TOO_LARGE, f"the request body is larger than {opts.max_body_bytes} bytes")
    ctype = next((v for k, v in headers if k.lower() == "content-type"), None)
    doc = frontdoor.document(query, ctype, body, path=path)
    attempt = frontdoor.caller_attempt([v for k, v in headers if k.lower() == frontdoor.HEADER_ATTEMPT.lower()])
    return Protected(key, frontdoor.operation(method, route), doc, prefer_wait(opts, headers), attempt)


def scope_of(name: str, headers: list[tuple[str, str]]) -> str:
    """The key scope of a request: the value of its scope header field, ""
    without one (the key is then not scoped). The field must come once and
    hold one value, as in the gateway (docs/frontdoor.md rule 3): with two,
    or a list in one, the key would be scoped by one reading of them while
    the app may serve the caller as another, so the request is refused 400
    invalid_key. A WSGI server joins repeated fields into one value with
    "," before the middleware sees them: there a comma is the only trace
    of a second field, which is why a comma is refused too."""
    values = [v for k, v in headers if k.lower() == name.lower()]
    if len(values) > 1:
        raise FrontDoorError(frontdoor.INVALID_KEY, f"the request carries {len(values)} {name} fields, which scope the key; send exactly one")
    if values and "," in values[0]:
        raise FrontDoorError(frontdoor.INVALID_KEY, f"the {name} header, which scopes the key, holds a list (a comma); send one value")
    return values[0] if values else ""


def prefer_wait(opts: Options, headers: list[tuple[str, str]]) -> float:
    """The wait to ask idem for: the request's Prefer: wait=N within
    max_wait (and a day), 0 without one or when max_wait is 0 or less."""
    n = frontdoor.prefer_wait([v for k, v in headers if k.lower() == "prefer"])
    if n <= 0 or (opts.max_wait is not None and opts.max_wait <= 0):
        return 0.0
    wait = float(min(n, 24 * 3600))
    return wait if opts.max_wait is None else min(wait, opts.max_wait)


def applied(ans: Answer, wait_applied: int) -> Answer:
    """ans with Preference-Applied: wait=<applied> when idem held the claim
    (RFC 7240: only a preference that was honoured is named)."""
    if wait_applied > 0:
        ans.headers.append((frontdoor.HEADER_PREFERENCE_APPLIED, f"wait={wait_applied}"))
    return ans


def wait_applied(err: IdemError) -> int:
    """The wait idem applied to a claim that failed (a 409 after the wait ran out), 0 when none."""
    return err.wait_applied if isinstance(err, ProblemError) else 0


def caller_request_id(headers: list[tuple[str, str]]) -> str:
    return frontdoor.request_id(next((v for k, v in headers if k.lower() == "x-request-id"), None))


def problem_answer(err: FrontDoorError, rid: str) -> Answer:
    status, headers, body = frontdoor.problem(err, rid)
    return Answer(status, headers, body)


def claim_failed(err: IdemError) -> FrontDoorError:
    """claim_refused, saying the fleet retry budget is spent (rule 9) on a
    retryable refusal whose idem answer said so."""
    out = claim_refused(err)
    if isinstance(err, ProblemError) and err.fleet_budget_spent:
        frontdoor.spent_budget(out, True)
    return out


def claim_refused(err: IdemError) -> FrontDoorError:
    """Map an error of the claim to the caller's problem: in flight 409 (a key
    idem's completer holds too; 409 outcome_review once it gave up), mismatch
    422, a document idem refuses as too large 413, the tenant's
    storage quota used up 507 (not retryable), the middleware's tenant
    disabled or gone 403 tenant_unknown (not retryable), a claim idem
    refuses as invalid 400 invalid_request (not retryable), and everything
    else fails closed as 503 — idem's refusal of the middleware's own token
    (401 unauthenticated, 403 forbidden) too: a fault of the service's
    credentials that a rotation fixes, never the caller's. idem's fleet
    retry budget (rule 9): a refusal of the caller's retry passed on is 429
    retry_budget_exhausted; a claim stopped after a failure of its own (its
    retry refused, or the failure saying the budget is spent) is that
    failure's answer, saying the budget is spent."""
    if isinstance(err, FleetBudgetExhausted):
        return frontdoor.spent_budget(claim_failed(err.original), True)
    if isinstance(err, ProblemError):
        if err.code == frontdoor.RETRY_BUDGET_EXHAUSTED:
            return frontdoor.budget_refusal(err.retry_after)
        if err.code == frontdoor.REQUEST_IN_FLIGHT:
            return FrontDoorError(frontdoor.REQUEST_IN_FLIGHT, "another request with this idempotency key is in progress; retry after Retry-After",
                                  retry_after=err.retry_after)
        held = frontdoor.held(err.code, err.retry_after)
        if held is not None:
            # idem's completer holds the key (rule 8): in flight while it finds out what the first request did,
            # a refusal for a person once it gave up; never the retryable 503 (idem is up and answered).
            return held
        if err.code == frontdoor.FINGERPRINT_MISMATCH:
            return FrontDoorError(frontdoor.FINGERPRINT_MISMATCH, frontdoor.MISMATCH_DETAIL)
        if err.code == frontdoor.PAYLOAD_TOO_LARGE:
            # idem's request limit (IDEM_MAX_BODY_BYTES) is under max_body_bytes: a retry cannot succeed.
            return FrontDoorError(frontdoor.PAYLOAD_TOO_LARGE, "the request body is too large for the idempotency service to fingerprint")
        if err.code == frontdoor.STORAGE_QUOTA_EXCEEDED:
            # idem is up and refused a new record: 503 would have the caller retry what cannot succeed.
            return FrontDoorError(frontdoor.STORAGE_QUOTA_EXCEEDED, frontdoor.STORAGE_QUOTA_DETAIL)
        if err.code == frontdoor.TENANT_UNKNOWN:
            # idem is up and refused the middleware's tenant: no retry succeeds until an operator enables it,
            # so not the retryable 503 (issue 21, hole 2's class).
            log.error("idem refused the middleware's tenant (it does not exist or is disabled): %s", err)
            return FrontDoorError(frontdoor.TENANT_UNKNOWN, frontdoor.TENANT_UNKNOWN_DETAIL)
        if err.code in (UNAUTHENTICATED, FORBIDDEN):
            # The middleware's own token (expired, a rotated secret, a deleted tenant's, without keys:write): a
            # fault of this service's credentials that a rotation fixes, not of the caller's request. Fail closed
            # with the retryable 503 (nothing was claimed, so the retry is safe), never a 401 or 403 that
            # would blame the caller's own credentials.
            log.error("idem refused the middleware's token (check its expiry, tenant and the keys:write scope); "
                      "failing closed: %s", err)
            return unavailable(err)
        if err.code == frontdoor.INVALID_REQUEST:
            # idem refused the claim itself (an operation from a route function it does not accept, say):
            # the same claim is refused again, so not the retryable 503.
            log.error("idem refused the claim: %s", err)
            return FrontDoorError(frontdoor.INVALID_REQUEST, f"the idempotency service refused the claim of this request: {err.detail}",
                                  fields=[{"field": f.field, "message": f.message} for f in err.fields])
    log.warning("idem unavailable; request refused (fail closed): %s", err)
    return unavailable(err)


def unavailable(err: IdemError) -> FrontDoorError:
    """The retryable 503 store_unavailable of a claim that failed (fail
    closed), with idem's Retry-After hint when it gave one."""
    ra = err.retry_after if isinstance(err, ProblemError) else 0.0
    return FrontDoorError(frontdoor.STORE_UNAVAILABLE, "the idempotency store cannot be reached; the request was not run",
                          retry_after=ra)


def replay_answer(resp: Response, rid: str) -> Answer:
    """The answer of a replay: the stored status, headers and body; 409
    response_not_replayable for a record stored as not replayable (too
    large, or a status idem cannot store)."""
    if frontdoor.HEADER_NOT_REPLAYABLE in resp.headers:
        return problem_answer(FrontDoorError(frontdoor.RESPONSE_NOT_REPLAYABLE, frontdoor.NOT_REPLAYABLE_DETAIL), rid)
    headers = [(k, v) for k, v in resp.headers.items() if k.lower() != "content-length"]
    headers += [(frontdoor.HEADER_REPLAYED, "true"), ("Content-Length", str(len(resp.body)))]
    return Answer(resp.status or 200, headers, resp.body)


def run_failed(err: IdemError, ran: list[Answer], rid: str) -> Answer:
    """The answer when run() raised: the handler's own answer when it ran
    (storing it failed, so it is sent unstored), else the claim's problem."""
    if ran:
        log.error("idem: storing the response failed; sending it unstored: %s", err)
        return ran[0]
    return problem_answer(claim_failed(err), rid)


def run_answer(res: RunResult, ran: list[Answer], rid: str) -> Answer:
    """The answer of a finished run(): the stored one for a replay, else
    the handler's own."""
    if res.replayed:
        return replay_answer(res.response, rid)
    return ran[0]


class Release(NoSideEffect):
    """Raised inside run() for an answer that is not stored: the key is released."""


def to_store(opts: Options, ans: Answer) -> Response:
    """The stored form of a handler's answer; raises Release when the
    answer is not stored (a 5xx with store_5xx off). An answer whose status
    idem cannot store is stored as not replayable, whatever store_5xx says:
    the handler ran."""
    if not frontdoor.storable_status(ans.status):
        return not_replayable(opts, ans)
    if not frontdoor.store_status(ans.status, opts.store_5xx):
        raise Release(f"status {ans.status} is not stored")
    headers = frontdoor.stored_headers(ans.headers, opts.stored_headers)
    if stored_size(headers, ans.body) > opts.max_stored_bytes:
        return not_replayable(opts, ans)
    return Response(ans.status, headers, ans.body)


def stored_size(headers: dict[str, str], body: bytes) -> int:
    return len(body) + sum(len(k) + len(v) for k, v in headers.items())


def not_replayable(opts: Options, ans: Answer) -> Response:
    """The response stored in place of one too large to keep: its status,
    no body, marked HEADER_NOT_REPLAYABLE (its replay answers 409
    response_not_replayable); for one whose status idem cannot store,
    UNSTORABLE_STATUS and the status sent."""
    if not frontdoor.storable_status(ans.status):
        return Response(frontdoor.UNSTORABLE_STATUS,
                         {frontdoor.HEADER_NOT_REPLAYABLE: f"response of status {ans.status} not stored (outside 100-599)"})
    size = stored_size(frontdoor.stored_headers(ans.headers, opts.stored_headers), ans.body)
    return Response(ans.status, {frontdoor.HEADER_NOT_REPLAYABLE: f"response of {size} bytes not stored"})


def refused_as_too_large(err: IdemError, ran: list[Answer]) -> bool:
    """Whether idem refused a handler's answer as over the tenant's
    max_response_bytes (a limit under max_stored_bytes): the middleware then
    stores it without its body, so that the retry is 409
    response_not_replayable instead of a second run after the lease."""
    return bool(ran) and isinstance(err, ProblemError) and err.code == frontdoor.PAYLOAD_TOO_LARGE
