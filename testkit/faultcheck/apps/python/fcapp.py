"""The faultcheck app of the Python front doors (testkit/faultcheck/PROTOCOL.md).

The counting handler of the protocol, wrapped in idem's own middleware as a
user wires it:

    FC_FRONTDOOR=asgi  a Starlette app with idem.asgi.IdempotencyMiddleware, served by uvicorn
    FC_FRONTDOOR=wsgi  a Flask app with idem.wsgi.install_flask, served by werkzeug (threaded)

Run it with the repository's virtualenv and the SDK's source, so the SDK
under test is the one in the tree:

    PYTHONPATH=clients/python/src FC_FRONTDOOR=asgi FC_ADDR=127.0.0.1:0 FC_LOG=/tmp/fc.jsonl \
        IDEM_URL=http://127.0.0.1:8080 IDEM_TOKEN=... .venv/bin/python testkit/faultcheck/apps/python/fcapp.py

It prints exactly one line on stdout, ``FC_LISTENING http://127.0.0.1:PORT``;
everything else goes to stderr. The token is never logged.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Iterator

log = logging.getLogger("fcapp")

# stdout carries the listening line and nothing else: whatever a library
# prints goes to stderr.
_STDOUT = sys.stdout
sys.stdout = sys.stderr


class HandlerRaised(Exception):
    """The failure the raise and cutstream modes raise on purpose."""


class BadMode(ValueError):
    """A mode the protocol does not define (answered 400)."""


class EffectLog:
    """The side-effect log (FC_LOG): one JSON object per line, each line
    one write(2) on an O_APPEND descriptor, so that lines of concurrent
    runs (threads here, other processes in principle) never interleave and
    a line is on disk (in the page cache) before the handler goes on: a run
    killed right after its start line still left it."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()
        self._runs = itertools.count(1)
        self._pid = os.getpid()

    def new_run(self) -> str:
        with self._lock:
            return f"{self._pid}-{next(self._runs)}"

    def write(self, rec: dict[str, Any]) -> None:
        line = (json.dumps(rec, separators=(",", ":"), ensure_ascii=False) + "\n").encode()
        with self._lock:
            view = memoryview(line)
            while view:
                n = os.write(self._fd, view)
                view = view[n:]


@dataclass
class Mode:
    kind: str  # ok, slow, status, raise, stream, cutstream
    status: int = 201
    ms: int = 0
    chunks: int = 0


def parse_mode(mode: str) -> Mode:
    parts = mode.split(":")
    try:
        if parts == ["ok"]:
            return Mode("ok")
        if parts == ["raise"]:
            return Mode("raise")
        if parts[0] == "slow" and len(parts) == 2:
            return Mode("slow", ms=_nonneg(parts[1]))
        if parts[0] == "status" and len(parts) == 2:
            n = int(parts[1])
            if not 200 <= n <= 999:  # as the Go app: no 1xx, which are not final answers
                raise BadMode(mode)
            return Mode("status", status=n)
        if parts[0] == "stream" and len(parts) == 3:
            return Mode("stream", status=200, chunks=_positive(parts[1]), ms=_nonneg(parts[2]))
        if parts[0] == "cutstream" and len(parts) == 2:
            return Mode("cutstream", status=200, chunks=_positive(parts[1]), ms=20)
    except ValueError as e:
        raise BadMode(mode) from e
    raise BadMode(mode)


def _nonneg(s: str) -> int:
    n = int(s)
    if n < 0:
        raise ValueError(s)
    return n


def _positive(s: str) -> int:
    n = int(s)
    if n < 1:
        raise ValueError(s)
    return n


