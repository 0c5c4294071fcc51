"""The clients keep their connections alive and reuse them (issue 23, goal
3): against a loopback server counting the TCP connections it accepts, 200
sequential calls through one client open one, and N threads or tasks x M
calls open about N - not one per call. 40 callers is more than httpx keeps
alive by default (20): the clients the SDK makes keep all 100 of their pool
(POOL_LIMITS). A little slack above N: a connection opened while another
frees up is kept too."""

from __future__ import annotations

import asyncio
import importlib.metadata
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import pytest

from idem import AsyncClient, Client

RECORD = b'{"key":"k","state":"completed","fencing_token":1,"attempt":1}'


class _Counting(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lock = threading.Lock()
        self.connections = 0

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.lock:
            self.connections += 1
        super().process_request(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(RECORD)))
        self.end_headers()
        self.wfile.write(RECORD)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def counting() -> Iterator[_Counting]:
    srv = _Counting()
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _url(srv: _Counting) -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}"


@pytest.mark.parametrize("callers,calls", [(16, 50), (40, 20)])
def test_sync_client_reuses_connections(counting: _Counting, callers: int, calls: int) -> None:
    with Client(_url(counting), token="t") as c:
        for _ in range(200):
            c.get("k")
        sequential = counting.connections
        assert sequential <= 2, f"{sequential} connections for 200 sequential calls"

        def work(_: int) -> None:
            for _ in range(calls):
                c.get("k")

        with ThreadPoolExecutor(callers) as ex:
            list(ex.map(work, range(callers)))
        opened = counting.connections - sequential
    assert opened <= 2 * callers, f"{opened} new connections for {callers}x{calls} concurrent calls"


@pytest.mark.parametrize("callers,calls", [(16, 50), (40, 20)])
def test_async_client_reuses_connections(counting: _Counting, callers: int, calls: int) -> None:
    async def main() -> tuple[int, int]:
        async with AsyncClient(_url(counting), token="t") as c:
            for _ in range(200):
                await c.get("k")
            sequential = counting.connections

            async def work() -> None:
                for _ in range(calls):
                    await c.get("k")

            await asyncio.gather(*(work() for _ in range(callers)))
            return sequential, counting.connections - sequential

    sequential, opened = asyncio.run(main())
    assert sequential <= 2, f"{sequential} connections for 200 sequential calls"
    assert opened <= 2 * callers, f"{opened} new connections for {callers}x{calls} concurrent calls"


class _Lookups:
    """A sys.meta_path finder that finds nothing and records the modules
    Python searched for (a module already imported is never searched)."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        self.names.append(name)
        return None


def test_async_client_imports_nothing_per_call(counting: _Counting) -> None:
    """httpcore's async pool asks sniffio which event loop runs at every
    lock and event it makes (several per call) by importing it inside the
    function; anyio >= 4.11 no longer installs sniffio, and Python does not
    cache a failed import, so without it every call searched the whole
    sys.path for sniffio again (encode/httpcore#1103). The SDK depends on
    sniffio itself: after the first call no call imports anything."""
    async def main(lookups: _Lookups) -> None:
        async with AsyncClient(_url(counting), token="t") as c:
            await c.get("k")
            sys.meta_path.insert(0, lookups)
            try:
                for _ in range(50):
                    await c.get("k")
            finally:
                sys.meta_path.remove(lookups)

    lookups = _Lookups()
    asyncio.run(main(lookups))
    assert lookups.names == [], f"modules searched for during 50 calls: {sorted(set(lookups.names))}"
    requires = importlib.metadata.requires("idem-client") or []
    assert any(r.replace(" ", "").startswith("sniffio") for r in requires), requires
