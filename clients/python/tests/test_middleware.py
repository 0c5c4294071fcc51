"""The acceptance tests of the Python middleware: a real Flask app and a
real Django project (WSGI) and a real FastAPI app (ASGI), each with a
side-effect counter, behind the
idem middleware talking to the real server, on both stores."""

from __future__ import annotations

import json
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from apps import App, serve
from conftest import Server, _cli, claim_waiters, new_key, start_server, wait_for
from faultproxy import FaultProxy, first_answer_to
from idem import Client, ProblemError, RetryPolicy, frontdoor
from idem._middleware import Options, prefer_wait

BODY = {"amount": 1000, "currency": "usd"}


@pytest.fixture(params=["flask", "django", "fastapi"])
def app(request: pytest.FixtureRequest, server: Server) -> Iterator[App]:
    yield from serve(request.param, server.url, server.token)


HTTP = httpx.Client(timeout=30, limits=httpx.Limits(max_connections=100))

#: The detail of 409 response_not_replayable, for either reason a record is
#: not replayable: the shared vectors hold it once (docs/frontdoor.md rule 7).
NOT_REPLAYABLE_DETAIL = next(p["detail"] for p in json.loads(
    (Path(__file__).resolve().parents[3] / "testvectors/frontdoor/policy.json").read_text())["problems"]
    if p["code"] == "response_not_replayable")


def post(url: str, key: str | None, body: Any = BODY, headers: dict[str, str] | None = None) -> httpx.Response:
    h = {"Idempotency-Key": key} if key is not None else {}
    return HTTP.post(url, json=body, headers={**h, **(headers or {})})


def test_fifty_concurrent_duplicates_one_side_effect(app: App) -> None:
    key = new_key("dup")
    barrier = threading.Barrier(50)

    def one(_: int) -> httpx.Response:
        barrier.wait()
        return post(app.url + "/charges/7", key)

    with ThreadPoolExecutor(50) as pool:
        answers = list(pool.map(one, range(50)))
    assert len(app.effects.charges) == 1, "exactly one side effect"
    fresh = [a for a in answers if a.status_code == 201 and "Idempotent-Replayed" not in a.headers]
    replays = [a for a in answers if a.status_code == 201 and a.headers.get("Idempotent-Replayed") == "true"]
    in_flight = [a for a in answers if a.status_code == 409]
    assert len(fresh) == 1 and len(fresh) + len(replays) + len(in_flight) == 50, [a.status_code for a in answers]
    for a in in_flight:
        p = a.json()
        assert a.headers["Content-Type"] == "application/problem+json"
        assert p["code"] == "request_in_flight" and p["retryable"] is True and int(a.headers["Retry-After"]) >= 1
        assert p["instance"].startswith("urn:idem:request:")
    want = fresh[0].json()
    assert all(r.json() == want for r in replays)
    # A retry once the first is done: the stored answer, verbatim, without the cookie.
    again = post(app.url + "/charges/7", key)
    assert again.status_code == 201 and again.headers["Idempotent-Replayed"] == "true"
    assert again.json() == want and again.headers["Location"] == fresh[0].headers["Location"]
    assert "set-cookie" not in again.headers and "set-cookie" in fresh[0].headers
    assert len(app.effects.charges) == 1


def test_retry_after_a_dropped_answer_one_side_effect(app: App) -> None:
    port = int(app.url.rsplit(":", 1)[1])
    left = {"n": 1}
    lock = threading.Lock()

    def drop(head: bytes) -> bool:
        with lock:
            if head.startswith(b"POST /charges/") and left["n"]:
                left["n"] -= 1
                return True
        return False

    proxy = FaultProxy(("127.0.0.1", port), drop)
    try:
        key = new_key("drop")
        with pytest.raises(httpx.TransportError):
            post(proxy.url + "/charges/9", key)  # the app charged, the answer was lost
        assert proxy.dropped == 1 and len(app.effects.charges) == 1
        retry = post(proxy.url + "/charges/9", key)
        assert retry.status_code == 201 and retry.headers["Idempotent-Replayed"] == "true"
        assert retry.json() == {"charge": "ch_1", "account": 9}
        assert len(app.effects.charges) == 1, "the retry did not charge again"
    finally:
        proxy.close()


