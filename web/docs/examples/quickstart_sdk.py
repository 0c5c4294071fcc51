#!/usr/bin/env python3
"""idem quickstart with the Python SDK: install it, wrap your handler.

    pip install ./clients/python          # from the idem repository; needs httpx
    IDEM_URL=http://127.0.0.1:8080 IDEM_TOKEN=<jwt with keys:write> python3 quickstart_sdk.py

run() claims the key, runs your handler once, checkpoints, completes, and
keeps the lease alive meanwhile; a retry with the same key gets the stored
response back (a replay) and the handler does not run again. The retry
contract of the docs (allowlist, full jitter, Retry-After, one deadline,
waiting out request_in_flight) is built in.

A web app wraps all its handlers at once instead (the complete apps:
docs/examples/frameworks/):

    from idem.wsgi import install_flask, install_django   # not loaded by `import idem`
    from idem.asgi import IdempotencyMiddleware

    install_flask(app, Client(IDEM_URL, token=IDEM_TOKEN))                              # Flask
    application = install_django(get_wsgi_application(), Client(IDEM_URL, token=IDEM_TOKEN))  # Django
    app.add_middleware(IdempotencyMiddleware, client=AsyncClient(IDEM_URL, token=IDEM_TOKEN))  # FastAPI

IDEM_KEY picks the key (default: an event-derived key for order 4711 and
this run). Exits non-zero on failure.
"""
import json
import os
import sys
import time

from idem import Claim, Client, IdemError, Response, derive_key

ORDER = {"order_id": "4711", "amount": 1000, "currency": "usd"}
charges = []  # the side effects this process performed


def confirm_order(claim: Claim) -> Response:
    """Your handler: charge the card once, then answer."""
    if claim.recovery_point != "charged":  # a takeover after a crash skips what is done
        charges.append(ORDER["amount"])  # charge the card here
        claim.checkpoint("charged", {"charge": "ch_1"})
    body = json.dumps({"order_id": ORDER["order_id"], "status": "confirmed"})
    return Response(201, {"Content-Type": "application/json"}, body.encode())


def main() -> None:
    token = os.environ.get("IDEM_TOKEN", "")
    if not token:
        sys.exit("set IDEM_TOKEN to a token with the keys:write scope")
    key = os.environ.get("IDEM_KEY") or derive_key("order-confirm", ORDER["order_id"], str(int(time.time())))
    with Client(os.environ.get("IDEM_URL", "http://127.0.0.1:8080"), token=token) as idem:
        for _ in range(2):  # the second call is the retry
            result = idem.run(key, confirm_order, operation="POST /orders/4711/confirm", request=ORDER, timeout=20)
            verb = "replayed" if result.replayed else "completed"
            print(f"{verb} {key}: status={result.response.status} body={result.response.body.decode()}")
    if charges != [ORDER["amount"]]:
        sys.exit(f"the handler charged {len(charges)} times")


if __name__ == "__main__":
    try:
        main()
    except IdemError as err:
        sys.exit(f"idem: {err}")
