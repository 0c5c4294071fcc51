"""The resume endpoint (issue 24, the completer protocol) in a real Flask app
(WSGI, werkzeug) and a real FastAPI app (ASGI, uvicorn) on loopback, each
behind the idem middleware, against the real server on both stores. The
test plays idem's completer: it takes an orphaned key over (a claim the
server holds until the dead worker's lease runs out), signs its calls
itself from the Standard Webhooks rule (hmac here, not the SDK's code) and
completes the key with the answered response."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from flask import Flask

from conftest import Server, mint_token, new_key, start_server
from idem import (AsyncClaim, AsyncClient, Claim, Client, NoSideEffect, ProblemError, Response, ResumeAnswer, ResumeCall,
                  ResumeResult, verify_signature)
from idem.asgi import IdempotencyMiddleware as ASGIIdempotency
from idem.asgi import ResumeMiddleware as ASGIResume
from idem.wsgi import install_flask, install_flask_resume

SECRET = "whsec_" + base64.b64encode(b"resume-endpoint-test-secret-32by").decode()
OTHER_SECRET = "whsec_" + base64.b64encode(b"another-secret-of-the-same-size!").decode()
WRONG_SECRET = "whsec_" + base64.b64encode(b"not-the-endpoint-secret").decode()
VECTORS = json.loads((Path(__file__).resolve().parents[3] / "testvectors/completer-signature.json").read_text())["vectors"]
HTTP = httpx.Client(timeout=30)


def sign(secret: str, wid: str, ts: int, body: bytes) -> str:
    """The Standard Webhooks signature, computed from the rule."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    return "v1," + base64.b64encode(hmac.new(key, f"{wid}.{ts}.".encode() + body, hashlib.sha256).digest()).decode()


