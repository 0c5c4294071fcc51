"""The retry contract shared by the sync and asyncio clients: allowlist,
full jitter, Retry-After, one deadline, attempt cap and retry budget."""

from __future__ import annotations

import random as _random
import threading
from dataclasses import dataclass
from datetime import datetime, timezone

import httpx

from ._errors import IdemError, ProblemError, TokenError, TransportError

_RETRY_STATUSES = frozenset({408, 429, 502, 503, 504})


@dataclass(frozen=True)
class RetryPolicy:
    """Configures the retry loop around every call of a client. The
    defaults are the contract of the docs (/docs/retries/).

    Durations are seconds. ``attempt_timeout`` None means no per-attempt
    timeout; ``in_flight_wait`` None means never wait for another holder of
    the key; ``budget_capacity`` None switches the retry budget off."""

    #: Attempts per call, the first included; 1 disables retries.
    max_attempts: int = 3
    #: Full jitter: the wait before retry n is uniform in [0, min(max_delay, base_delay * 2**n)).
    base_delay: float = 1.0
    max_delay: float = 30.0
    #: Bounds one whole attempt (connect, send, read every byte of the answer), cut to the time left.
    attempt_timeout: float | None = 10.0
    #: The loop stops when the time left cannot fit the next wait plus this.
    min_attempt_time: float = 0.1
    #: Spread added to a Retry-After wait: Retry-After + uniform [0, retry_after_jitter).
    retry_after_jitter: float = 1.0
    #: Retry HTTP 500 too (off: an unexpected error tends to repeat).
    retry_500: bool = False
    #: How long run() waits in total for another holder of the key (409 request_in_flight).
    in_flight_wait: float | None = 60.0
    #: The per-client retry budget: capacity, cost of a retry, refund per success.
    budget_capacity: float | None = 10.0
    budget_retry_cost: float = 1.0
    budget_success_refund: float = 0.1
    #: Bounds one whole call (its attempts, waits and run()'s in-flight waits)
    #: when the call gives no sooner ``timeout``; None: only the call's own.
    call_deadline: float | None = None

    @classmethod
    def interactive(cls) -> RetryPolicy:
        """The preset for a call a person waits on (/docs/retries#presets):
        10 s for the whole call, 3 attempts of at most 3 s, waits of 0.2 s
        growing to 2 s, at most 5 s waiting for another holder of the key,
        the per-process budget as by default (10 retries, 0.1 back per
        success)."""
        return cls(call_deadline=10.0, max_attempts=3, attempt_timeout=3.0, base_delay=0.2, max_delay=2.0,
                   in_flight_wait=5.0, budget_capacity=10.0, budget_success_refund=0.1)

    @classmethod
    def background(cls) -> RetryPolicy:
        """The preset for a job nobody waits on: 10 minutes for the whole
        call, 10 attempts of at most 30 s, waits of 1 s growing to 60 s, up
        to 5 minutes waiting for another holder of the key, a per-process
        budget of 100 retries (0.5 back per success)."""
        return cls(call_deadline=600.0, max_attempts=10, attempt_timeout=30.0, base_delay=1.0, max_delay=60.0,
                   in_flight_wait=300.0, budget_capacity=100.0, budget_success_refund=0.5)

    def full_jitter_ceiling(self, n: int) -> float:
        """min(max_delay, base_delay * 2**n): the exclusive bound of the
        wait before retry n (n = 0 for the first retry)."""
        if n < 62:
            c = self.base_delay * (2.0**n)
            if c < self.max_delay:
                return c
        return self.max_delay

    def backoff(self, n: int, rnd: float | None = None) -> float:
        """The full-jitter wait before retry n; rnd in [0, 1) is drawn when None."""
        r = _random.random() if rnd is None else rnd
        return r * self.full_jitter_ceiling(n)

    def retry_after_wait(self, retry_after: float, rnd: float | None = None) -> float:
        """The wait for a Retry-After answer: Retry-After plus the spread."""
        if self.retry_after_jitter <= 0:
            return retry_after
        r = _random.random() if rnd is None else rnd
        return retry_after + r * self.retry_after_jitter

    def retryable_status(self, status: int) -> bool:
        """Whether an HTTP status is on the retry allowlist."""
        return status in _RETRY_STATUSES or (status == 500 and self.retry_500)

    def fits(self, left: float | None, wait: float) -> bool:
        """Whether a wait plus a minimal attempt fits in the time left
        before the deadline (None: no deadline)."""
        return left is None or left >= wait + self.min_attempt_time

    def retryable(self, err: BaseException) -> bool:
        """Whether a failed attempt may be sent again by the call's loop."""
        if isinstance(err, ProblemError):
            return self.retryable_status(err.status)
        if isinstance(err, TransportError):
            return err.retryable
        return False


#: The Idem-Attempt request header (/docs/retries#attempt): "1", "2;cause=timeout".
HEADER_ATTEMPT = "Idem-Attempt"


def attempt_header(n: int, cause: str | None) -> str:
    """The Idem-Attempt value of attempt n after a failure of cause."""
    return str(n) if n <= 1 or not cause else f"{n};cause={cause}"


