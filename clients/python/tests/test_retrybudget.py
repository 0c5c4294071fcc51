"""The fleet retry budget (issue 28) from the Python SDK, against the real
server binary on both stores: every attempt carries Idem-Attempt with the
cause of the retry; a 429 retry_budget_exhausted ends the call at once with
FleetBudgetError carrying the original cause; the presets."""

from __future__ import annotations

import asyncio
import http.client
import secrets
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator
from urllib.parse import urlsplit

import pytest
from conftest import Server, _cli, start_server

from idem import AsyncClient, Client, FleetBudgetExhausted, ProblemError, RetryPolicy

UNAVAILABLE = (b'{"type":"/docs/errors#store_unavailable","title":"Store unavailable","status":503,'
               b'"detail":"the store does not answer","code":"store_unavailable","retryable":true}')


class FlakyFront:
    """A forwarding proxy in front of the real server that answers the first
    ``fail`` requests 503 store_unavailable itself (as a replica whose store
    is away would; with ``signal``, saying Idem-Retry-Budget: exhausted as
    such a replica does once the tenant's budget is spent) and records the
    Idem-Attempt header of every request. With ``fail_complete``, the first
    so many completes are answered so too, whenever they come."""

    def __init__(self, target: str, fail: int, signal: bool = False, fail_complete: int = 0) -> None:
        self.fail = fail
        self.fail_complete = fail_complete
        self.seen: list[str | None] = []
        self._lock = threading.Lock()
        t = urlsplit(target)
        front = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _any(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with front._lock:
                    front.seen.append(self.headers.get("Idem-Attempt"))
                    failing = front.fail > 0
                    front.fail -= 1 if failing else 0
                    if not failing and self.path.endswith("/complete") and front.fail_complete > 0:
                        failing = True
                        front.fail_complete -= 1
                if failing:
                    self.send_response(503)
                    self.send_header("Content-Type", "application/problem+json")
                    self.send_header("Retry-After", "1")
                    if signal:
                        self.send_header("Idem-Retry-Budget", "exhausted")
                    self.send_header("Content-Length", str(len(UNAVAILABLE)))
                    self.end_headers()
                    self.wfile.write(UNAVAILABLE)
                    return
                conn = http.client.HTTPConnection(t.hostname or "127.0.0.1", t.port, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                conn.request(self.command, self.path, body=body or None, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("content-length", "connection", "transfer-encoding", "date", "server"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                conn.close()

            do_GET = do_POST = _any

        self._srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._srv.server_address[1]}"
        threading.Thread(target=self._srv.serve_forever, daemon=True).start()

    def headers(self) -> list[str | None]:
        with self._lock:
            return list(self.seen)

    def close(self) -> None:
        self._srv.shutdown()
        self._srv.server_close()


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def budget_server(request: pytest.FixtureRequest, binary: str) -> Iterator[tuple[Server, str]]:
    # A window of an hour: nothing leaves it while the tests run.
    yield from ((s, binary) for s in start_server(binary, request.param, {"IDEM_RETRY_BUDGET_WINDOW": "1h"}))


def tenant(server: Server, binary: str, percent: int) -> str:
    """A new tenant at retry_budget_percent percent, and a token of it."""
    name = "py-" + secrets.token_hex(4)
    _cli(binary, server.env, "tenant", "create", name, "--retry-budget-percent", str(percent))
    return _cli(binary, server.env, "token", "--tenant", name, "--scope", "keys:write keys:read", "--ttl", "2h")


def use_up_floor(server: Server, token: str) -> None:
    """Ten retries reach the server: the floor of a tenant at 0 percent.
    Claims, as the budget covers them (a release's retry it does not)."""
    for i in range(10):
        req = urllib.request.Request(f"{server.url}/v1/keys/warm-{i}/claim", method="POST",
                                     data=b'{"operation":"POST /warm"}',
                                     headers={"Authorization": "Bearer " + token, "Content-Type": "application/json",
                                              "Idem-Attempt": "2;cause=timeout"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.status == 201  # served, not 429


FAST = RetryPolicy(base_delay=0.01, max_delay=0.02, retry_after_jitter=0.0, max_attempts=5)


def test_every_attempt_says_which_it_is(budget_server: tuple[Server, str]) -> None:
    server, binary = budget_server
    front = FlakyFront(server.url, fail=2)
    try:
        with Client(front.url, token=tenant(server, binary, 100), policy=FAST) as c:
            cr = c.claim("order-1", operation="POST /orders", request={"n": 1})
            assert cr.record.state == "in_flight"
            assert front.headers() == ["1", "2;cause=unavailable", "3;cause=unavailable"]
            c.complete("order-1", cr.record.fencing_token, __import__("idem").Response(201, {}, b"{}"))
            assert front.headers()[3] == "1", "a new logical call starts at 1"
    finally:
        front.close()


def test_finishing_write_outside_the_process_budget(budget_server: tuple[Server, str]) -> None:
    """With the client's own retry budget empty (one token, spent by a
    claim's retry; the next retry is refused, give_up=budget), a complete
    whose first attempt fails 503 store_unavailable is retried and stored:
    the record is completed and replays. Before the fix the complete was
    given up (give_up=budget), the work ran unrecorded and its key stayed
    in flight, to run again after the lease; sync and async."""
    from idem import AttemptInfo, Response

    server, binary = budget_server
    token = tenant(server, binary, 100)  # the fleet budget is no part of this
    policy = RetryPolicy(base_delay=0.01, max_delay=0.02, retry_after_jitter=0.0, max_attempts=5,
                         budget_capacity=1.0, budget_retry_cost=1.0, budget_success_refund=0.1)
    ok = Response(201, {"Content-Type": "application/json"}, b'{"id":"ord_1"}')
    infos: list[AttemptInfo] = []

    def drain(claim: object) -> None:
        with pytest.raises(ProblemError) as info:
            claim("drain", operation="POST /orders")  # type: ignore[operator]
        assert info.value.give_up == "budget", "the process budget is empty"

    front = FlakyFront(server.url, fail=2, fail_complete=1)
    try:
        with Client(front.url, token=token, policy=policy, on_attempt=infos.append) as c:
            drain(c.claim)
            runs: list[int] = []
            res = c.run("order-1", lambda claim: runs.append(1) or ok, operation="POST /orders")
            assert not res.replayed and runs == [1]
            completes = [i for i in infos if i.call == "complete"]
            assert [(i.status, i.retry, i.give_up) for i in completes] == [(503, True, None), (200, False, None)]
            assert front.headers()[-2:] == ["1", "2;cause=unavailable"]
            rec = c.get("order-1")
            assert rec.state == "completed" and rec.fencing_token == res.fencing_token
            again = c.run("order-1", lambda claim: runs.append(1) or ok, operation="POST /orders")
            assert again.replayed and again.response.body == b'{"id":"ord_1"}' and runs == [1], "the work ran once"
    finally:
        front.close()

    front = FlakyFront(server.url, fail=2, fail_complete=1)

    async def go() -> None:
        async with AsyncClient(front.url, token=token, policy=policy) as ac:
            with pytest.raises(ProblemError) as info:
                await ac.claim("drain", operation="POST /orders")
            assert info.value.give_up == "budget", "the process budget is empty"
            cr = await ac.claim("order-2", operation="POST /orders")
            await ac.complete("order-2", cr.record.fencing_token, ok)
            assert (await ac.get("order-2")).state == "completed"

    try:
        asyncio.run(go())
    finally:
        front.close()


def test_budget_refusal_stops_the_call_with_the_original_cause(budget_server: tuple[Server, str]) -> None:
    server, binary = budget_server
    token = tenant(server, binary, 0)
    use_up_floor(server, token)
    front = FlakyFront(server.url, fail=1)
    try:
        with Client(front.url, token=token, policy=FAST) as c:
            with pytest.raises(FleetBudgetExhausted) as info:
                c.claim("order-1", operation="POST /orders", request={"n": 1})
            err = info.value
            assert err.code == "store_unavailable", "the original cause, not the refusal"
            assert err.cause == "unavailable"
            assert err.attempts == 2
            assert isinstance(err.original, ProblemError) and err.original.status == 503
            assert err.refusal.code == "retry_budget_exhausted" and err.refusal.retry_after > 0
            assert front.headers() == ["1", "2;cause=unavailable"], "no attempt after the refusal, though 5 were allowed"
        # The refused retry left the key as it was: a later first attempt claims it.
        with Client(server.url, token=token) as c:
            assert c.claim("order-1", operation="POST /orders", request={"n": 1}).record.state == "in_flight"
    finally:
        front.close()


def test_async_budget_refusal(budget_server: tuple[Server, str]) -> None:
    server, binary = budget_server
    token = tenant(server, binary, 0)
    use_up_floor(server, token)
    front = FlakyFront(server.url, fail=1)

    async def go() -> None:
        async with AsyncClient(front.url, token=token, policy=FAST) as c:
            with pytest.raises(FleetBudgetExhausted) as info:
                await c.claim("order-2", operation="POST /orders", request={"n": 1})
            assert info.value.code == "store_unavailable" and info.value.cause == "unavailable"

    try:
        asyncio.run(go())
        assert front.headers() == ["1", "2;cause=unavailable"]
    finally:
        front.close()


def test_presets(budget_server: tuple[Server, str]) -> None:
    i, b = RetryPolicy.interactive(), RetryPolicy.background()
    assert (i.call_deadline, i.max_attempts, i.budget_capacity) == (10.0, 3, 10.0)
    assert (b.call_deadline, b.max_attempts) == (600.0, 10)
    assert b.budget_capacity is not None and i.budget_capacity is not None and b.budget_capacity > i.budget_capacity
    # The call deadline bounds a call given no timeout: every 503 says
    # Retry-After: 1, longer than the whole call may take, so one attempt.
    server, binary = budget_server
    front = FlakyFront(server.url, fail=1000)
    try:
        p = RetryPolicy(call_deadline=0.3, max_attempts=1000, base_delay=0.01, retry_after_jitter=0.0)
        with Client(front.url, token=tenant(server, binary, 100), policy=p) as c:
            with pytest.raises(ProblemError) as info:
                c.claim("order-1", operation="POST /orders")
            assert info.value.give_up == "deadline"
        assert len(front.headers()) == 1
    finally:
        front.close()


def test_budget_signal_stops_before_any_retry(budget_server: tuple[Server, str]) -> None:
    """A 503 that says Idem-Retry-Budget: exhausted ends the call after that
    one attempt, though 5 were allowed, with the 503 as the original cause."""
    server, binary = budget_server
    front = FlakyFront(server.url, fail=1, signal=True)
    try:
        with Client(front.url, token=tenant(server, binary, 10), policy=FAST) as c:
            with pytest.raises(FleetBudgetExhausted) as info:
                c.claim("order-1", operation="POST /orders", request={"n": 1})
            err = info.value
            assert err.code == "store_unavailable" and err.cause == "unavailable"
            assert err.refusal is None and err.attempts == 1
            assert front.headers() == ["1"], "no retry after the signal"
            assert c.claim("order-1", operation="POST /orders", request={"n": 1}).record.state == "in_flight"
    finally:
        front.close()


def test_run_stops_waiting_on_the_servers_signal(budget_server: tuple[Server, str]) -> None:
    """The real server's 409 request_in_flight says the spent budget once the
    floor's retries are used: run() claims once (counted at the proxy) and
    does not wait to claim again; the holder's claim is untouched."""
    server, binary = budget_server
    token = tenant(server, binary, 0)
    with Client(server.url, token=token) as raw:
        held = raw.claim("held", operation="POST /orders", request={"n": 1})
        use_up_floor(server, token)
        front = FlakyFront(server.url, fail=0)
        try:
            policy = RetryPolicy(base_delay=0.01, max_delay=0.02, retry_after_jitter=0.0, max_attempts=5, in_flight_wait=30.0)
            with Client(front.url, token=token, policy=policy) as c:
                ran = []
                with pytest.raises(FleetBudgetExhausted) as info:
                    c.run("held", lambda claim: ran.append(1) or __import__("idem").Response(201, {}, b"{}"),
                          operation="POST /orders", request={"n": 1})
                assert not ran
                assert info.value.code == "request_in_flight" and info.value.cause == "in-flight"
                assert info.value.refusal is None
            assert len(front.headers()) == 1, "no claim after the signal"

            async def go() -> None:
                async with AsyncClient(front.url, token=token, policy=policy) as ac:
                    async def fn(claim: object) -> object:
                        raise AssertionError("must not run")
                    with pytest.raises(FleetBudgetExhausted):
                        await ac.run("held", fn, operation="POST /orders", request={"n": 1})
            asyncio.run(go())
            assert len(front.headers()) == 2, "one claim of the async run, none after the signal"
        finally:
            front.close()
        assert raw.get("held").state == "in_flight"
        raw.complete("held", held.record.fencing_token, __import__("idem").Response(201, {}, b"{}"))


REFUSED = (b'{"type":"/docs/errors#retry_budget_exhausted","title":"Retry budget exhausted","status":429,'
           b'"detail":"stop retrying this call","code":"retry_budget_exhausted","retryable":true}')


class OldFront:
    """A forwarding proxy in front of the real server that answers the first
    attempt of each finishing write (checkpoint, complete, release) itself,
    as a server of before the fix did during a storm: 503 store_unavailable
    saying Idem-Retry-Budget: exhausted; with ``refuse``, the retry after it
    429 retry_budget_exhausted (Retry-After: 1). It records the
    Idem-Attempt of every finishing write, by call."""

    def __init__(self, target: str, refuse: bool = False) -> None:
        self.seen: dict[str, list[str | None]] = {}
        self._lock = threading.Lock()
        t = urlsplit(target)
        front = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _any(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                call = self.path.rsplit("/", 1)[-1]
                n = 0
                if call in ("checkpoint", "complete", "release"):
                    with front._lock:
                        front.seen.setdefault(call, []).append(self.headers.get("Idem-Attempt"))
                        n = len(front.seen[call])
                if n == 1 or (n == 2 and refuse):
                    data = UNAVAILABLE if n == 1 else REFUSED
                    self.send_response(503 if n == 1 else 429)
                    self.send_header("Content-Type", "application/problem+json")
                    self.send_header("Idem-Retry-Budget", "exhausted")
                    if n == 2:
                        self.send_header("Retry-After", "1")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                conn = http.client.HTTPConnection(t.hostname or "127.0.0.1", t.port, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                conn.request(self.command, self.path, body=body or None, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("content-length", "connection", "transfer-encoding", "date", "server"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                conn.close()

            do_GET = do_POST = _any

        self._srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._srv.server_address[1]}"
        threading.Thread(target=self._srv.serve_forever, daemon=True).start()

    def attempts(self, call: str) -> list[str | None]:
        with self._lock:
            return list(self.seen.get(call, []))

    def close(self) -> None:
        self._srv.shutdown()
        self._srv.server_close()


#: Fast retries; the call deadline turns a refusal of this server (whose
#: Retry-After is the rest of its hour-long window) into an error, not a wait.
FINISH = RetryPolicy(base_delay=0.01, max_delay=0.02, retry_after_jitter=0.0, max_attempts=5, call_deadline=30.0)


def test_finishing_writes_ignore_the_fleet_budget(budget_server: tuple[Server, str]) -> None:
    """With the tenant's fleet budget spent (a claim's retry is refused),
    run()'s checkpoint and complete whose first attempt failed with a 503
    saying Idem-Retry-Budget: exhausted are retried, not given up, and the
    real server serves the retries: the work ran once, its answer is stored
    under the one claim and replays; a release goes through the same way.
    Before the fix the complete raised FleetBudgetExhausted (the work ran,
    unrecorded, its key left to run again after the lease)."""
    from idem import NoSideEffect, Response

    server, binary = budget_server
    token = tenant(server, binary, 0)
    use_up_floor(server, token)
    front = OldFront(server.url)
    runs: list[int] = []

    def fn(claim: object) -> Response:
        runs.append(1)
        claim.checkpoint("charged")  # type: ignore[attr-defined]
        return Response(201, {"Content-Type": "application/json"}, b'{"id":"ord_1"}')

    try:
        with Client(front.url, token=token, policy=FINISH) as c:
            res = c.run("order-1", fn, operation="POST /orders", request={"n": 1})
            assert not res.replayed
            assert front.attempts("checkpoint") == ["1", "2;cause=unavailable"]
            assert front.attempts("complete") == ["1", "2;cause=unavailable"]
            rec = c.get("order-1")
            assert rec.state == "completed" and rec.fencing_token == res.fencing_token
            again = c.run("order-1", fn, operation="POST /orders", request={"n": 1})
            assert again.replayed and again.response.body == b'{"id":"ord_1"}'
            assert runs == [1], "the work ran once"

            def declined(claim: object) -> Response:
                raise NoSideEffect("declined")

            with pytest.raises(NoSideEffect):
                c.run("order-2", declined, operation="POST /orders", request={"n": 1})
            assert front.attempts("release") == ["1", "2;cause=unavailable"]
            with pytest.raises(ProblemError) as info:
                c.get("order-2")
            assert info.value.code == "key_not_found", "released"
    finally:
        front.close()


def test_finishing_write_retries_an_old_refusal(budget_server: tuple[Server, str]) -> None:
    """An older server refuses a complete's retry with 429
    retry_budget_exhausted (the proxy, in front of the real server): the
    client waits its Retry-After and completes; sync and async."""
    from idem import Response

    server, binary = budget_server
    token = tenant(server, binary, 0)
    use_up_floor(server, token)
    front = OldFront(server.url, refuse=True)
    ok = Response(201, {}, b"{}")
    try:
        with Client(front.url, token=token, policy=FINISH) as c:
            res = c.run("order-1", lambda claim: ok, operation="POST /orders")
            assert front.attempts("complete") == ["1", "2;cause=unavailable", "3;cause=throttled"]
            assert c.get("order-1").state == "completed" and not res.replayed

        async def go() -> None:
            async with AsyncClient(front.url, token=token, policy=FINISH) as ac:
                cr = await ac.claim("order-2", operation="POST /orders")
                await ac.complete("order-2", cr.record.fencing_token, ok)
                assert (await ac.get("order-2")).state == "completed"

        with front._lock:
            front.seen.clear()
        asyncio.run(go())
        assert front.attempts("complete") == ["1", "2;cause=unavailable", "3;cause=throttled"]
    finally:
        front.close()