def test_front_door_rules(app: App, server: Server) -> None:
    url = app.url + "/charges/1"
    r = post(url, None)
    assert r.status_code == 400 and r.json()["code"] == "idempotency_key_missing"
    r = httpx.post(url, json=BODY, headers=[("Idempotency-Key", "a"), ("Idempotency-Key", "b")])
    assert r.status_code == 400 and r.json()["code"] == "invalid_key"
    r = post(url, "a b", headers={"X-Request-Id": "req-42"})
    assert r.status_code == 400 and r.json()["code"] == "invalid_key" and r.json()["instance"] == "urn:idem:request:req-42"
    r = httpx.post(url, content=b'{"a":1,"a":2}', headers={"Idempotency-Key": new_key(), "Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["code"] == "invalid_request"
    assert httpx.get(url).json() == {"count": 0}, "GET passes through without a key"
    assert len(app.effects.charges) == 0

    key = new_key("rules")
    assert post(url, key).status_code == 201
    with Client(server.url, token=server.token) as idem:
        rec = idem.get(key)  # the operation names the route pattern, never the path or query
        assert rec.operation in ("POST /charges/<int:account>", "POST /charges/{account}"), rec.operation  # Flask and Django, FastAPI
    # The sf-string form is the same key; another body is another request.
    same = post(url, f'"{key}"', body={"currency": "usd", "amount": 1000.0})
    assert same.status_code == 201 and same.headers["Idempotent-Replayed"] == "true"
    other = post(url, key, body={"amount": 1, "currency": "usd"})
    assert other.status_code == 422 and other.json()["code"] == "fingerprint_mismatch"
    # The same key and body on another account of the same route: the path is
    # fingerprinted, so 422, not account 1's charge replayed.
    elsewhere = post(app.url + "/charges/2", key)
    assert elsewhere.status_code == 422 and elsewhere.json()["code"] == "fingerprint_mismatch"
    assert len(app.effects.charges) == 1

    # A 5xx the handler answered is stored like any status.
    k5 = new_key("fail")
    first = post(app.url + "/fail", k5, body={})
    assert first.status_code == 502
    assert post(app.url + "/fail", k5, body={}).headers["Idempotent-Replayed"] == "true"
    # A handler exception stores nothing: the claim stays until its lease ends.
    kb = new_key("boom")
    try:
        r = post(app.url + "/boom", kb, body={})
        assert r.status_code == 500
    except httpx.TransportError:
        pass  # a server may drop the connection of a failed handler
    # On a new connection: the server may close the failed handler's one
    # after its 500, and the pool would send the retry on it (reset).
    with httpx.Client(timeout=30) as fresh:
        r = fresh.post(app.url + "/boom", json={}, headers={"Idempotency-Key": kb})
    assert r.status_code == 409 and r.json()["code"] == "request_in_flight"
    assert [c for c in app.effects.charges if c in ("fail", "boom")] == ["fail", "boom"]


@pytest.mark.parametrize("kind", ["flask", "django", "fastapi"])
def test_fail_closed_when_idem_is_down(kind: str) -> None:
    for a in serve(kind, "http://127.0.0.1:1", "t", timeout=2):
        r = post(a.url + "/charges/1", new_key())
        assert r.status_code == 503 and r.json()["code"] == "store_unavailable"
        assert int(r.headers["Retry-After"]) >= 1
        assert a.effects.charges == [], "the handler did not run"


@pytest.mark.parametrize("kind", ["flask", "django", "fastapi"])
def test_release_5xx_when_not_stored(kind: str, server: Server) -> None:
    for a in serve(kind, server.url, server.token, store_5xx=False):
        key = new_key()
        assert post(a.url + "/fail", key, body={}).status_code == 502
        r = post(a.url + "/fail", key, body={})
        assert r.status_code == 502 and "Idempotent-Replayed" not in r.headers
        assert len(a.effects.charges) == 2



@pytest.mark.parametrize("kind", ["flask", "fastapi"])  # the sync and the asyncio path; Django shares Flask's
def test_lost_claim_answer_between_middleware_and_idem(kind: str, server: Server) -> None:
    """idem's answer to the middleware's claim is lost (the claim was made):
    the middleware's retry carries the same attempt id and gets the claim
    back, so the caller's first request runs the handler, once."""
    proxy = FaultProxy(("127.0.0.1", int(server.url.rsplit(":", 1)[1])), first_answer_to("claim"))
    try:
        for a in serve(kind, proxy.url, server.token, lease=1):
            key = new_key("lost")
            answers = []
            for _ in range(10):
                r = post(a.url + "/charges/3", key)
                answers.append(r.status_code)
                if r.status_code != 409:
                    break
                time.sleep(float(r.headers["Retry-After"]))
            assert answers == [201], answers
            assert proxy.dropped == 1
            assert len(a.effects.charges) == 1
            assert post(a.url + "/charges/3", key).headers["Idempotent-Replayed"] == "true"
    finally:
        proxy.close()


@pytest.mark.parametrize("kind", ["flask", "fastapi"])
def test_too_large_to_store_or_to_protect(kind: str, server: Server) -> None:
    """A response over max_stored_bytes is sent, stored without its body
    (Idem-Not-Replayable naming its size), and its retry answers 409
    response_not_replayable, with the shared detail, instead of running the
    handler again; a request body over max_body_bytes is refused 413."""
    for a in serve(kind, server.url, server.token, max_stored_bytes=50, max_body_bytes=64):
        key = new_key()
        first = post(a.url + "/charges/1", key)
        assert first.status_code == 201 and first.json()["charge"] == "ch_1"
        rec = Client(server.url, token=server.token).get(key)
        assert rec.state == "completed" and rec.response is not None and rec.response.status == 201, rec
        why = re.fullmatch(r"response of (\d+) bytes not stored", rec.response.headers["Idem-Not-Replayable"])
        assert why and int(why[1]) > 50, rec.response.headers
        again = post(a.url + "/charges/1", key)
        assert again.status_code == 409 and again.json()["code"] == "response_not_replayable"
        assert again.json()["retryable"] is False and "Retry-After" not in again.headers
        assert again.json()["detail"] == NOT_REPLAYABLE_DETAIL
        big = post(a.url + "/charges/1", new_key(), body={"pad": "x" * 100})
        assert big.status_code == 413 and big.json()["code"] == "payload_too_large"
        assert len(a.effects.charges) == 1
        # An unprotected request (PUT without a key) gets its whole large body.
        put = HTTP.put(a.url + "/files", content=b"y" * 5000)
        assert put.status_code == 200 and put.json() == {"length": 5000}


@pytest.mark.parametrize("kind", ["flask", "fastapi"])
def test_complete_failing_after_the_handler_ran(kind: str, server: Server) -> None:
    """idem cannot be reached for complete after the handler ran: the
    handler's answer is still sent (and the failure logged); nothing is
    stored, so the claim stays in flight and a retry gets 409, not a second
    side effect."""
    proxy = FaultProxy(("127.0.0.1", int(server.url.rsplit(":", 1)[1])), lambda head: False,
                       refuse=lambda head: b"/complete " in head.split(b"\r\n", 1)[0])
    try:
        for a in serve(kind, proxy.url, server.token, policy=RetryPolicy(base_delay=0.01, max_delay=0.05)):
            key = new_key("nocomplete")
            first = post(a.url + "/charges/5", key)
            assert first.status_code == 201 and first.json()["charge"] == "ch_1"
            assert "Idempotent-Replayed" not in first.headers
            assert proxy.refused == 3, "complete was tried three times"
            again = post(a.url + "/charges/5", key)
            assert again.status_code == 409 and again.json()["code"] == "request_in_flight"
            assert len(a.effects.charges) == 1
    finally:
        proxy.close()


@pytest.mark.parametrize("kind", ["flask", "django", "fastapi"])
def test_prefer_wait_gets_the_replay_not_409(kind: str, server: Server) -> None:
    """Two requests with one key and Prefer: wait=10: the duplicate's claim
    is held by the idem server while the first runs (its lease is 30 s, so
    nothing but the completion answers it soon) and it gets the first one's
    response replayed, not 409, with Preference-Applied; a wait that runs
    out is the 409 it would have been, with Preference-Applied; without
    Prefer the duplicate gets 409 at once, without it."""
    # The attempt timeout (30 s) leaves room for the whole wait (10 s).
    for a in serve(kind, server.url, server.token, lease=30, timeout=30, policy=RetryPolicy(attempt_timeout=30)):
        url, prefer = a.url + "/gated", {"Prefer": "wait=10"}
        key = new_key("prefer")
        with ThreadPoolExecutor(2) as pool:
            try:
                first = pool.submit(post, url, key, {"n": 1}, prefer)
                wait_for(lambda: len(a.effects.charges) == 1)
                short = post(url, key, {"n": 1}, {"Prefer": "respond-async, wait=1"})
                assert short.status_code == 409 and short.json()["code"] == "request_in_flight", short.text
                assert short.headers["Preference-Applied"] == "wait=1" and int(short.headers["Retry-After"]) >= 1
                held = pool.submit(post, url, key, {"n": 1}, prefer)
                wait_for(lambda: claim_waiters(server) == 1)  # the duplicate's claim is held by idem
                assert not held.done()
            finally:
                a.effects.gate.set()
            r1, r2 = first.result(), held.result()
        assert r1.status_code == 201 and "Idempotent-Replayed" not in r1.headers
        assert r2.status_code == 201 and r2.headers["Idempotent-Replayed"] == "true", r2.text
        assert r2.json() == r1.json() == {"charge": "ch_1"}
        assert r2.headers["Preference-Applied"] == "wait=10"
        # The first claim found the key free: idem says it was willing to wait, and the front door passes that on.
        assert r1.headers["Preference-Applied"] == "wait=10"
        assert len(a.effects.charges) == 1, "the handler ran once"
        wait_for(lambda: claim_waiters(server) == 0)

        # Without the preference: 409 at once, no Preference-Applied.
        a.effects.gate.clear()
        k2 = new_key("noprefer")
        with ThreadPoolExecutor(1) as pool:
            try:
                first = pool.submit(post, url, k2, {"n": 2})
                wait_for(lambda: len(a.effects.charges) == 2)
                now = post(url, k2, {"n": 2})
                assert now.status_code == 409 and now.json()["code"] == "request_in_flight"
                assert "Preference-Applied" not in now.headers
            finally:
                a.effects.gate.set()
            r1 = first.result()
        assert r1.status_code == 201 and "Preference-Applied" not in r1.headers
        assert len(a.effects.charges) == 2


def test_prefer_wait_cap() -> None:
    """The claim's wait: Prefer's N within max_wait (None: no cap of the
    middleware's own; 0 or less: Prefer ignored); malformed: none."""
    def wait(max_wait: float | None, *values: str) -> float:
        return prefer_wait(Options(max_wait=max_wait), [("Prefer", v) for v in values])
    assert wait(None, "wait=10") == 10
    assert wait(5, "wait=10") == 5 and wait(5, "wait=3") == 3
    assert wait(0, "wait=10") == 0 and wait(-1, "wait=10") == 0
    assert wait(None, "wait=abc") == 0 and wait(None) == 0 and wait(None, "wait=0") == 0
    assert wait(None, "wait=99999") == 24 * 3600
    assert wait(None, "return=minimal", "Wait = 7 ; x=y") == 7


@pytest.mark.parametrize("kind", ["flask", "fastapi"])
def test_tenant_limit_below_max_stored_bytes(kind: str, server: Server, binary: str) -> None:
    """The tenant's max_response_bytes (here 60 bytes) is under the
    middleware's max_stored_bytes: idem refuses the whole response (413), and
    the middleware stores it without its body, as one over max_stored_bytes,
    so that the retry is 409 response_not_replayable. Before, nothing was
    stored: the key stayed in flight and the retry after the lease ran the
    handler a second time."""
    tenant = "small-" + new_key("t")[-8:]
    _cli(binary, server.env, "tenant", "create", tenant, "--max-response-bytes", "60")
    token = _cli(binary, server.env, "token", "--tenant", tenant, "--scope", "keys:write", "--ttl", "1h")
    for a in serve(kind, server.url, token, lease=1):
        key = new_key("limit")
        first = post(a.url + "/charges/3", key)
        assert first.status_code == 201 and first.json()["charge"] == "ch_1"
        time.sleep(1.1)  # past the claim's lease: an in-flight key would be taken over now
        again = post(a.url + "/charges/3", key)
        assert again.status_code == 409 and again.json()["code"] == "response_not_replayable"
        assert again.json()["detail"] == NOT_REPLAYABLE_DETAIL
        assert len(a.effects.charges) == 1


@pytest.mark.parametrize("kind", ["flask", "fastapi"])  # Django refuses a status outside 100-599 itself
@pytest.mark.parametrize("store_5xx", [True, False])
def test_unstorable_status(kind: str, store_5xx: bool, server: Server) -> None:
    """A handler answers 799, which WSGI and ASGI servers send but idem's
    complete refuses (it stores 100-599): the answer is sent as it is and
    stored as not replayable (502, Idem-Not-Replayable), with store_5xx off
    too, so the retry after the claim's lease is 409
    response_not_replayable, not a second run. Before, complete was refused,
    the key stayed in flight and the retry after the lease ran the handler a
    second time. The record's Idem-Not-Replayable names the status sent, and
    the retry's detail is the shared one, which does not say "too large"
    (it did)."""
    for a in serve(kind, server.url, server.token, lease=1, store_5xx=store_5xx):
        key = new_key("odd")
        if kind == "flask":
            first = post(a.url + "/odd", key, body={})
            assert first.status_code == 799 and first.text == "odd"
        else:
            # uvicorn cannot send a status it has no reason phrase for: it drops
            # the connection, after the middleware stored the outcome.
            with pytest.raises(httpx.RemoteProtocolError):
                post(a.url + "/odd", key, body={})
        rec = Client(server.url, token=server.token).get(key)
        assert rec.state == "completed" and rec.response is not None, rec
        assert rec.response.status == 502 and rec.response.body == b""
        assert rec.response.headers["Idem-Not-Replayable"] == "response of status 799 not stored (outside 100-599)"
        time.sleep(1.1)  # past the claim's lease: an in-flight key would be taken over now
        again = post(a.url + "/odd", key, body={})
        assert again.status_code == 409 and again.json()["code"] == "response_not_replayable"
        assert again.json()["detail"] == NOT_REPLAYABLE_DETAIL, "the detail does not say too large of a 799"
        assert len(a.effects.charges) == 1


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_body_over_the_servers_limit(store: str, binary: str) -> None:
    """idem's request limit (IDEM_MAX_BODY_BYTES, 64 KiB here) is under the
    middleware's max_body_bytes, so idem refuses the claim's document (413):
    the caller gets 413 payload_too_large and the handler does not run.
    Before, it got 503 store_unavailable with Retry-After: a retry that can
    never succeed."""
    for srv in start_server(binary, store, {"IDEM_MAX_BODY_BYTES": str(64 << 10)}):
        for kind in ("flask", "fastapi"):
            for a in serve(kind, srv.url, srv.token):
                got = post(a.url + "/charges/1", new_key("big"), body={"pad": "x" * (100 << 10)})
                assert got.status_code == 413 and got.json()["code"] == "payload_too_large", got.text
                assert len(a.effects.charges) == 0


def _chunked(*parts: bytes) -> Iterator[bytes]:
    yield from parts


@pytest.mark.parametrize("kind", ["flask", "django"])
def test_chunked_request_body(kind: str, server: Server) -> None:
    """A body sent chunked (no Content-Length; werkzeug sets
    wsgi.input_terminated) is read to its end for the fingerprint and the
    handler: the same key with another body in its second chunk is 422, not
    the first one's replay; the same body is replayed; a chunked body over
    max_body_bytes is 413."""
    for a in serve(kind, server.url, server.token, max_body_bytes=64):
        key, h = new_key("chunked"), {"Idempotency-Key": "", "Content-Type": "application/json"}
        h["Idempotency-Key"] = key
        first = HTTP.post(a.url + "/charges/4", headers=h, content=_chunked(b'{"amount": 1', b'000, "currency": "usd"}'))
        assert first.status_code == 201, first.text
        assert a.effects.charges == [{"amount": 1000, "currency": "usd"}], "the handler got the whole body"
        same = HTTP.post(a.url + "/charges/4", headers=h, content=_chunked(b'{"amount": 1', b'000, "currency": "usd"}'))
        assert same.status_code == 201 and same.headers["Idempotent-Replayed"] == "true"
        other = HTTP.post(a.url + "/charges/4", headers=h, content=_chunked(b'{"amount": 1', b'001, "currency": "usd"}'))
        assert other.status_code == 422 and other.json()["code"] == "fingerprint_mismatch", other.text
        h["Idempotency-Key"] = new_key("chunked")
        big = HTTP.post(a.url + "/charges/4", headers=h, content=_chunked(b'{"pad": "', b"x" * 100, b'"}'))
        assert big.status_code == 413 and big.json()["code"] == "payload_too_large"
        assert len(a.effects.charges) == 1


def _serve_wsgi(app: Any) -> Iterator[str]:
    from werkzeug.serving import make_server

    srv = make_server("127.0.0.1", 0, app, threaded=True)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_port}"
    finally:
        srv.shutdown()


def test_wsgi_start_response_exc_info(server: Server) -> None:
    """PEP 3333: an app that answered start_response, then failed before any
    body byte and calls start_response again with exc_info replaces the
    status and headers (its error page is the answer, stored and replayed);
    one that calls it so after a body byte (the headers count as sent) gets
    the exception re-raised, and nothing is stored. A second call without
    exc_info is an error. Before, the middleware re-raised in the first case
    too: the app's own 500 page was lost, nothing was stored, and the retry
    after the lease ran the handler again."""
    import sys

    from idem.wsgi import IdempotencyMiddleware

    runs: list[str] = []

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        mode = environ["PATH_INFO"].strip("/")
        runs.append(mode)
        start_response("201 Created", [("Content-Type", "application/json")])
        if mode == "twice":
            start_response("202 Accepted", [])  # no exc_info: a bug of the app
            return [b"{}"]
        if mode == "after-body":
            def body() -> Iterator[bytes]:
                yield b'{"partial": '
                try:
                    raise RuntimeError("failed while streaming")
                except RuntimeError:
                    start_response("500 Internal Server Error", [("Content-Type", "text/plain")], sys.exc_info())
                yield b"unreachable"
            return body()
        try:
            raise RuntimeError("failed before the body")
        except RuntimeError:
            start_response("500 Internal Server Error", [("Content-Type", "text/plain")], sys.exc_info())
        return [b"error page"]

    client = Client(server.url, token=server.token)
    for url in _serve_wsgi(IdempotencyMiddleware(app, client, lease=1)):
        key = new_key("excinfo")
        first = HTTP.post(url + "/before-body", headers={"Idempotency-Key": key}, content=b"{}")
        assert first.status_code == 500 and first.text == "error page", first.text
        again = HTTP.post(url + "/before-body", headers={"Idempotency-Key": key}, content=b"{}")
        assert again.status_code == 500 and again.headers["Idempotent-Replayed"] == "true" and again.text == "error page"
        assert runs.count("before-body") == 1

        k2 = new_key("excinfo")
        streamed = HTTP.post(url + "/after-body", headers={"Idempotency-Key": k2}, content=b"{}")
        assert streamed.status_code == 500 and "partial" not in streamed.text  # werkzeug's own error page
        assert client.get(k2).state == "in_flight", "the re-raised exception stores nothing"

        k3 = new_key("excinfo")
        twice = HTTP.post(url + "/twice", headers={"Idempotency-Key": k3}, content=b"{}")
        assert twice.status_code == 500
        assert client.get(k3).state == "in_flight"


def _raw_post(url: str, target: bytes, key: str) -> int:
    """POST with a request line that is target byte for byte (no client
    library escaping it); the answer's status."""
    import socket

    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST " + target + b" HTTP/1.1\r\nHost: x\r\nIdempotency-Key: " + key.encode()
                  + b"\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return int(data.split(b" ", 2)[1])


def _raw_answer(url: str, target: bytes, key: str) -> tuple[int, bytes]:
    """POST {} with a request line that is target byte for byte; the
    answer's status and its head (status line and headers)."""
    import socket

    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST " + target + b" HTTP/1.1\r\nHost: x\r\nIdempotency-Key: " + key.encode()
                  + b"\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head = data.split(b"\r\n\r\n", 1)[0]
    return int(head.split(b" ", 2)[1]), head


@pytest.mark.parametrize("kind", ["flask", "django", "fastapi"])
def test_operation_vectors(kind: str, server: Server) -> None:
    """Each request line of testvectors/frontdoor/operations.json, sent
    byte for byte to a path no route pattern names, is served by the app
    (its own 404) and claimed with the operation the vector expects - the
    one client/idemhttp, the gateway and the Node middleware give the same
    bytes - and its retry is the replay. Before, a path that decodes to a
    control character (/pay%00x, /pay%0A, /pay%7F, /pay%C2%85) made a label
    idem refuses (400), answered as a retryable 503 store_unavailable no
    retry could get past; /pay%FF was U+FFFD under uvicorn and a 500 under
    werkzeug (the middleware's own exception)."""
    import base64

    vectors = json.loads((Path(__file__).resolve().parents[3] / "testvectors/frontdoor/operations.json").read_text())["vectors"]
    assert vectors
    client = Client(server.url, token=server.token)
    for a in serve(kind, server.url, server.token):
        for v in vectors:
            target = base64.b64decode(v["target_base64"]) if "target_base64" in v else v["target"].encode("latin-1")
            key = new_key("operation")
            status, _ = _raw_answer(a.url, target, key)
            if kind == "fastapi" and "uvicorn" in v["expect"].get("refused_by", []):
                assert status == 400, (v["name"], status)
                with pytest.raises(ProblemError):
                    client.get(key)
                continue
            assert status == 404, (v["name"], status)  # the app's own answer: no route matches
            rec = client.get(key)
            assert rec.state == "completed", v["name"]
            assert rec.operation == v["expect"].get("legacy", {}).get("python", v["expect"]["operation"]), v["name"]
            again, head = _raw_answer(a.url, target, key)
            assert again == 404 and b"Idempotent-Replayed: true" in head, (v["name"], head)


@pytest.mark.parametrize("kind", ["django", "fastapi"])  # the sync and the asyncio client
def test_claim_refused_as_invalid(kind: str, server: Server) -> None:
    """An operation idem refuses (here from a route function that names a
    control character) answers the caller 400 invalid_request, not
    retryable, naming idem's field, without running the handler or claiming
    anything. Before, it was 503 store_unavailable with Retry-After: a retry
    that could never succeed."""
    client = Client(server.url, token=server.token)
    for a in serve(kind, server.url, server.token, route=lambda _: "/charges/\x01"):
        key = new_key("refused")
        r = post(a.url + "/charges/1", key)
        assert r.status_code == 400, r.text
        p = r.json()
        assert p["code"] == "invalid_request" and p["retryable"] is False, p
        assert "Retry-After" not in r.headers
        assert p["errors"][0]["field"] == "operation", p
        assert a.effects.charges == [], "the handler must not run"
        with pytest.raises(ProblemError) as e:
            client.get(key)
        assert e.value.code == "key_not_found"


@pytest.mark.parametrize("kind", ["flask", "django", "fastapi"])
def test_target_vectors(kind: str, server: Server) -> None:
    """Each request line of testvectors/frontdoor/targets.json, sent byte
    for byte, gives the record the fingerprint the vector expects (the one
    client/idemhttp and the Node middleware give the same bytes). Before,
    werkzeug's dev server handed RAW_URI and QUERY_STRING over as the
    Latin-1 reading of their UTF-8 encoding, so a byte outside ASCII gave
    another fingerprint than in the other SDKs."""
    import base64

    vectors = json.loads((Path(__file__).resolve().parents[3] / "testvectors/frontdoor/targets.json").read_text())["vectors"]
    assert vectors
    client = Client(server.url, token=server.token)
    for a in serve(kind, server.url, server.token):
        for v in vectors:
            target = base64.b64decode(v["target_base64"]) if "target_base64" in v else v["target"].encode("latin-1")
            key = new_key("target")
            status = _raw_post(a.url, target, key)
            if kind == "fastapi" and "target_base64" in v:
                # uvicorn refuses bytes outside ASCII in the request target
                # before any app runs: nothing is claimed, nothing can differ.
                assert status == 400, (v["name"], status)
                with pytest.raises(ProblemError):
                    client.get(key)
                continue
            assert status < 500, (v["name"], status)
            assert client.get(key).fingerprint == v["expect"]["fingerprint"], v["name"]


@pytest.mark.parametrize("kind", ["flask", "fastapi"])  # the sync and the asyncio client; Django shares Flask's
def test_invalid_claim_answers(kind: str) -> None:
    """An idem URL that answers claims with something the client cannot
    interpret (each "invalid" claim answer of testvectors/sdk/replay.json,
    from a loopback fake: a real idem cannot send them) gets the caller 503
    store_unavailable; the handler never runs and nothing invented is
    replayed. Before, a 201 without a fencing token ran the handler and a 200
    without a response replayed an empty answer."""
    from http.server import ThreadingHTTPServer

    from test_vectors import _ClaimAnswer

    vectors = [v for v in json.loads((Path(__file__).resolve().parents[3] / "testvectors/sdk/replay.json").read_text())["claim_answers"]
               if v["expect"] == "invalid"]
    assert vectors
    fake = ThreadingHTTPServer(("127.0.0.1", 0), _ClaimAnswer)
    threading.Thread(target=fake.serve_forever, daemon=True).start()
    try:
        for a in serve(kind, f"http://127.0.0.1:{fake.server_address[1]}", "t"):
            for v in vectors:
                _ClaimAnswer.vector = v
                r = post(a.url + "/charges/1", new_key("invalid"))
                assert r.status_code == 503 and r.json()["code"] == "store_unavailable", (v["name"], r.status_code, r.text)
            assert a.effects.charges == [], "the handler never ran"
    finally:
        fake.shutdown()
        fake.server_close()


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_storage_quota_exceeded(store: str, binary: str) -> None:
    """The tenant's records fill its storage_quota_bytes (1200 bytes here;
    no tenant cache, so every claim checks it): the next new key gets 507
    storage_quota_exceeded from idem, and the middleware answers 507
    storage_quota_exceeded, not retryable, without Retry-After, the handler
    not run and nothing stored; a completed key still replays. Before, the
    refusal fell into the fail-closed branch: 503 store_unavailable,
    retryable, a retry that cannot succeed until the tenant's usage falls."""
    for srv in start_server(binary, store, {"IDEM_TENANT_CACHE_TTL": "0"}):
        for kind in ("flask", "django", "fastapi"):
            tenant = "full-" + kind
            _cli(binary, srv.env, "tenant", "create", tenant, "--max-response-bytes", "400", "--storage-quota-bytes", "1200")
            token = _cli(binary, srv.env, "token", "--tenant", tenant, "--scope", "keys:write", "--ttl", "1h")
            for a in serve(kind, srv.url, token):
                stored: list[str] = []
                refused = None
                for i in range(40):
                    key = f"fill-{i}"
                    got = post(a.url + "/charges/1", key)
                    if got.status_code != 201:
                        refused = got
                        break
                    stored.append(key)
                assert refused is not None, "the tenant filled its quota and kept claiming new keys"
                assert stored and len(a.effects.charges) == len(stored), "the handler ran for the stored keys only"
                assert refused.status_code == 507, refused.text
                assert refused.headers["Content-Type"] == "application/problem+json"
                p = refused.json()
                assert p["code"] == "storage_quota_exceeded" and p["retryable"] is False
                assert p["detail"] == frontdoor.STORAGE_QUOTA_DETAIL
                assert "Retry-After" not in refused.headers
                with pytest.raises(ProblemError) as e:
                    Client(srv.url, token=token).get(key)
                assert e.value.code == "key_not_found"
                replay = post(a.url + "/charges/1", stored[0])
                assert replay.status_code == 201 and replay.headers["Idempotent-Replayed"] == "true"
                assert len(a.effects.charges) == len(stored)


#: The detail of 403 tenant_unknown, held once in the shared vectors.
TENANT_UNKNOWN_DETAIL = next(p["detail"] for p in json.loads(
    (Path(__file__).resolve().parents[3] / "testvectors/frontdoor/policy.json").read_text())["problems"]
    if p["code"] == "tenant_unknown")


def _set_disabled(server: Server, binary: str, tenant: str, disabled: bool) -> None:
    """Disable or enable tenant through the admin API with an operator
    token (the server drops its cached tenant at once)."""
    admin = _cli(binary, server.env, "token", "--scope", "admin", "--ttl", "1h")
    r = HTTP.patch(f"{server.url}/v1/admin/tenants/{tenant}", json={"disabled": disabled},
                   headers={"Authorization": f"Bearer {admin}"})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("kind", ["flask", "fastapi"])  # the sync and the asyncio path; Django shares Flask's
def test_tenant_unknown(kind: str, server: Server, binary: str) -> None:
    """An operator disables the middleware's tenant: idem refuses its claims
    403 tenant_unknown, and the middleware answers 403 tenant_unknown, not
    retryable, without Retry-After, with the fixed detail, the handler not
    run and nothing claimed. Enabled again, the same key runs once and its
    retry is a replay. Before, the refusal fell into the fail-closed branch:
    503 store_unavailable, retryable, for as long as the tenant stayed
    disabled (issue 21, hole 2's class)."""
    tenant = "off-" + new_key("t")[-8:]
    _cli(binary, server.env, "tenant", "create", tenant)
    token = _cli(binary, server.env, "token", "--tenant", tenant, "--scope", "keys:write", "--ttl", "1h")
    for a in serve(kind, server.url, token):
        key = new_key("suspended")
        _set_disabled(server, binary, tenant, True)
        for _ in range(2):
            r = post(a.url + "/charges/1", key)
            assert r.status_code == 403, r.text
            assert r.headers["Content-Type"] == "application/problem+json"
            p = r.json()
            assert (p["code"], p["title"], p["retryable"], p["detail"]) == \
                ("tenant_unknown", "Tenant unknown", False, TENANT_UNKNOWN_DETAIL), p
            assert "Retry-After" not in r.headers
        assert a.effects.charges == [], "the handler must not run"
        _set_disabled(server, binary, tenant, False)
        with pytest.raises(ProblemError) as e:
            Client(server.url, token=token).get(key)
        assert e.value.code == "key_not_found", "nothing was claimed while the tenant was disabled"
        first = post(a.url + "/charges/1", key)
        assert first.status_code == 201, first.text
        again = post(a.url + "/charges/1", key)
        assert again.status_code == 201 and again.headers["Idempotent-Replayed"] == "true"
        assert again.content == first.content
        assert len(a.effects.charges) == 1, "the key ran the handler once"


@pytest.mark.parametrize("kind", ["flask", "fastapi"])
def test_token_refused_is_retryable(kind: str, server: Server, binary: str) -> None:
    """Pins the decision for idem's refusals of the middleware's own token
    (docs/frontdoor.md rule 5): 401 unauthenticated (expired, a rotated
    secret, a token of a deleted tenant) and 403 forbidden (without
    keys:write) are a fault of the service's credentials that a rotation
    fixes, not of the caller's request: the retryable 503 store_unavailable
    with Retry-After, never a 401 or 403 blaming the caller, the handler not
    run; once the token function hands out a good token the same key runs
    once. (The behaviour the SDKs had: this passed before the tenant_unknown
    change too.)"""
    read_only = _cli(binary, server.env, "token", "--tenant", "acme", "--scope", "keys:read", "--ttl", "1h")
    current = ["not-a-jwt"]
    for a in serve(kind, server.url, lambda: current[0]):  # type: ignore[arg-type]
        key = new_key("rotated")
        for bad in ("not-a-jwt", read_only):
            current[0] = bad
            r = post(a.url + "/charges/1", key)
            assert r.status_code == 503, r.text
            p = r.json()
            assert p["code"] == "store_unavailable" and p["retryable"] is True, p
            assert int(r.headers["Retry-After"]) >= 1
        assert a.effects.charges == [], "the handler must not run"
        current[0] = server.token
        first = post(a.url + "/charges/1", key)
        assert first.status_code == 201, first.text
        again = post(a.url + "/charges/1", key)
        assert again.headers["Idempotent-Replayed"] == "true"
        assert len(a.effects.charges) == 1, "the key ran the handler once"


def _hang_up(url: str, path: str, key: str, produced: threading.Event) -> None:
    """POST {} to path with key on a socket of its own, and close that
    socket (the caller hanging up) once the handler has produced its first
    chunk."""
    import socket

    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=10)
    try:
        s.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nIdempotency-Key: " + key.encode()
                  + b"\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
        assert produced.wait(30), "the handler never produced its first chunk"
    finally:
        s.close()


