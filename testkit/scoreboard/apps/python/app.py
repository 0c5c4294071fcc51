"""The scoreboard's Python apps: one counting endpoint, the conformance
kit's target contract (conformance/kit.go), wrapped in one Idempotency-Key
implementation as its README wires it.

    SB_IMPL=idem-asgi                 Starlette + idem.asgi.IdempotencyMiddleware (uvicorn)
    SB_IMPL=idem-wsgi                 Flask + idem.wsgi.install_flask (werkzeug, threaded)
    SB_IMPL=fastapi-idempotency-key   FastAPI + fastapi_idempotency_key.IdempotencyMiddleware, MemoryBackend
    SB_IMPL=fastapi-idempotency       FastAPI + fastapi_idempotency.IdempotencyMiddleware, MemoryStore
    SB_IMPL=asgi-idempotency-header   FastAPI + idempotency_header_middleware.IdempotencyHeaderMiddleware, MemoryBackend
    SB_IMPL=django-idempotency-key    Django + idempotency_key.middleware.IdempotencyKeyMiddleware, MemoryKeyStorage (werkzeug, threaded)

The endpoint: POST /orders and /orders/<id> perform one side effect (a
counter, after ?delay_ms=N) and answer 201 (or ?status=N) with
{"order": N, "echo": <the JSON body or null>}, Location and ETag (and
Set-Cookie for idem's front doors); GET /count answers {"count": N}. SB_EXPIRY_SECONDS, when set,
is the key expiry given to an implementation that has one. IDEM_URL and
IDEM_TOKEN reach idem for the idem front doors.

It prints one line on stdout, ``SB_LISTENING http://127.0.0.1:PORT <name>@<version>``;
everything else goes to stderr. The implementations are installed by
scripts/scoreboard into a virtualenv of their own; none of their code is
part of this repository.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import sys
import threading
import time
from importlib import metadata
from typing import Any

_STDOUT = sys.stdout
sys.stdout = sys.stderr

IMPL = os.environ.get("SB_IMPL", "")
EXPIRY = int(os.environ.get("SB_EXPIRY_SECONDS", "0") or 0)

# The distribution each implementation is installed from, for its version.
DISTRIBUTIONS = {
    "idem-asgi": "starlette",
    "idem-wsgi": "flask",
    "fastapi-idempotency-key": "fastapi-idempotency-key",
    "fastapi-idempotency": "fastapi-idempotency",
    "asgi-idempotency-header": "asgi-idempotency-header",
    "django-idempotency-key": "django-idempotency-key",
}


class Counter:
    def __init__(self) -> None:
        self._n = 0
        self._lock = threading.Lock()

    def add(self) -> int:
        with self._lock:
            self._n += 1
            return self._n

    @property
    def value(self) -> int:
        with self._lock:
            return self._n


COUNT = Counter()


def answer(body: bytes, query: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    """The side effect and its answer (the delay is the caller's: sync or async)."""
    n = COUNT.add()
    try:
        status = int(query.get("status", "") or 201)
    except ValueError:
        status = 201
    if not 200 <= status <= 599:
        status = 201
    try:
        echo = json.loads(body) if body else None
    except ValueError:
        echo = None
    out = json.dumps({"order": n, "echo": echo}).encode()
    headers = {"Content-Type": "application/json", "Location": f"/orders/{n}", "ETag": f'"order-{n}"'}
    if IMPL.startswith("idem-"):
        # As the reference upstream (replay_headers checks it is never
        # replayed); the other implementations get none: one of them
        # stores no answer that sets a cookie.
        headers["Set-Cookie"] = f"session=order-{n}"
    return status, headers, out


def delay_of(query: dict[str, str]) -> float:
    try:
        return min(int(query.get("delay_ms", "0") or 0), 60000) / 1000
    except ValueError:
        return 0.0


def count_body() -> bytes:
    return json.dumps({"count": COUNT.value}).encode()


# ---------------------------------------------------------------- ASGI


def starlette_routes() -> list[Any]:
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    async def orders(request: Request) -> Response:
        body = await request.body()
        q = dict(request.query_params)
        if d := delay_of(q):
            await asyncio.sleep(d)
        status, headers, out = answer(body, q)
        return Response(out, status_code=status, headers=headers)

    async def count(request: Request) -> Response:
        return Response(count_body(), media_type="application/json")

    methods = ["POST", "PUT", "PATCH"]
    return [Route("/orders", orders, methods=methods), Route("/orders/{id}", orders, methods=methods),
            Route("/count", count, methods=["GET"])]


def asgi_app() -> Any:
    if IMPL == "idem-asgi":
        from starlette.applications import Starlette

        from idem import AsyncClient
        from idem.asgi import IdempotencyMiddleware

        app = Starlette(routes=starlette_routes())
        app.add_middleware(IdempotencyMiddleware, client=AsyncClient(os.environ["IDEM_URL"], token=os.environ["IDEM_TOKEN"]))
        return app
    from fastapi import FastAPI

    app = FastAPI()
    for r in starlette_routes():
        app.router.routes.append(r)
    if IMPL == "fastapi-idempotency-key":
        from fastapi_idempotency_key import IdempotencyMiddleware, MemoryBackend

        kw: dict[str, Any] = {"default_ttl": EXPIRY} if EXPIRY else {}
        app.add_middleware(IdempotencyMiddleware, backend=MemoryBackend(), **kw)
    elif IMPL == "fastapi-idempotency":
        from datetime import timedelta

        from fastapi_idempotency import IdempotencyMiddleware, MemoryStore

        kw = {"key_window": timedelta(seconds=EXPIRY)} if EXPIRY else {}
        app.add_middleware(IdempotencyMiddleware, store=MemoryStore(), **kw)
    elif IMPL == "asgi-idempotency-header":
        from idempotency_header_middleware import IdempotencyHeaderMiddleware
        from idempotency_header_middleware.backends.memory import MemoryBackend as HeaderMemoryBackend

        backend = HeaderMemoryBackend(expiry=EXPIRY) if EXPIRY else HeaderMemoryBackend()
        app.add_middleware(IdempotencyHeaderMiddleware, backend=backend)
    else:
        raise SystemExit(f"app.py: unknown ASGI implementation {IMPL!r}")
    return app


def serve_asgi(app: Any, sock: socket.socket, version: str) -> None:
    import uvicorn

    class Server(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if not self.should_exit:
                announce(sock.getsockname()[1], version)

    config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="off", timeout_graceful_shutdown=2)
    Server(config).run(sockets=[sock])


# ---------------------------------------------------------------- WSGI


def flask_app() -> Any:
    from flask import Flask, Response, request

    from idem import Client
    from idem.wsgi import install_flask

    app = Flask("scoreboard")

    def orders(id: str | None = None) -> Response:
        body = request.get_data()
        q = request.args.to_dict()
        if d := delay_of(q):
            time.sleep(d)
        status, headers, out = answer(body, q)
        return Response(out, status=status, headers=headers)

    app.add_url_rule("/orders", "orders", orders, methods=["POST", "PUT", "PATCH"])
    app.add_url_rule("/orders/<id>", "order", orders, methods=["POST", "PUT", "PATCH"])
    app.add_url_rule("/count", "count", lambda: Response(count_body(), mimetype="application/json"), methods=["GET"])
    install_flask(app, Client(os.environ["IDEM_URL"], token=os.environ["IDEM_TOKEN"]))
    return app


def django_app() -> Any:
    import django
    from django.conf import settings

    settings.configure(
        DEBUG=False, SECRET_KEY="scoreboard-not-a-secret", ALLOWED_HOSTS=["*"], ROOT_URLCONF=__name__,
        MIDDLEWARE=["idempotency_key.middleware.IdempotencyKeyMiddleware"],
        INSTALLED_APPS=["django.contrib.contenttypes", "rest_framework"], USE_TZ=True,
        DATABASES={}, LOGGING_CONFIG=None,
    )
    django.setup()
    from django.core.wsgi import get_wsgi_application

    # ROOT_URLCONF is this module: its urlpatterns, once Django is set up.
    globals()["urlpatterns"] = _django_views()

    return get_wsgi_application()


def _django_views() -> list[Any]:
    from django.http import HttpResponse
    from django.urls import path
    from idempotency_key.decorators import idempotency_key_exempt

    def orders(request: Any, id: str | None = None) -> Any:
        q = request.GET.dict()
        if d := delay_of(q):
            time.sleep(d)
        status, headers, out = answer(request.body, q)
        resp = HttpResponse(out, status=status, content_type="application/json")
        for h, v in headers.items():
            if h != "Content-Type":
                resp[h] = v
        return resp

    @idempotency_key_exempt
    def count(request: Any) -> Any:
        return HttpResponse(count_body(), content_type="application/json")

    return [path("orders", orders), path("orders/<str:id>", orders), path("count", count)]


def serve_wsgi(app: Any, host: str, port: int, version: str) -> None:
    from werkzeug.serving import make_server

    srv = make_server(host, port, app, threaded=True)
    announce(srv.socket.getsockname()[1], version)
    srv.serve_forever()


def announce(port: int, version: str) -> None:
    _STDOUT.write(f"SB_LISTENING http://127.0.0.1:{port} {version}\n")
    _STDOUT.flush()


def main() -> int:
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    if IMPL not in DISTRIBUTIONS:
        print(f"app.py: SB_IMPL must be one of {sorted(DISTRIBUTIONS)}, not {IMPL!r}", file=sys.stderr)
        return 2
    dist = DISTRIBUTIONS[IMPL]
    if IMPL.startswith("idem-"):
        version = f"{IMPL}@tree"
    else:
        version = f"{dist}@{metadata.version(dist)}"
    addr = os.environ.get("SB_ADDR", "127.0.0.1:0")
    host, _, port = addr.rpartition(":")
    if IMPL == "idem-wsgi":
        serve_wsgi(flask_app(), host, int(port), version)
    elif IMPL == "django-idempotency-key":
        serve_wsgi(django_app(), host, int(port), version)
    else:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, int(port)))
        serve_asgi(asgi_app(), sock, version)
    return 0


if __name__ == "__main__":
    sys.exit(main())
