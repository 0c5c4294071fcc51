"""Fixtures: the real idem server binary on both stores, on loopback.

The binary is built once per session with `go build ./cmd/server` from the
repository root (IDEM_SERVER_BINARY names a prebuilt one). SQLite runs in a
temporary folder; PostgreSQL in a fresh schema on TEST_DATABASE_URL. Without
TEST_DATABASE_URL the PostgreSQL tests skip, unless IDEM_REQUIRE_POSTGRES=1
(make test), where they fail.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pytest

REPO = Path(__file__).resolve().parents[3]
SECRET = "python-sdk-hs256-secret-0123456789abcdef"


@dataclass
class Server:
    """A running idem server: its URL, a keys:write token of tenant acme,
    and the store it runs on."""

    url: str
    token: str
    store: str
    env: dict[str, str]


@pytest.fixture(scope="session")
def binary(tmp_path_factory: pytest.TempPathFactory) -> str:
    prebuilt = os.environ.get("IDEM_SERVER_BINARY")
    if prebuilt:
        return prebuilt
    out = tmp_path_factory.mktemp("bin") / "idem"
    subprocess.run(["go", "build", "-o", str(out), "./cmd/server"], cwd=REPO, check=True)
    return str(out)


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("IDEM_")}
    env.update(extra)
    return env


def _cli(binary: str, env: dict[str, str], *args: str) -> str:
    p = subprocess.run([binary, *args], env=_env(env), capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        raise RuntimeError(f"idem {' '.join(args)}: {p.stderr}")
    return p.stdout.strip()


def _postgres_url() -> tuple[str, str]:
    base = os.environ.get("TEST_DATABASE_URL", "")
    if not base:
        if os.environ.get("IDEM_REQUIRE_POSTGRES") == "1":
            pytest.fail("TEST_DATABASE_URL is not set but IDEM_REQUIRE_POSTGRES=1: PostgreSQL tests must run")
        pytest.skip("TEST_DATABASE_URL is not set; skipping PostgreSQL (run `make test` to get a server)")
    schema = "idem_pytest_" + secrets.token_hex(6)
    subprocess.run(["psql", base, "-q", "-v", "ON_ERROR_STOP=1", "-c", f"CREATE SCHEMA {schema}"], check=True, capture_output=True)
    u = urllib.parse.urlsplit(base)
    q = urllib.parse.parse_qsl(u.query) + [("search_path", schema)]
    return urllib.parse.urlunsplit(u._replace(query=urllib.parse.urlencode(q))), schema


def start_server(binary: str, store: str, extra: dict[str, str] | None = None) -> Iterator[Server]:
    """Start `idem serve` on 127.0.0.1:0 and yield it; stop it afterwards."""
    schema = ""
    with tempfile.TemporaryDirectory(prefix="idem-pytest-") as tmp:
        if store == "postgres":
            db, schema = _postgres_url()
        else:
            db = "sqlite:" + os.path.join(tmp, "idem.db")
        # A fresh store: creating the ledger is expected (IDEM_CREATE_DB).
        env = {"IDEM_DATABASE_URL": db, "IDEM_JWT_HS256_SECRET": SECRET, "IDEM_CREATE_DB": "1", **(extra or {})}
        _cli(binary, env, "tenant", "create", "acme")
        token = _cli(binary, env, "token", "--tenant", "acme", "--scope", "keys:write", "--ttl", "2h")
        proc = subprocess.Popen([binary, "serve"], env=_env({**env, "IDEM_ADDR": "127.0.0.1:0", "IDEM_LOG_FORMAT": "json"}),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        assert proc.stderr is not None
        addr = ""
        for line in proc.stderr:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("msg") == "listening" and rec.get("addr"):
                addr = rec["addr"]
                break
        if not addr:
            proc.kill()
            raise RuntimeError("the idem server did not start")
        stderr = proc.stderr
        threading.Thread(target=lambda: [None for _ in stderr], daemon=True).start()  # keep draining the log
        try:
            yield Server(url="http://" + addr, token=token, store=store, env=env)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
            if schema:
                subprocess.run(["psql", os.environ["TEST_DATABASE_URL"], "-q", "-c", f"DROP SCHEMA {schema} CASCADE"], capture_output=True)


@pytest.fixture(scope="session", params=["sqlite", "postgres"])
def server(request: pytest.FixtureRequest, binary: str) -> Iterator[Server]:
    yield from start_server(binary, request.param)


def mint_token(binary: str, server: Server, scope: str) -> str:
    """Another token of tenant acme on server, with scope (e.g. "tenant:admin")."""
    return _cli(binary, server.env, "token", "--tenant", "acme", "--scope", scope, "--ttl", "2h")


def new_key(prefix: str = "py") -> str:
    return f"{prefix}-{secrets.token_hex(8)}"


def claim_waiters(server: Server) -> float:
    """The server's idem_claim_waiters gauge: claims it holds now, waiting
    for a key in flight."""
    with urllib.request.urlopen(server.url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    m = re.search(r"(?m)^idem_claim_waiters (\S+)$", text)
    return float(m.group(1)) if m else 0.0


def wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll cond (every 5 ms) until it holds; fail after timeout seconds."""
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            pytest.fail("condition not reached in time")
        time.sleep(0.005)
