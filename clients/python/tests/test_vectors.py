"""The shared SDK vectors (testvectors/sdk), run against this SDK."""

from __future__ import annotations

import json
import threading
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest

import idem
from idem import ProblemError, Response, RetryBudget, RetryPolicy, TokenError, TransportError

VECTORS = Path(__file__).resolve().parents[3] / "testvectors" / "sdk"


def load(name: str) -> Any:
    return json.loads((VECTORS / name).read_text())


def test_keys() -> None:
    v = load("keys.json")
    assert v["validate"] and v["derive"]
    for tc in v["validate"]:
        if tc["valid"]:
            idem.validate_key(tc["key"])
        else:
            with pytest.raises(idem.InvalidKeyError) as ei:
                idem.validate_key(tc["key"])
            assert ei.value.code == tc["error"], tc["name"]
    for tc in v["derive"]:
        if "error" in tc:
            with pytest.raises(idem.InvalidKeyError):
                idem.derive_key(*tc["parts"])
            continue
        key = idem.derive_key(*tc["parts"])
        assert key == tc["key"], tc["name"]
        idem.validate_key(key)


def test_retry_after() -> None:
    v = load("retry_after.json")
    now = datetime.fromisoformat(v["now"].replace("Z", "+00:00"))
    assert v["cases"]
    for tc in v["cases"]:
        assert idem.parse_retry_after(tc["header"], now) == tc["seconds"], tc["name"]


def test_backoff() -> None:
    v = load("backoff.json")
    p = RetryPolicy()
    assert (p.base_delay, p.max_delay, p.max_attempts) == (v["base_seconds"], v["cap_seconds"], v["max_attempts"])
    assert (p.retry_after_jitter, p.min_attempt_time) == (v["retry_after_spread_seconds"], v["min_attempt_seconds"])
    for tc in v["full_jitter"]:
        assert p.full_jitter_ceiling(tc["retry"]) == tc["ceiling_seconds"]
        assert p.backoff(tc["retry"], tc["random"]) == pytest.approx(tc["wait_seconds"], abs=1e-6)
        for _ in range(100):
            assert 0 <= p.backoff(tc["retry"]) < tc["ceiling_seconds"]
    for tc in v["retry_after"]:
        assert p.retry_after_wait(tc["retry_after_seconds"], tc["random"]) == pytest.approx(tc["wait_seconds"], abs=1e-6)
    for tc in v["fits"]:
        left = None if tc["left_ms"] is None else tc["left_ms"] / 1000
        assert p.fits(left, tc["wait_ms"] / 1000) == tc["fits"], tc["name"]


def test_budget() -> None:
    v = load("budget.json")
    p = RetryPolicy()
    assert (p.budget_capacity, p.budget_retry_cost, p.budget_success_refund) == (v["capacity"], v["retry_cost"], v["success_refund"])
    b = RetryBudget(p)
    for i, s in enumerate(v["steps"]):
        if s["op"] == "take":
            assert b.take() == s["ok"], i
        else:
            for _ in range(s["repeat"]):
                b.success()
        assert b.left == pytest.approx(s["left"], abs=1e-6), i


def test_replay() -> None:
    v = load("replay.json")
    for tc in v["decode"]:
        if tc.get("error"):
            with pytest.raises(ValueError):
                Response.from_wire(tc["response"])
            continue
        r = Response.from_wire(tc["response"])
        assert (r.status, dict(r.headers), r.body.hex()) == (tc["status"], tc["headers"], tc["body_hex"]), tc["name"]
    for tc in v["encode"]:
        w = Response(status=200, body=bytes.fromhex(tc["body_hex"])).to_wire()
        assert (w["body"], w["body_encoding"]) == (tc["body"], tc["body_encoding"]), tc["name"]


class _ClaimAnswer(BaseHTTPRequestHandler):
    """Answers every claim as the vector says; completes and releases succeed (and are counted)."""

    vector: dict[str, Any] = {}
    claims = 0
    writes = 0

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        cls = type(self)
        if not self.path.endswith("/claim"):
            cls.writes += 1
            body = b'{"key":"k","state":"completed","fencing_token":3,"attempt":1}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
        else:
            cls.claims += 1
            tc = cls.vector
            body = tc["body"].encode()
            self.send_response(tc["status"])
            for k, val in tc["headers"].items():
                self.send_header(k, val)
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.mark.parametrize("tc", load("replay.json")["claim_answers"], ids=lambda tc: tc["name"])
def test_claim_answers(tc: dict[str, Any]) -> None:
    """A server's answer to a claim (testvectors/sdk/replay.json
    claim_answers): a claim runs the function, a replay returns the stored
    response without running it, and an answer the client cannot interpret
    is InvalidAnswer - the function never runs, nothing is completed,
    released or replayed, the claim is not retried - in claim() and run(),
    sync and asyncio."""
    import asyncio

    _ClaimAnswer.vector, _ClaimAnswer.claims, _ClaimAnswer.writes = tc, 0, 0
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _ClaimAnswer)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    ran: list[str] = []

    def fn(claim: Any) -> Response:
        ran.append("sync")
        return Response(201, body=b"ran")

    async def afn(claim: Any) -> Response:
        ran.append("async")
        return Response(201, body=b"ran")

    async def arun() -> Any:
        async with idem.AsyncClient(url) as ac:
            return await ac.run("k", afn, operation="op", request={})

    try:
        with idem.Client(url) as c:
            if tc["expect"] == "invalid":
                with pytest.raises(idem.InvalidAnswer):
                    c.claim("k", operation="op", request={})
                with pytest.raises(idem.InvalidAnswer):
                    c.run("k", fn, operation="op", request={})
                with pytest.raises(idem.InvalidAnswer):
                    asyncio.run(arun())
                assert ran == [], "the function must not run on an answer the client cannot interpret"
                assert _ClaimAnswer.writes == 0, "nothing is completed or released"
                assert _ClaimAnswer.claims == 3, "not retried"
                return
            cr = c.claim("k", operation="op", request={})
            res, ares = c.run("k", fn, operation="op", request={}), asyncio.run(arun())
            if tc["expect"] == "claim":
                assert not cr.replayed and cr.record.fencing_token >= 1
                assert ran == ["sync", "async"] and not res.replayed and not ares.replayed
            else:
                assert tc["expect"] == "replay", tc["expect"]
                assert cr.replayed and ran == []
                assert res.replayed and ares.replayed and res.response.body == ares.response.body == b"x"
    finally:
        srv.shutdown()
        srv.server_close()


