#!/usr/bin/env python3
"""A complete client retry loop for idem in Python, standard library only.

It follows the retry contract of the idem docs (/docs/retries/):

* retry only the allowlist: connection errors and timeouts (safe because the
  idempotency key is in place), 408, 429, 502, 503, 504 - never 500 by
  default, never another 4xx, never an auth error;
* full jitter: the wait before retry n (n = 0, 1, ...) is
  random(0, min(cap, base * 2**n)) with base 1 s and cap 30 s;
* Retry-After replaces the backoff (plus up to 1 s of spread);
* one overall deadline, a per-attempt timeout inside it, and no retry when
  the time left cannot fit the wait plus another attempt;
* at most 3 attempts per call, the first included;
* a claim answered 409 request_in_flight (another holder of the key - or
  our own earlier claim whose answer was lost) is claimed again after
  Retry-After (plus spread) for as long as the deadline allows; every other
  409 is final;
* a retry budget shared by every call of the process: a token bucket of 10,
  each retry costs 1, each good answer puts back 0.1;
* every attempt is logged.

Run it against a server (it claims and completes one key):

    IDEM_URL=http://127.0.0.1:8080 IDEM_TOKEN=<jwt with keys:write> python3 retry_loop.py
"""
import email.utils
import json
import os
import random
import socket
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

RETRY_STATUSES = {408, 429, 502, 503, 504}
BASE_DELAY = 1.0  # seconds
MAX_DELAY = 30.0  # seconds
MAX_ATTEMPTS = 3  # per call, the first included
ATTEMPT_TIMEOUT = 10.0  # seconds, cut to the time left
MIN_ATTEMPT_TIME = 0.1  # do not start an attempt with less time than this


class RetryBudget:
    """A token bucket shared by all calls: retries stop when it is empty."""

    def __init__(self, capacity=10.0, cost=1.0, refund=0.1):
        self.capacity, self.cost, self.refund = capacity, cost, refund
        self.tokens = capacity
        self.lock = threading.Lock()

    def take(self):
        with self.lock:
            if self.tokens < self.cost:
                return False
            self.tokens -= self.cost
            return True

    def success(self):
        with self.lock:
            self.tokens = min(self.capacity, self.tokens + self.refund)

    def left(self):
        with self.lock:
            return self.tokens


def log(**fields):
    """Logs one attempt as a line of key=value pairs on stderr."""
    print(" ".join(f"{k}={v}" for k, v in fields.items()), file=sys.stderr, flush=True)


def full_jitter(n):
    return random.uniform(0, min(MAX_DELAY, BASE_DELAY * 2 ** n))


def parse_retry_after(value):
    """Retry-After as seconds: delay-seconds or an HTTP-date; None if absent."""
    if not value:
        return None
    if value.strip().isdigit():
        return float(value.strip())
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


class CallFailed(Exception):
    """The call failed for good: a non-retryable answer or retries exhausted."""

    def __init__(self, reason, status=None, body=None):
        super().__init__(f"{reason} (status={status}, body={body})")
        self.status, self.body = status, body


