"""The synchronous client."""

from __future__ import annotations

import os
import socket
import threading
import time
from datetime import datetime
from typing import Any, Callable

import httpx

from ._core import (RENEWAL_POINT, AttemptInfo, Call, ClaimState, Core, Logical, TokenSource, has_no_side_effect,
                    is_lease_lost, lease_length, replayed_result, seeded, wall_now)
from ._errors import KEY_NOT_FOUND, IdemError, ProblemError
from ._keys import validate_key
from ._pool import sync_transport
from ._retry import RetryPolicy
from ._types import ClaimResult, KeyPage, Record, Response, RunResult

_USER_AGENT = "idem-python-client/0.1"

#: The connection pool of the httpx.Client a Client makes itself: up to 100
#: connections, all of them kept alive between calls (httpx keeps only 20 by
#: default, so a client driven by more threads than that would close and
#: reopen connections at every call).
POOL_LIMITS = httpx.Limits(max_connections=100, max_keepalive_connections=100, keepalive_expiry=30.0)


class LeaseLost(IdemError):
    """The claim's lease was lost while the function ran: someone took the
    key over (stale fencing token) or no renewal succeeded for a whole
    lease. ``__cause__`` holds the reason."""

    @property
    def code(self) -> str:
        return "lease_lost"


class Claim(ClaimState):
    """The handle the function run by ``Client.run`` receives: the claim's
    identity, the recovery point an earlier attempt left, and checkpoint()."""

    def __init__(self, client: Client, key: str, cr: ClaimResult, lease: float | None) -> None:
        super().__init__(key, cr, lease, client._core.monotonic())
        self._client = client
        self._lock = threading.Lock()
        #: Set when the lease is lost; a long function should check it between steps.
        self.lease_lost = threading.Event()

    def checkpoint(self, name: str, data: Any = None) -> None:
        """Save a recovery point (a phase name and optional JSON data) under
        the claim's fencing token, and renew the lease. Call it right after
        each external step, so that a takeover resumes after the step
        instead of repeating it. A stale token raises ProblemError lease_lost."""
        with self._lock:
            self._save(name, data, None)

    def _renew(self, deadline: float) -> None:
        with self._lock:
            self._save(self._point or RENEWAL_POINT, self._data, deadline)

    def _save(self, point: str, data: Any, deadline: float | None) -> None:
        c = self._client
        c._call(c._core.checkpoint_call(self.key, self.fencing_token, point, data, self._lease), deadline)
        self._point, self._data = point, data
        self._renewed = c._core.monotonic()

    def _since_renewed(self) -> float:
        with self._lock:
            return self._client._core.monotonic() - self._renewed


