"""The app of scripts/bench-mwreplay for the Python middleware (issue 23,
goal 2): POST /orders behind idem's middleware, answering 201 with a small
JSON order, served on 127.0.0.1:0.

    python replayapp.py asgi|wsgi IDEM_URL TOKEN on|off SEED

asgi is a Starlette app with idem.asgi.IdempotencyMiddleware on uvicorn;
wsgi is a Flask app with idem.wsgi.install_flask on werkzeug's threaded
server. on|off is the replay cache (the default, or
ReplayCacheOptions(off=True)). It prints "LISTENING http://127.0.0.1:PORT"
on stdout once it serves, and "SEEDED" once its handler ran SEED times
(the keys loadgen sends once before it measures its replays)."""

from __future__ import annotations

import itertools
import socket
import sys

from idem import AsyncClient, Client, ReplayCacheOptions

kind, idem_url, token, cache, seed = sys.argv[1:6]
opts = ReplayCacheOptions(off=cache == "off")
counter = itertools.count(1)


def next_order() -> int:
    n = next(counter)
    if n == int(seed):
        print("SEEDED", flush=True)
    return n

sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind(("127.0.0.1", 0))
port = sock.getsockname()[1]

if kind == "asgi":
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from idem.asgi import IdempotencyMiddleware

    async def order(req: Request) -> JSONResponse:
        body = await req.json()
        return JSONResponse({"order": next_order(), "amount": body.get("amount")}, status_code=201)

    app = Starlette(routes=[Route("/orders", order, methods=["POST"])])
    app.add_middleware(IdempotencyMiddleware, client=AsyncClient(idem_url, token=token), replay_cache=opts)
    sock.listen(1024)  # before LISTENING: a connect then waits for uvicorn instead of being refused
    print(f"LISTENING http://127.0.0.1:{port}", flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False)).run(sockets=[sock])
elif kind == "wsgi":
    from flask import Flask, request
    from werkzeug.serving import make_server

    from idem.wsgi import install_flask

    flask = Flask("bench")

    @flask.post("/orders")
    def order_wsgi() -> tuple[dict[str, object], int]:
        return {"order": next_order(), "amount": (request.get_json() or {}).get("amount")}, 201

    install_flask(flask, Client(idem_url, token=token), replay_cache=opts)
    sock.close()
    srv = make_server("127.0.0.1", port, flask, threaded=True)
    import logging
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    print(f"LISTENING http://127.0.0.1:{port}", flush=True)
    srv.serve_forever()
else:
    raise SystemExit(f"replayapp.py: unknown kind {kind!r}")