def call_body(key: str, token: int, **over: Any) -> dict[str, Any]:
    in1h = (datetime.now(timezone.utc) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {"type": "key.resume", "tenant": "acme", "key": key, "operation": "POST /orders", "attempt": 1,
            "max_attempts": 8, "fencing_token": token, "recovery_point": None, "recovery_data": None,
            "lease_expires_at": in1h, "deadline": in1h, **over}


def post(url: str, body: dict[str, Any] | bytes, *, secret: str = SECRET, ts: int | None = None, sent: bytes | None = None,
         signature: str | None = None, headers: dict[str, str] | None = None) -> httpx.Response:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    wid = "rsm_" + secrets.token_hex(8)
    t = int(time.time()) if ts is None else ts
    sig = sign(secret, wid, t, raw) if signature is None else signature
    h = {"Content-Type": "application/json", "webhook-id": wid, "webhook-timestamp": str(t), "webhook-signature": sig, **(headers or {})}
    return HTTP.post(url, content=sent if sent is not None else raw, headers=h)


class Shop:
    """The application: a two-step order (charge, then e-mail), written
    once (sync for Flask, async for FastAPI), run by run() and by the
    resume endpoint alike."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.charges: dict[str, int] = {}
        #: leaseend- keys: whether claim.lease_lost was set, when, and the call's lease end (unix seconds).
        self.lease_ends: dict[str, tuple[bool, float, float]] = {}
        self.emails: dict[str, int] = {}
        self.crash_after_charge: set[str] = set()
        #: Orders whose step 2 (the e-mail) fails before its side effect.
        self.mail_down: set[str] = set()
        self.resumed: list[ResumeCall] = []

    def _count(self, d: dict[str, int], k: str) -> None:
        with self.lock:
            d[k] = d.get(k, 0) + 1

    def place_order(self, claim: Claim, order: str) -> Response:
        if claim.recovery_point in ("charged", "emailed"):
            charge = claim.recovery_data["charge"]  # step 1 done by an earlier attempt
        else:
            self._count(self.charges, order)
            charge = f"ch_{order}"
            claim.checkpoint("charged", {"charge": charge})
        if order in self.crash_after_charge:
            self.crash_after_charge.discard(order)
            raise RuntimeError("the worker died after the charge")
        if claim.recovery_point != "emailed":
            if order in self.mail_down:
                raise RuntimeError("the mail service is down")
            self._count(self.emails, order)
            claim.checkpoint("emailed", {"charge": charge})
        return Response(201, {"Content-Type": "application/json"}, json.dumps({"order": order, "charge": charge}).encode())

    async def place_order_async(self, claim: AsyncClaim, order: str) -> Response:
        if claim.recovery_point in ("charged", "emailed"):
            charge = claim.recovery_data["charge"]
        else:
            self._count(self.charges, order)
            charge = f"ch_{order}"
            await claim.checkpoint("charged", {"charge": charge})
        if order in self.crash_after_charge:
            self.crash_after_charge.discard(order)
            raise RuntimeError("the worker died after the charge")
        if claim.recovery_point != "emailed":
            if order in self.mail_down:
                raise RuntimeError("the mail service is down")
            self._count(self.emails, order)
            await claim.checkpoint("emailed", {"charge": charge})
        return Response(201, {"Content-Type": "application/json"}, json.dumps({"order": order, "charge": charge}).encode())

    def outcome(self, call: ResumeCall) -> ResumeResult | None:
        """The outcome tests pick theirs by the key's prefix; None: place the order."""
        with self.lock:
            self.resumed.append(call)
        kind = call.key.split("-")[0]
        if kind == "binary":
            return Response(200, {"Content-Type": "application/octet-stream"}, b"\xff\x00\xfe")
        if kind == "notdone":
            return ResumeAnswer.not_done()
        if kind == "nse":
            raise NoSideEffect("the PSP says no charge was made")
        if kind == "unknown":
            return ResumeAnswer.unknown(retry_after=30)
        if kind == "unknownbare":
            return ResumeAnswer.unknown()
        if kind == "review":
            return ResumeAnswer.review("card charged twice? check PSP")
        if kind == "boom":
            raise RuntimeError("the PSP lookup failed")
        if kind == "nothing":
            return "not a response"  # type: ignore[return-value]
        if kind == "badstatus":
            return Response(0)
        return None

    def resume(self, claim: Claim, call: ResumeCall) -> ResumeResult:
        if call.key.startswith("leaseend-"):
            if call.attempt == 1:
                set_ = claim.lease_lost.wait(90)
                with self.lock:
                    self.lease_ends[call.key] = (set_, time.time(), call.lease_expires_at.timestamp())
            return ResumeAnswer.review("the lease ended")
        picked = self.outcome(call)
        return picked if picked is not None else self.place_order(claim, call.key)

    async def resume_async(self, claim: AsyncClaim, call: ResumeCall) -> ResumeResult:
        if call.key.startswith("leaseend-"):
            if call.attempt == 1:
                try:
                    await asyncio.wait_for(claim.lease_lost.wait(), 90)
                    set_ = True
                except asyncio.TimeoutError:
                    set_ = False
                with self.lock:
                    self.lease_ends[call.key] = (set_, time.time(), call.lease_expires_at.timestamp())
            return ResumeAnswer.review("the lease ended")
        picked = self.outcome(call)
        return picked if picked is not None else await self.place_order_async(claim, call.key)


def _serve_wsgi(app: Any, sock: socket.socket | None = None) -> Iterator[str]:
    """Serve app with werkzeug on loopback: on sock (bound and listening)
    when given, else on a free port."""
    from werkzeug.serving import make_server

    if sock is None:
        srv = make_server("127.0.0.1", 0, app, threaded=True)
    else:
        srv = make_server("127.0.0.1", sock.getsockname()[1], app, threaded=True, fd=sock.fileno())
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.socket.getsockname()[1]}"
    finally:
        srv.shutdown()


def _serve_asgi(app: Any, sock: socket.socket | None = None) -> Iterator[str]:
    """Serve app with uvicorn on loopback: on sock when given, else on a free port."""
    if sock is None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    t = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    t.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not t.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        t.join(10)
        sock.close()


def flask_app(server: Server, shop: Shop, secret: Any = (OTHER_SECRET, SECRET), **opts: Any) -> Any:
    app = Flask("shop")

    @app.post("/orders")
    def orders() -> Any:
        return {"ok": True}, 201

    client = Client(server.url, token=server.token)
    install_flask(app, client)
    install_flask_resume(app, client, secret=secret, resume=shop.resume, **opts)  # outermost: after install_flask
    return app


