#!/usr/bin/env node
// A complete client retry loop for idem in Node.js 20+, built-in fetch only.
//
// It follows the retry contract of the idem docs (/docs/retries/):
//   - retry only the allowlist: connection errors and timeouts (safe because
//     the idempotency key is in place), 408, 429, 502, 503, 504 - never 500
//     by default, never another 4xx, never an auth error;
//   - full jitter: the wait before retry n (n = 0, 1, ...) is
//     random(0, min(cap, base * 2**n)) with base 1 s and cap 30 s;
//   - Retry-After replaces the backoff (plus up to 1 s of spread);
//   - one overall deadline, a per-attempt timeout inside it, and no retry
//     when the time left cannot fit the wait plus another attempt;
//   - at most 3 attempts per call, the first included;
//   - a claim answered 409 request_in_flight (another holder of the key - or
//     our own earlier claim whose answer was lost) is claimed again after
//     Retry-After (plus spread) for as long as the deadline allows; every
//     other 409 is final;
//   - a retry budget shared by every call of the process: a token bucket of
//     10, each retry costs 1, each good answer puts back 0.1;
//   - every attempt is logged.
//
//   IDEM_URL=http://127.0.0.1:8080 IDEM_TOKEN=<jwt with keys:write> node retry_loop.mjs

import { pathToFileURL } from "node:url";

const RETRY_STATUSES = new Set([408, 429, 502, 503, 504]);
const BASE_DELAY = 1000; // ms
const MAX_DELAY = 30_000; // ms
const MAX_ATTEMPTS = 3; // per call, the first included
const ATTEMPT_TIMEOUT = 10_000; // ms, cut to the time left
const MIN_ATTEMPT_TIME = 100; // ms

/** A token bucket shared by all calls: retries stop when it is empty. */
export class RetryBudget {
  constructor(capacity = 10, cost = 1, refund = 0.1) {
    Object.assign(this, { capacity, cost, refund, tokens: capacity });
  }
  take() {
    if (this.tokens < this.cost) return false;
    this.tokens -= this.cost;
    return true;
  }
  success() {
    this.tokens = Math.min(this.capacity, this.tokens + this.refund);
  }
}

const log = (fields) =>
  console.error(Object.entries(fields).map(([k, v]) => `${k}=${v}`).join(" "));

export const fullJitter = (n) => Math.random() * Math.min(MAX_DELAY, BASE_DELAY * 2 ** n);

/** Retry-After in ms: delay-seconds or an HTTP-date; null if absent. */
export function parseRetryAfter(value) {
  if (!value) return null;
  if (/^\s*\d+\s*$/.test(value)) return Number(value) * 1000;
  const when = Date.parse(value);
  return Number.isNaN(when) ? null : Math.max(0, when - Date.now());
}

export class CallFailed extends Error {
  constructor(reason, status, body) {
    super(`${reason} (status=${status}, body=${JSON.stringify(body)})`);
    Object.assign(this, { status, body });
  }
}

