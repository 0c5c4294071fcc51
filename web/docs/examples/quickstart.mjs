#!/usr/bin/env node
// idem quickstart in Node.js 20+, built-in fetch only.
//
// Claims a key, does the work, completes the key with the response, then
// claims the same key again and gets the stored response back (a replay).
//
//   IDEM_URL=http://127.0.0.1:8080 IDEM_TOKEN=<jwt with keys:write> node quickstart.mjs
//
// IDEM_KEY picks the key (default: an event-derived key for order 4711 and
// this run). Exits non-zero on any unexpected answer.

const BASE = (process.env.IDEM_URL ?? "http://127.0.0.1:8080").replace(/\/+$/, "");
const TOKEN = process.env.IDEM_TOKEN ?? "";
const KEY = process.env.IDEM_KEY || `order-confirm-4711-${Math.floor(Date.now() / 1000)}`;

async function call(method, path, body) {
  const resp = await fetch(BASE + path, {
    method,
    headers: { Authorization: `Bearer ${TOKEN}`, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
    signal: AbortSignal.timeout(10_000),
  });
  const text = await resp.text();
  return { status: resp.status, headers: resp.headers, body: text ? JSON.parse(text) : null };
}

const keyPath = (key, action) => `/v1/keys/${encodeURIComponent(key)}${action ? "/" + action : ""}`;

function expect(res, want) {
  if (res.status !== want) {
    throw new Error(`unexpected ${res.status} (want ${want}): ${JSON.stringify(res.body)}`);
  }
}

async function main() {
  if (!TOKEN) throw new Error("set IDEM_TOKEN to a token with the keys:write scope");
  const claimBody = {
    operation: "POST /orders/4711/confirm",
    request: { order_id: "4711", amount: 1000, currency: "usd" },
  };

  // 1. Claim the key before doing anything with side effects.
  const claim = await call("POST", keyPath(KEY, "claim"), claimBody);
  expect(claim, 201);
  const token = claim.body.fencing_token;
  console.log(`claimed ${KEY}: fencing_token=${token} attempt=${claim.body.attempt}`);

  // 2. Do the work (here: pretend to confirm the order).
  const result = { order_id: "4711", status: "confirmed" };

  // 3. Complete the key with the response your caller gets.
  const done = await call("POST", keyPath(KEY, "complete"), {
    fencing_token: token,
    response: { status: 201, headers: { "Content-Type": "application/json" }, body: JSON.stringify(result) },
  });
  expect(done, 200);
  console.log(`completed ${KEY}: state=${done.body.state} replay_until=${done.body.replay_until}`);

  // 4. A retry of the same request is answered from the ledger.
  const replay = await call("POST", keyPath(KEY, "claim"), claimBody);
  expect(replay, 200);
  if (replay.headers.get("Idempotent-Replayed") !== "true") {
    throw new Error("the replay is missing Idempotent-Replayed: true");
  }
  if (replay.body.response.body !== JSON.stringify(result)) {
    throw new Error(`the replay returned another body: ${JSON.stringify(replay.body.response)}`);
  }
  console.log(`replayed ${KEY}: status=${replay.body.response.status} body=${replay.body.response.body}`);
}

main().catch((err) => {
  console.error(err.message ?? err);
  process.exit(1);
});
