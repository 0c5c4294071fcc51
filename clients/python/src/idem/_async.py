"""The asyncio client."""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import datetime
from typing import Any, Awaitable, Callable

import httpx

from ._client import _USER_AGENT, POOL_LIMITS, LeaseLost
from ._core import (RENEWAL_POINT, AttemptInfo, Call, ClaimState, Core, Logical, TokenSource, has_no_side_effect,
                    is_lease_lost, lease_length, replayed_result, seeded, wall_now)
from ._errors import KEY_NOT_FOUND, IdemError, ProblemError
from ._keys import validate_key
from ._pool import async_transport
from ._retry import RetryPolicy
from ._types import ClaimResult, KeyPage, Record, Response, RunResult

log = logging.getLogger("idem")


class AsyncClaim(ClaimState):
    """The handle the coroutine run by ``AsyncClient.run`` receives; see
    ``Claim``."""

    def __init__(self, client: AsyncClient, key: str, cr: ClaimResult, lease: float | None) -> None:
        super().__init__(key, cr, lease, client._core.monotonic())
        self._client = client
        self._lock = asyncio.Lock()
        self.lease_lost = asyncio.Event()

    async def checkpoint(self, name: str, data: Any = None) -> None:
        """Save a recovery point and renew the lease; see Claim.checkpoint."""
        async with self._lock:
            await self._save(name, data, None)

    async def _renew(self, deadline: float) -> None:
        async with self._lock:
            await self._save(self._point or RENEWAL_POINT, self._data, deadline)

    async def _save(self, point: str, data: Any, deadline: float | None) -> None:
        c = self._client
        await c._call(c._core.checkpoint_call(self.key, self.fencing_token, point, data, self._lease), deadline)
        self._point, self._data = point, data
        self._renewed = c._core.monotonic()


async def _outlive_cancellation(aw: Awaitable[None]) -> None:
    """Runs aw (the complete or release of work that ran) to its end even
    when the caller's task is cancelled meanwhile (its own timeout, a client
    hanging up): cancelled with it, the outcome would be lost and the key
    left in flight for the next run to run the function again. The caller
    still gets its CancelledError at once; a failure of aw after that is
    logged."""
    task = asyncio.ensure_future(aw)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        if not task.done():
            task.add_done_callback(_log_unrecorded)
        raise