/** Sends one logical call with retries; resolves to {status, headers, body}. */
export async function call(method, url, token, body, deadline, budget) {
  const name = `${method} ${new URL(url).pathname}`;
  for (let attempt = 1; attempt <= MAX_ATTEMPTS; attempt++) {
    const left = deadline - Date.now();
    if (left < MIN_ATTEMPT_TIME) throw new CallFailed("deadline reached");
    let res = null;
    let error = null;
    try {
      const resp = await fetch(url, {
        method,
        headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json" },
        body: body === undefined ? undefined : JSON.stringify(body),
        signal: AbortSignal.timeout(Math.min(ATTEMPT_TIMEOUT, left)),
      });
      const text = await resp.text();
      let parsed = null;
      try { parsed = text ? JSON.parse(text) : null; } catch { parsed = text; }
      res = { status: resp.status, headers: resp.headers, body: parsed };
    } catch (err) {
      error = err.cause?.code ?? err.name ?? String(err); // ECONNREFUSED, ECONNRESET, TimeoutError
    }

    const retryable = error !== null || RETRY_STATUSES.has(res.status);
    if (!retryable) {
      budget.success();
      log({ attempt, call: name, status: res.status, outcome: "done", budget: budget.tokens.toFixed(1) });
      return res;
    }
    const why = error ?? `status ${res.status}`;
    if (attempt === MAX_ATTEMPTS) {
      log({ attempt, call: name, error: why, outcome: "give_up", reason: "attempt_cap" });
      throw new CallFailed("attempt cap reached", res?.status, res?.body);
    }
    const retryAfter = res ? parseRetryAfter(res.headers.get("Retry-After")) : null;
    const wait = retryAfter !== null ? retryAfter + Math.random() * 1000 : fullJitter(attempt - 1);
    if (deadline - Date.now() < wait + MIN_ATTEMPT_TIME) {
      log({ attempt, call: name, error: why, outcome: "give_up", reason: "deadline" });
      throw new CallFailed("the time left cannot fit another attempt", res?.status, res?.body);
    }
    if (!budget.take()) {
      log({ attempt, call: name, error: why, outcome: "give_up", reason: "retry_budget" });
      throw new CallFailed("retry budget exhausted", res?.status, res?.body);
    }
    log({ attempt, call: name, error: why, outcome: "retry", wait: `${(wait / 1000).toFixed(2)}s`, budget: budget.tokens.toFixed(1) });
    await new Promise((resolve) => setTimeout(resolve, wait));
  }
  throw new CallFailed("unreachable");
}

/**
 * Claims the key, waiting out 409 request_in_flight: the key is held by
 * another attempt (or by our own earlier claim whose answer was lost), so
 * wait its Retry-After plus spread and claim again while the deadline
 * allows. Every other answer - every other 409 included - is returned.
 */
export async function claimWaiting(url, token, body, deadline, budget) {
  const name = `POST ${new URL(url).pathname}`;
  for (;;) {
    const res = await call("POST", url, token, body, deadline, budget);
    if (res.status !== 409 || res.body?.code !== "request_in_flight") return res;
    const wait = (parseRetryAfter(res.headers.get("Retry-After")) ?? BASE_DELAY) + Math.random() * 1000;
    if (deadline - Date.now() < wait + MIN_ATTEMPT_TIME) {
      log({ call: name, status: res.status, outcome: "give_up", reason: "deadline_in_flight" });
      throw new CallFailed("the key is still in flight and the deadline cannot fit another wait", res.status, res.body);
    }
    log({ call: name, status: res.status, code: "request_in_flight", outcome: "wait_in_flight", wait: `${(wait / 1000).toFixed(2)}s` });
    await new Promise((resolve) => setTimeout(resolve, wait));
  }
}

async function main() {
  const base = (process.env.IDEM_URL ?? "http://127.0.0.1:8080").replace(/\/+$/, "");
  const token = process.env.IDEM_TOKEN ?? "";
  if (!token) throw new Error("set IDEM_TOKEN to a token with the keys:write scope");
  // An event-derived key: the same order always maps to the same key.
  const key = process.env.IDEM_KEY || `order-confirm-4711-${Math.floor(Date.now() / 1000)}`;
  const path = `${base}/v1/keys/${encodeURIComponent(key)}`;
  const budget = new RetryBudget();
  const deadline = Date.now() + 20_000; // one overall deadline for the whole request

  const claim = await claimWaiting(`${path}/claim`, token, {
    operation: "POST /orders/4711/confirm",
    request: { order_id: "4711", amount: 1000 },
  }, deadline, budget);
  if (claim.status === 200) {
    console.log(`replayed ${key}: ${claim.body.response.body}`);
    return;
  }
  if (claim.status !== 201) throw new Error(`claim failed: ${claim.status} ${JSON.stringify(claim.body)}`);
  const result = JSON.stringify({ order_id: "4711", status: "confirmed" }); // the work
  const done = await call("POST", `${path}/complete`, token, {
    fencing_token: claim.body.fencing_token,
    response: { status: 201, headers: { "Content-Type": "application/json" }, body: result },
  }, deadline, budget);
  if (done.status !== 200) throw new Error(`complete failed: ${done.status} ${JSON.stringify(done.body)}`);
  console.log(`completed ${key}: state=${done.body.state} fencing_token=${done.body.fencing_token}`);
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  main().catch((err) => {
    console.error(`gave up: ${err.message ?? err}`);
    process.exit(1);
  });
}