class _Stub(BaseHTTPRequestHandler):
    """Fails the first claim as the vector says, accepts later claims and completes."""

    vector: dict[str, Any] = {}
    claims = 0
    lock = threading.Lock()

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path.endswith("/complete"):
            return self._send(200, "application/json", {"key": "k", "state": "completed", "fencing_token": 1, "attempt": 1})
        cls = type(self)
        with cls.lock:
            cls.claims += 1
            first = cls.claims == 1
        tc = cls.vector
        if first and "transport" not in tc:
            if tc["code"] == "unknown":
                return self._send(tc["status"], "text/plain", None, b"not a problem document")
            return self._send(tc["status"], "application/problem+json",
                              {"type": "urn:idem:problem:" + tc["code"], "title": "x", "status": tc["status"], "code": tc["code"]})
        self._send(201, "application/json", {"key": "k", "state": "in_flight", "fencing_token": 1, "attempt": 1})

    def _send(self, status: int, ctype: str, doc: Any, raw: bytes = b"") -> None:
        body = json.dumps(doc).encode() if doc is not None else raw
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Retry-After", "1")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _transport_error(name: str) -> Exception:
    req = httpx.Request("POST", "http://127.0.0.1/")
    return {
        "connection_refused": httpx.ConnectError("[Errno 111] Connection refused", request=req),
        "connection_reset": httpx.ReadError("[Errno 104] Connection reset by peer", request=req),
        "eof": httpx.RemoteProtocolError("Server disconnected without sending a response.", request=req),
        "timeout": httpx.ReadTimeout("timed out", request=req),
    }[name]


def _classification_cases() -> list[Any]:
    return [pytest.param(tc, id=tc["name"]) for tc in load("classification.json")["cases"]]


@pytest.mark.parametrize("tc", _classification_cases())
@pytest.mark.parametrize("no_wait", [False, True])
def test_classification(tc: dict[str, Any], no_wait: bool) -> None:
    """run() claims against a stub that fails the first claim as the vector
    says: a retried failure makes two claims, a final one a single claim.
    no_wait switches off only the in-flight wait."""
    handler = type("Stub", (_Stub,), {"vector": tc, "claims": 0, "lock": threading.Lock()})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()
    failed = threading.Event()

    def fail_first() -> bool:
        if failed.is_set():
            return False
        failed.set()
        return True

    token: str | Callable[[], str] = "t"
    transport: httpx.BaseTransport = httpx.HTTPTransport()
    kind = tc.get("transport")
    if kind == "token_error":
        def token_source() -> str:
            if fail_first():
                handler.claims += 1
                raise RuntimeError("token source down")
            return "t"
        token = token_source
    elif kind:
        inner = transport

        class Failing(httpx.BaseTransport):
            def handle_request(self, request: httpx.Request) -> httpx.Response:
                if request.url.path.endswith("/claim") and fail_first():
                    handler.claims += 1
                    raise _transport_error(kind)
                return inner.handle_request(request)
        transport = Failing()
    policy = RetryPolicy(retry_500=bool(tc.get("policy", {}).get("retry_500")))
    sleeps: list[float] = []
    c = idem.Client(f"http://127.0.0.1:{srv.server_address[1]}", token=token, policy=policy,
                    http=httpx.Client(transport=transport), sleep=sleeps.append)
    try:
        retried = tc["retry"] and not (no_wait and tc.get("how") == "in_flight")
        try:
            c.run("k", lambda claim: Response(201), operation="op", request={}, lease=30, no_wait=no_wait)
            err: Exception | None = None
        except (ProblemError, TransportError, TokenError) as e:
            err = e
        if retried:
            assert err is None
            assert handler.claims == 2
            assert len(sleeps) == 1
        else:
            assert err is not None
            assert handler.claims == 1, err
            if "transport" not in tc:
                assert idem.error_code(err) == tc["code"]
    finally:
        srv.shutdown()
        srv.server_close()

