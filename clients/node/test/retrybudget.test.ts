// The fleet retry budget (issue 28) from the Node SDK, against the real
// server binary on both stores: every attempt carries Idem-Attempt with the
// cause of the retry; a 429 retry_budget_exhausted ends the call at once
// with a FleetBudgetError carrying the original cause; the presets.
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { createServer, request as httpRequest } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, describe, test } from "node:test";
import { Client, FleetBudgetError, IdemError, NoSideEffect, background, interactive, type AttemptInfo, type RetryPolicy } from "../src/index.js";
import { startServer, stores, type Server } from "./server.js";

const unavailable = JSON.stringify({ type: "/docs/errors#store_unavailable", title: "Store unavailable", status: 503,
  detail: "the store does not answer", code: "store_unavailable", retryable: true });

/**
 * A forwarding proxy in front of the real server: it answers the first `fail` requests 503 itself (with `signal`, saying
 * Idem-Retry-Budget: exhausted, as a replica whose store is away does once the budget is spent) and records every Idem-Attempt header;
 * the first `failComplete` completes, whenever they come, so too.
 */
async function flakyFront(target: string, fail: number, signal = false, failComplete = 0): Promise<{ url: string; seen: (string | undefined)[] }> {
  const t = new URL(target);
  const seen: (string | undefined)[] = [];
  const srv = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      seen.push(req.headers["idem-attempt"] as string | undefined);
      const complete = fail <= 0 && failComplete > 0 && new URL(req.url ?? "/", "http://x").pathname.endsWith("/complete");
      if (fail > 0 || complete) {
        if (complete) failComplete--;
        else fail--;
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

const refused = JSON.stringify({ type: "/docs/errors#retry_budget_exhausted", title: "Retry budget exhausted", status: 429,
  detail: "stop retrying this call", code: "retry_budget_exhausted", retryable: true });

/**
 * A forwarding proxy in front of the real server that answers the first attempt of each finishing write (checkpoint,
 * complete, release) itself, as a server of before the fix did during a storm: 503 saying Idem-Retry-Budget: exhausted;
 * with `refuse`, the retry after it 429 retry_budget_exhausted (Retry-After: 1). It records their Idem-Attempt, by call.
 */
async function oldFront(target: string, refuse = false): Promise<{ url: string; seen: Map<string, (string | undefined)[]> }> {
  const t = new URL(target);
  const seen = new Map<string, (string | undefined)[]>();
  const srv = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const call = (req.url ?? "").split("?")[0]!.split("/").pop()!;
      let n = 0;
      if (call === "checkpoint" || call === "complete" || call === "release") {
        const list = seen.get(call) ?? [];
        list.push(req.headers["idem-attempt"] as string | undefined);
        seen.set(call, list);
        n = list.length;
      }
      if (n === 1 || (n === 2 && refuse)) {
        res.writeHead(n === 1 ? 503 : 429, { "Content-Type": "application/problem+json", "Idem-Retry-Budget": "exhausted", ...(n === 2 ? { "Retry-After": "1" } : {}) });
        res.end(n === 1 ? unavailable : refused);
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

/** Fast retries; the call deadline turns a refusal of this server (Retry-After: the rest of its hour-long window) into an error, not a wait. */
const finish: RetryPolicy = { ...fast, callDeadlineMs: 30_000 };

/** Ten claim retries reach the server: the floor of a tenant at 0 percent (claims, as the budget covers them). */
async function useUpFloor(url: string, token: string): Promise<void> {
  for (let i = 0; i < 10; i++) {
    const r = await fetch(`${url}/v1/keys/warm-${i}/claim`, { method: "POST", body: JSON.stringify({ operation: "POST /warm" }),
      headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json", "Idem-Attempt": "2;cause=timeout" } });
    assert.equal(r.status, 201, await r.text());
  }
}

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

    test("a finishing write is outside the client's own retry budget; the work runs once", async () => {
      // With the client's budget empty (one token, spent by a claim's retry; its next retry is refused, giveUp "budget"),
      // run's complete whose first attempt fails 503 store_unavailable is retried and stored. Before the fix it was given
      // up on the budget: the work ran unrecorded, its key in flight, to run again after the lease.
      const front = await flakyFront(srv.url, 2, false, 1);
      const completes: AttemptInfo[] = [];
      const c = new Client({ baseUrl: front.url, token: tenant(100), retry: { ...fast, budgetCapacity: 1, budgetRetryCost: 1, budgetSuccessRefund: 0.1 },
        onAttempt: (info) => { if (info.call === "complete") completes.push(info); } });
      const drained = await c.claim("drain", { operation: "POST /orders" }).then(() => undefined, (e: unknown) => e);
      assert.ok(drained instanceof IdemError && drained.giveUp === "budget", `the process budget is empty: ${String(drained)}`);
      let runs = 0;
      const fn = (): { status: number; body: string } => { runs++; return { status: 201, body: '{"id":"ord_1"}' }; };
      const res = await c.run("order-1", { operation: "POST /orders" }, fn);
      assert.equal(res.replayed, false);
      assert.deepEqual(completes.map((i) => [i.status, i.retry, i.giveUp]), [[503, true, undefined], [200, false, undefined]]);
      const rec = await c.get("order-1");
      assert.equal(rec.state, "completed");
      assert.equal(rec.fencing_token, res.fencingToken, "one claim");
      const again = await c.run("order-1", { operation: "POST /orders" }, fn);
      assert.equal(again.replayed, true);
      assert.equal(runs, 1, "the work ran once");
    });

    test("finishing writes go on through the fleet budget's signal; the work runs once", async () => {
      // With the budget spent (a claim's retry is refused), run's checkpoint and complete whose first attempt failed with
      // a 503 saying Idem-Retry-Budget: exhausted are retried and the real server serves the retries. Before the fix the
      // complete threw a FleetBudgetError: the work ran unrecorded, its key left to run again after the lease.
      const token = tenant(0);
      await useUpFloor(srv.url, token);
      const front = await oldFront(srv.url);
      const c = new Client({ baseUrl: front.url, token, retry: finish });
      let runs = 0;
      const fn = async (claim: { checkpoint(name: string): Promise<void> }) => {
        runs++;
        await claim.checkpoint("charged");
        return { status: 201, headers: { "Content-Type": "application/json" }, body: '{"id":"ord_1"}' };
      };
      const res = await c.run("order-1", { operation: "POST /orders", request: { n: 1 } }, fn);
      assert.equal(res.replayed, false);
      assert.deepEqual(front.seen.get("checkpoint"), ["1", "2;cause=unavailable"]);
      assert.deepEqual(front.seen.get("complete"), ["1", "2;cause=unavailable"]);
      const rec = await c.get("order-1");
      assert.equal(rec.state, "completed");
      assert.equal(rec.fencing_token, res.fencingToken, "one claim");
      const again = await c.run("order-1", { operation: "POST /orders", request: { n: 1 } }, fn);
      assert.equal(again.replayed, true, "the recorded answer replays");
      assert.equal(runs, 1, "the work ran once");

      // A release through the same signal frees the key.
      const err = await c.run("order-2", { operation: "POST /orders", request: { n: 1 } }, () => { throw new NoSideEffect("declined"); })
        .then(() => undefined, (e: unknown) => e);
      assert.ok(err instanceof NoSideEffect, String(err));
      assert.deepEqual(front.seen.get("release"), ["1", "2;cause=unavailable"]);
      await assert.rejects(c.get("order-2"), (e: unknown) => e instanceof IdemError && e.code === "key_not_found");
    });

    test("a finishing write retries an older server's refusal after its Retry-After", async () => {
      const token = tenant(0);
      await useUpFloor(srv.url, token);
      const front = await oldFront(srv.url, true);
      const c = new Client({ baseUrl: front.url, token, retry: finish });
      const cr = await c.claim("order-1", { operation: "POST /orders" });
      await c.complete("order-1", cr.fencingToken, { status: 201, body: "{}" });
      assert.deepEqual(front.seen.get("complete"), ["1", "2;cause=unavailable", "3;cause=throttled"]);
      assert.equal((await c.get("order-1")).state, "completed");
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