def cause_of(err: BaseException) -> str:
    """The Idem-Attempt cause of a failed attempt: timeout, network,
    unavailable (503), throttled (429), server-error (other 5xx) or
    in-flight (409 request_in_flight)."""
    if isinstance(err, ProblemError):
        if err.code == "request_in_flight":
            return "in-flight"
        if err.status == 503:
            return "unavailable"
        if err.status == 429:
            return "throttled"
        if err.status == 408:
            return "timeout"
        return "server-error"
    if isinstance(err, TransportError) and isinstance(err.__cause__, httpx.TimeoutException):
        return "timeout"
    return "network"


class RetryBudget:
    """The client-wide token bucket of retries: it starts full; a retry
    takes the cost and is refused when less is left; a success puts back
    the refund, up to the capacity. Safe for threads and asyncio."""

    def __init__(self, policy: RetryPolicy) -> None:
        self._lock = threading.Lock()
        self._off = policy.budget_capacity is None or policy.budget_capacity < 0
        self._capacity = policy.budget_capacity or 0.0
        self._tokens = self._capacity
        self._cost = policy.budget_retry_cost
        self._refund = policy.budget_success_refund

    def take(self) -> bool:
        """Spend the cost of one retry; False when the bucket cannot pay it."""
        if self._off:
            return True
        with self._lock:
            if self._tokens + 1e-9 < self._cost:  # ten refunds of 0.1 pay for a retry
                return False
            self._tokens = max(self._tokens - self._cost, 0.0)
            return True

    def success(self) -> None:
        """Refund a fraction of a retry."""
        if self._off:
            return
        with self._lock:
            self._tokens = min(self._capacity, self._tokens + self._refund)

    @property
    def left(self) -> float:
        """The tokens in the bucket (inf when the budget is off)."""
        if self._off:
            return float("inf")
        with self._lock:
            return self._tokens


_MONTHS = {m: i + 1 for i, m in enumerate("Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec".split())}
_DATE_FORMATS = ("%a, %d %b %Y %H:%M:%S GMT", "%A, %d-%b-%y %H:%M:%S GMT", "%a %b %d %H:%M:%S %Y", "%a %b  %d %H:%M:%S %Y")


def _parse_http_date(value: str) -> datetime | None:
    for fmt in _DATE_FORMATS:
        try:
            t = datetime.strptime(value, fmt)
        except ValueError:
            continue
        return t.replace(tzinfo=timezone.utc)
    return None


def parse_retry_after(value: str | None, now: datetime) -> float:
    """Read a Retry-After header: delay-seconds or an HTTP-date (relative to
    now, an aware datetime). 0 when absent, unreadable, negative or past."""
    if not value:
        return 0.0
    if value.isascii() and value.lstrip("+").isdigit():
        return float(max(int(value), 0))
    when = _parse_http_date(value)
    if when is None:
        return 0.0
    return max((when - now).total_seconds(), 0.0)


def transport_error(exc: httpx.HTTPError, call: str) -> TransportError:
    """Wrap an httpx error of an attempt that got no answer, classified by
    the allowlist: refused, reset, closed before the answer, timeouts."""
    retryable = isinstance(exc, (httpx.TimeoutException, httpx.ConnectError, httpx.ReadError,
                                 httpx.WriteError, httpx.RemoteProtocolError))
    err = TransportError(f"idem: {call}: {type(exc).__name__}: {exc}", retryable=retryable)
    err.__cause__ = exc
    return err


def problem_from(status: int, headers: httpx.Headers, body: bytes, now: datetime, policy: RetryPolicy, call: str) -> ProblemError:
    """Turn a non-2xx answer into ProblemError."""
    import json

    from ._errors import UNKNOWN, _field_errors
    from .frontdoor import HEADER_PREFERENCE_APPLIED, prefer_wait

    code, title, detail, typ = UNKNOWN, "", "", ""
    retryable = policy.retryable_status(status)
    fields = []
    try:
        pd = json.loads(body) if body else None
    except ValueError:
        pd = None
    if isinstance(pd, dict):
        code = str(pd.get("code") or UNKNOWN)
        title, detail, typ = str(pd.get("title") or ""), str(pd.get("detail") or ""), str(pd.get("type") or "")
        if isinstance(pd.get("retryable"), bool):
            retryable = pd["retryable"]
        fields = _field_errors(pd.get("errors"))
    return ProblemError(status=status, problem_code=code, title=title, detail=detail, type=typ, retryable=retryable,
                        retry_after=parse_retry_after(headers.get("Retry-After"), now),
                        request_id=headers.get("X-Request-Id", ""), fields=fields, call=call,
                        wait_applied=max(prefer_wait(headers.get_list(HEADER_PREFERENCE_APPLIED)), 0),
                        fleet_budget_spent=budget_spent(headers.get("Idem-Retry-Budget")))


def budget_spent(value: str | None) -> bool:
    """Whether an Idem-Retry-Budget value says the fleet budget is spent
    (the Token ``exhausted``; parameters ignored)."""
    return value is not None and value.split(";", 1)[0].strip() == "exhausted"


__all__ = ["RetryPolicy", "RetryBudget", "parse_retry_after", "IdemError", "TokenError"]