class Client:
    """A client of one idem service, safe for use from many threads; all
    its calls share one retry budget.

    Every call runs the retry contract of the docs: only the allowlist is
    retried (transport failures, 408, 429, 502, 503, 504; 500 with
    ``RetryPolicy.retry_500``), full jitter with base 1 s and cap 30 s,
    Retry-After honoured, at most 3 attempts, one overall deadline
    (``timeout``, seconds, never reset per attempt) and a per-client retry
    budget of 10 tokens.

    Every claim carries a random ``attempt_id``, the same for all retries of
    one logical claim (one ``claim()`` or ``run()`` call): a claim whose
    answer was lost gets its own attempt back on the retry instead of
    waiting out its own lease behind 409 request_in_flight.
    ``attempt_ids=False`` turns that off (for a server older than the
    attempt_id contract).

    ``token`` is a bearer token or a function returning one per attempt;
    ``http`` an httpx.Client of your own (retries off in its transport:
    only one layer retries); ``on_attempt`` is called after every attempt;
    ``sleep``, ``monotonic`` and ``now`` replace the clocks in tests."""

    def __init__(self, base_url: str, *, token: TokenSource = None, policy: RetryPolicy | None = None,
                 http: httpx.Client | None = None, user_agent: str = _USER_AGENT,
                 on_attempt: Callable[[AttemptInfo], None] | None = None,
                 sleep: Callable[[float], None] = time.sleep, monotonic: Callable[[], float] = time.monotonic,
                 now: Callable[[], datetime] = wall_now, attempt_ids: bool = True) -> None:
        self._core = Core(base_url, token, policy or RetryPolicy(), user_agent, on_attempt, monotonic, now, attempt_ids)
        self._own_http = http is None
        self._http = http or httpx.Client(limits=POOL_LIMITS, transport=sync_transport(POOL_LIMITS))
        self._sleep = sleep
        self._watchdog = _Watchdog()

    @property
    def policy(self) -> RetryPolicy:
        """The client's retry policy."""
        return self._core.policy

    @property
    def retry_budget_left(self) -> float:
        """Tokens left in the client-wide retry budget (inf when off)."""
        return self._core.budget.left

    def close(self) -> None:
        """Close the HTTP connections (only those of a client made here)."""
        if self._own_http:
            self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, call: Call, deadline: float | None,
                    logical: Logical | None = None) -> tuple[int, httpx.Headers, Any]:
        core = self._core
        logical = logical or Logical()
        attempt = 0
        while True:
            attempt += 1
            logical.attempts += 1
            try:
                headers = core.headers(call, logical)
                try:
                    resp = self._send(call.method, core.url(call), call.body, headers, core.attempt_timeout(deadline))
                except httpx.HTTPError as e:
                    raise core.transport(call, e) from e
                data = core.answer(call, resp)
            except IdemError as err:
                wait = core.next_wait(call, attempt, err, deadline, logical)
                self._sleep(wait)
                continue
            core.succeeded(call, attempt, resp.status_code)
            return resp.status_code, resp.headers, data

    def _send(self, method: str, url: str, body: bytes | None, headers: dict[str, str],
              timeout: float | None) -> httpx.Response:
        """Send one attempt and read its whole answer within ``timeout``
        seconds of wall-clock time (None: no bound).

        httpx's timeouts bound each socket operation, not the attempt: a
        server that sends its headers and then a byte every few seconds
        never trips the read timeout, and a 12 s call took 32 s. So the
        client's watchdog thread shuts the attempt's connection down when
        ``timeout`` runs out (shutdown wakes the read blocked here at once),
        and the attempt fails with httpx.TimeoutException, retryable like
        every timeout. The I/O stays on the calling thread: no thread
        handoff per call."""
        if timeout is None:
            return self._http.request(method, url, content=body, headers=headers)
        watch = self._watchdog.watch(timeout)
        request = self._http.build_request(method, url, content=body, headers=headers, timeout=timeout,
                                           extensions={"trace": watch.trace})
        try:
            resp = self._http.send(request, stream=True)
            try:
                watch.add(resp.extensions.get("network_stream"))
                resp.read()
            finally:
                # Off the watchdog before the connection goes back to the
                # pool: it must not shut down one another call took.
                self._watchdog.done(watch)
                resp.close()
        except httpx.HTTPError as e:
            if watch.expired:
                raise httpx.TimeoutException(f"no whole answer within the attempt timeout of {timeout:.3f} s",
                                             request=request) from e
            raise
        finally:
            self._watchdog.done(watch)
        return resp

    # -- the calls of the contract ---------------------------------------------

    def claim(self, key: str, *, operation: str = "", request: Any = None, fingerprint: str | None = None,
              lease: float | None = None, attempt_id: str | None = None, wait: float | None = None,
              timeout: float | None = None) -> ClaimResult:
        """Claim key for a request (POST /v1/keys/{key}/claim): a fresh claim
        or takeover, or a replay of a completed request (replayed True). A
        held key raises ProblemError request_in_flight (retry_after = the
        lease left); another request under the key fingerprint_mismatch.
        ``wait`` asks the server to hold the claim while another request
        holds the key, until it completes (the replay), releases or loses
        its lease (this claim gets the key): at most ``wait`` seconds,
        rounded down to whole seconds (under 1: not sent) and capped by the
        tenant's max_wait_seconds; keep it below the attempt timeout.
        ``request`` is any JSON value the server fingerprints; most callers
        want run() instead."""
        call = self._core.claim_call(key, operation, request, fingerprint, lease, attempt_id or self._core.new_attempt_id(), wait)
        status, headers, data = self._call(call, self._core.deadline(timeout))
        return self._core.claim_result(status, headers, data)

    def checkpoint(self, key: str, fencing_token: int, recovery_point: str, data: Any = None, *,
                   lease: float | None = None, timeout: float | None = None) -> Record:
        """Save a recovery point on a claimed key and renew its lease."""
        _, _, out = self._call(self._core.checkpoint_call(key, fencing_token, recovery_point, data, lease), self._core.deadline(timeout))
        return Record.from_json(out)

    def complete(self, key: str, fencing_token: int, response: Response, *, timeout: float | None = None) -> Record:
        """Store the response of a claimed key and end the claim; repeating
        it with the same token and response is a no-op."""
        _, _, out = self._call(self._core.complete_call(key, fencing_token, response), self._core.deadline(timeout))
        return Record.from_json(out)

    def release(self, key: str, fencing_token: int, *, timeout: float | None = None) -> None:
        """Remove a claimed key whose attempt left no side effect."""
        self._call(self._core.release_call(key, fencing_token), self._core.deadline(timeout))

    def get(self, key: str, *, timeout: float | None = None) -> Record:
        """The full record of key; an absent key raises key_not_found."""
        _, _, out = self._call(self._core.get_call(key), self._core.deadline(timeout))
        return Record.from_json(out)

    def list_keys(self, *, state: str | None = None, limit: int | None = None, cursor: str | None = None,
                  timeout: float | None = None) -> KeyPage:
        """One page of the tenant's records, newest first."""
        _, _, out = self._call(self._core.list_call(state, limit, cursor), self._core.deadline(timeout))
        return self._core.key_page(out)

    # -- the lifecycle helper ----------------------------------------------------

    def run(self, key: str, fn: Callable[[Claim], Response], *, operation: str = "", request: Any = None,
            fingerprint: str | None = None, lease: float | None = None, no_wait: bool = False, wait: float | None = None,
            no_side_effect: tuple[type[BaseException], ...] = (), timeout: float | None = None,
            attempt: tuple[int, str | None] | None = None) -> RunResult:
        """Run fn under the idempotency protocol for key:

        1. Claim the key. Completed already: return the stored response
           (replayed True); fn does not run.
        2. Another caller holds it (409 request_in_flight): wait for it,
           within ``policy.in_flight_wait`` and the deadline, then raise
           request_in_flight; ``no_wait`` raises at once (with ``wait``,
           once the server held the claim that long: a front door passing
           on a caller's Prefer: wait=N; the attempt timeout less a second
           still bounds it, and RunResult / ProblemError.wait_applied say
           what the server applied). Each claim asks
           the server to hold it (wait_seconds: what in_flight_wait, the
           attempt timeout less a second and the deadline leave, in whole
           seconds), so run() gets the replay or the key as soon as the
           holder finishes; when the server answers 409 anyway (its wait ran
           out, it holds too many), run() waits the Retry-After and claims
           again.
        3. Run fn(claim). After a takeover claim.resumed is True and
           claim.recovery_point tells where the earlier attempt got to.
        4. Meanwhile a lease keeper renews the lease every third of it; when
           the lease is lost, claim.lease_lost is set.
        5. fn returns a Response: complete the key with it and return it. fn
           raises NoSideEffect (or a type in no_side_effect): release the
           key and re-raise. Any other exception leaves the claim to expire
           into an orphan (fn may have had a side effect) and propagates.

        ``attempt=(n, cause)`` says the call continues a logical call that
        began before this process (a front door passing on its caller's
        Idem-Attempt): the first claim says attempt n after cause, and the
        retries count on from it, so idem's fleet retry budget counts the
        caller's retry.
        """
        core = self._core
        validate_key(key)
        deadline = core.deadline(timeout)
        attempt_id = core.new_attempt_id()
        waited = 0.0
        logical = seeded(attempt)  # one logical call, in-flight waits included
        while True:
            start = core.monotonic()
            try:
                call = core.claim_call(key, operation, request, fingerprint, lease, attempt_id,
                                       core.server_wait(waited, deadline, no_wait, wait))
                cr = self._call(call, deadline, logical)
                break
            except IdemError as err:
                waited += core.monotonic() - start  # the server may have held the claim
                wait = core.in_flight_wait(err, waited, deadline, no_wait, logical)
                self._sleep(wait)
                waited += wait
        res = core.claim_result(*cr)
        if res.replayed:
            return replayed_result(res)

        claim = Claim(self, key, res, lease)
        length = lease_length(lease, res, core.now())
        stop = threading.Event()
        keeper = threading.Thread(target=self._keep_lease, args=(claim, length, stop), name="idem-lease-keeper", daemon=True)
        keeper.start()
        try:
            resp = fn(claim)
        except BaseException as err:
            stop.set()
            keeper.join()
            if has_no_side_effect(err, no_side_effect):
                try:
                    self.release(key, claim.fencing_token, timeout=core.left(core.finish_deadline(deadline)))
                except ProblemError as rerr:
                    if rerr.code != KEY_NOT_FOUND:
                        raise rerr from err
                raise
            if claim.lease_lost.is_set():
                raise LeaseLost(f"idem: run {key!r}: lease lost while the function ran") from err
            raise
        stop.set()
        keeper.join()
        self.complete(key, claim.fencing_token, resp, timeout=core.left(core.finish_deadline(deadline)))
        return RunResult(resp, False, res.resumed, claim.attempt, claim.fencing_token, res.wait_applied)

    def _keep_lease(self, claim: Claim, lease: float, stop: threading.Event) -> None:
        interval = max(lease / 3, 0.1)
        while not stop.wait(interval):
            try:
                claim._renew(self._core.monotonic() + interval)
            except IdemError as err:
                if is_lease_lost(err) or claim._since_renewed() >= lease:
                    claim.lease_lost.set()
                    return