def _record(server: Server, key: str) -> Any:
    with Client(server.url, token=server.token) as idem:
        return idem.get(key)


@pytest.mark.parametrize("kind", ["flask", "fastapi"])  # WSGI and ASGI; Django's WSGI path is Flask's
def test_caller_hangs_up_mid_stream(kind: str, server: Server) -> None:
    """The caller hangs up after the first of ten streamed chunks: the
    handler runs to its end, its whole answer is stored, and the retry gets
    it replayed; one side effect (docs/frontdoor.md rule 5, "A cut
    answer"). Before, Starlette's StreamingResponse stopped at
    http.disconnect and the retry got "chunk0;" as a complete replayed
    200; a WSGI app never sees the hang-up (a guard there)."""
    from apps import FULL_STREAM

    for a in serve(kind, server.url, server.token):
        key = new_key("cut")
        _hang_up(a.url, "/stream", key, a.effects.first)
        wait_for(lambda: _record(server, key).state != "in_flight", timeout=30)
        r = post(a.url + "/stream", key, body={})
        assert r.status_code == 200 and r.headers.get("Idempotent-Replayed") == "true", (r.status_code, r.text)
        assert r.text == FULL_STREAM, "the whole answer, never the part produced before the hang-up"
        assert len(a.effects.charges) == 1 and a.effects.finished == 1, "one run, to its end"


