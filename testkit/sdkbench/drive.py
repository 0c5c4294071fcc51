"""One phase of scripts/bench-sdk for the Python SDK (issue 23, goal 3).

    drive.py MODE URL TOKEN SECONDS CONCURRENCY

MODE is sync-default / sync-fresh / async-default / async-fresh. "default"
is the client as a new user makes it (``idem.Client(url, token=tok)`` or
``idem.AsyncClient(...)``), shared by CONCURRENCY threads or tasks; "fresh"
is the baseline, a fresh connection per call: the same client, shared, on an
httpx client of the same pool size with keep-alive off
(max_keepalive_connections=0). A new idem client per call costs far more
(each httpx client builds its own TLS context: 59 ms of CPU per pair in a
first run of this bench, 20x the default's), so it is not the baseline. Each worker loops claim -> complete on fresh keys for SECONDS and
the driver prints one JSON line: pairs, wall seconds, and the process's CPU
(user + system, all threads) over the loop. It also times how long decoding
the complete answer takes (json.loads + Record.from_json of a real answer),
to price the decode the caller of run() never uses.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import secrets
import sys
import threading
import time

import httpx

import idem
from idem import AsyncClient, Client, Response
from idem._types import Record
from httpcore._backends.anyio import AnyIOBackend
from httpcore._backends.sync import SyncBackend

# The TCP connections the process opens, counted where httpcore opens them
# (an observation only: the call goes through unchanged). scripts/bench-sdk
# checks the count against the sockets the kernel saw (ss).
CONNECTS = [0]
_sync_connect, _async_connect = SyncBackend.connect_tcp, AnyIOBackend.connect_tcp


def _counted_sync(self, *a, **kw):  # type: ignore[no-untyped-def]
    CONNECTS[0] += 1
    return _sync_connect(self, *a, **kw)


async def _counted_async(self, *a, **kw):  # type: ignore[no-untyped-def]
    CONNECTS[0] += 1
    return await _async_connect(self, *a, **kw)


SyncBackend.connect_tcp = _counted_sync  # type: ignore[method-assign]
AnyIOBackend.connect_tcp = _counted_async  # type: ignore[method-assign]

REQ = {"amount": 1200, "currency": "eur", "customer": "cus_123"}
#: The baseline's pool: as many connections as the SDK's, none kept alive.
NO_KEEPALIVE = httpx.Limits(max_connections=idem._client.POOL_LIMITS.max_connections, max_keepalive_connections=0)
RESP = Response(status=201, headers={"Content-Type": "application/json"}, body=b'{"id":"ord_1","amount":1200}')


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def sync_phase(mode: str, url: str, tok: str, secs: float, conc: int) -> tuple[int, float, float, int, bytes]:
    if mode == "sync-default":
        shared = Client(url, token=tok)
    else:
        shared = Client(url, token=tok, http=httpx.Client(limits=NO_KEEPALIVE))
    stop = time.monotonic() + secs
    counts = [0] * conc
    sample: list[bytes] = []
    prefix = secrets.token_hex(4)

    def pair(c: Client, key: str) -> None:
        cr = c.claim(key, operation="POST /orders", request=REQ)
        c.complete(key, cr.record.fencing_token, RESP)

    def work(i: int) -> None:
        n = 0
        while time.monotonic() < stop:
            key = f"{prefix}-{i}-{n}"
            pair(shared, key)
            n += 1
        counts[i] = n

    CONNECTS[0] = 0
    c0, t0 = cpu(), time.monotonic()
    ts = [threading.Thread(target=work, args=(i,)) for i in range(conc)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall, used = time.monotonic() - t0, cpu() - c0
    connects = CONNECTS[0]
    # One real complete answer, for the decode price.
    c = shared
    key = f"{prefix}-sample"
    cr = c.claim(key, request=REQ)
    call = c._core.complete_call(key, cr.record.fencing_token, RESP)
    raw = c._http.post(c._core.url(call), content=call.body,
                       headers={"Authorization": "Bearer " + tok, "Content-Type": "application/json"}).content
    sample.append(raw)
    c.close()
    return sum(counts), wall, used, connects, sample[0]


async def async_phase(mode: str, url: str, tok: str, secs: float, conc: int) -> tuple[int, float, float, int]:
    if mode == "async-default":
        shared = AsyncClient(url, token=tok)
    else:
        shared = AsyncClient(url, token=tok, http=httpx.AsyncClient(limits=NO_KEEPALIVE))
    stop = time.monotonic() + secs
    counts = [0] * conc
    prefix = secrets.token_hex(4)

    async def work(i: int) -> None:
        n = 0
        while time.monotonic() < stop:
            key = f"{prefix}-{i}-{n}"
            cr = await shared.claim(key, operation="POST /orders", request=REQ)
            await shared.complete(key, cr.record.fencing_token, RESP)
            n += 1
        counts[i] = n

    CONNECTS[0] = 0
    c0, t0 = cpu(), time.monotonic()
    await asyncio.gather(*(work(i) for i in range(conc)))
    wall, used = time.monotonic() - t0, cpu() - c0
    connects = CONNECTS[0]
    await shared.aclose()
    return sum(counts), wall, used, connects


def decode_us(raw: bytes) -> float:
    n = 20000
    t0 = time.process_time()
    for _ in range(n):
        Record.from_json(json.loads(raw))
    return (time.process_time() - t0) / n * 1e6


def main() -> None:
    mode, url, tok, secs, conc = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5])
    out: dict[str, object] = {"lang": "python", "mode": mode, "httpx_pool": repr(idem._client.POOL_LIMITS)}
    if mode.startswith("sync-"):
        pairs, wall, used, connects, raw = sync_phase(mode, url, tok, secs, conc)
        out["complete_answer_bytes"] = len(raw)
        out["decode_complete_us"] = round(decode_us(raw), 2)
    else:
        pairs, wall, used, connects = asyncio.run(async_phase(mode, url, tok, secs, conc))
    out.update(connects=connects, pairs=pairs, wall=round(wall, 3), cpu=round(used, 3), pid=os.getpid())
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
