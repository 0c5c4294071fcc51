"""A Python storm worker: one process of the storm test's fleet, its
callers each with an idem.AsyncClient of its own (the interactive preset,
so each has its own per-process retry budget), on one shared httpx pool.

The protocol is cmd/loadgen/stormworker.go's: the configuration in
STORM_WORKER (JSON), "ready" on stdout, the start (Unix ms) read from
stdin, one logical call (AsyncClient.run: claim, the work, complete) per
caller per period on fresh keys, the work being one POST to the sink (the
ledger of side effects), and at the end one JSON line of per-second counts.
Run by scripts/bench-storm through `loadgen storm`; not a test of its own.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time

import httpx

import idem

GIVE_UPS = {"fleet_budget": "fleet_refused", "fleet_signal": "fleet_signal", "budget": "process_refused"}
FIELDS = ("calls", "succeeded", "attempts", "first", "fleet_refused", "fleet_signal", "process_refused", "side_effects")


async def main() -> None:
    # Every failed attempt of an outage is a warning of the SDK's: the
    # counts are the report, not the log.
    logging.getLogger("idem").setLevel(logging.ERROR)
    cfg = json.loads(os.environ["STORM_WORKER"])
    period = cfg["period_ms"] / 1000
    secs = [dict.fromkeys(FIELDS, 0) for _ in range(cfg["seconds"] + 60)]
    start = 0.0

    def at() -> dict[str, int]:
        return secs[max(0, min(int(time.time() - start), len(secs) - 1))]

    def hook(info: idem.AttemptInfo) -> None:
        s = at()
        s["attempts"] += 1
        if info.attempt == 1:
            s["first"] += 1
        if info.give_up in GIVE_UPS:
            s[GIVE_UPS[info.give_up]] += 1

    mine = list(range(cfg["index"], cfg["total"], cfg["stride"]))
    n = len(mine)
    limits = httpx.Limits(max_connections=n + 16, max_keepalive_connections=n + 16)
    async with httpx.AsyncClient(limits=limits) as pool, httpx.AsyncClient(limits=limits, timeout=10.0) as sink:
        clients = [idem.AsyncClient(cfg["base"], token=cfg["token"], policy=idem.RetryPolicy.interactive(), http=pool,
                                    on_attempt=hook) for _ in range(n)]
        print("ready", flush=True)
        line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        start = int(line.strip()) / 1000
        await asyncio.sleep(max(0.0, start - time.time()))
        late_ms = int((time.time() - start) * 1000)
        end = start + cfg["run_ms"] / 1000
        calls: set[asyncio.Task[None]] = set()
        errors: dict[str, int] = {}

        async def call(c: idem.AsyncClient, i: int, seq: int, s: dict[str, int]) -> None:
            key = f"storm-py-{i}-{seq}"

            async def work(_: idem.AsyncClaim) -> idem.Response:
                r = await sink.post(f"{cfg['sink']}/effect/{key}")
                if r.status_code != 204:
                    raise RuntimeError(f"sink: status {r.status_code}")
                at()["side_effects"] += 1
                return idem.Response(201, {}, b'{"ok":true}')

            try:
                await c.run(key, work, operation="POST /orders", request={"caller": i, "seq": seq})
            except Exception as e:
                why = f"{type(e).__name__}:{getattr(e, 'code', '') or getattr(e, 'cause', '')}:{getattr(e, 'give_up', '') or ''}"
                errors[why] = errors.get(why, 0) + 1
                return
            s["succeeded"] += 1

        async def caller(c: idem.AsyncClient, i: int) -> None:
            next_at = start + period * i / cfg["total"]
            seq = 0
            while True:
                await asyncio.sleep(max(0.0, next_at - time.time()))
                if time.time() >= end:
                    return
                next_at += period
                s = at()
                s["calls"] += 1
                t = asyncio.ensure_future(call(c, i, seq, s))
                calls.add(t)
                t.add_done_callback(calls.discard)
                seq += 1

        await asyncio.gather(*(caller(c, mine[j]) for j, c in enumerate(clients)))
        while calls:
            await asyncio.gather(*list(calls))
    totals = {f: sum(x[f] for x in secs) for f in FIELDS}
    out = {"sdk": "python", "callers": n, "late_ms": late_ms, "errors": errors, "seconds": secs[:cfg["seconds"]], "totals": totals}
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