def send_once(method, url, token, body, timeout):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={
        "Authorization": "Bearer " + token, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
            return resp.status, resp.headers, json.loads(raw) if raw else None
    except urllib.error.HTTPError as err:
        raw = err.read()
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = raw.decode(errors="replace")
        return err.code, err.headers, parsed


def call(method, url, token, body, deadline, budget):
    """Sends one logical call with retries; returns (status, headers, body)."""
    for attempt in range(1, MAX_ATTEMPTS + 1):
        left = deadline - time.monotonic()
        if left < MIN_ATTEMPT_TIME:
            raise CallFailed("deadline reached")
        status = headers = parsed = error = None
        try:
            status, headers, parsed = send_once(method, url, token, body, min(ATTEMPT_TIMEOUT, left))
        except (urllib.error.URLError, ConnectionError, socket.timeout, TimeoutError) as err:
            error = getattr(err, "reason", err)  # refused, reset, timed out

        retryable = error is not None or status in RETRY_STATUSES
        if not retryable:
            budget.success()
            log(attempt=attempt, call=f"{method} {urllib.parse.urlsplit(url).path}", status=status,
                outcome="done", budget=f"{budget.left():.1f}")
            return status, headers, parsed

        why = error if error is not None else f"status {status}"
        if attempt == MAX_ATTEMPTS:
            log(attempt=attempt, error=why, outcome="give_up", reason="attempt_cap")
            raise CallFailed("attempt cap reached", status, parsed)
        retry_after = parse_retry_after(headers.get("Retry-After")) if headers else None
        wait = retry_after + random.uniform(0, 1) if retry_after is not None else full_jitter(attempt - 1)
        if deadline - time.monotonic() < wait + MIN_ATTEMPT_TIME:
            log(attempt=attempt, error=why, outcome="give_up", reason="deadline")
            raise CallFailed("the time left cannot fit another attempt", status, parsed)
        if not budget.take():
            log(attempt=attempt, error=why, outcome="give_up", reason="retry_budget")
            raise CallFailed("retry budget exhausted", status, parsed)
        log(attempt=attempt, call=f"{method} {urllib.parse.urlsplit(url).path}", error=why,
            outcome="retry", wait=f"{wait:.2f}s", budget=f"{budget.left():.1f}")
        time.sleep(wait)
    raise CallFailed("unreachable")


def claim_waiting(url, token, body, deadline, budget):
    """Claims the key, waiting out 409 request_in_flight: the key is held by
    another attempt (or by our own earlier claim whose answer was lost), so
    wait its Retry-After plus spread and claim again, while the deadline
    allows. Every other answer - every other 409 included - is returned."""
    while True:
        status, headers, parsed = call("POST", url, token, body, deadline, budget)
        if status != 409 or not isinstance(parsed, dict) or parsed.get("code") != "request_in_flight":
            return status, headers, parsed
        wait = (parse_retry_after(headers.get("Retry-After")) or BASE_DELAY) + random.uniform(0, 1)
        path = urllib.parse.urlsplit(url).path
        if deadline - time.monotonic() < wait + MIN_ATTEMPT_TIME:
            log(call=f"POST {path}", status=status, outcome="give_up", reason="deadline_in_flight")
            raise CallFailed("the key is still in flight and the deadline cannot fit another wait", status, parsed)
        log(call=f"POST {path}", status=status, code="request_in_flight", outcome="wait_in_flight", wait=f"{wait:.2f}s")
        time.sleep(wait)


def main():
    base = os.environ.get("IDEM_URL", "http://127.0.0.1:8080").rstrip("/")
    token = os.environ.get("IDEM_TOKEN", "")
    if not token:
        sys.exit("set IDEM_TOKEN to a token with the keys:write scope")
    # An event-derived key: the same order always maps to the same key.
    key = os.environ.get("IDEM_KEY") or f"order-confirm-4711-{int(time.time())}"
    path = base + "/v1/keys/" + urllib.parse.quote(key, safe="")
    budget = RetryBudget()
    deadline = time.monotonic() + 20.0  # one overall deadline for the whole request

    try:
        status, _, claim = claim_waiting(path + "/claim", token, {
            "operation": "POST /orders/4711/confirm",
            "request": {"order_id": "4711", "amount": 1000},
        }, deadline, budget)
        if status == 200:
            print(f"replayed {key}: {claim['response']['body']}")
            return
        if status != 201:
            sys.exit(f"claim failed: {status} {claim}")
        result = json.dumps({"order_id": "4711", "status": "confirmed"})  # the work
        status, _, record = call("POST", path + "/complete", token, {
            "fencing_token": claim["fencing_token"],
            "response": {"status": 201, "headers": {"Content-Type": "application/json"}, "body": result},
        }, deadline, budget)
        if status != 200:
            sys.exit(f"complete failed: {status} {record}")
        print(f"completed {key}: state={record['state']} fencing_token={record['fencing_token']}")
    except CallFailed as err:
        sys.exit(f"gave up: {err}")


if __name__ == "__main__":
    main()
