"""The fault checker's Python apps (testkit/faultcheck/apps/python/fcapp.py)
speak its protocol (testkit/faultcheck/PROTOCOL.md): each front door
(asgi: Starlette on uvicorn, wsgi: Flask on werkzeug) is started as the
runner starts it, a subprocess against the real server on both stores, and
its answers and side-effect log are checked, so the apps cannot rot."""

from __future__ import annotations

import hashlib
import json
import os
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from conftest import REPO, Server, new_key

APP = REPO / "testkit" / "faultcheck" / "apps" / "python" / "fcapp.py"
#: Each request on a connection of its own: after a handler exception
#: uvicorn closes the connection once the 500 is sent, without
#: "Connection: close", and a request sent on it meanwhile is reset.
HTTP = httpx.Client(timeout=30, limits=httpx.Limits(max_keepalive_connections=0))


class FCApp:
    """A running faultcheck app: its URL, its log, its process."""

    def __init__(self, frontdoor: str, server: Server, extra: dict[str, str]) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="fcapp-")
        self.log = Path(self._dir.name) / "effects.jsonl"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("FC_", "IDEM_"))}
        env.update({"FC_ADDR": "127.0.0.1:0", "FC_LOG": str(self.log), "FC_FRONTDOOR": frontdoor,
                    "IDEM_URL": server.url, "IDEM_TOKEN": server.token,
                    "PYTHONPATH": str(REPO / "clients" / "python" / "src"), **extra})
        self.token = server.token
        self.stderr = open(Path(self._dir.name) / "stderr", "w+b")
        self.proc = subprocess.Popen([sys.executable, str(APP)], env=env, stdout=subprocess.PIPE, stderr=self.stderr)
        assert self.proc.stdout is not None
        line = b""
        deadline = time.monotonic() + 60
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None:
                self.stop()
                pytest.fail(f"the app did not report FC_LISTENING: {self.err()}")
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if ready:
                b = os.read(self.proc.stdout.fileno(), 1)
                if not b:
                    continue
                line += b
        self.listening = line.decode()
        assert self.listening.startswith("FC_LISTENING http://127.0.0.1:"), self.listening
        self.url = self.listening.split()[1]

    def err(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")[-4000:]

    def records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log.read_text().splitlines()] if self.log.exists() else []

    def runs_of(self, key: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The start lines of key, and the end lines of those runs."""
        recs = self.records()
        starts = [r for r in recs if r["ev"] == "start" and r["key"] == key]
        ids = {s["run"] for s in starts}
        return starts, [r for r in recs if r["ev"] == "end" and r["run"] in ids]

    def post(self, key: str, mode: str, req: str = "", pad: str = "p", headers: dict[str, str] | None = None) -> httpx.Response:
        return HTTP.post(self.url + "/fc/pay", headers={"Idempotency-Key": key, **(headers or {})},
                         json={"req": req or key, "mode": mode, "pad": pad})

    def stop(self) -> bytes:
        """Stops the app; returns what it wrote on stdout after the listening line."""
        self.proc.terminate()
        try:
            out, _ = self.proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        self.stderr.close()
        self._dir.cleanup()
        return out


@pytest.fixture(params=["asgi", "wsgi"])
def frontdoor(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def start(frontdoor: str, server: Server, **extra: str) -> Iterator[FCApp]:
    app = FCApp(frontdoor, server, extra)
    try:
        yield app
    finally:
        out = app.stop()
        assert out == b"", f"the app wrote more than the listening line on stdout: {out[:200]!r}"


@pytest.fixture
def fcapp(frontdoor: str, server: Server) -> Iterator[FCApp]:
    yield from start(frontdoor, server)


def body_of(run: str, req: str, scope: str, pad: str) -> bytes:
    return json.dumps({"run": run, "req": req, "scope": scope, "pad": pad}, separators=(",", ":")).encode()


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def test_faultcheck_app_ok_runs_once_and_replays(fcapp: FCApp) -> None:
    assert HTTP.get(fcapp.url + "/fc/healthz").text == "ok"
    key = new_key("fc")
    first = fcapp.post(key, "ok", pad="x" * 100)
    assert first.status_code == 201, first.text
    assert first.headers["content-type"].startswith("application/json")
    starts, ends = fcapp.runs_of(key)
    assert len(starts) == 1 and len(ends) == 1, fcapp.records()
    s = starts[0]
    assert (s["key"], s["scope"], s["req"], s["mode"]) == (key, "", key, "ok") and isinstance(s["t"], int)
    assert first.content == body_of(s["run"], key, "", "x" * 100)
    assert ends[0] == {"ev": "end", "run": s["run"], "status": 201, "body_sha256": sha(first.content), "len": len(first.content)}

    again = fcapp.post(key, "ok", pad="x" * 100)
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert (again.status_code, again.content) == (201, first.content)
    assert len(fcapp.runs_of(key)[0]) == 1, "the duplicate did not run the handler"


def test_faultcheck_app_raise_writes_start_and_no_end(fcapp: FCApp) -> None:
    key = new_key("fc")
    r = fcapp.post(key, "raise")
    assert r.status_code == 500 and r.headers["content-type"] == "application/problem+json", r.text
    assert r.json()["status"] == 500
    starts, ends = fcapp.runs_of(key)
    assert len(starts) == 1 and ends == []
    aborts = [x for x in fcapp.records() if x["ev"] == "abort" and x["run"] == starts[0]["run"]]
    assert len(aborts) == 1
    # Nothing was stored: the key is in flight until its lease runs out.
    again = fcapp.post(key, "raise")
    assert again.status_code == 409 and again.json()["code"] == "request_in_flight"
    assert len(fcapp.runs_of(key)[0]) == 1


def test_faultcheck_app_stream_is_the_full_body(fcapp: FCApp) -> None:
    key = new_key("fc")
    t0 = time.monotonic()
    r = fcapp.post(key, "stream:4:10", pad="s" * 1000)
    assert time.monotonic() - t0 >= 0.03, "three pauses of 10 ms between four pieces"
    assert r.status_code == 200, r.text
    starts, ends = fcapp.runs_of(key)
    assert len(starts) == 1 and len(ends) == 1
    assert r.content == body_of(starts[0]["run"], key, "", "s" * 1000)
    assert (ends[0]["status"], ends[0]["body_sha256"], ends[0]["len"]) == (200, sha(r.content), len(r.content))
    again = fcapp.post(key, "stream:4:10", pad="s" * 1000)
    assert again.headers.get("Idempotent-Replayed") == "true" and (again.status_code, again.content) == (200, r.content)


def test_faultcheck_app_cutstream_writes_no_end_and_stores_nothing(fcapp: FCApp) -> None:
    key = new_key("fc")
    r = fcapp.post(key, "cutstream:4")
    assert r.status_code == 500 and r.headers["content-type"] == "application/problem+json", r.text
    starts, ends = fcapp.runs_of(key)
    assert len(starts) == 1 and ends == []
    again = fcapp.post(key, "cutstream:4")
    assert again.status_code == 409 and again.json()["code"] == "request_in_flight"


def test_faultcheck_app_slow_and_status_stored(fcapp: FCApp) -> None:
    key = new_key("fc")
    t0 = time.monotonic()
    assert fcapp.post(key, "slow:200").status_code == 201
    assert time.monotonic() - t0 >= 0.2
    key = new_key("fc")
    r = fcapp.post(key, "status:503")
    assert r.status_code == 503
    again = fcapp.post(key, "status:503")
    assert again.headers.get("Idempotent-Replayed") == "true" and (again.status_code, again.content) == (503, r.content)
    starts, ends = fcapp.runs_of(key)
    assert len(starts) == 1 and [e["body_sha256"] for e in ends] == [sha(r.content)]


def test_faultcheck_app_scope_header_and_released_5xx(frontdoor: str, server: Server) -> None:
    for app in start(frontdoor, server, FC_SCOPE_HEADER="X-Account-Id", FC_RELEASE_5XX="1"):
        key = new_key("fc")
        a = app.post(key, "ok", headers={"X-Account-Id": "acct-a"})
        b = app.post(key, "ok", headers={"X-Account-Id": "acct-b"})
        assert (a.status_code, b.status_code) == (201, 201)
        assert (a.json()["scope"], b.json()["scope"]) == ("acct-a", "acct-b")
        starts, ends = app.runs_of(key)
        assert sorted(s["scope"] for s in starts) == ["acct-a", "acct-b"] and len(ends) == 2
        replay = app.post(key, "ok", headers={"X-Account-Id": "acct-b"})
        assert replay.headers.get("Idempotent-Replayed") == "true" and replay.content == b.content

        key = new_key("fc")
        first = app.post(key, "status:503", headers={"X-Account-Id": "acct-a"})
        second = app.post(key, "status:503", headers={"X-Account-Id": "acct-a"})
        assert (first.status_code, second.status_code) == (503, 503)
        assert "Idempotent-Replayed" not in second.headers, "a released 5xx runs the handler again"
        assert len(app.runs_of(key)[0]) == 2
        assert first.json()["run"] != second.json()["run"]


def test_faultcheck_app_repeated_scope_header_refused(frontdoor: str, server: Server) -> None:
    # Protocol v1.1: the scope header given twice must be refused before
    # the handler runs. The ASGI middleware sees the two fields and refuses
    # them (400 invalid_key); a WSGI server joins them itself with "," before
    # the middleware sees them, and the middleware refuses the comma.
    for app in start(frontdoor, server, FC_SCOPE_HEADER="X-Account-Id"):
        key = new_key("fc")
        r = HTTP.post(app.url + "/fc/pay", headers=[("Idempotency-Key", key), ("X-Account-Id", "acct-a"),
                                                    ("X-Account-Id", "mallory")],
                      json={"req": key, "mode": "ok", "pad": ""})
        assert r.status_code == 400 and r.headers["content-type"] == "application/problem+json", r.text
        assert r.json()["code"] == "invalid_key"
        assert app.runs_of(key)[0] == [], "the handler did not run"


def test_faultcheck_app_caller_gone_mid_stream_is_hidden(server: Server) -> None:
    # docs/frontdoor.md rule 5, "A cut answer": the front door keeps a
    # started handler from seeing its caller go (ASGI: no http.disconnect
    # after the body), so the stream is not cancelled (no abort line), runs
    # to its end and its whole answer is stored: the retry replays it. (WSGI
    # tells an app nothing of a caller gone either way.)
    import hashlib
    import socket
    from urllib.parse import urlsplit

    for app in start("asgi", server):
        key = new_key("fc")
        u = urlsplit(app.url)
        body = json.dumps({"req": key, "mode": "stream:40:50", "pad": ""}).encode()
        with socket.create_connection((u.hostname, u.port)) as s:
            s.sendall(b"POST /fc/pay HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nIdempotency-Key: " +
                      key.encode() + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            deadline = time.monotonic() + 30
            while not app.runs_of(key)[0]:
                assert time.monotonic() < deadline, "the handler did not start"
                time.sleep(0.01)
            time.sleep(0.2)
        deadline = time.monotonic() + 30
        while True:
            starts, ends = app.runs_of(key)
            if ends:
                break
            assert time.monotonic() < deadline, f"no end line: {app.records()}"
            time.sleep(0.02)
        run = starts[0]["run"]
        assert [r for r in app.records() if r["ev"] == "abort" and r["run"] == run] == [], "the stream was not cancelled"
        deadline = time.monotonic() + 30
        while True:
            r = app.post(key, "stream:40:50", req=key, pad="")
            if r.status_code != 409:
                break
            assert time.monotonic() < deadline, "the answer was never stored"
            time.sleep(0.05)
        assert r.headers.get("idempotent-replayed") == "true", r.text
        assert hashlib.sha256(r.content).hexdigest() == ends[0]["body_sha256"], "the replay is the whole answer"
        assert len(app.runs_of(key)[0]) == 1, "the handler ran once"