def pieces(body: bytes, n: int) -> list[bytes]:
    """body cut into n pieces of (nearly) equal length, in order."""
    return [body[i * len(body) // n:(i + 1) * len(body) // n] for i in range(n)]


class Run:
    """One invocation of the counting handler: writes its start line when
    made, its end line when end() is called (after the last byte was handed
    to the framework), an abort line otherwise."""

    def __init__(self, fc: EffectLog, key: str, scope: str, raw: bytes) -> None:
        self.fc = fc
        self.id = fc.new_run()
        try:
            doc = json.loads(raw)
            if not isinstance(doc, dict):
                raise ValueError("not an object")
            self.req, self.mode_text, self.pad = str(doc.get("req", "")), str(doc.get("mode", "")), str(doc.get("pad", ""))
            self.bad_body = False
        except ValueError:
            self.req = self.mode_text = self.pad = ""
            self.bad_body = True
        self.scope = scope
        fc.write({"ev": "start", "run": self.id, "key": key, "scope": scope, "req": self.req, "mode": self.mode_text,
                  "t": int(time.time() * 1000)})
        self.body = json.dumps({"run": self.id, "req": self.req, "scope": scope, "pad": self.pad},
                               separators=(",", ":"), ensure_ascii=False).encode()

    def mode(self) -> Mode:
        if self.bad_body:
            raise BadMode("the body is not a JSON object")
        return parse_mode(self.mode_text)

    def end(self, status: int, body: bytes | None = None) -> None:
        b = self.body if body is None else body
        self.fc.write({"ev": "end", "run": self.id, "status": status, "body_sha256": hashlib.sha256(b).hexdigest(), "len": len(b)})

    def abort(self, why: str) -> None:
        self.fc.write({"ev": "abort", "run": self.id, "why": why})


#: The app's answer to a handler exception (its error handler's, outside
#: the middleware, which stores nothing for it): RFC 9457, as every error
#: answer of a careful app, so that the checker can hold every refusal to
#: problem+json.
PROBLEM_500 = json.dumps({"type": "about:blank", "title": "Internal Server Error", "status": 500,
                          "detail": "the handler raised"}).encode()


def _joined(values: list[str]) -> str:
    # As the middleware reads a scope header sent on several field lines.
    return ", ".join(values)


# ---------------------------------------------------------------- ASGI (Starlette on uvicorn)

def asgi_app(fc: EffectLog, idem_url: str, token: str, scope_header: str | None, store_5xx: bool) -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse, Response, StreamingResponse
    from starlette.routing import Route

    from idem import AsyncClient
    from idem.asgi import IdempotencyMiddleware

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def handler(request: Request) -> Response:
        raw = await request.body()
        scope = _joined(request.headers.getlist(scope_header)) if scope_header else ""
        run = Run(fc, _joined(request.headers.getlist("idempotency-key")), scope, raw)
        try:
            mode = run.mode()
        except BadMode:
            run.end(400)
            return Response(run.body, status_code=400, media_type="application/json")
        if mode.kind == "raise":
            run.abort("raise")
            raise HandlerRaised("raise mode")
        if mode.kind == "slow":
            try:
                await asyncio.sleep(mode.ms / 1000)
            except asyncio.CancelledError:
                run.abort("cancelled")
                raise
        if mode.kind in ("stream", "cutstream"):
            return StreamingResponse(stream(run, mode), status_code=200, media_type="application/json")
        # The handler's answer is the Response it returns: the body is
        # handed over here, before the framework (and the middleware) sees it.
        run.end(mode.status)
        return Response(run.body, status_code=mode.status, media_type="application/json")

    async def stream(run: Run, mode: Mode) -> AsyncIterator[bytes]:
        # StreamingResponse sends each piece (awaits send) before it asks
        # for the next one: the code after the last yield runs only once the
        # last piece was handed over. The caller gone, Starlette cancels the
        # stream (its http.disconnect listener) or closes the generator: it
        # stops where it waits and leaves an abort line.
        parts = pieces(run.body, mode.chunks)
        cut = mode.chunks // 2 if mode.kind == "cutstream" else None
        done = False
        try:
            for i, piece in enumerate(parts):
                if i > 0:
                    await asyncio.sleep(mode.ms / 1000)
                if i == cut:
                    run.abort("cutstream")
                    done = True
                    raise HandlerRaised(f"cutstream after {cut} of {mode.chunks} pieces")
                yield piece
            done = True
            run.end(200)
        finally:
            if not done:
                run.abort("cancelled")

    routes = [
        Route("/fc/healthz", healthz, methods=["GET"]),
        Route("/fc/{rest:path}", handler, methods=["POST", "PUT", "PATCH"]),
    ]
    async def on_error(request: Request, exc: Exception) -> Response:
        # Starlette's ServerErrorMiddleware, outside the idem middleware: it
        # answers with this after the exception went through the middleware,
        # then re-raises it (uvicorn logs it).
        return Response(PROBLEM_500, status_code=500, media_type="application/problem+json")

    app = Starlette(routes=routes, exception_handlers={Exception: on_error})
    app.add_middleware(IdempotencyMiddleware, client=AsyncClient(idem_url, token=token),
                       scope_header=scope_header, store_5xx=store_5xx)
    return app


def serve_asgi(app: Any, host: str, port: int) -> None:
    import socket

    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))

    class Server(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if not self.should_exit:
                announce(sock.getsockname()[1])

    # log_config=None: uvicorn's own configuration sends access lines to
    # stdout; here every logger goes to the root handler on stderr.
    config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="off", timeout_graceful_shutdown=5)
    Server(config).run(sockets=[sock])


# ---------------------------------------------------------------- WSGI (Flask on werkzeug)

