"""The sync client and run() against the real server, on both stores."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

import idem
from conftest import Server, _cli, claim_waiters, new_key, wait_for
from faultproxy import FaultProxy, first_answer_to
from idem import Claim, Client, NoSideEffect, ProblemError, Response


@pytest.fixture
def client(server: Server) -> Any:
    with Client(server.url, token=server.token) as c:
        yield c


def test_claim_complete_replay(client: Client) -> None:
    key = new_key()
    cr = client.claim(key, operation="POST /v1/payments", request={"amount": 1000, "currency": "usd"})
    assert not cr.replayed and cr.record.state == "in_flight" and cr.record.fencing_token > 0
    binary = bytes([0xFF, 0x00, 0x01])
    rec = client.complete(key, cr.record.fencing_token, Response(201, {"Content-Type": "application/octet-stream"}, binary))
    assert rec.state == "completed"
    again = client.claim(key, operation="POST /v1/payments", request={"currency": "usd", "amount": 1000})
    assert again.replayed
    assert again.record.response == Response(201, {"Content-Type": "application/octet-stream"}, binary)
    got = client.get(key)
    assert got.state == "completed" and got.response is not None and got.response.body == binary


def test_mismatch_and_in_flight(client: Client) -> None:
    key = new_key()
    client.claim(key, operation="op", request={"a": 1}, lease=5)
    with pytest.raises(ProblemError) as ei:
        client.claim(key, operation="op", request={"a": 2})
    assert ei.value.status == 422 and ei.value.code == "fingerprint_mismatch" and ei.value.give_up is None
    with pytest.raises(ProblemError) as ei:
        client.claim(key, operation="op", request={"a": 1})
    assert ei.value.status == 409 and ei.value.code == "request_in_flight"
    assert 1 <= ei.value.retry_after <= 5 and ei.value.retryable


def test_invalid_key_is_local(client: Client) -> None:
    with pytest.raises(idem.InvalidKeyError):
        client.claim("a b", operation="op")


def test_run_once_then_replay(client: Client) -> None:
    key = new_key()
    calls = []

    def work(claim: Claim) -> Response:
        calls.append(claim.fencing_token)
        claim.checkpoint("charged", {"charge": "ch_1"})
        return Response(201, {"Content-Type": "application/json"}, b'{"id":"ord_1"}')

    first = client.run(key, work, operation="POST /orders", request={"order": 1})
    assert not first.replayed and first.response.status == 201
    second = client.run(key, work, operation="POST /orders", request={"order": 1})
    assert second.replayed and second.response == first.response
    assert len(calls) == 1


def test_run_releases_on_no_side_effect(client: Client) -> None:
    key = new_key()
    calls = 0

    class Invalid(ValueError):
        pass

    def bad(claim: Claim) -> Response:
        nonlocal calls
        calls += 1
        raise Invalid("amount must be positive")

    with pytest.raises(Invalid):
        client.run(key, bad, operation="op", no_side_effect=(Invalid,))
    with pytest.raises(ProblemError) as ei:
        client.get(key)
    assert ei.value.code == "key_not_found"

    def refuse(claim: Claim) -> Response:
        raise NoSideEffect("declined before charging")

    with pytest.raises(NoSideEffect):
        client.run(key, refuse, operation="op")
    done = client.run(key, lambda c: Response(200, body=b"ok"), operation="op")
    assert not done.replayed and calls == 1


def test_run_takes_over_an_orphan_and_resumes(client: Client) -> None:
    key = new_key()
    crashed = client.claim(key, operation="op", lease=1)
    client.checkpoint(key, crashed.record.fencing_token, "charged", {"charge": "ch_9"}, lease=1)
    seen: dict[str, Any] = {}

    def resume(claim: Claim) -> Response:
        seen.update(resumed=claim.resumed, point=claim.recovery_point, data=claim.recovery_data, attempt=claim.attempt)
        return Response(201, body=b"done")

    start = time.monotonic()
    res = client.run(key, resume, operation="op", timeout=15)
    assert seen == {"resumed": True, "point": "charged", "data": {"charge": "ch_9"}, "attempt": 2}
    assert res.resumed and res.fencing_token > crashed.record.fencing_token
    assert time.monotonic() - start < 10


def test_lease_keeper_holds_the_key(client: Client) -> None:
    key = new_key()
    seen: list[str] = []

    def slow(claim: Claim) -> Response:
        time.sleep(3.2)  # longer than the 2 s lease: only the keeper keeps it
        try:
            client.claim(key, operation="op")
        except ProblemError as e:
            seen.append(e.code)
        return Response(200, body=b"slow")

    res = client.run(key, slow, operation="op", lease=2)
    assert seen == ["request_in_flight"]
    assert not res.replayed and res.attempt == 1


def test_fifty_concurrent_runs_one_execution(client: Client) -> None:
    key = new_key()
    lock = threading.Lock()
    effects = 0

    def work(claim: Claim) -> Response:
        nonlocal effects
        with lock:
            effects += 1
        time.sleep(0.2)
        return Response(201, body=b"charged once")

    def one(_: int) -> idem.RunResult:
        return client.run(key, work, operation="POST /charge", request={"amount": 5}, lease=2, timeout=30)

    with ThreadPoolExecutor(50) as pool:
        results = list(pool.map(one, range(50)))
    assert effects == 1
    assert sum(not r.replayed for r in results) == 1
    assert all(r.response.body == b"charged once" for r in results)


def test_run_waits_on_the_server_for_a_key_in_flight(server: Server, client: Client) -> None:
    # The holder's lease is 30 s, so waiting out its Retry-After would take
    # half a minute: run() asks the server to hold its claim instead and is
    # answered with the replay as soon as the holder completes.
    key = new_key()
    holder = client.claim(key, operation="POST /pay", request={"amount": 9}, lease=30)
    ran: list[int] = []

    def work(claim: Claim) -> Response:
        ran.append(1)
        return Response(201, body=b"not me")

    with ThreadPoolExecutor(1) as pool:
        fut = pool.submit(client.run, key, work, operation="POST /pay", request={"amount": 9}, timeout=30)
        wait_for(lambda: claim_waiters(server) == 1)  # the server holds run()'s claim
        start = time.monotonic()
        client.complete(key, holder.record.fencing_token, Response(201, body=b"paid"))
        res = fut.result(timeout=10)
    assert res.replayed and res.response.body == b"paid" and ran == []
    assert time.monotonic() - start < 5


def test_run_without_waiting_on_the_server(server: Server, client: Client) -> None:
    # no_wait: the claim asks for no hold (the server holds nothing) and
    # run() raises request_in_flight at once.
    key = new_key()
    client.claim(key, operation="op", lease=30)
    start = time.monotonic()
    with pytest.raises(ProblemError) as ei:
        client.run(key, lambda c: Response(200), operation="op", no_wait=True)
    assert ei.value.code == "request_in_flight" and time.monotonic() - start < 5
    assert claim_waiters(server) == 0


def test_retry_after_a_dropped_complete_answer(server: Server) -> None:
    proxy = FaultProxy(("127.0.0.1", int(server.url.rsplit(":", 1)[1])), first_answer_to("complete"))
    waits: list[float] = []
    try:
        with Client(proxy.url, token=server.token, sleep=waits.append) as c:
            key = new_key()
            res = c.run(key, lambda claim: Response(201, body=b"x"), operation="op")
            assert not res.replayed
            assert proxy.dropped == 1 and len(waits) == 1  # one retry after the lost answer
            assert c.get(key).state == "completed"
    finally:
        proxy.close()


@pytest.mark.parametrize("attempt_ids", [True, False])
def test_retry_after_a_dropped_claim_answer(server: Server, attempt_ids: bool) -> None:
    """The claim's answer is lost. With attempt ids (the default) the retry
    gets the lost claim back at once - same fencing token, attempt 1 - well
    inside a deadline shorter than the 30 s lease; without, run() waits the
    lease out (1 s here) and takes over. The function runs once either way."""
    proxy = FaultProxy(("127.0.0.1", int(server.url.rsplit(":", 1)[1])), first_answer_to("claim"))
    effects = 0

    def work(claim: Claim) -> Response:
        nonlocal effects
        effects += 1
        return Response(201, body=b"y")

    try:
        with Client(proxy.url, token=server.token, attempt_ids=attempt_ids) as c:
            key = new_key()
            if attempt_ids:
                res = c.run(key, work, operation="op", lease=30, timeout=8)
                assert res.attempt == 1 and not res.resumed, "the lost claim itself, recovered"
            else:
                res = c.run(key, work, operation="op", lease=1, timeout=20)
                assert res.attempt == 2, "a takeover after the lease"
            assert effects == 1 and proxy.dropped == 1 and not res.replayed
            assert c.run(key, work, operation="op").replayed and effects == 1
    finally:
        proxy.close()


def test_attempt_id_edge_cases(client: Client) -> None:
    """The same attempt id gets the same attempt back; another attempt id
    (or the fresh one claim() makes when none is given) still gets 409; another request under the same attempt id is
    a mismatch; after the lease even the same id takes over with a new
    token."""
    key = new_key()
    first = client.claim(key, operation="op", request={"a": 1}, lease=1, attempt_id="att-1")
    again = client.claim(key, operation="op", request={"a": 1}, lease=1, attempt_id="att-1")  # renews the lease from now
    assert not again.replayed and again.record.fencing_token == first.record.fencing_token and again.record.attempt == 1
    for other in ("att-2", None):
        with pytest.raises(ProblemError) as ei:
            client.claim(key, operation="op", request={"a": 1}, attempt_id=other)
        assert ei.value.code == "request_in_flight"
    with pytest.raises(ProblemError) as ei:
        client.claim(key, operation="op", request={"a": 2}, attempt_id="att-1")
    assert ei.value.code == "fingerprint_mismatch"
    time.sleep(1.3)  # the 1 s lease runs out
    late = client.claim(key, operation="op", request={"a": 1}, attempt_id="att-1")
    assert late.record.fencing_token > first.record.fencing_token and late.resumed and late.record.attempt == 2


def test_budget_stops_retries_against_a_dead_server() -> None:
    waits: list[float] = []
    with Client("http://127.0.0.1:1", token="t", sleep=waits.append) as c:
        for _ in range(6):
            with pytest.raises(idem.TransportError):
                c.get("k")
        assert len(waits) == 10  # 6 calls x 2 retries wanted, the budget paid for 10
        assert c.retry_budget_left < 1


class _CompleteFailsOnce(httpx.HTTPTransport):
    """The real server, but the first complete meets a store hiccup: 503
    store_unavailable with Retry-After: 1 (the server never sees it)."""

    failed = False

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/complete") and not self.failed:
            self.failed = True
            return httpx.Response(503, headers={"Content-Type": "application/problem+json", "Retry-After": "1"},
                                  json={"code": "store_unavailable", "status": 503, "retryable": True})
        return super().handle_request(request)


def test_complete_outlives_a_deadline_fn_nearly_spent(server: Server) -> None:
    # fn leaves 0.3 s of a 1.5 s deadline; its complete must be retried after
    # Retry-After: 1. Before, the retry did not fit the deadline: the response
    # was lost and the key stayed in flight for the next run to run fn again.
    key = new_key()
    with Client(server.url, token=server.token, http=httpx.Client(transport=_CompleteFailsOnce())) as c:
        end = time.monotonic() + 1.5

        def work(claim: Claim) -> Response:
            time.sleep(max(end - time.monotonic() - 0.3, 0))
            return Response(201, body=b"late")

        res = c.run(key, work, operation="POST /orders", request={"n": 8}, timeout=1.5)
        assert not res.replayed
    with Client(server.url, token=server.token) as fresh:
        assert fresh.get(key).state == "completed"


@pytest.mark.parametrize("skew", [-10.0, 10.0])
def test_lease_keeper_ignores_clock_skew(server: Server, binary: str, skew: float) -> None:
    # The tenant's default lease is 1 s and this host's wall clock is 10 s
    # off the server's. Before, the keeper read the lease as lease_expires_at
    # less this host's time (11 s, or spent and so 30 s): its first renewal
    # came after the lease had run out and another request took the key over
    # and ran the work a second time. The work waits (at most 3 s) until the
    # keeper's first renewal reaches the server, which must come while the
    # lease still runs (a third of it, about 0.5 s), and another claim then
    # finds the key in flight.
    from datetime import timedelta

    from idem._core import RENEWAL_POINT, wall_now

    tenant = "brief-" + new_key("t")[-8:]
    _cli(binary, server.env, "tenant", "create", tenant, "--lease-seconds-default", "1")
    token = _cli(binary, server.env, "token", "--tenant", tenant, "--scope", "keys:write", "--ttl", "1h")
    key = new_key("skew")
    runs: list[int] = []

    with Client(server.url, token=token, now=lambda: wall_now() + timedelta(seconds=skew)) as skewed, \
            Client(server.url, token=token) as other:
        def work(claim: Claim) -> Response:
            runs.append(1)
            end = time.monotonic() + 3
            while (rec := other.get(key)).recovery_point != RENEWAL_POINT:
                assert time.monotonic() < end, "the keeper did not renew the 1 s lease"
                time.sleep(0.02)
            assert rec.state == "in_flight", "renewed before the lease ran out"
            with pytest.raises(ProblemError) as ei:
                other.claim(key, operation="POST /reports", request={"n": 1})
            assert ei.value.code == "request_in_flight", "the keeper renewed the lease: no takeover"
            return Response(201, body=b"once")

        assert not skewed.run(key, work, operation="POST /reports", request={"n": 1}).replayed
    assert runs == [1]