@pytest.mark.parametrize("kind", ["flask", "fastapi"])
def test_stream_that_breaks_off(kind: str, server: Server) -> None:
    """A stream that raises after three chunks is a handler that raised:
    nothing is stored, the retry gets 409 request_in_flight while the claim's
    lease runs, then takes the orphan over and runs the handler again; never
    the three chunks replayed (a guard: both middleware already let the
    exception through)."""
    from apps import FULL_STREAM

    for a in serve(kind, server.url, server.token, lease=1):
        key = new_key("broke")
        try:
            first = post(a.url + "/stream-breaks", key, body={})
            assert first.status_code == 500, first.text
        except httpx.TransportError:
            pass  # a server may drop the connection of a failed handler
        rec = _record(server, key)
        assert rec.state == "in_flight" and rec.response is None, rec
        deadline = time.monotonic() + 30
        while True:
            r = post(a.url + "/stream-breaks", key, body={})
            if r.status_code != 409:
                break
            assert r.json()["code"] == "request_in_flight", r.text
            assert time.monotonic() < deadline, "the orphan was never taken over"
            time.sleep(0.1)
        assert r.status_code == 200 and "Idempotent-Replayed" not in r.headers, (r.status_code, r.text)
        assert r.text == FULL_STREAM and len(a.effects.charges) == 2, "the broken run and the takeover"
        again = post(a.url + "/stream-breaks", key, body={})
        assert again.headers.get("Idempotent-Replayed") == "true" and again.text == FULL_STREAM
        assert len(a.effects.charges) == 2


