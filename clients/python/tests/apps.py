"""Real Flask and FastAPI apps with the idem middleware and a side-effect
counter, served on loopback by real servers (werkzeug and uvicorn, each in
a thread)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Iterator

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from flask import Flask, request
from werkzeug.serving import make_server

from idem import AsyncClient, Client
from idem.asgi import IdempotencyMiddleware as ASGIMiddleware
from idem.wsgi import install_django, install_flask


@dataclass
class Effects:
    """The side effects an app performed: one per charge it made."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    charges: list[Any] = field(default_factory=list)
    #: The /gated handlers charge, then wait for this (at most 30 s, so a failed test does not hang).
    gate: threading.Event = field(default_factory=threading.Event)

    #: Set when a /stream handler has produced its first chunk.
    first: threading.Event = field(default_factory=threading.Event)
    #: The /stream runs that produced every chunk.
    finished: int = 0
    #: The requests the app (middleware included) has finished with, answered or not.
    answered: int = 0

    def charge(self, body: Any) -> int:
        with self.lock:
            self.charges.append(body)
            return len(self.charges)

    def finish(self) -> None:
        with self.lock:
            self.finished += 1

    def done(self) -> None:
        with self.lock:
            self.answered += 1


#: The /stream handlers answer STREAM_CHUNKS chunks "chunk<i>;", one per
#: STREAM_DELAY seconds; /stream-breaks raises after BREAK_AFTER chunks on
#: its first run.
STREAM_CHUNKS = 10
STREAM_DELAY = 0.05
BREAK_AFTER = 3
FULL_STREAM = "".join(f"chunk{i};" for i in range(STREAM_CHUNKS))

#: The /big handlers answer a pad of BIG_PAD bytes (over a 16th of a replay cache of 16 KiB).
BIG_PAD = 2000


def _breaks(path: str, n: int, i: int) -> None:
    if path.endswith("-breaks") and n == 1 and i == BREAK_AFTER:
        raise RuntimeError("the stream broke off")


@dataclass
class App:
    url: str
    effects: Effects
    operations: list[str]


def flask_app(idem_url: str, token: str, effects: Effects, **opts: Any) -> Any:
    app = Flask("shop")

    @app.post("/charges/<int:account>")
    def charge(account: int) -> Any:
        n = effects.charge(request.get_json())
        time.sleep(0.05)  # widen the window for duplicates
        resp = app.response_class(json.dumps({"charge": f"ch_{n}", "account": account}), status=201, mimetype="application/json")
        resp.headers["Location"] = f"/charges/{n}"
        resp.set_cookie("session", "secret")
        return resp

    @app.get("/charges/<int:account>")
    def count(account: int) -> Any:
        return {"count": len(effects.charges)}

    @app.post("/boom")
    def boom() -> Any:
        effects.charge("boom")
        raise RuntimeError("handler failed")

    @app.put("/files")
    def put_file() -> Any:
        return {"length": len(request.get_data())}

    @app.post("/raw")
    def raw() -> Any:
        data = request.get_data()
        n = effects.charge(data)
        return {"charge": f"ch_{n}", "length": len(data)}, 201

    @app.post("/big")
    def big() -> Any:
        n = effects.charge(request.get_json())
        return {"charge": f"ch_{n}", "pad": "x" * BIG_PAD}, 201

    @app.post("/fail")
    def fail() -> Any:
        effects.charge("fail")
        return {"error": "upstream down"}, 502

    @app.post("/odd")
    def odd() -> Any:
        effects.charge("odd")
        return app.response_class("odd", status=799, mimetype="text/plain")

    @app.post("/gated")
    def gated() -> Any:
        n = effects.charge(request.get_json())
        effects.gate.wait(30)
        return {"charge": f"ch_{n}"}, 201

    @app.post("/stream")
    @app.post("/stream-breaks")
    def stream() -> Any:
        n = effects.charge(request.get_json())
        path = request.path

        def chunks() -> Iterator[str]:
            for i in range(STREAM_CHUNKS):
                _breaks(path, n, i)
                yield f"chunk{i};"
                effects.first.set()
                time.sleep(STREAM_DELAY)
            effects.finish()
        return app.response_class(chunks(), mimetype="text/plain")

    install_flask(app, Client(idem_url, token=token, policy=opts.pop("policy", None), on_attempt=opts.pop("on_attempt", None)), **opts)
    return app


