"""Errors of the idem SDK."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# The error codes of the idem HTTP contract, version 1.
INVALID_REQUEST = "invalid_request"
INVALID_KEY = "invalid_key"
UNAUTHENTICATED = "unauthenticated"
FORBIDDEN = "forbidden"
TENANT_UNKNOWN = "tenant_unknown"
KEY_NOT_FOUND = "key_not_found"
TENANT_NOT_FOUND = "tenant_not_found"
REQUEST_IN_FLIGHT = "request_in_flight"
#: 409, retryable after Retry-After: the key's first attempt died and idem's
#: completer holds it while it finds out what happened.
OUTCOME_UNKNOWN = "outcome_unknown"
#: 409, not retryable: the completer gave up; a person must resolve the key.
OUTCOME_REVIEW = "outcome_review"
LEASE_LOST = "lease_lost"
ALREADY_COMPLETED = "already_completed"
TENANT_EXISTS = "tenant_exists"
PAYLOAD_TOO_LARGE = "payload_too_large"
UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
FINGERPRINT_MISMATCH = "fingerprint_mismatch"
RATE_LIMITED = "rate_limited"
#: 429: the tenant's fleet retry budget refused this retry; the client stops
#: retrying the call at once and raises with the original cause.
RETRY_BUDGET_EXHAUSTED = "retry_budget_exhausted"
#: The response header by which idem says, on a retryable failure, that the
#: tenant's fleet retry budget is spent: an RFC 9651 Token, ``exhausted``.
HEADER_RETRY_BUDGET = "Idem-Retry-Budget"
STORE_UNAVAILABLE = "store_unavailable"
SERVER_BUSY = "server_busy"
#: 507, never retried: the tenant stores its storage_quota_bytes or more, so a
#: claim of a new key was refused before anything ran.
STORAGE_QUOTA_EXCEEDED = "storage_quota_exceeded"
WEBHOOK_NOT_FOUND = "webhook_not_found"
WEBHOOK_DISABLED = "webhook_disabled"
WEBHOOK_LIMIT_REACHED = "webhook_limit_reached"
COMPLETER_NOT_FOUND = "completer_not_found"
COMPLETER_LIMIT_REACHED = "completer_limit_reached"
NOT_FOUND = "not_found"
METHOD_NOT_ALLOWED = "method_not_allowed"
INTERNAL = "internal"
#: Given to an HTTP error whose body is not a problem document with a code.
UNKNOWN = "unknown"


@dataclass(frozen=True)
class FieldError:
    """One invalid field of an invalid_request problem."""

    field: str
    message: str


class IdemError(Exception):
    """Base of every error the SDK raises.

    ``give_up`` says why a retryable failure was not retried again:
    "attempts", "budget", "deadline" or "in_flight_wait"; None when the
    failure was final or the caller's own.
    """

    give_up: str | None = None

    @property
    def code(self) -> str:
        """The contract's error code; "unknown" for errors without one."""
        return UNKNOWN


@dataclass(eq=False)
class ProblemError(IdemError):
    """An error answer of the idem service: RFC 9457 problem details plus
    the HTTP status, Retry-After (seconds, 0 when absent) and request id."""

    status: int
    problem_code: str = UNKNOWN
    title: str = ""
    detail: str = ""
    type: str = ""
    retryable: bool = False
    retry_after: float = 0.0
    request_id: str = ""
    fields: list[FieldError] = field(default_factory=list)
    call: str = ""
    #: How long, in whole seconds, the server held a claim that asked to wait
    #: before this answer (its Preference-Applied); 0 when it held none (it
    #: may refuse to: its waiter limit, a shutdown).
    wait_applied: int = 0
    #: True when the answer carried ``Idem-Retry-Budget: exhausted``: the
    #: tenant's fleet retry budget is spent, so the client sent no retry (it
    #: raised FleetBudgetExhausted with this error as the original).
    fleet_budget_spent: bool = False

    def __post_init__(self) -> None:
        super().__init__(str(self))

    @property
    def code(self) -> str:
        return self.problem_code

    def __str__(self) -> str:
        s = f"idem: {self.call + ': ' if self.call else ''}{self.status} {self.problem_code}"
        if self.detail or self.title:
            s += ": " + (self.detail or self.title)
        if self.request_id:
            s += f" (request id {self.request_id})"
        return s


class TransportError(IdemError):
    """No answer arrived: connection refused or reset, closed before the
    answer, or a timeout. ``__cause__`` holds the httpx exception."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


class FleetBudgetExhausted(IdemError):
    """idem refused a retry of this call with 429 retry_budget_exhausted: the
    tenant's retries use its retry budget across the fleet. The client sent
    no further attempt. ``original`` is the error of the attempt before the
    refusal (the 503, the timeout) and ``cause`` its Idem-Attempt cause;
    ``code`` is the original's, so callers handle the outage as they would
    have; ``refusal`` is the 429 itself (its retry_after says when the
    budget has room again), or None when the client sent no retry at all
    because the failed attempt's answer said the budget is spent
    (``Idem-Retry-Budget: exhausted``)."""

    give_up: str | None = "fleet_budget"

    def __init__(self, call: str, attempts: int, cause: str, original: IdemError, refusal: ProblemError | None) -> None:
        super().__init__(f"idem: {call}: stopped after {attempts} attempts: the tenant's fleet retry budget refused "
                         f"the retry (original cause {cause}): {original}")
        self.call = call
        self.attempts = attempts
        self.cause = cause
        self.original = original
        self.refusal = refusal
        self.__cause__ = original

    @property
    def code(self) -> str:
        return self.original.code


class InvalidAnswer(IdemError):
    """A 2xx answer the client cannot interpret: not JSON, or a claim answer
    without what acting on it needs (a fencing token and state, a stored
    response to replay). Not retried, and run() does not run its function on
    it: it comes from something that is not an idem server speaking the
    contract (a misrouted proxy, say), and guessing could run the work twice
    or replay a response that was never stored."""


class TokenError(IdemError):
    """The token source failed; never retried."""


class InvalidKeyError(IdemError, ValueError):
    """A key the service would refuse, caught before any request."""

    @property
    def code(self) -> str:
        return INVALID_KEY


class NoSideEffect(Exception):
    """Raise it (or a subclass) from a function run by ``run`` to declare
    that the attempt left no side effect: the key is released, so the next
    attempt with the key starts afresh, and the exception propagates."""


def error_code(err: BaseException | None) -> str:
    """The contract's code of err: "" for None, "unknown" for an error
    without one (a network error, say)."""
    if err is None:
        return ""
    if isinstance(err, IdemError):
        return err.code
    return UNKNOWN


def _field_errors(raw: Any) -> list[FieldError]:
    out: list[FieldError] = []
    if isinstance(raw, list):
        for item in raw:
            if isinstance(item, dict):
                out.append(FieldError(str(item.get("field", "")), str(item.get("message", ""))))
    return out
