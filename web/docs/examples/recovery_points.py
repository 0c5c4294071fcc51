#!/usr/bin/env python3
"""Recovery points and fencing tokens with the Python SDK's low-level calls:
the worked example of /docs/keys/ (create order -> charge -> email).

    pip install ./clients/python
    IDEM_URL=http://127.0.0.1:8080 IDEM_TOKEN=<jwt with keys:write> python3 recovery_points.py

Worker A creates the order, charges, checkpoints "charged" and crashes.
Worker B, the retry, takes the key over when A's 1 s lease runs out and
resumes after "charged": no second order, no second charge. Worker A's
late write with its old token matches no row, and idem refuses its complete
(409 lease_lost). The next retry is the replay. IDEM_KEY picks the key.
"""
import json
import os
import sqlite3
import time

from idem import Client, ProblemError, Response, derive_key

db = sqlite3.connect(":memory:")  # your database: each row keeps the token that last wrote it
db.execute("CREATE TABLE orders (id TEXT PRIMARY KEY, status TEXT, idem_token INTEGER NOT NULL DEFAULT 0)")
charges: dict[str, str] = {}  # your payment provider: one charge per idempotency key
emails: list[str] = []


class Crash(Exception):
    """Worker A dies after its charge: its claim is left to expire."""


def write_order(order_id: str, status: str, token: int) -> bool:
    """Every write carries the claim's token; False: a newer attempt wrote, you lost the key."""
    db.execute("INSERT OR IGNORE INTO orders (id, status) VALUES (?, 'new')", (order_id,))
    cur = db.execute("UPDATE orders SET status = ?, idem_token = ? WHERE id = ? AND idem_token < ?",
                     (status, token, order_id, token))
    return cur.rowcount == 1


def confirm_order(idem: Client, key: str, order: dict, wait: float = 0, crash: bool = False) -> Response:
    claim = idem.claim(key, operation="POST /orders/confirm", request=order, lease=1, wait=wait)
    if claim.replayed:  # done before: replay
        return claim.record.response
    token, point = claim.record.fencing_token, claim.record.recovery_point
    data = claim.record.recovery_data or {}
    print(f"token {token}: resumed={claim.resumed} recovery_point={point or None}")

    if not point:  # phase 1: create the order
        data["order_id"] = "ord_" + order["id"]
        write_order(data["order_id"], "created", token)
        idem.checkpoint(key, token, "order_created", data, lease=1)
        point = "order_created"

    if point == "order_created":  # phase 2: charge, idempotently at the PSP too
        data["charge_id"] = charges.setdefault("charge-" + key, f"ch_{len(charges) + 1}")
        idem.checkpoint(key, token, "charged", data, lease=1)
        point = "charged"
        if crash:
            raise Crash(token)

    if point == "charged":  # phase 3: confirm and email
        if not write_order(data["order_id"], "confirmed", token):
            raise RuntimeError("a newer attempt wrote the order: stop, do not complete")
        emails.append(data["order_id"])

    body = json.dumps({"order_id": data["order_id"], "charge_id": data["charge_id"]})
    response = Response(201, {"Content-Type": "application/json"}, body.encode())
    idem.complete(key, token, response)
    return response


order = {"id": "4711", "amount": 1000}
key = os.environ.get("IDEM_KEY") or derive_key("order-confirm", order["id"], str(time.time_ns()))
with Client(os.environ["IDEM_URL"], token=os.environ["IDEM_TOKEN"]) as idem:
    try:
        confirm_order(idem, key, order, crash=True)  # worker A
    except Crash as crash:
        stale_token = crash.args[0]
    # Worker B: the server holds its claim until A's lease runs out, then B takes over.
    print("worker B:", confirm_order(idem, key, order, wait=10).body.decode())

    print("worker A's late write:", "applied" if write_order("ord_4711", "confirmed", stale_token) else "refused")
    try:
        idem.complete(key, stale_token, Response(201, {}, b""))
    except ProblemError as err:
        print(f"worker A's complete: {err.status} {err.code}")

    replay = confirm_order(idem, key, order)
    print(f"retry: {replay.body.decode()} charges={len(charges)} emails={len(emails)}")
