// The fleet retry budget (issue 28) from the Node SDK, against the real
// server binary on both stores: every attempt carries Idem-Attempt with the
// cause of the retry; a 429 retry_budget_exhausted ends the call at once
// with a FleetBudgetError carrying the original cause; the presets.
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { createServer, request as httpRequest } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, describe, test } from "node:test";
import { Client, FleetBudgetError, IdemError, background, interactive, type RetryPolicy } from "../src/index.js";
import { startServer, stores, type Server } from "./server.js";

const unavailable = JSON.stringify({ type: "/docs/errors#store_unavailable", title: "Store unavailable", status: 503,
  detail: "the store does not answer", code: "store_unavailable", retryable: true });

/**
 * A forwarding proxy in front of the real server: it answers the first `fail` requests 503 itself (with `signal`, saying
 * Idem-Retry-Budget: exhausted, as a replica whose store is away does once the budget is spent) and records every Idem-Attempt header.
 */
async function flakyFront(target: string, fail: number, signal = false): Promise<{ url: string; seen: (string | undefined)[] }> {
  const t = new URL(target);
  const seen: (string | undefined)[] = [];
  const srv = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      seen.push(req.headers["idem-attempt"] as string | undefined);
      if (fail > 0) {
        fail--;
        res.writeHead(503, { "Content-Type": "application/problem+json", "Retry-After": "1", ...(signal ? { "Idem-Retry-Budget": "exhausted" } : {}) });
        res.end(unavailable);
        return;
      }
      const up = httpRequest({ host: t.hostname, port: t.port, method: req.method, path: req.url, headers: { ...req.headers, host: t.host } }, (ur) => {
        res.writeHead(ur.statusCode ?? 502, ur.headers);
        ur.pipe(res);
      });
      up.on("error", () => res.destroy());
      up.end(Buffer.concat(chunks));
    });
  });
  await new Promise<void>((r) => srv.listen(0, "127.0.0.1", r));
  after(() => {
    srv.closeAllConnections();
    srv.close();
  });
  return { url: `http://127.0.0.1:${(srv.address() as AddressInfo).port}`, seen };
}

const fast: RetryPolicy = { maxAttempts: 5, baseDelayMs: 10, maxDelayMs: 20, retryAfterJitterMs: 0 };