def test_asgi_response_never_finished(server: Server) -> None:
    """An ASGI app that returns before its last body message (more_body
    never false) did not finish its answer: nothing is stored (the caller
    gets the server's 500), the claim is left in flight as for an app that
    raised, and the retry gets 409 request_in_flight. Before, "chunk0;" was
    stored and replayed as a complete 200."""
    for a in serve("fastapi", server.url, server.token):
        key = new_key("unfinished")
        try:
            first = post(a.url + "/unfinished", key, body={})
            assert first.status_code == 500, first.text
        except httpx.TransportError:
            pass
        rec = _record(server, key)
        assert rec.state == "in_flight" and rec.response is None, rec
        r = post(a.url + "/unfinished", key, body={})
        assert r.status_code == 409 and r.json()["code"] == "request_in_flight", (r.status_code, r.text)
        assert len(a.effects.charges) == 1


#: A request body of 61 bytes, the Content-Length of the cut requests below.
CUT_BODY = json.dumps({"amount": 1000, "currency": "usd", "note": "x" * 14}).encode()
assert len(CUT_BODY) == 61


def _cut_request(url: str, path: str, key: str, ctype: str, sent: int) -> None:
    """Send POST path with key and Content-Length: 61, then only the first
    sent bytes of the body, and close the connection (the caller went away,
    or the body was cut on the way)."""
    import socket

    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nIdempotency-Key: " + key.encode()
                  + b"\r\nContent-Type: " + ctype.encode() + b"\r\nContent-Length: " + str(len(CUT_BODY)).encode()
                  + b"\r\n\r\n" + CUT_BODY[:sent])