def fastapi_app(server: Server, shop: Shop, secret: Any = (OTHER_SECRET, SECRET), **opts: Any) -> Any:
    app = FastAPI()

    @app.post("/orders")
    async def orders() -> Any:
        return {"ok": True}

    client = AsyncClient(server.url, token=server.token)
    app.add_middleware(ASGIIdempotency, client=client)
    app.add_middleware(ASGIResume, client=client, secret=secret, resume=shop.resume_async, **opts)  # outermost
    return app


MAKERS: dict[str, Callable[..., Any]] = {"flask": flask_app, "fastapi": fastapi_app}


def serve(kind: str, server: Server, shop: Shop, **opts: Any) -> Iterator[str]:
    app = MAKERS[kind](server, shop, **opts)
    serving = _serve_wsgi(app) if kind == "flask" else _serve_asgi(app)
    for base in serving:
        yield base + "/idem/resume"


@pytest.fixture(scope="module", params=["flask", "fastapi"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def shop() -> Shop:
    """One app per framework and store: the tests tell their calls apart by key."""
    return Shop()


@pytest.fixture(scope="module")
def endpoint(kind: str, server: Server, shop: Shop) -> Iterator[str]:
    yield from serve(kind, server, shop)


@pytest.fixture
def client(server: Server) -> Iterator[Client]:
    with Client(server.url, token=server.token) as c:
        yield c


def test_vectors_verify() -> None:
    """The shared vectors (computed by webhooks.Sign in Go) verify, at
    their timestamps, and refuse any change."""
    assert len(VECTORS) >= 3
    for v in VECTORS:
        body, at = v["body"].encode(), float(v["timestamp"])
        assert sign(v["secret"], v["id"], v["timestamp"], body) == v["expect"]["signature"], v["name"]
        sig = v["expect"]["signature"]
        assert verify_signature(v["secret"], v["id"], str(v["timestamp"]), sig, body, at) is None, v["name"]
        assert verify_signature([OTHER_SECRET, v["secret"]], v["id"], str(v["timestamp"]), "v1,AAAA " + sig, body, at) is None
        assert verify_signature(v["secret"], v["id"] + "x", str(v["timestamp"]), sig, body, at)
        assert verify_signature(v["secret"], v["id"], str(v["timestamp"] + 1), sig, body, at)
        assert verify_signature(v["secret"], v["id"], str(v["timestamp"]), sig, body + b" ", at)
        assert verify_signature(OTHER_SECRET, v["id"], str(v["timestamp"]), sig, body, at)
        assert verify_signature(v["secret"], v["id"], str(v["timestamp"]), sig, body, at + 301)
        assert verify_signature(v["secret"], v["id"], str(v["timestamp"]), sig, body, at - 300) is None


def test_vectors_over_http(kind: str, server: Server, shop: Shop) -> None:
    for v in VECTORS:
        for url in serve(kind, server, shop, secret=v["secret"], now=lambda: float(v["timestamp"])):
            h = {"webhook-id": v["id"], "webhook-timestamp": str(v["timestamp"]), "webhook-signature": v["expect"]["signature"]}
            before = len(shop.resumed)
            r = HTTP.post(url, content=v["body"].encode(), headers=h)
            if '"key.resume"' in v["body"]:
                assert r.status_code == 200, (v["name"], r.text)
                assert len(shop.resumed) == before + 1
                assert shop.resumed[-1].recovery_data == json.loads(v["body"])["recovery_data"]
            else:
                assert r.status_code == 400 and r.json()["code"] == "invalid_request", v["name"]  # verified, not a call
            spoiled = HTTP.post(url, content=v["body"].replace("}", " }", 1).encode(), headers=h)
            assert spoiled.status_code == 401, v["name"]


def test_resumes_at_step_two_side_effect_once(endpoint: str, client: Client, shop: Shop) -> None:
    """A worker that died after step 1 (charge + checkpoint) is resumed at
    step 2 by the endpoint: one charge, one e-mail, the key completes with
    the answered response and a retry replays it."""
    k = new_key("order")
    shop.crash_after_charge.add(k)
    with pytest.raises(RuntimeError, match="died after the charge"):
        client.run(k, lambda c: shop.place_order(c, k), operation="POST /orders", request={"amount": 1000}, lease=1)
    assert shop.charges[k] == 1
    # The completer takes the orphan over: the server holds this claim until
    # the dead worker's lease runs out, then hands over the key.
    taken = client.claim(k, operation="POST /orders", request={"amount": 1000}, lease=30, wait=8)
    assert taken.resumed and taken.record.recovery_point == "charged"
    r = post(endpoint, call_body(k, taken.record.fencing_token, recovery_point="charged", recovery_data=taken.record.recovery_data))
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["outcome"] == "completed"
    resp = doc["response"]
    assert resp["status"] == 201 and resp["body_encoding"] == "utf8"
    assert json.loads(resp["body"]) == {"order": k, "charge": f"ch_{k}"}
    assert shop.charges[k] == 1 and shop.emails[k] == 1
    # Step 2's checkpoint went through the SDK with idem's token.
    rec = client.get(k)
    assert (rec.state, rec.recovery_point, rec.fencing_token) == ("in_flight", "emailed", taken.record.fencing_token)
    client.complete(k, taken.record.fencing_token, Response.from_wire(resp))
    again = client.run(k, lambda c: shop.place_order(c, k), operation="POST /orders", request={"amount": 1000})
    assert again.replayed and again.response.body == resp["body"].encode()
    assert shop.charges[k] == 1 and shop.emails[k] == 1
    call = next(c for c in shop.resumed if c.key == k)
    assert call.fencing_token == taken.record.fencing_token and call.operation == "POST /orders"
    assert call.webhook_id.startswith("rsm_")


def test_stale_token_checkpoint_is_unknown(endpoint: str, client: Client, shop: Shop) -> None:
    """A call under a token idem has since replaced: the function's
    checkpoint fails lease_lost, an exception, so the answer is unknown
    and the key does not move on."""
    k = new_key("order")
    first = client.claim(k, operation="POST /orders", lease=1)
    taken = client.claim(k, operation="POST /orders", lease=30, wait=8)
    assert taken.resumed
    r = post(endpoint, call_body(k, first.record.fencing_token))
    assert r.json() == {"outcome": "unknown"}
    assert shop.charges[k] == 1
    rec = client.get(k)
    assert rec.fencing_token == taken.record.fencing_token and rec.recovery_point == ""
    with pytest.raises(ProblemError):
        client.checkpoint(k, first.record.fencing_token, "late")


OUTCOMES: list[tuple[str, dict[str, Any]]] = [
    ("notdone", {"outcome": "not_done"}),
    ("nse", {"outcome": "not_done"}),
    ("unknown", {"outcome": "unknown", "retry_after_seconds": 30}),
    ("unknownbare", {"outcome": "unknown"}),
    ("review", {"outcome": "review", "note": "card charged twice? check PSP"}),
    ("boom", {"outcome": "unknown"}),
    ("nothing", {"outcome": "unknown"}),
    ("badstatus", {"outcome": "unknown"}),
    ("binary", {"outcome": "completed", "response": {"status": 200, "headers": {"Content-Type": "application/octet-stream"},
                                                      "body": base64.b64encode(b"\xff\x00\xfe").decode(), "body_encoding": "base64"}}),
]


@pytest.mark.parametrize("prefix,want", OUTCOMES, ids=[o[0] for o in OUTCOMES])
def test_outcome_mapping(endpoint: str, shop: Shop, prefix: str, want: dict[str, Any]) -> None:
    k = new_key(prefix)
    r = post(endpoint, call_body(k, 7, recovery_point="charged", recovery_data={"charge": "ch_9"}))
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    assert r.json() == want
    calls = [c for c in shop.resumed if c.key == k]
    assert len(calls) == 1
    assert calls[0].recovery_point == "charged" and calls[0].recovery_data == {"charge": "ch_9"}
    assert calls[0].fencing_token == 7 and calls[0].attempt == 1 and calls[0].max_attempts == 8


REFUSED: list[tuple[str, Callable[[str, str], httpx.Response]]] = [
    ("wrong secret", lambda u, k: post(u, call_body(k, 1), secret=WRONG_SECRET)),
    ("stale timestamp", lambda u, k: post(u, call_body(k, 1), ts=int(time.time()) - 360)),
    ("future timestamp", lambda u, k: post(u, call_body(k, 1), ts=int(time.time()) + 360)),
    ("tampered body", lambda u, k: post(u, call_body(k, 1), sent=json.dumps(call_body(k, 2)).encode())),
    ("no signature", lambda u, k: post(u, call_body(k, 1), signature="")),
    ("another scheme only", lambda u, k: post(u, call_body(k, 1), signature="v1a,abcd")),
    ("garbage signature", lambda u, k: post(u, call_body(k, 1), signature="v1,!!!not-base64")),
    ("timestamp not seconds", lambda u, k: post(u, call_body(k, 1), headers={"webhook-timestamp": "2026-12-01T00:00:00Z"})),
]


@pytest.mark.parametrize("what,send", REFUSED, ids=[r[0] for r in REFUSED])
def test_refused_401_function_not_called(endpoint: str, shop: Shop, what: str, send: Callable[[str, str], httpx.Response]) -> None:
    k = new_key("order")
    r = send(endpoint, k)
    assert r.status_code == 401, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    doc = r.json()
    assert doc["code"] == "unauthenticated" and doc["status"] == 401
    assert not [c for c in shop.resumed if c.key == k] and k not in shop.charges


def test_several_signatures_one_verifies(endpoint: str) -> None:
    k = new_key("notdone")
    body = json.dumps(call_body(k, 1)).encode()
    wid, ts = "rsm_" + secrets.token_hex(8), int(time.time())
    sig = f"{sign(WRONG_SECRET, wid, ts, body)} v1a,xyz {sign(SECRET, wid, ts, body)}"
    r = HTTP.post(endpoint, content=body, headers={"webhook-id": wid, "webhook-timestamp": str(ts), "webhook-signature": sig})
    assert r.status_code == 200 and r.json() == {"outcome": "not_done"}


def test_replayed_webhook_id_refused(endpoint: str, shop: Shop) -> None:
    """A signed call replayed with its webhook-id within the tolerance is
    401 unauthenticated and the function does not run again."""
    k = new_key("notdone")
    body = json.dumps(call_body(k, 1)).encode()
    wid, ts = "rsm_" + secrets.token_hex(8), int(time.time())
    headers = {"webhook-id": wid, "webhook-timestamp": str(ts), "webhook-signature": sign(SECRET, wid, ts, body)}
    before = len(shop.resumed)
    r = HTTP.post(endpoint, content=body, headers=headers)
    assert r.status_code == 200 and r.json() == {"outcome": "not_done"}
    r = HTTP.post(endpoint, content=body, headers=headers)
    assert r.status_code == 401 and r.json()["code"] == "unauthenticated"
    assert len(shop.resumed) - before == 1, "the function ran once"


def _without(k: str, name: str) -> bytes:
    b = call_body(k, 1)
    del b[name]
    return json.dumps(b).encode()


def _not_utf8(k: str) -> bytes:
    return json.dumps(call_body(k, 1, operation="POST /@")).encode().replace(b"@", b"\xff")


BAD_BODIES: list[tuple[str, Callable[[str], bytes]]] = [
    ("not JSON", lambda k: b"{not json"),
    ("an array", lambda k: b"[]"),
    ("another type", lambda k: json.dumps(call_body(k, 1, type="key.completed")).encode()),
    ("token as a string", lambda k: json.dumps(call_body(k, 1, fencing_token="42")).encode()),
    ("fractional attempt", lambda k: json.dumps(call_body(k, 1, attempt=1.5)).encode()),
    ("attempt 0", lambda k: json.dumps(call_body(k, 1, attempt=0)).encode()),
    ("attempt true", lambda k: json.dumps(call_body(k, 1, attempt=True)).encode()),
    ("no recovery_data", lambda k: _without(k, "recovery_data")),
    ("no recovery_point", lambda k: _without(k, "recovery_point")),
    ("recovery_point a number", lambda k: json.dumps(call_body(k, 1, recovery_point=3)).encode()),
    ("deadline not a time", lambda k: json.dumps(call_body(k, 1, deadline="tomorrow")).encode()),
    ("invalid key", lambda k: json.dumps(call_body("has space", 1)).encode()),
    ("duplicate member", lambda k: json.dumps(call_body(k, 1)).replace("{", '{"fencing_token": 99, ', 1).encode()),
    ("NaN", lambda k: json.dumps(call_body(k, 1, recovery_data=float("nan"))).encode()),
    ("not UTF-8", _not_utf8),
]


@pytest.mark.parametrize("what,make", BAD_BODIES, ids=[b[0] for b in BAD_BODIES])
def test_bad_body_400_function_not_called(endpoint: str, shop: Shop, what: str, make: Callable[[str], bytes]) -> None:
    before = len(shop.resumed)
    r = post(endpoint, make(new_key("order")))
    assert r.status_code == 400, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["code"] == "invalid_request"
    assert len(shop.resumed) == before


def test_unnamed_member_ignored(endpoint: str) -> None:
    r = post(endpoint, call_body(new_key("notdone"), 1, added_later={"x": 1}))
    assert r.json() == {"outcome": "not_done"}


def test_get_is_405_and_other_paths_reach_the_app(endpoint: str) -> None:
    r = HTTP.get(endpoint)
    assert r.status_code == 405 and r.json()["code"] == "method_not_allowed" and r.headers["allow"] == "POST"
    # The rest of the app is behind the idempotency middleware as before.
    base = endpoint.removesuffix("/idem/resume")
    assert HTTP.post(base + "/orders", json={}).json()["code"] == "idempotency_key_missing"
    assert HTTP.post(base + "/orders", json={}, headers={"Idempotency-Key": new_key()}).status_code in (200, 201)


def test_bad_secret_refused_at_construction() -> None:
    with pytest.raises(ValueError):
        install_flask_resume(Flask("x"), Client("http://127.0.0.1:1"), secret="whsec_not base64!", resume=Shop().resume)
    with pytest.raises(ValueError):
        ResumeAnswer.review("  ")
    with pytest.raises(ValueError):
        ResumeAnswer.unknown(retry_after=-1)
    assert asyncio.iscoroutinefunction(Shop().resume_async)


def test_standalone_mounts(server: Server) -> None:
    """ResumeEndpoint as a Starlette Route and resume_app as a WSGI app of
    its own serve the same protocol."""
    from starlette.applications import Starlette
    from starlette.routing import Route

    from idem.asgi import ResumeEndpoint
    from idem.wsgi import resume_app

    shop = Shop()
    asgi = Starlette(routes=[Route("/idem/resume", ResumeEndpoint(AsyncClient(server.url, token=server.token), secret=SECRET,
                                                                   resume=shop.resume_async), methods=["POST"])])
    wsgi = resume_app(Client(server.url, token=server.token), secret=SECRET, resume=shop.resume)
    for serving, path in ((_serve_asgi(asgi), "/idem/resume"), (_serve_wsgi(wsgi), "/anywhere")):
        for base in serving:
            k = new_key("review")
            assert post(base + path, call_body(k, 3)).json() == {"outcome": "review", "note": "card charged twice? check PSP"}
            assert post(base + path, call_body(k, 3), secret=WRONG_SECRET).status_code == 401
            assert [c.key for c in shop.resumed].count(k) == 1


# The real completer. The idem binary runs with its completer on and fast;
# each framework app (Flask, FastAPI) serves the SDK's resume endpoint and is
# registered as the tenant's completer for its own operation. A worker dies
# through run() after step 1 and its checkpoint; nobody but the completer
# touches the key until the test's assertions.

COMPLETER_ENV = {
    "IDEM_WEBHOOK_ALLOW_PRIVATE": "1",  # the apps listen on loopback
    "IDEM_COMPLETER_INTERVAL": "100ms",
    "IDEM_COMPLETER_TIMEOUT": "10s",
    "IDEM_COMPLETER_BACKOFF_BASE": "200ms",
    "IDEM_COMPLETER_BACKOFF_CAP": "1s",
    "IDEM_COMPLETER_MAX_ATTEMPTS": "100",  # the raising test must not reach review
    "IDEM_COMPLETER_DEADLINE": "1h",
    "IDEM_ORPHAN_WATCH_INTERVAL": "100ms",
    "IDEM_TENANT_CACHE_TTL": "0s",
}


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def completing(request: pytest.FixtureRequest, binary: str) -> Iterator[Server]:
    """The real server with its completer on and fast."""
    yield from start_server(binary, request.param, COMPLETER_ENV)


@dataclass
class Resumable:
    """A framework app serving the SDK's resume endpoint, registered as the
    completer of operation on server; reader reads records and the audit."""

    server: Server
    shop: Shop
    operation: str
    reader: str


@pytest.fixture(scope="module")
def resumable(kind: str, completing: Server, binary: str) -> Iterator[Resumable]:
    admin = mint_token(binary, completing, "tenant:admin")
    # The app's port first: the registration needs the URL, the app the secret it returns.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    operation = f"POST /{kind}-orders"
    r = HTTP.post(completing.url + "/v1/completers", headers={"Authorization": "Bearer " + admin},
                  json={"url": f"http://127.0.0.1:{sock.getsockname()[1]}/idem/resume", "operation_pattern": operation})
    assert r.status_code == 201, r.text
    secret = r.json()["secret"]
    assert secret.startswith("whsec_")
    shop = Shop()
    app = MAKERS[kind](completing, shop, secret=secret)
    serving = _serve_wsgi(app, sock) if kind == "flask" else _serve_asgi(app, sock)
    try:
        for _ in serving:
            yield Resumable(completing, shop, operation, mint_token(binary, completing, "keys:read"))
    finally:
        sock.close()


def _record(r: Resumable, key: str) -> dict[str, Any]:
    """The key's record as the API answers it (with its completer member)."""
    res = HTTP.get(f"{r.server.url}/v1/keys/{key}", headers={"Authorization": "Bearer " + r.reader})
    assert res.status_code == 200, res.text
    doc: dict[str, Any] = res.json()
    return doc


def _wait_record(r: Resumable, key: str, cond: Callable[[dict[str, Any]], bool], timeout: float = 30) -> dict[str, Any]:
    """Poll the key's record until cond holds; fail after timeout seconds."""
    end = time.monotonic() + timeout
    while True:
        rec = _record(r, key)
        if cond(rec):
            return rec
        if time.monotonic() > end:
            pytest.fail(f"{key}: not reached in {timeout} s; the record: {rec}")
        time.sleep(0.05)


def _audit(r: Resumable, key: str) -> list[dict[str, Any]]:
    """The key's audit entries, oldest first."""
    res = HTTP.get(f"{r.server.url}/v1/keys/{key}/audit", params={"limit": 100}, headers={"Authorization": "Bearer " + r.reader})
    assert res.status_code == 200, res.text
    return list(reversed(res.json()["items"]))


def _die_after_charge(r: Resumable, client: Client, key: str) -> int:
    """A worker, through run(), claims with a 1 s lease, charges (step 1),
    checkpoints "charged" and dies: run() stops renewing and never
    completes. Returns its fencing token."""
    tokens: list[int] = []

    def work(claim: Claim) -> Response:
        tokens.append(claim.fencing_token)
        return r.shop.place_order(claim, key)

    r.shop.crash_after_charge.add(key)
    with pytest.raises(RuntimeError, match="died after the charge"):
        client.run(key, work, operation=r.operation, request={"amount": 1000}, lease=1)
    assert r.shop.charges[key] == 1 and key not in r.shop.emails
    return tokens[0]


def test_real_completer_resumes_dead_worker_exactly_once(resumable: Resumable) -> None:
    """The completer takes the dead worker's key over and calls the app's
    resume endpoint; the resume function skips step 1 (the recovery point)
    and does step 2; the key completes with its answer: one charge, one
    e-mail, a retry replays it, the late worker gets lease_lost, the audit
    shows the completer's completion."""
    r = resumable
    k = new_key("order")
    with Client(r.server.url, token=r.server.token) as client:
        stale = _die_after_charge(r, client, k)
        rec = _wait_record(r, k, lambda d: d["state"] == "completed")
        assert rec["completer"] is None
        assert rec["response"]["status"] == 201
        body = {"order": k, "charge": f"ch_{k}"}
        assert json.loads(rec["response"]["body"]) == body
        assert r.shop.charges[k] == 1, "step 1 happened once"
        assert r.shop.emails[k] == 1, "step 2 happened once"
        calls = [c for c in r.shop.resumed if c.key == k]
        assert len(calls) == 1, "one resume call"
        call = calls[0]
        assert (call.operation, call.attempt, call.recovery_point, call.recovery_data) == (r.operation, 1, "charged", {"charge": f"ch_{k}"})
        assert call.fencing_token > stale and call.webhook_id.startswith("rsm_")

        with pytest.raises(ProblemError) as late:
            client.complete(k, stale, Response(200, {}, b"late"))
        assert (late.value.status, late.value.code) == (409, "lease_lost"), "the late original worker is fenced off"

        again = client.run(k, lambda c: r.shop.place_order(c, k), operation=r.operation, request={"amount": 1000})
        assert again.replayed and again.response.status == 201 and json.loads(again.response.body) == body
        assert r.shop.charges[k] == 1 and r.shop.emails[k] == 1
        assert _record(r, k)["response"] == rec["response"], "the late complete changed nothing"

    audit = _audit(r, k)
    assert [a["action"] for a in audit] == ["completer_completed"]
    assert audit[0]["actor"]["scope"] == "completer" and audit[0]["actor"]["subject"].startswith("completer:")
    assert audit[0]["fencing_token"] == call.fencing_token


def test_real_completer_resume_raises_key_stays_held(resumable: Resumable) -> None:
    """The resume function raises at step 2 (before its side effect): the
    answer is unknown, the key stays held by the completer (state unknown),
    a retry gets 409 outcome_unknown and nothing runs twice; once the
    function recovers the completer completes the key, still one charge
    and one e-mail."""
    r = resumable
    k = new_key("order")
    r.shop.mail_down.add(k)
    with Client(r.server.url, token=r.server.token) as client:
        stale = _die_after_charge(r, client, k)
        rec = _wait_record(r, k, lambda d: (d.get("completer") or {}).get("state") == "unknown")
        # Held: not completed, not released (its lease may show it orphaned between attempts).
        assert rec["state"] in ("in_flight", "orphaned") and rec["completer"]["attempts"] >= 1
        assert rec["recovery_point"] == "charged"

        with pytest.raises(ProblemError) as retry:
            client.claim(k, operation=r.operation, request={"amount": 1000})
        assert (retry.value.status, retry.value.code) == (409, "outcome_unknown"), "a retry never takes the key over"
        with pytest.raises(ProblemError) as late:
            client.complete(k, stale, Response(200, {}, b"late"))
        assert late.value.code == "lease_lost"
        assert r.shop.charges[k] == 1 and k not in r.shop.emails, "no side effect doubled"
        assert _record(r, k)["state"] in ("in_flight", "orphaned")
        held = [a["action"] for a in _audit(r, k)]
        assert held and set(held) == {"completer_unknown"}

        r.shop.mail_down.discard(k)
        rec = _wait_record(r, k, lambda d: d["state"] == "completed")
        assert json.loads(rec["response"]["body"]) == {"order": k, "charge": f"ch_{k}"}
        assert r.shop.charges[k] == 1 and r.shop.emails[k] == 1
        calls = [c for c in r.shop.resumed if c.key == k]
        assert len(calls) >= 2 and all(c.recovery_point == "charged" for c in calls)
        assert [c.attempt for c in calls] == list(range(1, len(calls) + 1))

    actions = [a["action"] for a in _audit(r, k)]
    assert actions == ["completer_unknown"] * (len(calls) - 1) + ["completer_completed"]


def test_real_completer_lease_end_sets_lease_lost(resumable: Resumable) -> None:
    """The resume function runs on after the completer hung up (its call
    timed out), but not past the completer's lease on the key: claim.lease_lost
    is set at the call's lease_expires_at, never before, as the Go SDK's
    context ends then, so a long function stops before the next attempt's
    new token takes the key."""
    k = new_key("leaseend")
    with Client(resumable.server.url, token=resumable.server.token) as client:
        client.claim(k, operation=resumable.operation, request={"amount": 1}, lease=1)  # the worker dies at once
    end = time.monotonic() + 120
    while k not in resumable.shop.lease_ends:
        assert time.monotonic() < end, "the resume function never saw its lease end"
        time.sleep(0.05)
    was_set, at, lease_end = resumable.shop.lease_ends[k]
    assert was_set, "claim.lease_lost is set when the completer's lease ends"
    assert at >= lease_end - 0.05, "not before the lease ended"
    rec = _wait_record(resumable, k, lambda d: (d.get("completer") or {}).get("state") == "review", timeout=120)
    assert rec["state"] in ("in_flight", "orphaned")
