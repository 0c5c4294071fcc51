// The resume endpoint (issue 24, COMPLETER-PROTOCOL.md) in a real Express
// app and a real Hono app on real HTTP, against the real idem server on
// both stores. The test plays idem's completer: it takes an orphaned key
// over (a claim that the server holds until the dead worker's lease runs
// out), signs its calls itself from the Standard Webhooks rule (node:crypto,
// not the SDK's code) and completes the key with the answered response.
import { serve } from "@hono/node-server";
import express from "express";
import { Hono } from "hono";
import assert from "node:assert/strict";
import { createHmac, randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import type { Server as HTTPServer } from "node:http";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import {
  Claim,
  Client,
  NoSideEffect,
  ResumeAnswer,
  expressMiddleware,
  expressResumeHandler,
  fetchResumeHandler,
  verifySignature,
  type ResponseInit,
  type ResumeCall,
  type ResumeFunction,
  type ResumeOptions,
} from "../src/index.js";
import { repoRoot, startServer, stores, type Server } from "./server.js";

const SECRET = "whsec_" + Buffer.from("resume-endpoint-test-secret-32by").toString("base64");
const OTHER_SECRET = "whsec_" + Buffer.from("another-secret-of-the-same-size!").toString("base64");
const newKey = (name: string) => `${name}-${randomUUID()}`;

/** The Standard Webhooks signature, computed from the rule. */
function sign(secret: string, id: string, ts: number, body: string | Buffer): string {
  const key = Buffer.from(secret.replace(/^whsec_/, ""), "base64");
  return "v1," + createHmac("sha256", key).update(`${id}.${ts}.`).update(body).digest("base64");
}

const nowSeconds = () => Math.floor(Date.now() / 1000);

/** A completer call's body. */
function callBody(key: string, fencingToken: number, over: Record<string, unknown> = {}): Record<string, unknown> {
  const in1h = new Date(Date.now() + 3600_000).toISOString();
  return {
    type: "key.resume", tenant: "t1", key, operation: "POST /orders", attempt: 1, max_attempts: 8, fencing_token: fencingToken,
    recovery_point: null, recovery_data: null, lease_expires_at: in1h, deadline: in1h, ...over,
  };
}

interface Sent {
  status: number;
  type: string | null;
  json: Record<string, unknown>;
}

/** Posts a call to url, signed as the completer signs (or spoiled as opts say). */
async function post(url: string, body: Record<string, unknown> | string | Buffer, opts: { secret?: string; ts?: number; sent?: string; signature?: string; headers?: Record<string, string> } = {}): Promise<Sent> {
  const text = typeof body === "string" || Buffer.isBuffer(body) ? body : JSON.stringify(body);
  const id = "rsm_" + randomUUID();
  const ts = opts.ts ?? nowSeconds();
  const signature = opts.signature ?? sign(opts.secret ?? SECRET, id, ts, text);
  const headers: Record<string, string> = { "Content-Type": "application/json", "webhook-id": id, "webhook-timestamp": String(ts), "webhook-signature": signature, ...opts.headers };
  const res = await fetch(url, { method: "POST", headers, body: opts.sent ?? text });
  const raw = await res.text();
  return { status: res.status, type: res.headers.get("content-type"), json: raw ? (JSON.parse(raw) as Record<string, unknown>) : {} };
}

/** The application: a two-step order (charge, then e-mail) written once, run by `run` and by the resume endpoint alike. */
class Shop {
  charges = new Map<string, number>();
  emails = new Map<string, number>();
  /** Keys whose next run dies after the charge (the worker crashes). */
  crashAfterCharge = new Set<string>();
  /** The calls the resume endpoint passed to the resume function. */
  resumed: ResumeCall[] = [];

  async placeOrder(claim: Claim, orderKey: string): Promise<ResponseInit> {
    let charge: string;
    if (claim.recoveryPoint === "charged" || claim.recoveryPoint === "emailed") {
      charge = (claim.recoveryData as { charge: string }).charge; // step 1 done by an earlier attempt
    } else {
      this.charges.set(orderKey, (this.charges.get(orderKey) ?? 0) + 1);
      charge = `ch_${this.charges.size}`;
      await claim.checkpoint("charged", { charge });
    }
    if (this.crashAfterCharge.delete(orderKey)) throw new Error("the worker died after the charge");
    if (claim.recoveryPoint !== "emailed") {
      this.emails.set(orderKey, (this.emails.get(orderKey) ?? 0) + 1);
      await claim.checkpoint("emailed", { charge });
    }
    return { status: 201, headers: { "Content-Type": "application/json" }, body: JSON.stringify({ order: orderKey, charge }) };
  }

  /** The resume function: the outcome tests pick theirs by the key's prefix, the rest is placeOrder. */
  resume: ResumeFunction = async (claim, call) => {
    this.resumed.push(call);
    const kind = call.key.split("-")[0];
    switch (kind) {
      case "binary":
        return { status: 200, headers: { "Content-Type": "application/octet-stream" }, body: new Uint8Array([0xff, 0x00, 0xfe]) };
      case "notdone":
        return ResumeAnswer.notDone();
      case "nse":
        throw new NoSideEffect("the PSP says no charge was made");
      case "unknown":
        return ResumeAnswer.unknown({ retryAfterSeconds: 30 });
      case "unknownbare":
        return ResumeAnswer.unknown();
      case "review":
        return ResumeAnswer.review("card charged twice? check PSP");
      case "boom":
        throw new Error("the PSP lookup failed");
      case "nothing":
        return undefined as unknown as ResponseInit;
      case "badstatus":
        return { status: 0 };
      default:
        return this.placeOrder(claim, call.key);
    }
  };
}

interface App {
  url: string;
  close(): Promise<void>;
}

async function expressApp(opts: ResumeOptions): Promise<App> {
  const app = express();
  // The resume route before the idempotency middleware (the completer's
  // call has no Idempotency-Key) and before any body parser (it verifies
  // the raw bytes).
  app.post("/idem/resume", expressResumeHandler(opts));
  app.use(expressMiddleware({ client: opts.client, log: () => {} }));
  app.use(express.json());
  app.post("/orders", (_req, res) => res.status(201).json({ ok: true }));
  const srv = app.listen(0, "127.0.0.1");
  await new Promise<void>((r) => srv.once("listening", () => r()));
  return { url: `http://127.0.0.1:${(srv.address() as AddressInfo).port}/idem/resume`, close: () => new Promise((r) => { srv.closeAllConnections(); srv.close(() => r()); }) };
}

async function honoApp(opts: ResumeOptions): Promise<App> {
  const app = new Hono();
  const endpoint = fetchResumeHandler(opts);
  app.post("/idem/resume", (c) => endpoint(c.req.raw));
  let srv: HTTPServer | undefined;
  const url = await new Promise<string>((r) => {
    srv = serve({ fetch: app.fetch, port: 0, hostname: "127.0.0.1" }, (info) => r(`http://127.0.0.1:${info.port}/idem/resume`)) as HTTPServer;
  });
  return { url, close: () => new Promise((r) => { srv!.closeAllConnections(); srv!.close(() => r()); }) };
}

const frameworks = { express: expressApp, hono: honoApp } as const;

interface Vector {
  name: string;
  secret: string;
  id: string;
  timestamp: number;
  body: string;
  expect: { signature: string };
}
const vectors = (JSON.parse(readFileSync(join(repoRoot, "testvectors", "completer-signature.json"), "utf8")) as { vectors: Vector[] }).vectors;

describe("completer signature vectors (testvectors/completer-signature.json, computed by webhooks.Sign)", () => {
  test("the test's own signer agrees with them", () => {
    for (const v of vectors) assert.equal(sign(v.secret, v.id, v.timestamp, v.body), v.expect.signature, v.name);
  });
  test("verifySignature accepts each at its timestamp, refuses it changed", () => {
    assert.ok(vectors.length >= 3);
    for (const v of vectors) {
      const body = new TextEncoder().encode(v.body);
      const at = v.timestamp * 1000;
      assert.equal(verifySignature(v.secret, v.id, String(v.timestamp), v.expect.signature, body, at), undefined, v.name);
      assert.equal(verifySignature([OTHER_SECRET, v.secret], v.id, String(v.timestamp), `v1,AAAA ${v.expect.signature}`, body, at), undefined, v.name);
      assert.ok(verifySignature(v.secret, v.id + "x", String(v.timestamp), v.expect.signature, body, at), v.name);
      assert.ok(verifySignature(v.secret, v.id, String(v.timestamp + 1), v.expect.signature, body, at), v.name);
      assert.ok(verifySignature(v.secret, v.id, String(v.timestamp), v.expect.signature, new TextEncoder().encode(v.body + " "), at), v.name);
      assert.ok(verifySignature(OTHER_SECRET, v.id, String(v.timestamp), v.expect.signature, body, at), v.name);
      assert.ok(verifySignature(v.secret, v.id, String(v.timestamp), v.expect.signature, body, at + 301_000), v.name);
      assert.equal(verifySignature(v.secret, v.id, String(v.timestamp), v.expect.signature, body, at + 300_000), undefined, v.name);
    }
  });
});

for (const store of stores()) {
  for (const [fw, start] of Object.entries(frameworks)) {
    describe(`resume endpoint in ${fw} on ${store}`, () => {
      let srv: Server;
      let client: Client;
      let shop: Shop;
      let app: App;
      before(async () => {
        srv = await startServer(store);
        client = new Client({ baseUrl: srv.url, token: srv.token });
        shop = new Shop();
        app = await start({ client, secret: [OTHER_SECRET, SECRET], resume: shop.resume, log: () => {} });
      });
      after(async () => {
        await app.close();
        await srv.stop();
      });

      test("a worker that died after step 1 is resumed at step 2: the charge happens once, the e-mail once, the key completes", async () => {
        const k = newKey("order");
        const req = { operation: "POST /orders", request: { amount: 1000 }, leaseSeconds: 1 };
        shop.crashAfterCharge.add(k);
        await assert.rejects(client.run(k, req, (claim) => shop.placeOrder(claim, k)), /died after the charge/);
        assert.equal(shop.charges.get(k), 1);
        // The completer takes the orphan over: the server holds this claim
        // until the dead worker's lease runs out, then hands over the key
        // with a fresh fencing token and its recovery point.
        const taken = await client.claim(k, { ...req, leaseSeconds: 30 }, { waitSeconds: 8 });
        assert.equal(taken.resumed, true);
        assert.equal(taken.record.recovery_point, "charged");
        const res = await post(app.url, callBody(k, taken.fencingToken, { attempt: 1, recovery_point: "charged", recovery_data: taken.record.recovery_data }));
        assert.equal(res.status, 200);
        assert.equal(res.json.outcome, "completed");
        const response = res.json.response as { status: number; body: string; body_encoding: string; headers: Record<string, string> };
        assert.equal(response.status, 201);
        assert.equal(response.body_encoding, "utf8");
        assert.deepEqual(JSON.parse(response.body), { order: k, charge: "ch_" + String(shop.charges.size) });
        assert.equal(shop.charges.get(k), 1, "step 1 ran once");
        assert.equal(shop.emails.get(k), 1, "step 2 ran once");
        // Step 2's checkpoint went through the SDK with idem's token.
        const rec = await client.get(k);
        assert.equal(rec.state, "in_flight");
        assert.equal(rec.recovery_point, "emailed");
        assert.equal(rec.fencing_token, taken.fencingToken);
        // The completer completes with the answered response; a retry replays it, nothing runs again.
        await client.complete(k, taken.fencingToken, { status: response.status, headers: response.headers, body: response.body });
        const again = await client.run(k, req, (claim) => shop.placeOrder(claim, k));
        assert.equal(again.replayed, true);
        assert.equal(again.response.text(), response.body);
        assert.equal(shop.charges.get(k), 1);
        assert.equal(shop.emails.get(k), 1);
        const call = shop.resumed.find((c) => c.key === k)!;
        assert.equal(call.fencingToken, taken.fencingToken);
        assert.equal(call.operation, "POST /orders");
        assert.ok(call.webhookId.startsWith("rsm_"));
      });

      test("a checkpoint with a token idem has since replaced fails lease_lost, answered unknown", async () => {
        const k = newKey("order");
        const first = await client.claim(k, { operation: "POST /orders", leaseSeconds: 1 });
        const taken = await client.claim(k, { operation: "POST /orders", leaseSeconds: 30 }, { waitSeconds: 8 });
        assert.equal(taken.resumed, true);
        const before = shop.charges.get(k) ?? 0;
        // A stale call (the first token) must not move the key on.
        const res = await post(app.url, callBody(k, first.fencingToken));
        assert.deepEqual(res.json, { outcome: "unknown" });
        assert.equal(shop.charges.get(k), before + 1, "the function ran; its checkpoint was refused");
        const rec = await client.get(k);
        assert.equal(rec.fencing_token, taken.fencingToken);
        assert.equal(rec.recovery_point ?? "", "");
      });

      const outcomes: [string, unknown][] = [
        ["notdone", { outcome: "not_done" }],
        ["nse", { outcome: "not_done" }],
        ["unknown", { outcome: "unknown", retry_after_seconds: 30 }],
        ["unknownbare", { outcome: "unknown" }],
        ["review", { outcome: "review", note: "card charged twice? check PSP" }],
        ["boom", { outcome: "unknown" }],
        ["nothing", { outcome: "unknown" }],
        ["badstatus", { outcome: "unknown" }],
        ["binary", { outcome: "completed", response: { status: 200, headers: { "Content-Type": "application/octet-stream" }, body: Buffer.from([0xff, 0x00, 0xfe]).toString("base64"), body_encoding: "base64" } }],
      ];
      for (const [kind, want] of outcomes) {
        test(`the function's ${kind} answers ${JSON.stringify(want)}`, async () => {
          const k = newKey(kind);
          const res = await post(app.url, callBody(k, 7, { recovery_point: "charged", recovery_data: { charge: "ch_9" } }));
          assert.equal(res.status, 200);
          assert.match(res.type ?? "", /^application\/json/);
          assert.deepEqual(res.json, want);
          const call = shop.resumed.filter((c) => c.key === k);
          assert.equal(call.length, 1);
          assert.equal(call[0]!.recoveryPoint, "charged");
          assert.deepEqual(call[0]!.recoveryData, { charge: "ch_9" });
        });
      }

      const refused: [string, (k: string) => Promise<Sent>][] = [
        ["a wrong secret", (k) => post(app.url, callBody(k, 1), { secret: "whsec_" + Buffer.from("not-the-endpoint-secret").toString("base64") })],
        ["a timestamp 6 minutes old", (k) => post(app.url, callBody(k, 1), { ts: nowSeconds() - 360 })],
        ["a timestamp 6 minutes ahead", (k) => post(app.url, callBody(k, 1), { ts: nowSeconds() + 360 })],
        ["a tampered body", (k) => post(app.url, callBody(k, 1), { sent: JSON.stringify(callBody(k, 2)) })],
        ["no signature", (k) => post(app.url, callBody(k, 1), { signature: "" })],
        ["only another scheme's signature", (k) => post(app.url, callBody(k, 1), { signature: "v1a,abcd" })],
        ["a garbage signature", (k) => post(app.url, callBody(k, 1), { signature: "v1,!!!not-base64" })],
        ["a timestamp that is not seconds", (k) => post(app.url, callBody(k, 1), { headers: { "webhook-timestamp": "2026-12-01T00:00:00Z" } })],
      ];
      for (const [what, send] of refused) {
        test(`${what}: 401 problem+json, the function does not run`, async () => {
          const k = newKey("order");
          const res = await send(k);
          assert.equal(res.status, 401);
          assert.match(res.type ?? "", /^application\/problem\+json/);
          assert.equal(res.json.code, "unauthenticated");
          assert.equal(res.json.status, 401);
          assert.equal(shop.resumed.filter((c) => c.key === k).length, 0);
          assert.equal(shop.charges.get(k), undefined);
        });
      }

      test("several signatures: one that verifies is enough", async () => {
        const k = newKey("notdone");
        const body = JSON.stringify(callBody(k, 1));
        const id = "rsm_" + randomUUID();
        const ts = nowSeconds();
        const res = await fetch(app.url, { method: "POST", body, headers: { "webhook-id": id, "webhook-timestamp": String(ts),
          "webhook-signature": `${sign("whsec_" + Buffer.from("yet another secret").toString("base64"), id, ts, body)} v1a,xyz ${sign(SECRET, id, ts, body)}` } });
        assert.equal(res.status, 200);
        assert.deepEqual(await res.json(), { outcome: "not_done" });
      });

      const badBodies: [string, (k: string) => string | Buffer][] = [
        ["not JSON", () => "{not json"],
        ["an array", () => "[]"],
        ["another type", (k) => JSON.stringify(callBody(k, 1, { type: "key.completed" }))],
        ["a fencing token as a string", (k) => JSON.stringify(callBody(k, 1, { fencing_token: "42" }))],
        ["a fractional attempt", (k) => JSON.stringify(callBody(k, 1, { attempt: 1.5 }))],
        ["attempt 0", (k) => JSON.stringify(callBody(k, 1, { attempt: 0 }))],
        ["no recovery_data", (k) => { const b = callBody(k, 1); delete b.recovery_data; return JSON.stringify(b); }],
        ["no recovery_point", (k) => { const b = callBody(k, 1); delete b.recovery_point; return JSON.stringify(b); }],
        ["a recovery_point that is a number", (k) => JSON.stringify(callBody(k, 1, { recovery_point: 3 }))],
        ["a deadline that is not a time", (k) => JSON.stringify(callBody(k, 1, { deadline: "tomorrow" }))],
        ["an invalid key", () => JSON.stringify(callBody("has space", 1))],
        ["a duplicate member", (k) => JSON.stringify(callBody(k, 1)).replace("{", '{"fencing_token":99,')],
        ["bytes that are not UTF-8", (k) => {
          const b = Buffer.from(JSON.stringify(callBody(k, 1, { operation: "POST /@" })));
          b[b.indexOf("@")] = 0xff;
          return b;
        }],
      ];
      for (const [what, make] of badBodies) {
        test(`a signed body with ${what}: 400 invalid_request, the function does not run`, async () => {
          const k = newKey("order");
          const before = shop.resumed.length;
          const res = await post(app.url, make(k));
          assert.equal(res.status, 400);
          assert.match(res.type ?? "", /^application\/problem\+json/);
          assert.equal(res.json.code, "invalid_request");
          assert.equal(shop.resumed.length, before);
        });
      }

      test("a member the protocol does not name is ignored (a newer idem)", async () => {
        const k = newKey("notdone");
        const res = await post(app.url, callBody(k, 1, { added_later: { x: 1 } }));
        assert.deepEqual(res.json, { outcome: "not_done" });
      });

      test("the shared vectors verify over HTTP at their timestamps", async () => {
        for (const v of vectors) {
          const fixed = await start({ client, secret: v.secret, resume: shop.resume, log: () => {}, now: () => v.timestamp * 1000 });
          try {
            const headers = { "webhook-id": v.id, "webhook-timestamp": String(v.timestamp), "webhook-signature": v.expect.signature };
            const before = shop.resumed.length;
            const res = await fetch(fixed.url, { method: "POST", headers, body: v.body });
            const doc = (await res.json()) as Record<string, unknown>;
            if (v.body.includes('"key.resume"')) {
              assert.equal(res.status, 200, v.name);
              assert.equal(shop.resumed.length, before + 1, v.name);
              assert.deepEqual(shop.resumed.at(-1)!.recoveryData, (JSON.parse(v.body) as { recovery_data: unknown }).recovery_data);
            } else {
              assert.equal(res.status, 400, v.name); // verified, but not a completer call
              assert.equal(doc.code, "invalid_request");
            }
            const spoiled = await fetch(fixed.url, { method: "POST", headers, body: v.body.replace("}", " }") });
            assert.equal(spoiled.status, 401, v.name);
            await spoiled.body?.cancel();
          } finally {
            await fixed.close();
          }
        }
      });
    });
  }
}