def _log_unrecorded(task: asyncio.Future[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("idem: recording the outcome of a cancelled run failed: %s", task.exception())


async def _asyncio_sleep(d: float) -> None:
    await asyncio.sleep(d)


class AsyncClient:
    """The asyncio twin of Client: the same calls and retry contract, as
    coroutines on httpx.AsyncClient."""

    def __init__(self, base_url: str, *, token: TokenSource = None, policy: RetryPolicy | None = None,
                 http: httpx.AsyncClient | None = None, user_agent: str = _USER_AGENT,
                 on_attempt: Callable[[AttemptInfo], None] | None = None,
                 sleep: Callable[[float], Awaitable[None]] = _asyncio_sleep, monotonic: Callable[[], float] = time.monotonic,
                 now: Callable[[], datetime] = wall_now, attempt_ids: bool = True) -> None:
        self._core = Core(base_url, token, policy or RetryPolicy(), user_agent, on_attempt, monotonic, now, attempt_ids)
        self._own_http = http is None
        self._http = http or httpx.AsyncClient(limits=POOL_LIMITS, transport=async_transport(POOL_LIMITS))
        self._sleep = sleep

    @property
    def policy(self) -> RetryPolicy:
        """The client's retry policy."""
        return self._core.policy

    @property
    def retry_budget_left(self) -> float:
        """Tokens left in the client-wide retry budget (inf when off)."""
        return self._core.budget.left

    async def aclose(self) -> None:
        """Close the HTTP connections (only those of a client made here)."""
        if self._own_http:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _call(self, call: Call, deadline: float | None,
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
                    resp = await self._send(call.method, core.url(call), call.body, headers, core.attempt_timeout(deadline))
                except httpx.HTTPError as e:
                    raise core.transport(call, e) from e
                data = core.answer(call, resp)
            except IdemError as err:
                wait = core.next_wait(call, attempt, err, deadline, logical)
                await self._sleep(wait)
                continue
            core.succeeded(call, attempt, resp.status_code)
            return resp.status_code, resp.headers, data

    async def _send(self, method: str, url: str, body: bytes | None, headers: dict[str, str],
                    timeout: float | None) -> httpx.Response:
        """Send one attempt and read its whole answer within ``timeout``
        seconds of wall-clock time (None: no bound). httpx's timeouts bound
        each socket operation, not the attempt (a server that drips its
        answer a byte at a time never trips them), so the whole attempt runs
        under asyncio.timeout; when it runs out the request is cancelled
        (httpcore drops the connection) and the caller gets
        httpx.TimeoutException, retryable like every timeout."""
        if timeout is None:
            return await self._http.request(method, url, content=body, headers=headers)
        request = self._http.build_request(method, url, content=body, headers=headers, timeout=timeout)
        try:
            async with asyncio.timeout(timeout) as scope:
                return await self._http.send(request)
        except TimeoutError as e:
            if not scope.expired():
                raise
            raise httpx.TimeoutException(f"no whole answer within the attempt timeout of {timeout:.3f} s",
                                         request=request) from e

    async def claim(self, key: str, *, operation: str = "", request: Any = None, fingerprint: str | None = None,
                    lease: float | None = None, attempt_id: str | None = None, wait: float | None = None,
                    timeout: float | None = None) -> ClaimResult:
        """See Client.claim."""
        call = self._core.claim_call(key, operation, request, fingerprint, lease, attempt_id or self._core.new_attempt_id(), wait)
        status, headers, data = await self._call(call, self._core.deadline(timeout))
        return self._core.claim_result(status, headers, data)

    async def checkpoint(self, key: str, fencing_token: int, recovery_point: str, data: Any = None, *,
                         lease: float | None = None, timeout: float | None = None) -> Record:
        """See Client.checkpoint."""
        _, _, out = await self._call(self._core.checkpoint_call(key, fencing_token, recovery_point, data, lease), self._core.deadline(timeout))
        return Record.from_json(out)

    async def complete(self, key: str, fencing_token: int, response: Response, *, timeout: float | None = None) -> Record:
        """See Client.complete."""
        _, _, out = await self._call(self._core.complete_call(key, fencing_token, response), self._core.deadline(timeout))
        return Record.from_json(out)

    async def release(self, key: str, fencing_token: int, *, timeout: float | None = None) -> None:
        """See Client.release."""
        await self._call(self._core.release_call(key, fencing_token), self._core.deadline(timeout))

    async def get(self, key: str, *, timeout: float | None = None) -> Record:
        """See Client.get."""
        _, _, out = await self._call(self._core.get_call(key), self._core.deadline(timeout))
        return Record.from_json(out)

    async def list_keys(self, *, state: str | None = None, limit: int | None = None, cursor: str | None = None,
                        timeout: float | None = None) -> KeyPage:
        """See Client.list_keys."""
        _, _, out = await self._call(self._core.list_call(state, limit, cursor), self._core.deadline(timeout))
        return self._core.key_page(out)

    async def run(self, key: str, fn: Callable[[AsyncClaim], Awaitable[Response]], *, operation: str = "",
                  request: Any = None, fingerprint: str | None = None, lease: float | None = None, no_wait: bool = False,
                  wait: float | None = None, no_side_effect: tuple[type[BaseException], ...] = (), timeout: float | None = None,
                  attempt: tuple[int, str | None] | None = None) -> RunResult:
        """See Client.run. When the lease is lost while fn runs, fn's task is
        cancelled and LeaseLost is raised."""
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
                cr = await self._call(call, deadline, logical)
                break
            except IdemError as err:
                waited += core.monotonic() - start  # the server may have held the claim
                wait = core.in_flight_wait(err, waited, deadline, no_wait, logical)
                await self._sleep(wait)
                waited += wait
        res = core.claim_result(*cr)
        if res.replayed:
            return replayed_result(res)

        claim = AsyncClaim(self, key, res, lease)
        length = lease_length(lease, res, core.now())
        work = asyncio.ensure_future(fn(claim))
        keeper = asyncio.ensure_future(self._keep_lease(claim, length, work))
        try:
            resp = await work
        except BaseException as err:
            keeper.cancel()
            await asyncio.gather(keeper, return_exceptions=True)
            if has_no_side_effect(err, no_side_effect):
                try:
                    await _outlive_cancellation(self.release(key, claim.fencing_token,
                                                             timeout=core.left(core.finish_deadline(deadline))))
                except ProblemError as rerr:
                    if rerr.code != KEY_NOT_FOUND:
                        raise rerr from err
                raise
            if claim.lease_lost.is_set():
                raise LeaseLost(f"idem: run {key!r}: lease lost while the function ran") from err
            raise

        async def finish() -> None:
            keeper.cancel()
            await asyncio.gather(keeper, return_exceptions=True)
            await self.complete(key, claim.fencing_token, resp, timeout=core.left(core.finish_deadline(deadline)))

        await _outlive_cancellation(finish())
        return RunResult(resp, False, res.resumed, claim.attempt, claim.fencing_token, res.wait_applied)

    async def _keep_lease(self, claim: AsyncClaim, lease: float, work: asyncio.Future[Response]) -> None:
        interval = max(lease / 3, 0.1)
        while True:
            await asyncio.sleep(interval)
            try:
                await claim._renew(self._core.monotonic() + interval)
            except IdemError as err:
                if is_lease_lost(err) or self._core.monotonic() - claim._renewed >= lease:
                    claim.lease_lost.set()
                    work.cancel()
                    return
