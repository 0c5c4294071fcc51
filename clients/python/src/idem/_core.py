"""What the sync and asyncio clients share: request building, answer
decoding, and the decisions of the retry loop and the in-flight wait. The
clients only do the I/O and the sleeping."""

from __future__ import annotations

import email.utils
import json
import logging
import math
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable, Mapping
from urllib.parse import quote, urlencode

import httpx

from ._errors import (
    REQUEST_IN_FLIGHT,
    RETRY_BUDGET_EXHAUSTED,
    FleetBudgetExhausted,
    IdemError,
    InvalidAnswer,
    NoSideEffect,
    ProblemError,
    TokenError,
    TransportError,
)
from ._keys import validate_key
from ._retry import HEADER_ATTEMPT, RetryBudget, RetryPolicy, attempt_header, cause_of, problem_from, transport_error
from ._types import ClaimResult, KeyPage, Record, Response, RunResult
from .frontdoor import HEADER_PREFERENCE_APPLIED, prefer_wait

if TYPE_CHECKING:
    from ._resume import ResumeCall

log = logging.getLogger("idem")

#: The recovery point the lease keeper saves when it renews a lease before
#: the function's first checkpoint; a takeover of such a claim sees none.
RENEWAL_POINT = "idem:lease-renewal"

#: A bearer token, or a function returning the token of the next attempt.
TokenSource = str | Callable[[], str] | None


@dataclass(frozen=True)
class AttemptInfo:
    """One attempt of a call, as given to the on_attempt hook and logged."""

    call: str
    method: str
    path: str
    #: Counts from 1.
    attempt: int
    #: HTTP status, 0 when no answer arrived.
    status: int
    error: BaseException | None
    #: Whether another attempt follows, and the wait chosen before it.
    retry: bool
    wait: float
    #: Why no retry follows a retryable failure: "attempts", "budget", "deadline"; None otherwise.
    give_up: str | None
    budget_left: float


@dataclass
class Logical:
    """The attempts of one logical call across its HTTP calls: run()'s
    claim and its in-flight waits are one call, so the server sees a claim
    after a wait as a retry (cause in-flight)."""

    attempts: int = 0
    cause: str | None = None
    original: IdemError | None = None

    def failed(self, err: IdemError, cause: str | None = None) -> None:
        self.cause = cause or cause_of(err)
        if self.original is None:
            self.original = err


def seeded(attempt: tuple[int, str | None] | None) -> Logical:
    """The logical call of a run() that continues a caller's: a front door
    passing on its caller's Idem-Attempt (n, cause) claims as attempt n
    after cause, and its own retries count on from it (rule 9 of the
    front-door contract)."""
    if attempt is None or attempt[0] <= 1:
        return Logical()
    return Logical(attempts=attempt[0] - 1, cause=attempt[1])


@dataclass(frozen=True)
class Call:
    """One HTTP call of the contract."""

    name: str
    method: str
    path: str  # already escaped
    body: bytes | None = None
    query: str = ""


def key_path(key: str, suffix: str = "") -> str:
    return "/v1/keys/" + quote(key, safe="") + suffix


def dumps(v: Any) -> bytes:
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


