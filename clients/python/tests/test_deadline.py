"""The attempt timeout and the overall deadline bound the whole call, not
each socket operation: against a server that sends its answer's headers at
once and then one byte every 200 ms (the answer would take a minute), a
call ends with the timeout error well before the drip does (issue 21,
hole 7: claim(timeout=12) used to return after 32 s).

The bounds asserted are loose on purpose (seconds of margin on a
two-second deadline): what matters is that the call ended with the
documented error, long before the drip server finished."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from typing import Iterator

import httpx
import pytest

from conftest import wait_for
from idem import AsyncClient, AttemptInfo, Client, RetryPolicy, TransportError


DRIP_BYTES = 300
DRIP_INTERVAL = 0.2  # seconds: the whole answer would take DRIP_BYTES * DRIP_INTERVAL = 60 s
RECORD = b'{"key":"k","state":"completed","fencing_token":1,"attempt":1}'


class DripServer:
    """A loopback HTTP server that answers every request slowly, with
    ``status``: in "body"
    mode the status line and headers at once, then the body one byte every
    DRIP_INTERVAL; in "head" mode the status line and headers themselves
    one byte at a time; in "reuse" mode it answers a connection's first
    request at once and drips the body of the second. It counts the connections it accepted, those still
    open (the client has not hung up) and the answers it finished."""

    def __init__(self, mode: str = "body", status: bytes = b"201 Created") -> None:
        self.mode = mode
        self.status = status
        self._lock = threading.Lock()
        self.accepted = 0
        self.open = 0
        self.finished = 0
        self._stop = threading.Event()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._stop.set()
        self._sock.close()

    def count(self, name: str) -> int:
        with self._lock:
            return int(getattr(self, name))

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                self.accepted += 1
                self.open += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn:
                _read_request(conn)
                if self.mode == "reuse":
                    # The first request at once, keep-alive: the dripped one comes on a pooled connection.
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                                 % (len(RECORD), RECORD))
                    _read_request(conn)
                head = (b"HTTP/1.1 " + self.status + b"\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\n\r\n" % DRIP_BYTES)
                if self.mode in ("body", "reuse"):
                    conn.sendall(head)
                    drip = b" " * DRIP_BYTES
                else:
                    drip = head + b" " * DRIP_BYTES
                for b in drip:
                    if self._stop.wait(DRIP_INTERVAL):
                        return
                    conn.sendall(bytes([b]))
                with self._lock:
                    self.finished += 1
        except OSError:
            return  # the client hung up: what a bounded call does
        finally:
            with self._lock:
                self.open -= 1


def _read_request(conn: socket.socket) -> None:
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = conn.recv(65536)
        if not chunk:
            raise OSError("closed before the request")
        buf += chunk
    head, _, body = buf.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            raise OSError("closed in the request body")
        body += chunk


@pytest.fixture(params=["body", "head", "reuse"])
def drip(request: pytest.FixtureRequest) -> Iterator[DripServer]:
    srv = DripServer(request.param)
    yield srv
    srv.close()


@pytest.fixture(params=["body", "head"])
def drip503(request: pytest.FixtureRequest) -> Iterator[DripServer]:
    """A 503 drip: an attempt cut off in its body is retried in every SDK
    (Go and Node retry a cut answer only when its status allows)."""
    srv = DripServer(request.param, b"503 Service Unavailable")
    yield srv
    srv.close()


def _check_timeout(err: TransportError, elapsed: float, srv: DripServer, attempts: list[AttemptInfo]) -> None:
    assert isinstance(err.__cause__, httpx.TimeoutException), repr(err.__cause__)
    assert err.retryable
    # Far less than the minute the answer takes, and no answer was finished.
    assert elapsed < 30, f"the call took {elapsed:.1f} s"
    assert srv.count("finished") == 0
    assert attempts and all(isinstance(a.error, TransportError) for a in attempts)
    assert srv.count("accepted") == len(attempts)
    # The client hung up on every dripping connection, it did not leave
    # them reading in the background.
    wait_for(lambda: srv.count("open") == 0, timeout=20)


def test_sync_deadline_bounds_a_dripping_answer(drip: DripServer) -> None:
    attempts: list[AttemptInfo] = []
    with Client(drip.url, token="t", on_attempt=attempts.append) as c:
        if drip.mode == "reuse":
            c.get("k")  # leaves its connection in the pool for the claim
            attempts.clear()
        start = time.monotonic()
        with pytest.raises(TransportError) as ei:
            c.claim("deadline-sync", operation="POST /x", request={"a": 1}, timeout=2)
        elapsed = time.monotonic() - start
    # The 10 s attempt timeout was cut to the 2 s deadline; nothing fit after it.
    assert ei.value.give_up == "deadline"
    _check_timeout(ei.value, elapsed, drip, attempts)


def test_sync_attempt_timeout_bounds_each_attempt(drip503: DripServer) -> None:
    drip = drip503
    attempts: list[AttemptInfo] = []
    policy = RetryPolicy(attempt_timeout=1.0, base_delay=0.05, max_delay=0.1)
    with Client(drip.url, token="t", policy=policy, on_attempt=attempts.append) as c:
        start = time.monotonic()
        with pytest.raises(TransportError) as ei:
            c.get("deadline-sync-attempts")  # no overall deadline: only the attempt timeout bounds it
        elapsed = time.monotonic() - start
    assert ei.value.give_up == "attempts"
    assert len(attempts) == 3
    _check_timeout(ei.value, elapsed, drip, attempts)


def test_async_deadline_bounds_a_dripping_answer(drip: DripServer) -> None:
    attempts: list[AttemptInfo] = []

    async def main() -> tuple[TransportError, float]:
        async with AsyncClient(drip.url, token="t", on_attempt=attempts.append) as c:
            if drip.mode == "reuse":
                await c.get("k")
                attempts.clear()
            start = time.monotonic()
            with pytest.raises(TransportError) as ei:
                await c.claim("deadline-async", operation="POST /x", request={"a": 1}, timeout=2)
            return ei.value, time.monotonic() - start

    err, elapsed = asyncio.run(main())
    assert err.give_up == "deadline"
    _check_timeout(err, elapsed, drip, attempts)


def test_async_attempt_timeout_bounds_each_attempt(drip503: DripServer) -> None:
    drip = drip503
    attempts: list[AttemptInfo] = []
    policy = RetryPolicy(attempt_timeout=1.0, base_delay=0.05, max_delay=0.1)

    async def main() -> tuple[TransportError, float]:
        async with AsyncClient(drip.url, token="t", policy=policy, on_attempt=attempts.append) as c:
            start = time.monotonic()
            with pytest.raises(TransportError) as ei:
                await c.get("deadline-async-attempts")
            return ei.value, time.monotonic() - start

    err, elapsed = asyncio.run(main())
    assert err.give_up == "attempts"
    assert len(attempts) == 3
    _check_timeout(err, elapsed, drip, attempts)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_sync_deadline_holds_in_a_forked_child() -> None:
    """A pre-forking server (gunicorn --preload) forks after the client
    made calls: the child has no watchdog thread, and it must start its
    own rather than trust the parent's state."""
    srv = DripServer("reuse")
    try:
        with Client(srv.url, token="t") as c:
            c.get("k")  # the parent's watchdog now runs, for 10 s
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    start = time.monotonic()
                    try:
                        c.claim("deadline-fork", operation="POST /x", request={"a": 1}, timeout=2)
                    except TransportError as e:
                        if isinstance(e.__cause__, httpx.TimeoutException) and time.monotonic() - start < 30:
                            code = 0
                finally:
                    os._exit(code)
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0, "the forked child's call was not bounded"
    finally:
        srv.close()
