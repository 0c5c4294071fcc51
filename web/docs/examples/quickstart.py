#!/usr/bin/env python3
"""idem quickstart in Python, standard library only.

Claims a key, does the work, completes the key with the response, then
claims the same key again and gets the stored response back (a replay).

    IDEM_URL=http://127.0.0.1:8080 IDEM_TOKEN=<jwt with keys:write> python3 quickstart.py

IDEM_KEY picks the key (default: an event-derived key for order 4711 and
this run). Exits non-zero on any unexpected answer.
"""
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

BASE = os.environ.get("IDEM_URL", "http://127.0.0.1:8080").rstrip("/")
TOKEN = os.environ.get("IDEM_TOKEN", "")
KEY = os.environ.get("IDEM_KEY") or f"order-confirm-4711-{int(time.time())}"


def call(method, path, body=None):
    """Sends one request; returns (status, headers, parsed JSON body or None)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        BASE + path,
        data=data,
        method=method,
        headers={"Authorization": "Bearer " + TOKEN, "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            raw = resp.read()
            return resp.status, resp.headers, json.loads(raw) if raw else None
    except urllib.error.HTTPError as err:  # 4xx/5xx: a problem+json body
        raw = err.read()
        return err.code, err.headers, json.loads(raw) if raw else None


def key_path(key, action=""):
    path = "/v1/keys/" + urllib.parse.quote(key, safe="")
    return path + "/" + action if action else path


def expect(status, want, body):
    if status != want:
        sys.exit(f"unexpected {status} (want {want}): {json.dumps(body)}")


def main():
    if not TOKEN:
        sys.exit("set IDEM_TOKEN to a token with the keys:write scope")
    claim_body = {
        "operation": "POST /orders/4711/confirm",
        "request": {"order_id": "4711", "amount": 1000, "currency": "usd"},
    }

    # 1. Claim the key before doing anything with side effects.
    status, _, claim = call("POST", key_path(KEY, "claim"), claim_body)
    expect(status, 201, claim)
    token = claim["fencing_token"]
    print(f"claimed {KEY}: fencing_token={token} attempt={claim['attempt']}")

    # 2. Do the work (here: pretend to confirm the order).
    result = {"order_id": "4711", "status": "confirmed"}

    # 3. Complete the key with the response your caller gets.
    status, _, record = call("POST", key_path(KEY, "complete"), {
        "fencing_token": token,
        "response": {
            "status": 201,
            "headers": {"Content-Type": "application/json"},
            "body": json.dumps(result),
        },
    })
    expect(status, 200, record)
    print(f"completed {KEY}: state={record['state']} replay_until={record['replay_until']}")

    # 4. A retry of the same request is answered from the ledger.
    status, headers, replay = call("POST", key_path(KEY, "claim"), claim_body)
    expect(status, 200, replay)
    if headers.get("Idempotent-Replayed") != "true":
        sys.exit("the replay is missing Idempotent-Replayed: true")
    if json.loads(replay["response"]["body"]) != result:
        sys.exit(f"the replay returned another body: {replay['response']}")
    print(f"replayed {KEY}: status={replay['response']['status']} body={replay['response']['body']}")


if __name__ == "__main__":
    main()