for (const store of stores()) {
  describe(`fleet retry budget (${store})`, () => {
    let srv: Server;
    // A window of an hour: nothing leaves it while the tests run.
    before(async () => { srv = await startServer(store, {}, { IDEM_RETRY_BUDGET_WINDOW: "1h" }); });
    after(async () => { await srv.stop(); });

    const tenant = (percent: number): string => {
      const id = "node-" + randomBytes(4).toString("hex");
      srv.createTenant(id, { "retry-budget-percent": percent });
      return srv.mint(id, "keys:write keys:read");
    };

    test("every attempt says which it is, and a retry why", async () => {
      const front = await flakyFront(srv.url, 2);
      const c = new Client({ baseUrl: front.url, token: tenant(100), retry: fast });
      const cr = await c.claim("order-1", { operation: "POST /orders", request: { n: 1 } });
      assert.equal(cr.record.state, "in_flight");
      assert.deepEqual(front.seen, ["1", "2;cause=unavailable", "3;cause=unavailable"]);
      await c.complete("order-1", cr.fencingToken, { status: 201, body: "{}" });
      assert.equal(front.seen[3], "1", "a new logical call starts at 1");
    });

    test("a budget refusal stops the call with the original cause; the key is as it was", async () => {
      const token = tenant(0);
      // Use up the floor: 10 retries reach the server (served: key_not_found).
      for (let i = 0; i < 10; i++) {
        const r = await fetch(`${srv.url}/v1/keys/warm-${i}`, { headers: { Authorization: `Bearer ${token}`, "Idem-Attempt": "2;cause=timeout" } });
        assert.equal(r.status, 404);
        await r.text();
      }
      const front = await flakyFront(srv.url, 1);
      const c = new Client({ baseUrl: front.url, token, retry: fast });
      const err = await c.claim("order-1", { operation: "POST /orders", request: { n: 1 } }).then(() => undefined, (e: unknown) => e);
      assert.ok(err instanceof FleetBudgetError, String(err));
      assert.ok(err instanceof IdemError);
      assert.equal(err.code, "store_unavailable", "the original cause, not the refusal");
      assert.equal(err.status, 503);
      assert.equal(err.attemptCause, "unavailable");
      assert.equal(err.attempts, 2);
      assert.equal(err.giveUp, "fleet_budget");
      assert.equal(err.refusal?.code, "retry_budget_exhausted");
      assert.ok((err.refusal?.retryAfterMs ?? 0) > 0);
      assert.deepEqual(front.seen, ["1", "2;cause=unavailable"], "no attempt after the refusal, though 5 were allowed");

      const direct = new Client({ baseUrl: srv.url, token });
      await assert.rejects(direct.get("order-1"), (e: unknown) => e instanceof IdemError && e.code === "key_not_found");
      assert.equal((await direct.claim("order-1", { operation: "POST /orders", request: { n: 1 } })).record.state, "in_flight");
    });

    test("a failure that says the budget is spent ends the call before any retry", async () => {
      const front = await flakyFront(srv.url, 1, true);
      const c = new Client({ baseUrl: front.url, token: tenant(10), retry: fast });
      const err = await c.claim("order-1", { operation: "POST /orders", request: { n: 1 } }).then(() => undefined, (e: unknown) => e);
      assert.ok(err instanceof FleetBudgetError, String(err));
      assert.equal(err.code, "store_unavailable");
      assert.equal(err.attemptCause, "unavailable");
      assert.equal(err.refusal, undefined);
      assert.equal(err.attempts, 1);
      assert.deepEqual(front.seen, ["1"], "no retry after the signal, though 5 were allowed");
      assert.equal((await c.claim("order-1", { operation: "POST /orders", request: { n: 1 } })).record.state, "in_flight");
    });

    test("run stops waiting when the real server's 409 says the budget is spent", async () => {
      const token = tenant(0);
      const direct = new Client({ baseUrl: srv.url, token });
      const held = await direct.claim("held", { operation: "POST /orders", request: { n: 1 } });
      for (let i = 0; i < 10; i++) {
        const r = await fetch(`${srv.url}/v1/keys/warm-${i}`, { headers: { Authorization: `Bearer ${token}`, "Idem-Attempt": "2;cause=timeout" } });
        assert.equal(r.status, 404);
        await r.text();
      }
      const front = await flakyFront(srv.url, 0);
      const c = new Client({ baseUrl: front.url, token, retry: { ...fast, inFlightWaitMs: 30_000 } });
      let ran = false;
      const err = await c.run("held", { operation: "POST /orders", request: { n: 1 } }, () => {
        ran = true;
        return { status: 201, body: "{}" };
      }).then(() => undefined, (e: unknown) => e);
      assert.ok(err instanceof FleetBudgetError, String(err));
      assert.equal(ran, false);
      assert.equal(err.code, "request_in_flight", "the original cause");
      assert.equal(err.attemptCause, "in-flight");
      assert.equal(err.refusal, undefined);
      assert.equal(front.seen.length, 1, "no claim after the signal");
      assert.equal((await direct.get("held")).state, "in_flight");
      await direct.complete("held", held.fencingToken, { status: 201, body: "{}" });
    });

    test("the presets, and the call deadline bounds a call given none", async () => {
      assert.equal(interactive.callDeadlineMs, 10_000);
      assert.equal(interactive.maxAttempts, 3);
      assert.equal(background.callDeadlineMs, 600_000);
      assert.equal(background.maxAttempts, 10);
      assert.ok((background.budgetCapacity ?? 0) > (interactive.budgetCapacity ?? 0));
      // Every 503 says Retry-After: 1, longer than the whole call may take: one attempt.
      const front = await flakyFront(srv.url, 1000);
      const c = new Client({ baseUrl: front.url, token: tenant(100), retry: { ...interactive, callDeadlineMs: 300, maxAttempts: 1000, retryAfterJitterMs: 0 } });
      const err = await c.claim("order-1", { operation: "POST /orders" }).then(() => undefined, (e: unknown) => e);
      assert.ok(err instanceof IdemError && err.giveUp === "deadline", String(err));
      assert.equal(front.seen.length, 1);
    });
  });
}