class _Watch:
    """One attempt of the sync client under the watchdog: its deadline (on
    time.monotonic) and the sockets it uses, so that they can be shut down
    when it runs out of time: the connection it opens (httpcore's trace of
    connect_tcp and start_tls) and the one its answer arrives on (the
    response's network_stream, also for a connection reused from the pool).
    A socket added after the give-up is shut at once."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.expired = False
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []

    def trace(self, event: str, info: dict[str, Any]) -> None:
        if event in ("connection.connect_tcp.complete", "connection.start_tls.complete"):
            self.add(info.get("return_value"))

    def add(self, stream: Any) -> None:
        sock = stream.get_extra_info("socket") if stream is not None else None
        if not isinstance(sock, socket.socket):
            return
        with self._lock:
            self._socks.append(sock)
            if not self.expired:
                return
        _shut(sock)

    def give_up(self) -> None:
        with self._lock:
            self.expired = True
            socks = list(self._socks)
        for sock in socks:
            _shut(sock)


class _Watchdog:
    """The sync client's watchdog: one daemon thread that gives up the
    attempts still running at their deadline. Registering an attempt is a
    lock and a dict insert; the thread wakes only when the earliest
    deadline of the attempts it was told about comes (with the default 10 s
    attempt timeout, about every 10 s under steady traffic), and ends once
    none is left, so an idle or forgotten Client holds no thread."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._cond = threading.Condition()
        self._active: dict[int, _Watch] = {}
        self._wake_at: float | None = None  # None: the thread is not running

    def watch(self, timeout: float) -> _Watch:
        if os.getpid() != self._pid:
            # A forked child (a pre-forking server): the thread, and maybe
            # the holder of the lock, stayed in the parent.
            self._reset()
        w = _Watch(time.monotonic() + timeout)
        with self._cond:
            self._active[id(w)] = w
            if self._wake_at is None:
                self._wake_at = w.deadline
                threading.Thread(target=self._run, name="idem-watchdog", daemon=True).start()
            elif w.deadline < self._wake_at:
                self._wake_at = w.deadline
                self._cond.notify()
        return w

    def done(self, w: _Watch) -> None:
        with self._cond:
            self._active.pop(id(w), None)

    def _run(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                for w in [w for w in self._active.values() if w.deadline <= now]:
                    del self._active[id(w)]
                    w.give_up()
                if not self._active:
                    self._wake_at = None
                    return
                self._wake_at = min(w.deadline for w in self._active.values())
                self._cond.wait(self._wake_at - now)


def _shut(sock: socket.socket) -> None:
    # shutdown, not close: it wakes a recv blocked in another thread.
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
