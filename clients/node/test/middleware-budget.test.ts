// The fleet retry budget at the Node front doors (docs/frontdoor.md rule
// 9): a real Express app and a real Hono app (on @hono/node-server) behind
// the idem middleware, against the real server binary on both stores. The
// caller's Idem-Attempt goes on with the claim, so idem counts its retries;
// the retry idem refuses is answered 429 retry_budget_exhausted with
// Retry-After and Idem-Retry-Budget: exhausted, the handler not run and the
// key as it was; a first attempt is served; a 409 request_in_flight
// answered while the budget is spent says so.
import { serve } from "@hono/node-server";
import express from "express";
import { Hono } from "hono";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { createServer, type Server as HTTPServer } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, describe, test } from "node:test";
import { Client, IdemError, expressMiddleware, retryBudgetDetail, withIdempotency } from "../src/index.js";
import { startServer, stores, type Server } from "./server.js";

interface App {
  url: string;
  /** Side effects per order id. */
  effects: Map<string, number>;
  /** Opens the /gated handler, which holds its answer until then. */
  open(): void;
  gated: Promise<void>;
  close(): Promise<void>;
}

function gate(): { wait: Promise<void>; open: () => void } {
  let open!: () => void;
  const wait = new Promise<void>((r) => (open = r));
  return { wait, open };
}

async function expressApp(client: Client): Promise<App> {
  const effects = new Map<string, number>();
  const g = gate();
  const entered = gate();
  const app = express();
  app.use(expressMiddleware({ client, log: () => {} }));
  app.post("/orders/:id/pay", (req, res) => {
    effects.set(req.params.id, (effects.get(req.params.id) ?? 0) + 1);
    res.status(201).json({ order: req.params.id });
  });
  app.post("/gated", async (_req, res) => {
    effects.set("gated", (effects.get("gated") ?? 0) + 1);
    entered.open();
    await g.wait;
    res.status(201).json({ gated: true });
  });
  const srv = createServer(app);
  const url = await new Promise<string>((r) => srv.listen(0, "127.0.0.1", () => r(`http://127.0.0.1:${(srv.address() as AddressInfo).port}`)));
  return { url, effects, open: g.open, gated: entered.wait, close: () => new Promise((r) => { srv.closeAllConnections(); srv.close(() => r()); }) };
}

async function honoApp(client: Client): Promise<App> {
  const effects = new Map<string, number>();
  const g = gate();
  const entered = gate();
  const app = new Hono();
  const pay = withIdempotency(async (_req: Request, id: string) => {
    effects.set(id, (effects.get(id) ?? 0) + 1);
    return Response.json({ order: id }, { status: 201 });
  }, { client, log: () => {}, route: () => "/orders/:id/pay" });
  app.post("/orders/:id/pay", (c) => pay(c.req.raw, c.req.param("id")));
  const gated = withIdempotency(async () => {
    effects.set("gated", (effects.get("gated") ?? 0) + 1);
    entered.open();
    await g.wait;
    return Response.json({ gated: true }, { status: 201 });
  }, { client, log: () => {} });
  app.post("/gated", (c) => gated(c.req.raw));
  let srv: HTTPServer | undefined;
  const url = await new Promise<string>((r) => {
    srv = serve({ fetch: app.fetch, port: 0, hostname: "127.0.0.1" }, (info) => r(`http://127.0.0.1:${info.port}`)) as HTTPServer;
  });
  return { url, effects, open: g.open, gated: entered.wait, close: () => new Promise((r) => { srv!.closeAllConnections(); srv!.close(() => r()); }) };
}

const post = (url: string, key: string, attempt?: string) => fetch(url, {
  method: "POST", headers: { "Content-Type": "application/json", "Idempotency-Key": key, ...(attempt ? { "Idem-Attempt": attempt } : {}) },
  body: JSON.stringify({ amount: 1 }),
});

const total = (m: Map<string, number>) => [...m.values()].reduce((a, b) => a + b, 0);

for (const store of stores()) {
  describe(`the fleet retry budget at the middleware (${store})`, () => {
    let srv: Server;
    // A window of an hour: nothing leaves it while the tests run.
    before(async () => { srv = await startServer(store, {}, { IDEM_RETRY_BUDGET_WINDOW: "1h" }); });
    after(async () => { await srv.stop(); });

    for (const [name, make] of [["Express", expressApp], ["Hono", honoApp]] as const) {
      test(`${name}: the caller's retries count; past the budget 429 retry_budget_exhausted, nothing claimed or run`, async () => {
        const id = "nodemw-" + randomBytes(4).toString("hex");
        srv.createTenant(id, { "retry-budget-percent": 0 }); // the allowance is the floor: 10 retries
        const client = new Client({ baseUrl: srv.url, token: srv.mint(id, "keys:write keys:read") });
        const app = await make(client);
        after(() => app.close());
        const url = app.url + "/orders/o1/pay";
        assert.equal((await post(url, "first")).status, 201);
        for (let i = 0; i < 10; i++) {
          const r = await post(url, `r${i}`, "2;cause=timeout");
          assert.equal(r.status, 201, await r.text());
          assert.equal(r.headers.get("Idem-Retry-Budget"), null);
        }
        const runs = total(app.effects);
        assert.equal(runs, 11);

        for (const key of ["refused", "r0"]) {
          const r = await post(url, key, "3;cause=unavailable");
          const p = await r.json() as { code: string; retryable: boolean; detail: string };
          assert.equal(r.status, 429, JSON.stringify(p));
          assert.deepEqual([p.code, p.retryable, p.detail], ["retry_budget_exhausted", true, retryBudgetDetail]);
          assert.ok(Number(r.headers.get("Retry-After")) >= 1);
          assert.equal(r.headers.get("Idem-Retry-Budget"), "exhausted");
        }
        assert.equal(total(app.effects), runs, "a refused retry runs nothing");
        await assert.rejects(client.get("refused"), (e: unknown) => e instanceof IdemError && e.code === "key_not_found", "a refused retry claims nothing");
        const rec = await client.get("r0");
        assert.deepEqual([rec.state, rec.attempt], ["completed", 1], "the completed key is as it was");

        const served = await post(url, "refused");
        assert.equal(served.status, 201);
        const body = await served.text();
        const replay = await post(url, "refused");
        assert.equal(replay.headers.get("Idempotent-Replayed"), "true");
        assert.equal(await replay.text(), body, "one full stored answer");
        assert.equal(total(app.effects), runs + 1, "one run");

        // A key in flight while the budget is spent: the 409 says so.
        const first = post(app.url + "/gated", "held");
        await app.gated;
        const held = await post(app.url + "/gated", "held");
        app.open();
        assert.equal((await first).status, 201);
        assert.equal(held.status, 409);
        assert.equal((await held.json() as { code: string }).code, "request_in_flight");
        assert.equal(held.headers.get("Idem-Retry-Budget"), "exhausted");
        assert.equal(app.effects.get("gated"), 1);
      });
    }
  });
}