def fastapi_app(idem_url: str, token: str, effects: Effects, **opts: Any) -> Any:
    app = FastAPI()

    @app.post("/charges/{account}")
    async def charge(account: int, req: Request) -> Any:
        n = effects.charge(await req.json())
        await asyncio.sleep(0.05)
        resp = JSONResponse({"charge": f"ch_{n}", "account": account}, status_code=201, headers={"Location": f"/charges/{n}"})
        resp.set_cookie("session", "secret")
        return resp

    @app.get("/charges/{account}")
    async def count(account: int) -> Any:
        return {"count": len(effects.charges)}

    @app.put("/files")
    async def put_file(req: Request) -> Any:
        return {"length": len(await req.body())}

    @app.post("/raw")
    async def raw(req: Request) -> Any:
        data = await req.body()
        n = effects.charge(data)
        return JSONResponse({"charge": f"ch_{n}", "length": len(data)}, status_code=201)

    @app.post("/boom")
    async def boom() -> Any:
        effects.charge("boom")
        raise RuntimeError("handler failed")

    @app.post("/big")
    async def big(req: Request) -> Any:
        n = effects.charge(await req.json())
        return JSONResponse({"charge": f"ch_{n}", "pad": "x" * BIG_PAD}, status_code=201)

    @app.post("/fail")
    async def fail() -> Any:
        effects.charge("fail")
        return JSONResponse({"error": "upstream down"}, status_code=502)

    @app.post("/odd")
    async def odd() -> Any:
        effects.charge("odd")
        return PlainTextResponse("odd", status_code=799)

    @app.post("/gated")
    async def gated(req: Request) -> Any:
        n = effects.charge(await req.json())
        await asyncio.to_thread(effects.gate.wait, 30)
        return JSONResponse({"charge": f"ch_{n}"}, status_code=201)

    @app.post("/stream")
    @app.post("/stream-breaks")
    async def stream(req: Request) -> Any:
        n = effects.charge(await req.json())
        path = req.url.path

        async def chunks() -> AsyncIterator[str]:
            for i in range(STREAM_CHUNKS):
                _breaks(path, n, i)
                yield f"chunk{i};"
                effects.first.set()
                await asyncio.sleep(STREAM_DELAY)  # cancelled when Starlette sees http.disconnect
            effects.finish()
        return StreamingResponse(chunks(), media_type="text/plain")

    @app.post("/unfinished")
    async def unfinished(req: Request) -> Any:
        effects.charge(await req.json())
        return Unfinished()

    app.add_middleware(ASGIMiddleware, client=AsyncClient(idem_url, token=token, policy=opts.pop("policy", None), on_attempt=opts.pop("on_attempt", None)), **opts)
    return app


class Unfinished(Response):
    """An answer that starts and sends a chunk, then stops without its last
    body message (more_body never false)."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"chunk0;", "more_body": True})


_django_lock = threading.Lock()


def django_app(idem_url: str, token: str, effects: Effects, **opts: Any) -> Any:
    """A Django project (settings configured once per process) wrapped by
    install_django; the views find this instance's counter in the environ."""
    import django
    from django.conf import settings
    from django.core.wsgi import get_wsgi_application

    with _django_lock:
        if not settings.configured:
            settings.configure(DEBUG=False, ALLOWED_HOSTS=["*"], ROOT_URLCONF="django_urls", SECRET_KEY="test-only",
                               MIDDLEWARE=[], INSTALLED_APPS=[], DATABASES={}, USE_TZ=True,
                               LOGGING_CONFIG=None)
            django.setup()
    inner = install_django(get_wsgi_application(), Client(idem_url, token=token, policy=opts.pop("policy", None), on_attempt=opts.pop("on_attempt", None)), **opts)

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        environ["idem_test.effects"] = effects
        return inner(environ, start_response)
    return app


def serve(kind: str, idem_url: str, token: str, **opts: Any) -> Iterator[App]:
    """Serve a fresh app of kind ("flask", "django" or "fastapi") on loopback;
    opts go to the middleware, except policy and on_attempt, the idem
    client's RetryPolicy and attempt hook."""
    effects = Effects()
    if kind in ("flask", "django"):
        make = flask_app if kind == "flask" else django_app
        wsgi = make(idem_url, token, effects, **opts)

        def counted(environ: dict[str, Any], start_response: Any) -> Any:
            try:
                return wsgi(environ, start_response)
            finally:
                effects.done()
        srv = make_server("127.0.0.1", 0, counted, threaded=True)
        t = threading.Thread(target=srv.serve_forever, daemon=True)
        t.start()
        try:
            yield App(f"http://127.0.0.1:{srv.server_port}", effects, [])
        finally:
            srv.shutdown()
        return
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    asgi = fastapi_app(idem_url, token, effects, **opts)

    async def counted_asgi(scope: Any, receive: Any, send: Any) -> None:
        try:
            await asgi(scope, receive, send)
        finally:
            effects.done()
    config = uvicorn.Config(counted_asgi, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    t = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    t.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not t.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield App(f"http://127.0.0.1:{sock.getsockname()[1]}", effects, [])
    finally:
        server.should_exit = True
        t.join(10)
        sock.close()


_: Callable[..., Any] = serve