@pytest.mark.parametrize("kind", ["flask", "fastapi"])  # WSGI (werkzeug) and ASGI (uvicorn); Django's WSGI path is Flask's
def test_request_body_cut_before_its_content_length(kind: str, server: Server) -> None:
    """A caller sends Content-Length: 61 and 0 or 10 bytes of the body, then
    hangs up: nothing is claimed (the key does not exist in idem) and the
    handler does not run; the whole request with the same key then runs
    once (201). A JSON body and an opaque one (which no JSON check refuses
    on the way). Before, the WSGI middleware claimed the key with the bytes
    that had arrived and ran the handler on them: Flask answered 400 for the
    empty JSON body, that was stored and the real retry got 422
    fingerprint_mismatch; the opaque route ran its side effect on the cut
    body and stored 201 (issue 21, a cut request body)."""
    for a in serve(kind, server.url, server.token):
        for path, ctype in (("/charges/1", "application/json"), ("/raw", "application/octet-stream")):
            for sent in (0, 10):
                key = new_key("cutbody")
                before = a.effects.answered
                _cut_request(a.url, path, key, ctype, sent)
                wait_for(lambda: a.effects.answered > before, timeout=30)
                with pytest.raises(ProblemError) as e:
                    _record(server, key)
                assert e.value.code == "key_not_found", (path, sent, "a cut request body claimed the key")
                assert len(a.effects.charges) == 0, (path, sent, "the handler ran on a cut body")
                whole = HTTP.post(a.url + path, headers={"Idempotency-Key": key, "Content-Type": ctype}, content=CUT_BODY)
                assert whole.status_code == 201 and "Idempotent-Replayed" not in whole.headers, (path, sent, whole.text)
                assert len(a.effects.charges) == 1, "the whole request ran once"
                a.effects.charges.clear()


