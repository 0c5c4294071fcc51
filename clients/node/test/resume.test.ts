// The resume endpoint (issue 24, the page "When a worker dies") in a real Express
// app and a real Hono app on real HTTP, against the real idem server on
// both stores. The test plays idem's completer: it takes an orphaned key
// over (a claim that the server holds until the dead worker's lease runs
// out), signs its calls itself from the Standard Webhooks rule (node:crypto,
// not the SDK's code) and completes the key with the answered response.
import { getRequestListener, serve } from "@hono/node-server";
import express from "express";
import { Hono } from "hono";
import assert from "node:assert/strict";
import { createHmac, randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { createServer, type RequestListener, type Server as HTTPServer } from "node:http";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { after, before, describe, test } from "node:test";
import {
  Claim,
  Client,
  IdemError,
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
  /** Orders whose step 2 (the e-mail) fails before its side effect. */
  mailDown = new Set<string>();
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
      if (this.mailDown.has(orderKey)) throw new Error("the mail service is down");
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

/** The Express app with the resume endpoint mounted. */
function expressRoutes(opts: ResumeOptions): express.Express {
  const app = express();
  // The resume route before the idempotency middleware (the completer's
  // call has no Idempotency-Key) and before any body parser (it verifies
  // the raw bytes).
  app.post("/idem/resume", expressResumeHandler(opts));
  app.use(expressMiddleware({ client: opts.client, log: () => {} }));
  app.use(express.json());
  app.post("/orders", (_req, res) => res.status(201).json({ ok: true }));
  return app;
}

async function expressApp(opts: ResumeOptions): Promise<App> {
  const srv = expressRoutes(opts).listen(0, "127.0.0.1");
  await new Promise<void>((r) => srv.once("listening", () => r()));
  return { url: `http://127.0.0.1:${(srv.address() as AddressInfo).port}/idem/resume`, close: () => new Promise((r) => { srv.closeAllConnections(); srv.close(() => r()); }) };
}

/** The Hono app with the resume endpoint mounted. */
function honoRoutes(opts: ResumeOptions): Hono {
  const app = new Hono();
  const endpoint = fetchResumeHandler(opts);
  app.post("/idem/resume", (c) => endpoint(c.req.raw));
  return app;
}

async function honoApp(opts: ResumeOptions): Promise<App> {
  const app = honoRoutes(opts);
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

      test("a signed call replayed with its webhook-id within the tolerance: 401 problem+json, the function does not run again", async () => {
        const k = newKey("notdone");
        const body = JSON.stringify(callBody(k, 1));
        const id = "rsm_" + randomUUID();
        const ts = nowSeconds();
        const send = () => fetch(app.url, { method: "POST", body, headers: { "webhook-id": id, "webhook-timestamp": String(ts), "webhook-signature": sign(SECRET, id, ts, body) } });
        const before = shop.resumed.length;
        const first = await send();
        assert.equal(first.status, 200);
        assert.deepEqual(await first.json(), { outcome: "not_done" });
        const again = await send();
        assert.equal(again.status, 401);
        assert.match(again.headers.get("content-type") ?? "", /problem\+json/);
        assert.equal(((await again.json()) as { code: string }).code, "unauthenticated");
        assert.equal(shop.resumed.length - before, 1, "the function ran once");
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

// The real completer. The idem binary runs with its completer on and fast;
// an Express app and a Hono app serve the SDK's resume endpoint, each
// registered as the tenant's completer for its own operation. A worker dies
// through run() after step 1 and its checkpoint; nobody but the completer
// touches the key until the assertions.

const completerEnv: Record<string, string> = {
  IDEM_WEBHOOK_ALLOW_PRIVATE: "1", // the apps listen on loopback
  IDEM_COMPLETER_INTERVAL: "100ms",
  IDEM_COMPLETER_TIMEOUT: "10s",
  IDEM_COMPLETER_BACKOFF_BASE: "200ms",
  IDEM_COMPLETER_BACKOFF_CAP: "1s",
  IDEM_COMPLETER_MAX_ATTEMPTS: "100", // the raising test must not reach review
  IDEM_COMPLETER_DEADLINE: "1h",
  IDEM_ORPHAN_WATCH_INTERVAL: "100ms",
  IDEM_TENANT_CACHE_TTL: "0s",
};

const routes: Record<keyof typeof frameworks, (opts: ResumeOptions) => RequestListener> = {
  express: (opts) => expressRoutes(opts),
  hono: (opts) => getRequestListener(honoRoutes(opts).fetch),
};

/** A framework app serving the resume endpoint, registered as the completer of operation. */
interface Resumable {
  shop: Shop;
  operation: string;
  close(): Promise<void>;
}

interface Wire {
  state: string;
  fencing_token: number;
  recovery_point: string | null;
  completer: { state: string; attempts: number } | null;
  response: { status: number; body: string } | null;
}

interface AuditEntry {
  action: string;
  fencing_token: number;
  actor: { subject: string; scope: string };
}

for (const store of stores()) {
  describe(`the real completer on ${store} resumes through the resume endpoint of express and hono`, () => {
    let srv: Server;
    let client: Client;
    const apps = new Map<string, Resumable>();

    const api = async <T>(path: string): Promise<T> => {
      const res = await fetch(srv.url + path, { headers: { Authorization: "Bearer " + srv.token } });
      const text = await res.text();
      assert.equal(res.status, 200, text);
      return JSON.parse(text) as T;
    };
    const record = (k: string) => api<Wire>(`/v1/keys/${k}`);
    /** The key's audit entries, oldest first. */
    const audit = async (k: string) => (await api<{ items: AuditEntry[] }>(`/v1/keys/${k}/audit?limit=100`)).items.reverse();
    /** Polls the key's record until cond holds; fails after timeoutMs. */
    const waitRecord = async (k: string, cond: (r: Wire) => boolean, timeoutMs = 30_000): Promise<Wire> => {
      const end = Date.now() + timeoutMs;
      for (;;) {
        const rec = await record(k);
        if (cond(rec)) return rec;
        if (Date.now() > end) assert.fail(`${k}: not reached in ${timeoutMs} ms; the record: ${JSON.stringify(rec)}`);
        await sleep(50);
      }
    };
    /** A worker, through run(), claims with a 1 s lease, charges (step 1), checkpoints and dies: it stops renewing and never completes. Returns its token. */
    const dieAfterCharge = async (app: Resumable, k: string): Promise<number> => {
      let token = 0;
      app.shop.crashAfterCharge.add(k);
      await assert.rejects(client.run(k, { operation: app.operation, request: { amount: 1000 }, leaseSeconds: 1 }, (claim) => {
        token = claim.fencingToken;
        return app.shop.placeOrder(claim, k);
      }), /died after the charge/);
      assert.equal(app.shop.charges.get(k), 1);
      assert.equal(app.shop.emails.get(k), undefined);
      return token;
    };
    const isCode = (status: number, code: string) => (err: unknown) => err instanceof IdemError && err.status === status && err.code === code;

    before(async () => {
      srv = await startServer(store, {}, completerEnv);
      client = new Client({ baseUrl: srv.url, token: srv.token });
      const admin = srv.mint("t1", "tenant:admin");
      for (const fw of Object.keys(routes) as (keyof typeof routes)[]) {
        // The app's port first: the registration needs the URL, the app the secret it returns.
        const http = createServer();
        await new Promise<void>((r) => http.listen(0, "127.0.0.1", () => r()));
        const operation = `POST /${fw}-orders`;
        const url = `http://127.0.0.1:${(http.address() as AddressInfo).port}/idem/resume`;
        const res = await fetch(srv.url + "/v1/completers", { method: "POST", headers: { Authorization: "Bearer " + admin, "Content-Type": "application/json" },
          body: JSON.stringify({ url, operation_pattern: operation }) });
        const doc = (await res.json()) as { secret: string };
        assert.equal(res.status, 201, JSON.stringify(doc));
        assert.match(doc.secret, /^whsec_/);
        const shop = new Shop();
        http.on("request", routes[fw]({ client, secret: doc.secret, resume: shop.resume, log: () => {} }));
        apps.set(fw, { shop, operation, close: () => new Promise((r) => { http.closeAllConnections(); http.close(() => r()); }) });
      }
    });
    after(async () => {
      for (const app of apps.values()) await app.close();
      await srv?.stop();
    });

    for (const fw of Object.keys(routes)) {
      test(`${fw}: a worker dead after step 1 is resumed at step 2 by the completer and completed exactly once`, async () => {
        const app = apps.get(fw)!;
        const k = newKey("order");
        const stale = await dieAfterCharge(app, k);
        const rec = await waitRecord(k, (r) => r.state === "completed");
        assert.equal(rec.completer, null);
        assert.equal(rec.response!.status, 201);
        const body = JSON.parse(rec.response!.body) as { order: string; charge: string };
        assert.equal(body.order, k);
        assert.equal(app.shop.charges.get(k), 1, "step 1 happened once");
        assert.equal(app.shop.emails.get(k), 1, "step 2 happened once");
        const calls = app.shop.resumed.filter((c) => c.key === k);
        assert.equal(calls.length, 1, "one resume call");
        const call = calls[0]!;
        assert.equal(call.operation, app.operation);
        assert.equal(call.attempt, 1);
        assert.equal(call.recoveryPoint, "charged");
        assert.deepEqual(call.recoveryData, { charge: body.charge }, "the answer carries step 1's result from the recovery data");
        assert.ok(call.fencingToken > stale);
        assert.ok(call.webhookId.startsWith("rsm_"));

        await assert.rejects(client.complete(k, stale, { status: 200, body: "late" }), isCode(409, "lease_lost"), "the late original worker is fenced off");
        const again = await client.run(k, { operation: app.operation, request: { amount: 1000 } }, (claim) => app.shop.placeOrder(claim, k));
        assert.equal(again.replayed, true);
        assert.equal(again.response.status, 201);
        assert.equal(again.response.text(), rec.response!.body);
        assert.equal(app.shop.charges.get(k), 1);
        assert.equal(app.shop.emails.get(k), 1);
        assert.deepEqual((await record(k)).response, rec.response, "the late complete changed nothing");

        const entries = await audit(k);
        assert.deepEqual(entries.map((e) => e.action), ["completer_completed"]);
        assert.equal(entries[0]!.actor.scope, "completer");
        assert.match(entries[0]!.actor.subject, /^completer:/);
        assert.equal(entries[0]!.fencing_token, call.fencingToken);
      });

      test(`${fw}: a resume function that raises keeps the key held (outcome_unknown), nothing doubled, until it recovers`, async () => {
        const app = apps.get(fw)!;
        const k = newKey("order");
        app.shop.mailDown.add(k);
        const stale = await dieAfterCharge(app, k);
        const rec = await waitRecord(k, (r) => r.completer?.state === "unknown");
        // Held: not completed, not released (its lease may show it orphaned between attempts).
        assert.ok(["in_flight", "orphaned"].includes(rec.state), rec.state);
        assert.ok(rec.completer!.attempts >= 1);
        assert.equal(rec.recovery_point, "charged");

        await assert.rejects(client.claim(k, { operation: app.operation, request: { amount: 1000 } }), isCode(409, "outcome_unknown"), "a retry never takes the key over");
        await assert.rejects(client.complete(k, stale, { status: 200, body: "late" }), isCode(409, "lease_lost"));
        assert.equal(app.shop.charges.get(k), 1, "no side effect doubled");
        assert.equal(app.shop.emails.get(k), undefined);
        assert.ok(["in_flight", "orphaned"].includes((await record(k)).state));
        const held = (await audit(k)).map((e) => e.action);
        assert.ok(held.length >= 1);
        assert.deepEqual([...new Set(held)], ["completer_unknown"]);

        app.shop.mailDown.delete(k);
        const done = await waitRecord(k, (r) => r.state === "completed");
        assert.equal((JSON.parse(done.response!.body) as { order: string }).order, k);
        assert.equal(app.shop.charges.get(k), 1);
        assert.equal(app.shop.emails.get(k), 1);
        const calls = app.shop.resumed.filter((c) => c.key === k);
        assert.ok(calls.length >= 2);
        assert.deepEqual(calls.map((c) => c.attempt), calls.map((_, i) => i + 1));
        assert.ok(calls.every((c) => c.recoveryPoint === "charged"));
        const actions = (await audit(k)).map((e) => e.action);
        assert.deepEqual(actions, [...Array<string>(calls.length - 1).fill("completer_unknown"), "completer_completed"]);
      });
    }
  });
}

// The completer hangs up (its call timed out) while the resume function is
// between an external call and its checkpoint. The function's claim.signal
// must not abort then: the function runs until the completer's lease on the
// key ends, so the external call finishes and its checkpoint is saved, and
// the next attempt resumes after it instead of making the call again.
for (const store of stores()) {
  describe(`a completer that hangs up on ${store} does not cut the resume function short`, () => {
    let srv: Server;
    let client: Client;
    const apps: (() => Promise<void>)[] = [];
    const record = async (k: string): Promise<Wire> => {
      const res = await fetch(`${srv.url}/v1/keys/${k}`, { headers: { Authorization: "Bearer " + srv.token } });
      assert.equal(res.status, 200);
      return (await res.json()) as Wire;
    };
    const waitRecord = async (k: string, cond: (r: Wire) => boolean, timeoutMs: number): Promise<Wire> => {
      const end = Date.now() + timeoutMs;
      for (;;) {
        const rec = await record(k);
        if (cond(rec)) return rec;
        if (Date.now() > end) assert.fail(`${k}: not reached in ${timeoutMs} ms; the record: ${JSON.stringify(rec)}`);
        await sleep(50);
      }
    };
    before(async () => {
      srv = await startServer(store, {}, { ...completerEnv, IDEM_COMPLETER_TIMEOUT: "1s", IDEM_STORE_TIMEOUT: "2s" });
      client = new Client({ baseUrl: srv.url, token: srv.token });
    });
    after(async () => {
      for (const close of apps) await close();
      await srv?.stop();
    });

    for (const fw of Object.keys(routes) as (keyof typeof routes)[]) {
      test(`${fw}: the external call after the hang-up reaches its checkpoint; the next attempt resumes after it, the charge happens once`, async () => {
        const operation = `POST /${fw}-hangup`;
        let charges = 0;
        const calls: ResumeCall[] = [];
        const resume: ResumeFunction = async (claim, call) => {
          calls.push(call);
          if (claim.recoveryPoint !== "charged") {
            // Still at work when idem hangs up: the completer records the
            // attempt unknown once its 1 s timeout ran out.
            await waitRecord(call.key, (r) => r.completer?.state === "unknown", 30_000);
            // The external call honours the claim's signal, as a fetch would.
            claim.signal.throwIfAborted();
            await sleep(10, undefined, { signal: claim.signal });
            charges++;
            await claim.checkpoint("charged", { charge: "ch_1" });
          }
          return { status: 201, body: "ordered" };
        };
        const http = createServer();
        await new Promise<void>((r) => http.listen(0, "127.0.0.1", () => r()));
        apps.push(() => new Promise((r) => { http.closeAllConnections(); http.close(() => r()); }));
        const admin = srv.mint("t1", "tenant:admin");
        const res = await fetch(srv.url + "/v1/completers", { method: "POST", headers: { Authorization: "Bearer " + admin, "Content-Type": "application/json" },
          body: JSON.stringify({ url: `http://127.0.0.1:${(http.address() as AddressInfo).port}/idem/resume`, operation_pattern: operation }) });
        const doc = (await res.json()) as { secret: string };
        assert.equal(res.status, 201, JSON.stringify(doc));
        http.on("request", routes[fw]({ client, secret: doc.secret, resume, log: () => {} }));

        const k = newKey("hangup");
        await client.claim(k, { operation, request: { amount: 1 }, leaseSeconds: 1 }); // the worker dies at once
        const charged = await waitRecord(k, (r) => r.recovery_point === "charged", 30_000);
        assert.equal(charged.completer?.state, "unknown", "the key stays held while the next attempt waits for the lease");
        const done = await waitRecord(k, (r) => r.state === "completed", 60_000);
        assert.equal(done.response!.body, "ordered");
        assert.equal(charges, 1, "the external call happened once");
        assert.ok(calls.length >= 2);
        assert.equal(calls.at(-1)!.recoveryPoint, "charged", "the last attempt resumed after the checkpoint");
      });
    }
  });
}
