"""The middleware's replay cache (docs/frontdoor.md, "The replay cache"):
real Flask and Django (WSGI) and FastAPI (ASGI) apps behind the idem
middleware, against the real server on both stores. The claims that reach
idem are counted at the middleware's client (its on_attempt hook)."""

from __future__ import annotations

import re
import socket
import threading
import time
from typing import Any

import httpx
import pytest

from apps import serve
from conftest import Server, _cli, new_key
from idem import AttemptInfo, ReplayCacheOptions, Response, frontdoor
from idem._replaycache import ReplayCache

HTTP = httpx.Client(timeout=30)


class Claims:
    """Counts the claim calls a middleware's client sends to idem."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.n = 0

    def __call__(self, info: AttemptInfo) -> None:
        if info.call == "claim":
            with self.lock:
                self.n += 1


def raw(url: str, path: str, key: str, body: bytes, extra: bytes = b"") -> bytes:
    """POST body to path over a connection of its own; the answer's bytes as
    they came, less the Date line (the server's clock)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nIdempotency-Key: " + key.encode() + b"\r\n" + extra
                  + b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode()
                  + b"\r\nConnection: close\r\n\r\n" + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return re.sub(rb"(?im)^date: [^\r\n]*\r\n", b"", data)


def status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def replayed(answer: bytes) -> bool:
    return re.search(rb"(?im)^idempotent-replayed: true\r$", answer.split(b"\r\n\r\n", 1)[0] + b"\r") is not None


def mismatch(answer: bytes) -> bool:
    return re.search(rb'"code": ?"fingerprint_mismatch"', answer) is not None


def post(url: str, key: str, body: Any = None, headers: dict[str, str] | None = None) -> httpx.Response:
    return HTTP.post(url, json={"amount": 1} if body is None else body, headers={"Idempotency-Key": key, **(headers or {})})


def admin_patch(server: Server, binary: str, tenant: str, patch: dict[str, Any]) -> None:
    """Change a tenant through the admin API (the server drops its cached tenant at once)."""
    admin = _cli(binary, server.env, "token", "--scope", "admin", "--ttl", "1h")
    r = HTTP.patch(f"{server.url}/v1/admin/tenants/{tenant}", json=patch, headers={"Authorization": f"Bearer {admin}"})
    assert r.status_code == 200, r.text


def own_tenant(server: Server, binary: str) -> tuple[str, str]:
    """A fresh tenant and a keys:write token of it."""
    tenant = "rc-" + new_key("t")[-8:]
    _cli(binary, server.env, "tenant", "create", tenant)
    return tenant, _cli(binary, server.env, "token", "--tenant", tenant, "--scope", "keys:write", "--ttl", "1h")


@pytest.mark.parametrize("kind", ["flask", "django", "fastapi"])
@pytest.mark.parametrize("off", [False, True])
def test_replay_cache(kind: str, off: bool, server: Server) -> None:
    """A replay idem answered is answered again from the middleware's cache,
    byte for byte idem's replay (status, headers, body, Idempotent-Replayed),
    without a claim; a request with the key and another body, or on another
    path, is not (idem answers 422, and the entry stays for its own
    request); the handler ran once. With replay_cache off every replay is a
    claim. Without the cache the second replay was a claim; without the
    fingerprint match the 422 was the first request's answer."""
    claims = Claims()
    for a in serve(kind, server.url, server.token, on_attempt=claims, replay_cache=ReplayCacheOptions(off=off)):
        key = new_key("cache")
        first = raw(a.url, "/charges/1", key, b'{"amount":1}')
        assert status(first) == 201, first
        from_idem = raw(a.url, "/charges/1", key, b'{"amount":1}')
        assert replayed(from_idem), from_idem
        assert claims.n == 2, "the first replay is idem's"

        again = raw(a.url, "/charges/1", key, b'{"amount":1}')
        assert again == from_idem, "a cached replay is byte for byte idem's"
        want = 3 if off else 2
        assert claims.n == want, f"off={off}: a cached replay makes no claim"

        other = raw(a.url, "/charges/1", key, b'{"amount":2}')
        assert status(other) == 422 and mismatch(other), other
        path = raw(a.url, "/charges/2", key, b'{"amount":1}')
        assert status(path) == 422 and mismatch(path), path
        want += 2
        assert claims.n == want, "another fingerprint goes to idem"

        again = raw(a.url, "/charges/1", key, b'{"amount":1}')
        assert again == from_idem
        assert claims.n == want + (1 if off else 0), "the entry stays for its own request"
        assert len(a.effects.charges) == 1, "the handler ran once"


@pytest.mark.parametrize("kind", ["flask", "fastapi"])  # WSGI and ASGI; Django's WSGI path is Flask's
def test_replay_cache_never_shared_across_scopes_or_tenants(kind: str, server: Server, binary: str) -> None:
    """One key under two scopes (scope_header) is two records: each scope's
    replays, cached or not, are its own run's answer, never the other's; a
    middleware of another tenant with the same key runs its own handler.
    A cache keyed by the caller's key alone answered scope b with scope a's
    charge."""
    claims = Claims()
    _, token2 = own_tenant(server, binary)
    for a in serve(kind, server.url, server.token, on_attempt=claims, scope_header="X-Account", replay_cache=ReplayCacheOptions(max_age=60)):
        key = new_key("scoped")
        url = a.url + "/charges/1"
        ra = post(url, key, headers={"X-Account": "a"})
        assert ra.status_code == 201, ra.text
        assert post(url, key, headers={"X-Account": "a"}).headers.get("Idempotent-Replayed") == "true"
        before = claims.n
        hit = post(url, key, headers={"X-Account": "a"})
        assert hit.content == ra.content and claims.n == before, "scope a's replay is cached"

        rb = post(url, key, headers={"X-Account": "b"})
        assert rb.status_code == 201 and "Idempotent-Replayed" not in rb.headers, rb.text
        assert rb.json()["charge"] != ra.json()["charge"], "scope b ran its own request"
        for _ in range(2):
            assert post(url, key, headers={"X-Account": "b"}).content == rb.content
            assert post(url, key, headers={"X-Account": "a"}).content == ra.content
        assert len(a.effects.charges) == 2

        for b in serve(kind, server.url, token2, replay_cache=ReplayCacheOptions(max_age=60)):
            other = post(b.url + "/charges/1", key, headers={"X-Account": "a"})
            assert other.status_code == 201 and "Idempotent-Replayed" not in other.headers, other.text
            assert len(b.effects.charges) == 1, "another tenant's middleware ran its own handler"


@pytest.mark.parametrize("kind", ["flask", "fastapi"])
def test_replay_cache_ends_at_max_age(kind: str, server: Server) -> None:
    """An entry is served no longer than max_age from the claim that
    brought it: every replay answered without a claim was sent within
    max_age of the answer that brought its entry, and a replay after that
    is a claim again. An entry that ignored max_age (the record's window is
    a day) was served for the whole test."""
    claims = Claims()
    max_age = 1.5
    for a in serve(kind, server.url, server.token, on_attempt=claims, replay_cache=ReplayCacheOptions(max_age=max_age)):
        key = new_key("age")
        url = a.url + "/charges/1"
        post(url, key)
        post(url, key)
        brought = time.monotonic()  # the answer of the claim that brought the entry; the entry's life began before
        hits = 0
        deadline = time.monotonic() + 30
        while True:
            assert time.monotonic() < deadline, "the entry was never dropped"
            before, sent = claims.n, time.monotonic()
            r = post(url, key)
            assert r.headers.get("Idempotent-Replayed") == "true", r.text
            if claims.n > before:
                break
            hits += 1
            assert sent < brought + max_age, f"a cached replay {sent - brought:.2f} s after the claim, past max_age {max_age}"
        assert hits > 0, "the entry was served within its max_age"
        assert len(a.effects.charges) == 1


@pytest.mark.parametrize("kind", ["flask", "fastapi"])
def test_replay_cache_ends_at_replay_until(kind: str, server: Server, binary: str) -> None:
    """With a replay window of 3 s and a max_age of a minute, a cached
    replay is served no later than the record's replay_until (on the
    server's clock, a second early): once the window is over the request is
    claimed and runs again, as without a cache. An entry that lived for its
    max_age alone replayed for a minute."""
    tenant, token = own_tenant(server, binary)
    admin_patch(server, binary, tenant, {"settings": {"replay_window_seconds": 3}})
    from idem import Client

    for a in serve(kind, server.url, token, replay_cache=ReplayCacheOptions(max_age=60)):
        key = new_key("window")
        url = a.url + "/charges/1"
        first = post(url, key)
        assert first.status_code == 201, first.text
        rec = Client(server.url, token=token).get(key)
        assert rec.replay_until is not None
        replays = 0
        deadline = time.monotonic() + 30
        while len(a.effects.charges) == 1:
            assert time.monotonic() < deadline, f"the request never ran again after replay_until {rec.replay_until}"
            sent = time.time()
            got = post(url, key)
            assert got.status_code == 201, got.text
            if got.headers.get("Idempotent-Replayed") == "true":
                replays += 1
                assert got.content == first.content
                assert sent < rec.replay_until.timestamp(), f"a replay of a request sent at {sent}, after replay_until {rec.replay_until}"
        assert replays > 0, "the key was replayed within its window"
        assert len(a.effects.charges) == 2, "once more after the window, once only"


@pytest.mark.parametrize("kind", ["flask", "fastapi"])
def test_replay_cache_disabled_tenant_not_served_past_max_age(kind: str, server: Server, binary: str) -> None:
    """The middleware's tenant disabled, a key the cache holds is replayed
    for at most max_age from the claim that brought it, then refused 403
    tenant_unknown, as idem refuses it; enabled again, it replays. An entry
    that ignored max_age replayed for as long as the test ran."""
    tenant, token = own_tenant(server, binary)
    max_age = 1.5
    for a in serve(kind, server.url, token, replay_cache=ReplayCacheOptions(max_age=max_age)):
        key = new_key("disabled")
        url = a.url + "/charges/1"
        post(url, key)
        assert post(url, key).headers.get("Idempotent-Replayed") == "true"
        brought = time.monotonic()
        admin_patch(server, binary, tenant, {"disabled": True})
        deadline = time.monotonic() + 30
        while True:
            assert time.monotonic() < deadline, "the disabled tenant's key was replayed for 30 s"
            sent = time.monotonic()
            r = post(url, key)
            if r.status_code == 403:
                assert r.json()["code"] == frontdoor.TENANT_UNKNOWN, r.text
                break
            assert r.headers.get("Idempotent-Replayed") == "true", r.text
            assert sent < brought + max_age, f"a disabled tenant's key replayed {sent - brought:.2f} s after the claim"
        admin_patch(server, binary, tenant, {"disabled": False})
        assert post(url, key).headers.get("Idempotent-Replayed") == "true"
        assert len(a.effects.charges) == 1


@pytest.mark.parametrize("kind", ["flask", "fastapi"])
def test_replay_cache_dropped_when_the_tenant_is_refused(kind: str, server: Server, binary: str) -> None:
    """The tenant disabled, the first request the cache cannot answer is
    refused 403 tenant_unknown by idem, and that drops the cache: the
    completed key is refused too from then on (with a max_age of a minute),
    as without a cache; enabled again, it replays."""
    tenant, token = own_tenant(server, binary)
    for a in serve(kind, server.url, token, replay_cache=ReplayCacheOptions(max_age=60)):
        url = a.url + "/charges/1"
        key = new_key("kept")
        post(url, key)
        assert post(url, key).headers.get("Idempotent-Replayed") == "true"
        admin_patch(server, binary, tenant, {"disabled": True})
        for k in (new_key("other"), key):
            r = post(url, k)
            assert r.status_code == 403 and r.json()["code"] == frontdoor.TENANT_UNKNOWN, r.text
        admin_patch(server, binary, tenant, {"disabled": False})
        again = post(url, key)
        assert again.headers.get("Idempotent-Replayed") == "true", again.text
        assert len(a.effects.charges) == 1


@pytest.mark.parametrize("kind", ["flask", "fastapi"])
def test_replay_cache_bounded(kind: str, server: Server) -> None:
    """With room for two entries the third key's replay evicts the least
    recently used, whose next replay is a claim again; an answer over a
    16th of max_bytes is never cached."""
    claims = Claims()
    for a in serve(kind, server.url, server.token, on_attempt=claims,
                   replay_cache=ReplayCacheOptions(max_entries=2, max_bytes=16384, max_age=60)):
        keys = {k: new_key(k) for k in ("a", "b", "c", "big")}

        def replay(name: str, want_claim: bool, path: str = "/charges/1") -> None:
            before = claims.n
            got = post(a.url + path, keys[name])
            assert got.headers.get("Idempotent-Replayed") == "true", (name, got.status_code, got.text)
            assert (claims.n > before) == want_claim, f"{name}: claimed in idem"

        for k in ("a", "b", "c"):
            post(a.url + "/charges/1", keys[k])
        replay("a", True)
        replay("b", True)
        replay("a", False)
        replay("c", True)  # evicts b
        replay("a", False)
        replay("c", False)
        replay("b", True)

        assert post(a.url + "/big", keys["big"]).status_code == 201
        replay("big", True, "/big")
        replay("big", True, "/big")


def test_replay_cache_bounds_unit() -> None:
    """The cache itself, on a clock of its own: the byte bound evicts the
    least recently used, an entry over a 16th of max_bytes is not kept, an
    entry ends at its until, one marked not replayable is never kept, and a
    lookup with another operation or document misses without dropping it."""
    now = [0.0]
    c = ReplayCache(ReplayCacheOptions(max_bytes=16 * 300, max_age=60), clock=lambda: now[0])
    resp = Response(201, {"Content-Type": "application/json"}, b"x" * 100)
    keys = [f"k{i}" for i in range(40)]
    for k in keys:
        c.put(k, "POST /a", b"d", resp, 10.0)
        assert c.stats().bytes <= 16 * 300
    s = c.stats()
    assert s.evictions > 0 and 0 < s.entries < 40
    assert c.get("k0", "POST /a", b"d") is None and c.get("k39", "POST /a", b"d") == resp
    c.put("huge", "POST /a", b"d", Response(201, {}, b"x" * 300), 10.0)
    assert c.get("huge", "POST /a", b"d") is None
    c.put("nr", "POST /a", b"d", Response(201, {frontdoor.HEADER_NOT_REPLAYABLE: "too large"}), 10.0)
    assert c.get("nr", "POST /a", b"d") is None
    assert c.get("k39", "POST /b", b"d") is None and c.get("k39", "POST /a", b"e") is None
    assert c.get("k39", "POST /a", b"d") == resp, "a mismatch leaves the entry"
    now[0] = 10.0
    assert c.get("k39", "POST /a", b"d") is None, "an entry ends at its until"