@pytest.mark.parametrize("kind", ["flask", "django", "fastapi"])
def test_repeated_scope_header_refused(kind: str, server: Server) -> None:
    """scope_header="X-Account-Id": two X-Account-Id fields, or one holding
    a list (a comma), are 400 invalid_key naming the header, and the handler
    does not run, as in the gateway (docs/frontdoor.md rule 3). Before,
    werkzeug joined the two into "acct1,mallory" and the request was scoped
    as that and run; the ASGI middleware refused the two only by accident
    (it joined them with ", " and the space made the key invalid) and ran
    the comma."""
    for a in serve(kind, server.url, server.token, scope_header="X-Account-Id"):
        for fields in ([("X-Account-Id", "acct1"), ("X-Account-Id", "mallory")], [("X-Account-Id", "acct1,mallory")]):
            key = new_key("scope")
            r = HTTP.post(a.url + "/charges/1", json=BODY, headers=[("Idempotency-Key", key), *fields])
            assert r.status_code == 400 and r.headers["Content-Type"] == "application/problem+json", (fields, r.text)
            p = r.json()
            assert p["code"] == "invalid_key" and p["retryable"] is False and "X-Account-Id" in p["detail"], (fields, p)
            assert len(a.effects.charges) == 0, "the handler did not run"
        ok = HTTP.post(a.url + "/charges/1", json=BODY, headers=[("Idempotency-Key", new_key("scope")), ("X-Account-Id", "acct1")])
        assert ok.status_code == 201, ok.text
        assert len(a.effects.charges) == 1


