"""The asyncio client and its run() against the real server, on both stores."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from conftest import Server, claim_waiters, new_key
from faultproxy import FaultProxy, first_answer_to
from idem import AsyncClaim, AsyncClient, LeaseLost, NoSideEffect, ProblemError, Response


def test_async_calls_and_replay(server: Server) -> None:
    async def main() -> None:
        async with AsyncClient(server.url, token=server.token) as c:
            key = new_key()
            cr = await c.claim(key, operation="op", request={"a": 1})
            assert not cr.replayed
            await c.checkpoint(key, cr.record.fencing_token, "step-1", {"n": 1})
            await c.complete(key, cr.record.fencing_token, Response(200, {"Content-Type": "text/plain"}, "héllo".encode()))
            again = await c.claim(key, operation="op", request={"a": 1})
            assert again.replayed and again.record.response == Response(200, {"Content-Type": "text/plain"}, "héllo".encode())
            with pytest.raises(ProblemError) as ei:
                await c.claim(key, operation="op", request={"a": 2})
            assert ei.value.code == "fingerprint_mismatch"
            page = await c.list_keys(limit=5)
            assert any(r.key == key for r in page.items)

    asyncio.run(main())


def test_async_run_waits_on_the_server_for_a_key_in_flight(server: Server) -> None:
    # As the sync test: a 30 s lease, run() answered with the replay as
    # soon as the holder completes because the server held its claim.
    async def main() -> None:
        async with AsyncClient(server.url, token=server.token) as c:
            key = new_key()
            holder = await c.claim(key, operation="POST /pay", request={"amount": 9}, lease=30)
            ran: list[int] = []

            async def work(claim: AsyncClaim) -> Response:
                ran.append(1)
                return Response(201, body=b"not me")

            task = asyncio.ensure_future(c.run(key, work, operation="POST /pay", request={"amount": 9}, timeout=30))
            end = time.monotonic() + 10
            while await asyncio.to_thread(claim_waiters, server) != 1:  # the server holds run()'s claim
                assert time.monotonic() < end and not task.done(), "run()'s claim was not held by the server"
                await asyncio.sleep(0.005)
            start = time.monotonic()
            await c.complete(key, holder.record.fencing_token, Response(201, body=b"paid"))
            res = await asyncio.wait_for(task, 10)
            assert res.replayed and res.response.body == b"paid" and ran == []
            assert time.monotonic() - start < 5

    asyncio.run(main())


def test_async_fifty_concurrent_runs_one_execution(server: Server) -> None:
    effects = 0

    async def work(claim: AsyncClaim) -> Response:
        nonlocal effects
        effects += 1
        await asyncio.sleep(0.2)
        return Response(201, body=b"once")

    async def main() -> None:
        async with AsyncClient(server.url, token=server.token) as c:
            key = new_key()
            results = await asyncio.gather(*(c.run(key, work, operation="op", request={"x": 1}, lease=2, timeout=30) for _ in range(50)))
            assert sum(not r.replayed for r in results) == 1
            assert all(r.response.body == b"once" for r in results)

    asyncio.run(main())
    assert effects == 1


def test_async_run_release_and_takeover(server: Server) -> None:
    async def main() -> None:
        async with AsyncClient(server.url, token=server.token) as c:
            key = new_key()

            async def refuse(claim: AsyncClaim) -> Response:
                raise NoSideEffect("nothing done")

            with pytest.raises(NoSideEffect):
                await c.run(key, refuse, operation="op")
            crashed = await c.claim(key, operation="op", lease=1)
            await c.checkpoint(key, crashed.record.fencing_token, "charged", lease=1)

            async def resume(claim: AsyncClaim) -> Response:
                assert claim.resumed and claim.recovery_point == "charged" and claim.attempt == 2
                return Response(201)

            res = await c.run(key, resume, operation="op", timeout=15)
            assert res.resumed and not res.replayed

    asyncio.run(main())


def test_async_lease_keeper_and_lease_lost(server: Server) -> None:
    """The keeper keeps a 2 s lease over a 3.2 s function; when someone
    takes the key over meanwhile, the function is cancelled with LeaseLost."""

    async def main() -> None:
        async with AsyncClient(server.url, token=server.token) as c:
            key = new_key()

            async def slow(claim: AsyncClaim) -> Response:
                await asyncio.sleep(3.2)
                with pytest.raises(ProblemError) as ei:
                    await c.claim(key, operation="op")
                assert ei.value.code == "request_in_flight"
                return Response(200)

            res = await c.run(key, slow, operation="op", lease=2)
            assert not res.replayed

            # A keeper that cannot renew (its checkpoints are dropped) loses the key.
            key2 = new_key()
            port = int(server.url.rsplit(":", 1)[1])
            proxy = FaultProxy(("127.0.0.1", port), lambda head: b"/checkpoint " in head.split(b"\r\n", 1)[0])
            try:
                async with AsyncClient(proxy.url, token=server.token) as lossy:
                    started = time.monotonic()

                    async def forever(claim: AsyncClaim) -> Response:
                        await asyncio.sleep(30)
                        return Response(200)

                    with pytest.raises(LeaseLost):
                        await lossy.run(key2, forever, operation="op", lease=1, timeout=60)
                    assert time.monotonic() - started < 10
            finally:
                proxy.close()

    asyncio.run(main())


def test_async_retry_after_a_dropped_answer(server: Server) -> None:
    proxy = FaultProxy(("127.0.0.1", int(server.url.rsplit(":", 1)[1])), first_answer_to("complete"))
    waits: list[float] = []

    async def no_sleep(d: float) -> None:
        waits.append(d)

    async def main() -> None:
        async with AsyncClient(proxy.url, token=server.token, sleep=no_sleep) as c:
            key = new_key()

            async def work(claim: AsyncClaim) -> Response:
                return Response(201, body=b"z")

            await c.run(key, work, operation="op")
            assert (await c.get(key)).state == "completed"

    try:
        asyncio.run(main())
        assert proxy.dropped == 1 and len(waits) == 1
    finally:
        proxy.close()


def test_async_complete_outlives_a_cancelled_caller(server: Server) -> None:
    # The caller's task is cancelled (its own timeout, a client hanging up)
    # while the complete is on its way. Before, the complete was cancelled
    # with it: the response was lost and the key stayed in flight for the
    # next run to run fn again. The complete now finishes; the caller still
    # sees its cancellation.
    async def main() -> None:
        outer: list[asyncio.Task[object]] = []

        class CancelOnComplete(httpx.AsyncHTTPTransport):
            async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
                if request.url.path.endswith("/complete"):
                    outer[0].cancel()
                    await asyncio.sleep(0.05)
                return await super().handle_async_request(request)

        key = new_key()
        ran: list[int] = []

        async def work(claim: AsyncClaim) -> Response:
            ran.append(1)
            return Response(201, body=b"done")

        async with AsyncClient(server.url, token=server.token, http=httpx.AsyncClient(transport=CancelOnComplete())) as c:
            task = asyncio.ensure_future(c.run(key, work, operation="POST /orders", request={"n": 7}, timeout=10))
            outer.append(task)  # type: ignore[arg-type]
            with pytest.raises(asyncio.CancelledError):
                await task
        async with AsyncClient(server.url, token=server.token) as fresh:
            end = time.monotonic() + 10
            while (await fresh.get(key)).state != "completed":
                assert time.monotonic() < end, "the complete was lost with the cancelled caller"
                await asyncio.sleep(0.02)
            again = await fresh.run(key, work, operation="POST /orders", request={"n": 7})
            assert again.replayed and again.response.body == b"done" and ran == [1]

    asyncio.run(main())
