"""The fleet retry budget at the Python front doors (docs/frontdoor.md rule
9): a real Flask app (WSGI) and a real FastAPI app (ASGI) behind the idem
middleware, against the real server binary on both stores. The caller's
Idem-Attempt goes on with the claim, so idem counts its retries; the retry
idem refuses is answered 429 retry_budget_exhausted with Retry-After and
Idem-Retry-Budget: exhausted, the handler not run and the key as it was;
a first attempt is served; a 409 request_in_flight answered while the
budget is spent says so."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import httpx
import pytest

from apps import serve
from conftest import Server, start_server, wait_for
from idem import Client, ProblemError, frontdoor
from test_retrybudget import tenant

HTTP = httpx.Client(timeout=30)
BODY = {"amount": 1000, "currency": "usd"}


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def budget_server(request: pytest.FixtureRequest, binary: str) -> Iterator[tuple[Server, str]]:
    # A window of an hour: nothing leaves it while the test runs.
    yield from ((s, binary) for s in start_server(binary, request.param, {"IDEM_RETRY_BUDGET_WINDOW": "1h"}))


def post(url: str, key: str, headers: dict[str, str] | None = None) -> httpx.Response:
    return HTTP.post(url, json=BODY, headers={"Idempotency-Key": key, **(headers or {})})


@pytest.mark.parametrize("kind", ["flask", "fastapi"])  # the sync and the asyncio path
def test_retry_budget_at_the_middleware(kind: str, budget_server: tuple[Server, str]) -> None:
    server, binary = budget_server
    token = tenant(server, binary, 0)  # the allowance is the floor: 10 retries
    sdk = Client(server.url, token=token)
    for a in serve(kind, server.url, token):
        url = a.url + "/charges/1"
        assert post(url, f"{kind}-first").status_code == 201
        for i in range(10):
            r = post(url, f"{kind}-r{i}", {"Idem-Attempt": "2;cause=timeout"})
            assert r.status_code == 201, r.text
            assert frontdoor.HEADER_RETRY_BUDGET not in r.headers
        charges = len(a.effects.charges)
        assert charges == 11

        for key in (f"{kind}-refused", f"{kind}-r0"):
            r = post(url, key, {"Idem-Attempt": "3;cause=unavailable"})
            assert r.status_code == 429, r.text
            p = r.json()
            assert (p["code"], p["retryable"], p["detail"]) == ("retry_budget_exhausted", True, frontdoor.RETRY_BUDGET_DETAIL)
            assert int(r.headers["Retry-After"]) >= 1
            assert r.headers[frontdoor.HEADER_RETRY_BUDGET] == "exhausted"
        assert len(a.effects.charges) == charges, "a refused retry runs nothing"
        with pytest.raises(ProblemError) as e:
            sdk.get(f"{kind}-refused")
        assert e.value.code == "key_not_found", "a refused retry claims nothing"
        rec = sdk.get(f"{kind}-r0")
        assert rec.state == "completed" and rec.attempt == 1, "the completed key is as it was"

        served = post(url, f"{kind}-refused")
        assert served.status_code == 201, served.text
        replay = post(url, f"{kind}-refused")
        assert replay.headers["Idempotent-Replayed"] == "true" and replay.content == served.content
        assert len(a.effects.charges) == charges + 1, "one run"

        # A key in flight while the budget is spent: the 409 says so.
        key = f"{kind}-held"
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(post, a.url + "/gated", key)
            wait_for(lambda: len(a.effects.charges) == charges + 2)
            held = post(a.url + "/gated", key)
            a.effects.gate.set()
            assert first.result().status_code == 201
        assert held.status_code == 409, held.text
        assert held.json()["code"] == "request_in_flight"
        assert held.headers[frontdoor.HEADER_RETRY_BUDGET] == "exhausted"
        assert len(a.effects.charges) == charges + 2
