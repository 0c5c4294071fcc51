#!/usr/bin/env node
// idem quickstart with the Node.js SDK: install it, wrap your handler.
//
//   npm install --install-links ./clients/node            # from the idem repository; Node.js 20+, no dependencies
//   IDEM_URL=http://127.0.0.1:8080 IDEM_TOKEN=<jwt with keys:write> node quickstart_sdk.mjs
//
// run() claims the key, runs your handler once, checkpoints, completes, and
// keeps the lease alive meanwhile; a retry with the same key gets the stored
// response back (a replay) and the handler does not run again. The retry
// contract of the docs (allowlist, full jitter, Retry-After, one deadline,
// waiting out request_in_flight) is built in.
//
// A web app wraps its handlers instead:
//
//   app.use(expressMiddleware({ client: idem }));                        // Express
//   app.post("/orders", (c) => withIdempotency(handler, { client: idem })(c.req.raw));  // Hono, Next.js route handlers
//
// IDEM_KEY picks the key (default: an event-derived key for order 4711 and
// this run). Exits non-zero on failure.
import { Client, IdemError, key as deriveKey } from "@idem-dev/idem";

const ORDER = { order_id: "4711", amount: 1000, currency: "usd" };
const charges = []; // the side effects this process performed

/** Your handler: charge the card once, then answer. */
async function confirmOrder(claim) {
  if (claim.recoveryPoint !== "charged") { // a takeover after a crash skips what is done
    charges.push(ORDER.amount); // charge the card here
    await claim.checkpoint("charged", { charge: "ch_1" });
  }
  const body = JSON.stringify({ order_id: ORDER.order_id, status: "confirmed" });
  return { status: 201, headers: { "Content-Type": "application/json" }, body };
}

async function main() {
  const token = process.env.IDEM_TOKEN ?? "";
  if (!token) throw new Error("set IDEM_TOKEN to a token with the keys:write scope");
  const key = process.env.IDEM_KEY || deriveKey("order-confirm", ORDER.order_id, String(Math.floor(Date.now() / 1000)));
  const idem = new Client({ baseUrl: process.env.IDEM_URL ?? "http://127.0.0.1:8080", token });
  for (let i = 0; i < 2; i++) { // the second call is the retry
    const result = await idem.run(key, { operation: "POST /orders/4711/confirm", request: ORDER }, confirmOrder, { timeoutMs: 20_000 });
    const verb = result.replayed ? "replayed" : "completed";
    console.log(`${verb} ${key}: status=${result.response.status} body=${result.response.text()}`);
  }
  if (charges.length !== 1) throw new Error(`the handler charged ${charges.length} times`);
}

main().catch((err) => {
  console.error(err instanceof IdemError ? `idem: ${err.message}` : err.message ?? err);
  process.exit(1);
});