#: The fixed details of rule 8, held once in the shared vectors.
_HELD = {h["idem"]["code"]: h["expect"]["detail"] for h in json.loads(
    (Path(__file__).resolve().parents[3] / "testvectors/frontdoor/policy.json").read_text())["held"]}

#: The server's completer picks orphans at once, and may call a resume endpoint on loopback.
COMPLETER_ENV = {"IDEM_WEBHOOK_ALLOW_PRIVATE": "1", "IDEM_COMPLETER_INTERVAL": "100ms",
                 "IDEM_COMPLETER_BACKOFF_BASE": "50ms", "IDEM_COMPLETER_BACKOFF_CAP": "200ms"}


def _resume_endpoint() -> tuple[str, dict[str, int], Any]:
    """A resume endpoint that never resumes a key: "review" for a key whose
    name contains it, else "unknown, ask again in 120 s". It returns its URL,
    the calls per key and the server (to shut down)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    calls: dict[str, int] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            key = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["key"]
            calls[key] = calls.get(key, 0) + 1
            answer = {"outcome": "review", "note": "the provider cannot say"} if "review" in key else \
                {"outcome": "unknown", "retry_after_seconds": 120}
            body = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{srv.server_port}/resume", calls, srv


def _completer_state(server: Server, key: str) -> Any:
    r = HTTP.get(f"{server.url}/v1/keys/{key}", headers={"Authorization": f"Bearer {server.token}"})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_completer_held_keys(store: str, binary: str) -> None:
    """docs/frontdoor.md rule 8, in a real Flask app: a view that charges and
    raises leaves its claim to run out (lease 1 s); idem's real completer
    takes the key over and the resume endpoint answers "unknown, ask again
    in 120 s" (or, for the other key, "needs a person"). The caller's retry
    is 409 request_in_flight, retryable, with idem's Retry-After — or 409
    outcome_review, not retryable, without Retry-After — and the view does
    not run again; the completer keeps the key. Before, both were the
    retryable 503 store_unavailable."""
    for srv in start_server(binary, store, COMPLETER_ENV):
        admin = _cli(binary, srv.env, "token", "--tenant", "acme", "--scope", "tenant:admin", "--ttl", "1h")
        url, calls, endpoint = _resume_endpoint()
        try:
            r = HTTP.post(srv.url + "/v1/completers", json={"url": url}, headers={"Authorization": f"Bearer {admin}"})
            assert r.status_code == 201, r.text
            for a in serve("flask", srv.url, srv.token, lease=1):
                unknown, review = new_key("held-unknown"), new_key("held-review")
                for key in (unknown, review):
                    assert post(a.url + "/boom", key).status_code == 500
                assert len(a.effects.charges) == 2

                wait_for(lambda: (_completer_state(srv, unknown).get("completer") or {}).get("state") == "unknown", timeout=30)
                held = _completer_state(srv, unknown)
                for _ in range(2):
                    got = post(a.url + "/boom", unknown)
                    assert got.status_code == 409, got.text
                    assert got.headers["Content-Type"] == "application/problem+json"
                    p = got.json()
                    assert (p["code"], p["retryable"], p["detail"]) == ("request_in_flight", True, _HELD["outcome_unknown"]), p
                    assert 100 <= int(got.headers["Retry-After"]) <= 120, got.headers["Retry-After"]

                wait_for(lambda: (_completer_state(srv, review).get("completer") or {}).get("state") == "review", timeout=30)
                for _ in range(2):
                    got = post(a.url + "/boom", review)
                    assert got.status_code == 409, got.text
                    p = got.json()
                    assert (p["code"], p["title"], p["retryable"], p["detail"]) == \
                        ("outcome_review", "Outcome under review", False, _HELD["outcome_review"]), p
                    assert "Retry-After" not in got.headers
                assert len(a.effects.charges) == 2, "the view did not run again"
                after = _completer_state(srv, unknown)
                assert after["completer"]["state"] == "unknown" and after["fencing_token"] == held["fencing_token"], after
                assert calls[unknown] == 1, "the retries made no completer attempt"
        finally:
            endpoint.shutdown()