def lease_seconds(lease: float | None) -> int:
    if lease is None or lease <= 0:
        return 0
    return int(-(-lease // 1))


#: The calls that finish a claim, outside idem's fleet retry budget and the
#: client's per-process one (Core.next_wait).
FINISHING_CALLS = frozenset({"checkpoint", "complete", "release"})


class Core:
    """The state of one client: base URL, token, policy, the retry budget,
    clocks and the hook."""

    def __init__(self, base_url: str, token: TokenSource, policy: RetryPolicy, user_agent: str,
                 on_attempt: Callable[[AttemptInfo], None] | None, monotonic: Callable[[], float],
                 now: Callable[[], datetime], attempt_ids: bool) -> None:
        u = httpx.URL(base_url.rstrip("/"))
        if u.scheme not in ("http", "https"):
            raise ValueError(f"idem base URL {base_url!r}: scheme must be http or https")
        self.base = str(u).rstrip("/")
        self.token = token
        self.policy = policy
        self.budget = RetryBudget(policy)
        self.user_agent = user_agent
        self.on_attempt = on_attempt
        self.monotonic = monotonic
        self.now = now
        self.attempt_ids = attempt_ids

    # -- requests -------------------------------------------------------

    def deadline(self, timeout: float | None) -> float | None:
        """The monotonic deadline of a call with an overall timeout, and at
        most the policy's call_deadline (the presets set one)."""
        cd = self.policy.call_deadline
        if cd is not None and cd > 0 and (timeout is None or cd < timeout):
            timeout = cd
        return None if timeout is None else self.monotonic() + timeout

    def left(self, deadline: float | None) -> float | None:
        return None if deadline is None else deadline - self.monotonic()

    def attempt_timeout(self, deadline: float | None) -> float | None:
        """The policy's per-attempt timeout, cut to the time left."""
        d = self.policy.attempt_timeout
        left = self.left(deadline)
        if left is not None and (d is None or left < d):
            d = max(left, 0.001)
        return d

    def headers(self, call: Call, logical: Logical | None = None) -> dict[str, str]:
        h = {"Accept": "application/json, application/problem+json", "User-Agent": self.user_agent}
        if logical is not None:
            h[HEADER_ATTEMPT] = attempt_header(logical.attempts, logical.cause)
        if call.body is not None:
            h["Content-Type"] = "application/json"
        tok = self.token
        if callable(tok):
            try:
                tok = tok()
            except Exception as e:  # the token source failed: never retried
                raise TokenError(f"idem: {call.name}: get token: {e}") from e
        if tok:
            h["Authorization"] = "Bearer " + tok
        return h

    def url(self, call: Call) -> str:
        return self.base + call.path + ("?" + call.query if call.query else "")

    def answer(self, call: Call, resp: httpx.Response) -> Any:
        """Decode a 2xx answer, or raise ProblemError."""
        if 200 <= resp.status_code < 300:
            if not resp.content:
                return None
            try:
                return json.loads(resp.content)
            except ValueError as e:
                raise InvalidAnswer(f"idem: {call.name}: decode answer: {e}") from e
        raise problem_from(resp.status_code, resp.headers, resp.content, self.now(), self.policy, call.name)

    def transport(self, call: Call, exc: httpx.HTTPError) -> TransportError:
        return transport_error(exc, call.name)

    # -- the retry loop -------------------------------------------------

    def succeeded(self, call: Call, attempt: int, status: int) -> None:
        self.budget.success()
        self.report(AttemptInfo(call.name, call.method, call.path, attempt, status, None, False, 0.0, None, self.budget.left))

    def next_wait(self, call: Call, attempt: int, err: IdemError, deadline: float | None,
                  logical: Logical | None = None) -> float:
        """Decide about a failed attempt: return the wait before the next
        one, or raise err (with give_up set when it was retryable). A retry
        idem's fleet budget refused (429 retry_budget_exhausted) ends the
        call at once with FleetBudgetExhausted and the original cause.

        Not a finishing write's (checkpoint, complete, release): the fleet
        budget does not cover those, and given up they would leave work
        that ran unrecorded, its key in flight, to run again after the
        lease. For them the Idem-Retry-Budget signal is ignored, and an
        older server's refusal is retried after its Retry-After like a
        429, within the deadline and the policy; each admitted claim has
        one of them, so their retries stay bounded (/docs/retries#finishing).
        For the same reason a finishing write neither spends nor is refused
        by the client's own retry budget: bursts of failed claims empty it,
        and a complete given up there is a duplicate run. Its retries stay
        bounded by max_attempts, the deadline and the backoff."""
        status = err.status if isinstance(err, ProblemError) else 0
        p = self.policy
        finishing = call.name in FINISHING_CALLS
        if (isinstance(err, ProblemError) and err.code == RETRY_BUDGET_EXHAUSTED and logical is not None
                and logical.original is not None and not finishing):
            stop = FleetBudgetExhausted(call.name, logical.attempts, logical.cause or "", logical.original, err)
            self.report(AttemptInfo(call.name, call.method, call.path, attempt, status, stop, False, 0.0,
                                    "fleet_budget", self.budget.left))
            raise stop
        if isinstance(err, ProblemError) and err.code == RETRY_BUDGET_EXHAUSTED and not finishing:
            self.report(AttemptInfo(call.name, call.method, call.path, attempt, status, err, False, 0.0, None, self.budget.left))
            raise err  # never retried: more retries are what it refuses
        if logical is not None:
            logical.failed(err)
        if isinstance(err, ProblemError) and err.fleet_budget_spent and p.retryable(err) and not finishing:
            # idem says the fleet budget is spent: a retry would only be
            # refused (an attempt reaching idem all the same), so stop now
            # as for the refusal, with the original cause.
            raise self.fleet_budget_stop(call, attempt, status, err, logical)
        if not p.retryable(err):
            if 0 < status < 500:
                self.budget.success()  # the service answered sensibly: it is healthy
            self.report(AttemptInfo(call.name, call.method, call.path, attempt, status, err, False, 0.0, None, self.budget.left))
            raise err
        ra = err.retry_after if isinstance(err, ProblemError) else 0.0
        wait = p.retry_after_wait(ra) if ra > 0 else p.backoff(attempt - 1)
        give_up = None
        if attempt >= p.max_attempts:
            give_up = "attempts"
        elif not p.fits(self.left(deadline), wait):
            give_up = "deadline"
        elif not finishing and not self.budget.take():
            give_up = "budget"
        self.report(AttemptInfo(call.name, call.method, call.path, attempt, status, err, give_up is None,
                                wait if give_up is None else 0.0, give_up, self.budget.left))
        if give_up is not None:
            err.give_up = give_up
            raise err
        return wait

    def fleet_budget_stop(self, call: Call, attempt: int, status: int, err: ProblemError,
                          logical: Logical | None) -> FleetBudgetExhausted:
        """The error ending a call whose failure said Idem-Retry-Budget:
        exhausted, reported as a give-up of the fleet budget."""
        attempts = logical.attempts if logical is not None else attempt
        cause = (logical.cause if logical is not None else None) or cause_of(err)
        original = (logical.original if logical is not None else None) or err
        stop = FleetBudgetExhausted(call.name, attempts, cause, original, None)
        self.report(AttemptInfo(call.name, call.method, call.path, attempt, status, stop, False, 0.0,
                                "fleet_signal", self.budget.left))
        return stop

    def report(self, info: AttemptInfo) -> None:
        if self.on_attempt is not None:
            self.on_attempt(info)
        if info.error is None or (not info.retry and not info.give_up and 0 < info.status < 500):
            # A success, or a final answer of a healthy service (409, 422, ...) that the caller handles.
            log.debug("idem call answered call=%s method=%s path=%s attempt=%d status=%d error=%s budget_left=%.2f",
                      info.call, info.method, info.path, info.attempt, info.status, info.error, info.budget_left)
            return
        log.warning("idem call attempt failed call=%s method=%s path=%s attempt=%d status=%d error=%s retry=%s wait=%.2fs give_up=%s budget_left=%.2f",
                    info.call, info.method, info.path, info.attempt, info.status, info.error, info.retry,
                    info.wait, info.give_up or "", info.budget_left)

    # -- the calls --------------------------------------------------------

    def claim_call(self, key: str, operation: str, request: Any, fingerprint: str | None, lease: float | None,
                   attempt_id: str | None, wait: float | None = None) -> Call:
        validate_key(key)
        if request is not None and fingerprint is not None:
            raise ValueError("claim: request and fingerprint are mutually exclusive")
        body: dict[str, Any] = {}
        if operation:
            body["operation"] = operation
        if fingerprint is not None:
            body["fingerprint"] = fingerprint
        if request is not None:
            body["request"] = request
        if lease_seconds(lease):
            body["lease_seconds"] = lease_seconds(lease)
        if attempt_id is not None:
            body["attempt_id"] = attempt_id
        if wait is not None and wait >= 1:
            body["wait_seconds"] = int(wait)
        return Call("claim", "POST", key_path(key, "/claim"), dumps(body))

    def new_attempt_id(self) -> str | None:
        """A random attempt id for one logical claim, when the client sends them."""
        return uuid.uuid4().hex if self.attempt_ids else None

    @staticmethod
    def claim_result(status: int, headers: httpx.Headers, data: Any) -> ClaimResult:
        """Decode a claim's answer; InvalidAnswer for one that is neither a
        claim (201 in_flight with a fencing token and an attempt) nor a
        replay (200 completed with a response idem can have stored): running
        the function on a claim without a fencing token, or replaying a
        response the server did not send, would do what idempotency
        prevents."""
        check_claim_answer(status, headers, data)
        d: Mapping[str, Any] = data
        replayed = status == 200
        try:
            record = Record.from_json(d)
        except ValueError as e:
            raise InvalidAnswer(f"idem: claim: the {status} answer to a claim has a response that cannot be decoded: {e}") from e
        lease_left = replay_left = 0.0
        if headers.get("Date"):
            try:
                at = email.utils.parsedate_to_datetime(headers["Date"])
                if record.lease_expires_at is not None:
                    lease_left = max((record.lease_expires_at - at).total_seconds(), 0.0)
                if replayed and record.replay_until is not None:
                    replay_left = max((record.replay_until - at).total_seconds() - 1.0, 0.0)
            except (TypeError, ValueError):
                lease_left = replay_left = 0.0
        return ClaimResult(record=record, resumed=bool(d.get("resumed")), replayed=replayed,
                           wait_applied=max(prefer_wait(headers.get_list(HEADER_PREFERENCE_APPLIED)), 0), lease_left=lease_left,
                           replay_left=replay_left)

    @staticmethod
    def checkpoint_call(key: str, fencing_token: int, recovery_point: str, data: Any, lease: float | None) -> Call:
        validate_key(key)
        body: dict[str, Any] = {"fencing_token": fencing_token, "recovery_point": recovery_point}
        if data is not None:
            body["data"] = data
        if lease_seconds(lease):
            body["lease_seconds"] = lease_seconds(lease)
        return Call("checkpoint", "POST", key_path(key, "/checkpoint"), dumps(body))

    @staticmethod
    def complete_call(key: str, fencing_token: int, response: Response) -> Call:
        validate_key(key)
        return Call("complete", "POST", key_path(key, "/complete"),
                    dumps({"fencing_token": fencing_token, "response": response.to_wire()}))

    @staticmethod
    def release_call(key: str, fencing_token: int) -> Call:
        validate_key(key)
        return Call("release", "POST", key_path(key, "/release"), dumps({"fencing_token": fencing_token}))

    @staticmethod
    def get_call(key: str) -> Call:
        validate_key(key)
        return Call("get key", "GET", key_path(key))

    @staticmethod
    def list_call(state: str | None, limit: int | None, cursor: str | None) -> Call:
        q: dict[str, str] = {}
        if state:
            q["state"] = state
        if limit:
            q["limit"] = str(limit)
        if cursor:
            q["cursor"] = cursor
        return Call("list keys", "GET", "/v1/keys", query=urlencode(q))

    @staticmethod
    def key_page(data: Any) -> KeyPage:
        d = data if isinstance(data, dict) else {}
        return KeyPage(items=[Record.from_json(r) for r in d.get("items") or []], next_cursor=str(d.get("next_cursor") or ""))

    # -- the in-flight wait of run() -----------------------------------------

    def server_wait(self, waited: float, deadline: float | None, no_wait: bool, wait: float | None = None) -> float:
        """How long run()'s next claim asks the server to hold it while
        another request holds the key (wait_seconds): what is left of
        policy.in_flight_wait after ``waited`` - or with ``no_wait`` the
        caller's own ``wait`` (a front door passing on Prefer: wait=N) -
        within the attempt timeout (and so the deadline) less a second for
        the answer to come back, in whole seconds; 0 (not sent) when not
        even one second fits, or when in_flight_wait is None (with
        ``no_wait``: without ``wait``)."""
        p = self.policy
        if no_wait:
            if wait is None or wait <= 0:
                return 0.0
            d = wait
        elif p.in_flight_wait is None:
            return 0.0
        else:
            d = p.in_flight_wait - waited
        at = self.attempt_timeout(deadline)
        if at is not None:
            d = min(d, at - 1)
        return float(math.floor(d)) if d >= 1 else 0.0

    def in_flight_wait(self, err: IdemError, waited: float, deadline: float | None, no_wait: bool,
                       logical: Logical | None = None) -> float:
        """Decide about a failed claim of run(): return the wait before
        claiming again when another holder has the key (409
        request_in_flight: the server did not hold the claim, or its hold
        ran out) and the wait fits the in-flight limit and the deadline;
        else raise err. ``waited`` includes the time the server held
        run()'s claims."""
        p = self.policy
        if not isinstance(err, ProblemError) or err.code != REQUEST_IN_FLIGHT or no_wait or p.in_flight_wait is None:
            raise err
        if logical is not None:
            logical.failed(err, "in-flight")
        if err.fleet_budget_spent:  # no claim after a wait either
            raise self.fleet_budget_stop(Call("claim", "POST", ""), logical.attempts if logical else 1, err.status, err, logical)
        ra = err.retry_after if err.retry_after > 0 else p.base_delay
        wait = p.retry_after_wait(ra)
        if waited + wait > p.in_flight_wait:
            err.give_up = "in_flight_wait"
            raise err
        if not p.fits(self.left(deadline), wait):
            err.give_up = "deadline"
            raise err
        log.debug("idem key in flight elsewhere; waiting %.2fs", wait)
        return wait

    def finish_deadline(self, deadline: float | None) -> float | None:
        """The deadline of complete/release after the function ran: the
        call's, but at least a fresh attempt timeout from now - the outcome
        of work already done is worth recording (lost, it would leave the key
        in flight for the next run to run the function again)."""
        if deadline is None:
            return None
        return max(deadline, self.monotonic() + (self.policy.attempt_timeout or 10.0))


def _positive_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def check_claim_answer(status: int, headers: httpx.Headers, data: Any) -> None:
    """Raise InvalidAnswer unless (status, data) is a claim or a replay the
    client can act on (see Core.claim_result)."""
    def bad(why: str) -> InvalidAnswer:
        return InvalidAnswer(f"idem: claim: the {status} answer to a claim {why}")
    if status not in (200, 201):
        raise bad("is neither a claim (201) nor a replay (200)")
    if not isinstance(data, dict):
        raise bad("is not a JSON object")
    state = data.get("state")
    if status == 201:
        if headers.get("Idempotent-Replayed") == "true":
            raise bad("is marked Idempotent-Replayed")
        if state != "in_flight":
            raise bad(f"has state {state!r}, not in_flight")
        if not _positive_int(data.get("fencing_token")):
            raise bad("has no fencing token")
        if not _positive_int(data.get("attempt")):
            raise bad("has no attempt")
        return
    if state != "completed":
        raise bad(f"has state {state!r}, not completed")
    resp = data.get("response")
    if not isinstance(resp, dict):
        raise bad("replays no stored response")
    st = resp.get("status")
    if not (isinstance(st, int) and not isinstance(st, bool) and 100 <= st <= 599):
        raise bad(f"replays a response of status {st!r}")


def lease_length(requested: float | None, cr: ClaimResult, now: datetime) -> float:
    """The lease the keeper maintains: the one asked for, else the lease the
    server granted on its own clock (cr.lease_left: up to a second more than
    the truth, a third of it still renews in time), else what the record
    says is left by this host's clock, else 30 s."""
    if requested is not None and requested > 0:
        return requested
    if cr.lease_left > 0:
        return cr.lease_left
    record = cr.record
    if record.lease_expires_at is not None:
        left = (record.lease_expires_at - now).total_seconds()
        if left > 0:
            return left
    return 30.0


def wall_now() -> datetime:
    return datetime.now(timezone.utc)


def is_lease_lost(err: BaseException) -> bool:
    from ._errors import KEY_NOT_FOUND, LEASE_LOST

    return isinstance(err, ProblemError) and err.code in (LEASE_LOST, KEY_NOT_FOUND)



class ClaimState:
    """What Claim and AsyncClaim hold alike: the claim's identity, the
    recovery point an earlier attempt left, and the point the lease keeper
    renews with. Each adds its own lock, lease_lost event and I/O."""

    def __init__(self, key: str, cr: ClaimResult, lease: float | None, renewed: float) -> None:
        self.key = key
        self.fencing_token = cr.record.fencing_token
        #: 1 for a fresh claim, more after takeovers.
        self.attempt = cr.record.attempt
        #: True when this claim took over an orphaned one: see recovery_point.
        self.resumed = cr.resumed
        start = cr.record.recovery_point
        #: The last recovery point the earlier attempt saved ("" when none).
        self.recovery_point = "" if start == RENEWAL_POINT else start
        #: The JSON saved with recovery_point (None when none).
        self.recovery_data: Any = None if start == RENEWAL_POINT else cr.record.recovery_data
        #: Set when the claim is idem's completer resuming an orphaned key (a
        #: resume endpoint, idem.wsgi / idem.asgi): the call's key, operation,
        #: attempt, deadline. run() never sets it, so a function can tell the
        #: two apart, though it seldom needs to: the recovery point says what
        #: is done. In a resume, attempt is the completer's, 1-based.
        self.resume: ResumeCall | None = None
        self._lease = lease
        self._point, self._data = start, cr.record.recovery_data
        self._renewed = renewed


def replayed_result(res: ClaimResult) -> RunResult:
    """run()'s answer for a claim that replayed a completed request."""
    rec = res.record
    return RunResult(rec.response or Response(status=0), True, res.resumed, rec.attempt, rec.fencing_token, res.wait_applied,
                     res.replay_left)


def has_no_side_effect(err: BaseException, types: tuple[type[BaseException], ...]) -> bool:
    """Whether fn's exception says it left no side effect (NoSideEffect or
    one of run()'s no_side_effect types), so run() releases the key."""
    return isinstance(err, NoSideEffect) or bool(types and isinstance(err, types))