def wsgi_app(fc: EffectLog, idem_url: str, token: str, scope_header: str | None, store_5xx: bool) -> Any:
    from flask import Flask, Response, request

    from idem import Client
    from idem.wsgi import install_flask

    app = Flask("fcapp")

    @app.get("/fc/healthz")
    def healthz() -> Any:
        return Response("ok", mimetype="text/plain")

    @app.route("/fc/<path:rest>", methods=["POST", "PUT", "PATCH"])
    def handler(rest: str) -> Any:
        raw = request.get_data()
        scope = _joined(request.headers.getlist(scope_header)) if scope_header else ""
        run = Run(fc, _joined(request.headers.getlist("Idempotency-Key")), scope, raw)
        try:
            mode = run.mode()
        except BadMode:
            run.end(400)
            return Response(run.body, status=400, mimetype="application/json")
        if mode.kind == "raise":
            run.abort("raise")
            raise HandlerRaised("raise mode")
        if mode.kind == "slow":
            time.sleep(mode.ms / 1000)
        if mode.kind in ("stream", "cutstream"):
            return Response(stream(run, mode), status=200, mimetype="application/json")
        run.end(mode.status)
        return Response(run.body, status=mode.status, mimetype="application/json")

    def stream(run: Run, mode: Mode) -> Iterator[bytes]:
        # The WSGI server (here the middleware) takes each piece before it
        # resumes the iterator: the code after the last yield runs only once
        # the last piece was handed over. WSGI tells an app nothing of a
        # caller gone (and the middleware buffers the answer): only close()
        # before the end (GeneratorExit at a yield) stops it.
        parts = pieces(run.body, mode.chunks)
        cut = mode.chunks // 2 if mode.kind == "cutstream" else None
        done = False
        try:
            for i, piece in enumerate(parts):
                if i > 0:
                    time.sleep(mode.ms / 1000)
                if i == cut:
                    run.abort("cutstream")
                    done = True
                    raise HandlerRaised(f"cutstream after {cut} of {mode.chunks} pieces")
                yield piece
            done = True
            run.end(200)
        finally:
            if not done:
                run.abort("cancelled")

    @app.errorhandler(500)
    def on_error(e: Any) -> Any:
        # A view's exception: Flask answers with this (got_request_exception
        # has told the middleware, which stores nothing for it).
        return Response(PROBLEM_500, status=500, mimetype="application/problem+json")

    install_flask(app, Client(idem_url, token=token), scope_header=scope_header, store_5xx=store_5xx)
    protected = app.wsgi_app

    def guarded(environ: dict[str, Any], start_response: Any) -> Any:
        # A stream's exception comes out of the middleware (which runs the
        # iterator to buffer the answer, and stores nothing for it), after
        # Flask's own handling: the app's outermost error handler answers.
        try:
            return protected(environ, start_response)
        except Exception:
            log.exception("the handler raised")
            start_response("500 INTERNAL SERVER ERROR", [("Content-Type", "application/problem+json"),
                                                         ("Content-Length", str(len(PROBLEM_500)))], sys.exc_info())
            return [PROBLEM_500]

    app.wsgi_app = guarded  # type: ignore[method-assign]
    return app


def serve_wsgi(app: Any, host: str, port: int) -> None:
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    srv = make_server(host, port, app, threaded=True)
    announce(srv.server_port)
    srv.serve_forever()


# ---------------------------------------------------------------- main

def announce(port: int) -> None:
    _STDOUT.write(f"FC_LISTENING http://127.0.0.1:{port}\n")
    _STDOUT.flush()


def main() -> int:
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="fcapp %(levelname)s %(name)s: %(message)s")
    env = os.environ
    frontdoor = env.get("FC_FRONTDOOR", "")
    if frontdoor not in ("asgi", "wsgi"):
        log.error("FC_FRONTDOOR must be asgi or wsgi, not %r", frontdoor)
        return 2
    missing = [k for k in ("FC_LOG", "IDEM_URL", "IDEM_TOKEN") if not env.get(k)]
    if missing:
        log.error("missing environment: %s", ", ".join(missing))
        return 2
    host, _, port = env.get("FC_ADDR", "127.0.0.1:0").rpartition(":")
    fc = EffectLog(env["FC_LOG"])
    scope_header = env.get("FC_SCOPE_HEADER") or None
    store_5xx = env.get("FC_RELEASE_5XX") != "1"
    if frontdoor == "asgi":
        serve_asgi(asgi_app(fc, env["IDEM_URL"], env["IDEM_TOKEN"], scope_header, store_5xx), host or "127.0.0.1", int(port))
    else:
        serve_wsgi(wsgi_app(fc, env["IDEM_URL"], env["IDEM_TOKEN"], scope_header, store_5xx), host or "127.0.0.1", int(port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
