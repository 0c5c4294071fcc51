// Acceptance: a real Express app and a real Hono app (on @hono/node-server)
// with a side-effect counter, in front of the real idem binary, on both
// stores. 50 concurrent duplicates and a retry after a dropped answer give
// exactly one side effect.
import { serve } from "@hono/node-server";
import express from "express";
import { Hono } from "hono";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { createServer, request as httpRequest, type IncomingMessage, type Server as HTTPServer } from "node:http";
import { connect, type AddressInfo } from "node:net";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { Client, FrontDoor, expressErrorHandler, expressMiddleware, outcomeReviewDetail, outcomeUnknownDetail, storageQuotaDetail, withIdempotency } from "../src/index.js";
import { repoRoot, startServer, stores, type Server } from "./server.js";

// eslint-disable-next-line @typescript-eslint/no-explicit-any
type Any = any;

/** A response over the default 1 MiB stored for replay. */
const BIG = (1 << 20) + 1;

interface App {
  url: string;
  /** Side effects per order id. */
  effects: Map<string, number>;
  close(): Promise<void>;
}

function listen(srv: HTTPServer): Promise<string> {
  return new Promise((r) => srv.listen(0, "127.0.0.1", () => r(`http://127.0.0.1:${(srv.address() as AddressInfo).port}`)));
}

/** The /stream handlers answer STREAM_CHUNKS chunks "chunk<i>;", one per STREAM_DELAY_MS; the breaking ones break off after BREAK_AFTER chunks on their first run. */
const STREAM_CHUNKS = 10;
const STREAM_DELAY_MS = 50;
const BREAK_AFTER = 3;
const fullStream = Array.from({ length: STREAM_CHUNKS }, (_, i) => `chunk${i};`).join("");

/** What the /stream handlers did for one idempotency key. */
class StreamState {
  runs = 0;
  /** Runs that wrote every chunk. */
  finished = 0;
  /** Opened when the first run has written its first chunk. */
  first = new Gate();
}

const streams = new Map<string, StreamState>();

function streamState(key: string): StreamState {
  let st = streams.get(key);
  if (!st) {
    st = new StreamState();
    streams.set(key, st);
  }
  return st;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Options the test apps pass to their middleware: leaseSeconds overrides the tenant's default lease. */
interface AppOptions {
  leaseSeconds?: number;
}

async function expressApp(client: Client, extra: AppOptions = {}): Promise<App> {
  const effects = new Map<string, number>();
  const app = express();
  app.use(expressMiddleware({ client, log: () => {}, ...extra }));
  app.post("/orders/:id/pay", async (req, res) => {
    const id = req.params.id;
    effects.set(id, (effects.get(id) ?? 0) + 1); // the side effect
    await new Promise((r) => setTimeout(r, 100));
    res.status(201).set("Location", `/orders/${id}`).set("Set-Cookie", "s=1").json({ order: id, amount: (req.body as { amount: number }).amount });
  });
  app.post("/boom", () => {
    throw new Error("handler failed after its side effect");
  });
  app.post("/big", (_req, res) => {
    effects.set("big", (effects.get("big") ?? 0) + 1);
    res.status(200).type("text/plain").send("x".repeat(BIG));
  });
  // Streams its chunks with res.write and stops (ends its answer) when its
  // caller goes away, as a streaming handler does.
  app.post("/stream", (req, res) => {
    const st = streamState(String(req.headers["idempotency-key"]));
    st.runs++;
    let gone = false;
    res.on("close", () => (gone = true));
    res.status(200).type("text/plain");
    let i = 0;
    const tick = () => {
      if (gone || res.destroyed) {
        res.end();
        return;
      }
      res.write(`chunk${i};`);
      if (i === 0) st.first.open();
      if (++i === STREAM_CHUNKS) {
        st.finished++;
        res.end();
        return;
      }
      setTimeout(tick, STREAM_DELAY_MS);
    };
    tick();
  });
  // Break off their answer after BREAK_AFTER chunks on their first run: res.destroy(), or a throw.
  for (const how of ["destroys", "throws"] as const) {
    app.post(`/stream-${how}`, async (req, res) => {
      const st = streamState(String(req.headers["idempotency-key"]));
      const run = ++st.runs;
      res.status(200).type("text/plain");
      for (let i = 0; i < STREAM_CHUNKS; i++) {
        if (run === 1 && i === BREAK_AFTER) {
          if (how === "throws") throw new Error("the stream broke off");
          res.destroy();
          return;
        }
        res.write(`chunk${i};`);
        await sleep(STREAM_DELAY_MS);
      }
      st.finished++;
      res.end();
    });
  }
  app.use(expressErrorHandler());
  app.use((_err: unknown, _req: express.Request, res: express.Response, _next: express.NextFunction) => {
    res.status(500).json({ error: "boom" });
  });
  const srv = createServer(app);
  const url = await listen(srv);
  return { url, effects, close: () => new Promise((r) => { srv.closeAllConnections(); srv.close(() => r()); }) };
}

async function honoApp(client: Client, extra: AppOptions = {}): Promise<App> {
  const effects = new Map<string, number>();
  const app = new Hono();
  const pay = withIdempotency(async (req: Request, id: string) => {
    const body = (await req.json()) as { amount: number };
    effects.set(id, (effects.get(id) ?? 0) + 1); // the side effect
    await new Promise((r) => setTimeout(r, 100));
    return Response.json({ order: id, amount: body.amount }, { status: 201, headers: { Location: `/orders/${id}`, "Set-Cookie": "s=1" } });
  }, { client, log: () => {}, route: () => "/orders/:id/pay", ...extra });
  app.post("/orders/:id/pay", (c) => pay(c.req.raw, c.req.param("id")));
  const boom = withIdempotency(async () => {
    throw new Error("handler failed after its side effect");
  }, { client, log: () => {}, ...extra });
  app.post("/boom", (c) => boom(c.req.raw));
  const big = withIdempotency(async () => {
    effects.set("big", (effects.get("big") ?? 0) + 1);
    return new Response("x".repeat(BIG), { headers: { "Content-Type": "text/plain" } });
  }, { client, log: () => {}, ...extra });
  app.post("/big", (c) => big(c.req.raw));
  // Streams its chunks from a ReadableStream that stops (closes) when the
  // request's signal aborts (the caller went away); /stream-breaks errors
  // after BREAK_AFTER chunks on its first run.
  const stream = withIdempotency(async (req: Request) => {
    const st = streamState(req.headers.get("Idempotency-Key") ?? "");
    const run = ++st.runs;
    const breaks = new URL(req.url).pathname.endsWith("-breaks");
    const enc = new TextEncoder();
    let i = 0;
    return new Response(new ReadableStream<Uint8Array>({
      async pull(controller) {
        if (req.signal.aborted) {
          controller.close();
          return;
        }
        if (breaks && run === 1 && i === BREAK_AFTER) {
          controller.error(new Error("the stream broke off"));
          return;
        }
        controller.enqueue(enc.encode(`chunk${i};`));
        if (i === 0) st.first.open();
        if (++i === STREAM_CHUNKS) {
          st.finished++;
          controller.close();
          return;
        }
        await sleep(STREAM_DELAY_MS);
      },
    }), { headers: { "Content-Type": "text/plain" } });
  }, { client, log: () => {}, ...extra });
  app.post("/stream", (c) => stream(c.req.raw));
  app.post("/stream-breaks", (c) => stream(c.req.raw));
  app.onError((_err, c) => c.json({ error: "boom" }, 500));
  let srv: HTTPServer | undefined;
  const url = await new Promise<string>((r) => {
    srv = serve({ fetch: app.fetch, port: 0, hostname: "127.0.0.1" }, (info) => r(`http://127.0.0.1:${info.port}`)) as HTTPServer;
  });
  return { url, effects, close: () => new Promise((r) => { srv!.closeAllConnections(); srv!.close(() => r()); }) };
}

/** A loopback proxy in front of target that drops (resets) the answer to the first request it forwards, after the app has answered. */
async function droppingProxy(target: string): Promise<{ url: string; dropped: () => number; close(): Promise<void> }> {
  const t = new URL(target);
  let dropped = 0;
  let first = true;
  const srv = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const drop = first;
      first = false;
      const up = httpRequest({ host: t.hostname, port: t.port, method: req.method, path: req.url, headers: req.headers }, (ur) => {
        const body: Buffer[] = [];
        ur.on("data", (c: Buffer) => body.push(c));
        ur.on("end", () => {
          if (drop) {
            dropped++;
            req.socket.destroy(); // the app answered; the caller never sees it
            return;
          }
          res.writeHead(ur.statusCode ?? 502, ur.headers);
          res.end(Buffer.concat(body));
        });
      });
      up.end(Buffer.concat(chunks));
    });
  });
  const url = await listen(srv);
  return { url, dropped: () => dropped, close: () => new Promise((r) => { srv.closeAllConnections(); srv.close(() => r()); }) };
}

async function post(url: string, key: string | undefined, body: unknown, extra: Record<string, string> = {}) {
  const headers: Record<string, string> = { "Content-Type": "application/json", ...extra };
  if (key !== undefined) headers["Idempotency-Key"] = key;
  const res = await fetch(url, { method: "POST", headers, body: JSON.stringify(body) });
  return { status: res.status, headers: res.headers, text: await res.text() };
}

/** An Express app without expressErrorHandler, with express.json() before the middleware. */
async function plainExpressApp(client: Client): Promise<App> {
  const effects = new Map<string, number>();
  const app = express();
  app.set("env", "test"); // the final handler does not print the errors
  app.use(express.json());
  app.use(expressMiddleware({ client, log: () => {} }));
  app.post("/orders/:id/pay", (req, res) => {
    const id = req.params.id;
    effects.set(id, (effects.get(id) ?? 0) + 1);
    res.status(201).json({ order: id, amount: (req.body as { amount: number }).amount });
  });
  app.post("/boom", () => {
    throw new Error("sync throw");
  });
  app.post("/reject", async () => {
    await new Promise((r) => setTimeout(r, 10));
    throw new Error("async rejection");
  });
  const srv = createServer(app);
  const url = await listen(srv);
  return { url, effects, close: () => new Promise((r) => { srv.closeAllConnections(); srv.close(() => r()); }) };
}

/** A handler's gate: handlers wait() on it until open(); reset() closes it again. */
class Gate {
  private p!: Promise<void>;
  private r!: () => void;
  constructor() {
    this.reset();
  }
  reset(): void {
    this.p = new Promise((r) => (this.r = r));
  }
  open(): void {
    this.r();
  }
  wait(): Promise<void> {
    return this.p;
  }
}

/** An app whose pay handler makes its side effect, then waits for the gate; 30 s leases, so only a completion ends a wait soon. */
async function gatedApp(kind: "express" | "hono", client: Client, gate: Gate): Promise<App> {
  const effects = new Map<string, number>();
  const opts = { client, leaseSeconds: 30, log: () => {} };
  let srv: HTTPServer;
  if (kind === "express") {
    const app = express();
    app.use(expressMiddleware(opts));
    app.post("/orders/:id/pay", async (req, res) => {
      const id = req.params.id;
      effects.set(id, (effects.get(id) ?? 0) + 1);
      await gate.wait();
      res.status(201).json({ order: id, amount: (req.body as { amount: number }).amount });
    });
    srv = createServer(app);
  } else {
    const app = new Hono();
    const pay = withIdempotency(async (req: Request, id: string) => {
      const body = (await req.json()) as { amount: number };
      effects.set(id, (effects.get(id) ?? 0) + 1);
      await gate.wait();
      return Response.json({ order: id, amount: body.amount }, { status: 201 });
    }, { ...opts, route: () => "/orders/:id/pay" });
    app.post("/orders/:id/pay", (c) => pay(c.req.raw, c.req.param("id")));
    srv = serve({ fetch: app.fetch, port: 0, hostname: "127.0.0.1" }) as HTTPServer;
    await new Promise<void>((r) => (srv.listening ? r() : srv.once("listening", () => r())));
  }
  const url = srv.listening ? `http://127.0.0.1:${(srv.address() as AddressInfo).port}` : await listen(srv);
  return { url, effects, close: () => new Promise((r) => { srv.closeAllConnections(); srv.close(() => r()); }) };
}

/** The server's idem_claim_waiters gauge: claims it holds now, waiting for a key in flight. */
async function claimWaiters(srv: Server): Promise<number> {
  const text = await (await fetch(`${srv.url}/metrics`)).text();
  const m = /^idem_claim_waiters (\S+)$/m.exec(text);
  return m ? Number(m[1]) : 0;
}

/** Polls cond (every 5 ms) until it holds; fails after 60 s (a generous deadline: CI runs on 2 busy cores). */
async function waitFor(cond: () => boolean | Promise<boolean>, what: string): Promise<void> {
  const end = Date.now() + 60_000;
  while (!(await cond())) {
    if (Date.now() > end) assert.fail(`not reached in time: ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

/** POSTs {} with a request line that is target byte for byte (no client library escaping it); the answer's status. */
function rawPost(url: string, target: Buffer, key: string): Promise<number> {
  const u = new URL(url);
  return new Promise((resolve, reject) => {
    const s = connect(Number(u.port), u.hostname, () => {
      s.write(Buffer.concat([Buffer.from("POST "), target,
        Buffer.from(` HTTP/1.1\r\nHost: x\r\nIdempotency-Key: ${key}\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}`)]));
    });
    const chunks: Buffer[] = [];
    s.on("data", (d: Buffer) => chunks.push(d));
    s.on("error", reject);
    s.on("close", () => resolve(Number(Buffer.concat(chunks).toString("latin1").split(" ")[1])));
  });
}

/** POSTs {} to path with key on a socket of its own, and destroys that socket (the caller going away) once first opens. */
function hangUp(url: string, path: string, key: string, first: Gate): Promise<void> {
  const u = new URL(url);
  return new Promise((resolve, reject) => {
    const s = connect(Number(u.port), u.hostname, () => {
      s.write(`POST ${path} HTTP/1.1\r\nHost: x\r\nIdempotency-Key: ${key}\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}`);
      void first.wait().then(() => {
        s.destroy();
        resolve();
      });
    });
    s.on("error", reject);
  });
}

const targetVectors = (JSON.parse(readFileSync(join(repoRoot, "testvectors", "frontdoor", "targets.json"), "utf8")) as {
  vectors: { name: string; target?: string; target_base64?: string; expect: { fingerprint: string } }[];
}).vectors;

/**
 * The detail of 409 response_not_replayable, for either reason a record is
 * not replayable: the shared vectors hold it once (docs/frontdoor.md rule 7).
 */
const notReplayableDetail = (JSON.parse(readFileSync(join(repoRoot, "testvectors", "frontdoor", "policy.json"), "utf8")) as {
  problems: { code: string; detail?: string }[];
}).problems.find((p) => p.code === "response_not_replayable")?.detail;

/** The detail of 403 tenant_unknown, held once in the shared vectors. */
const tenantUnknownDetail = (JSON.parse(readFileSync(join(repoRoot, "testvectors", "frontdoor", "policy.json"), "utf8")) as {
  problems: { code: string; detail?: string }[];
}).problems.find((p) => p.code === "tenant_unknown")?.detail;

const operationVectors = (JSON.parse(readFileSync(join(repoRoot, "testvectors", "frontdoor", "operations.json"), "utf8")) as {
  vectors: { name: string; target?: string; target_base64?: string; expect: { operation: string; refused_by?: string[]; legacy?: { node?: string } } }[];
}).vectors;

/** POSTs {} with a request line that is target byte for byte; the answer's status and head (status line and headers). */
function rawAnswer(url: string, target: Buffer, key: string): Promise<{ status: number; head: string }> {
  const u = new URL(url);
  return new Promise((resolve, reject) => {
    const s = connect(Number(u.port), u.hostname, () => {
      s.write(Buffer.concat([Buffer.from("POST "), target,
        Buffer.from(` HTTP/1.1\r\nHost: x\r\nIdempotency-Key: ${key}\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}`)]));
    });
    const chunks: Buffer[] = [];
    s.on("data", (d: Buffer) => chunks.push(d));
    s.on("error", reject);
    s.on("close", () => {
      const head = Buffer.concat(chunks).toString("latin1").split("\r\n\r\n")[0] ?? "";
      resolve({ status: Number(head.split(" ")[1]), head });
    });
  });
}

describe("invalid claim answers", () => {
  // An idem URL that answers claims with something the client cannot
  // interpret (each "invalid" claim answer of testvectors/sdk/replay.json,
  // from a loopback fake: a real idem cannot send them) gets the caller 503
  // store_unavailable; the handler never runs and nothing invented is
  // replayed. Before, a 201 without a fencing token ran the handler and a 200
  // without a response replayed an empty answer.
  const answers = (JSON.parse(readFileSync(join(repoRoot, "testvectors", "sdk", "replay.json"), "utf8")) as {
    claim_answers: { name: string; status: number; headers: Record<string, string>; body: string; expect: string }[];
  }).claim_answers.filter((v) => v.expect === "invalid");
  for (const [name, make] of [["express", expressApp], ["hono", honoApp]] as const) {
    test(`${name}: 503 store_unavailable, the handler never runs`, async () => {
      assert.ok(answers.length > 0);
      let v = answers[0]!;
      const fake = createServer((req, res) => {
        req.resume();
        req.on("end", () => res.writeHead(v.status, { ...v.headers, "Content-Type": "application/json" }).end(v.body));
      });
      const app = await make(new Client({ baseUrl: await listen(fake), token: "t" }));
      try {
        for (v of answers) {
          const id = randomUUID();
          const res = await post(`${app.url}/orders/${id}/pay`, `pay-${id}`, { amount: 1 });
          assert.equal(res.status, 503, `${v.name}: ${res.text}`);
          assert.equal(JSON.parse(res.text).code, "store_unavailable", v.name);
          assert.equal(app.effects.get(id), undefined, `${v.name}: the handler must not run`);
        }
      } finally {
        await app.close();
        fake.closeAllConnections();
        await new Promise<void>((r) => fake.close(() => r()));
      }
    });
  }
});

for (const store of stores()) {
  describe(`request-target vectors on ${store}`, () => {
    let srv: Server;
    before(async () => {
      srv = await startServer(store);
    });
    after(async () => {
      await srv.stop();
    });

    // Each request line of testvectors/frontdoor/targets.json, sent byte for
    // byte, gives the record the fingerprint the vector expects (the one
    // client/idemhttp and the Python middleware give the same bytes). Node.js
    // refuses bytes outside ASCII in the target (400) before any handler:
    // nothing is claimed, nothing can differ. Before, the Express middleware
    // took the query from WHATWG URL parsing, which escapes ' " < > raw in a
    // query, and the fetch wrapper took path and query from Request.url,
    // which escapes more.
    for (const kind of ["express", "hono"] as const) {
      test(`${kind}: every vector's fingerprint`, async () => {
        const c = new Client({ baseUrl: srv.url, token: srv.token });
        let h: HTTPServer;
        if (kind === "express") {
          const app = express();
          app.use(expressMiddleware({ client: c, log: () => {} }));
          app.use((_req, res) => { res.status(201).end(); });
          h = createServer(app);
        } else {
          const app = new Hono<{ Bindings: { incoming: IncomingMessage } }>();
          const handler = withIdempotency(async (_req: Request, _incoming: IncomingMessage) => new Response(null, { status: 201 }), {
            client: c, log: () => {}, target: (_req: Request, incoming: IncomingMessage) => incoming.url ?? "/",
          });
          app.all("*", (ctx) => handler(ctx.req.raw, ctx.env.incoming));
          h = serve({ fetch: app.fetch, port: 0, hostname: "127.0.0.1" }) as HTTPServer;
          await new Promise<void>((r) => (h.listening ? r() : h.once("listening", () => r())));
        }
        const url = h.listening ? `http://127.0.0.1:${(h.address() as AddressInfo).port}` : await listen(h);
        try {
          for (const v of targetVectors) {
            const k = `target-${randomUUID()}`;
            const status = await rawPost(url, v.target_base64 !== undefined ? Buffer.from(v.target_base64, "base64") : Buffer.from(v.target!, "latin1"), k);
            if (v.target_base64 !== undefined) {
              assert.equal(status, 400, v.name);
              await assert.rejects(c.get(k), (e: Any) => e.code === "key_not_found", v.name);
              continue;
            }
            assert.equal(status, 201, v.name);
            assert.equal((await c.get(k)).fingerprint, v.expect.fingerprint, v.name);
          }
        } finally {
          h.closeAllConnections();
          await new Promise<void>((r) => h.close(() => r()));
        }
      });
    }
  });

  describe(`operation vectors on ${store}`, () => {
    let srv: Server;
    before(async () => {
      srv = await startServer(store);
    });
    after(async () => {
      await srv.stop();
    });

    // Each request line of testvectors/frontdoor/operations.json, sent byte
    // for byte to a path no route pattern names, is served once and claimed
    // with the operation the vector expects (the one client/idemhttp, the
    // gateway and the Python middleware give the same bytes; a label this
    // front door has always built otherwise stays, expect.legacy.node), and
    // its retry is the replay. Before, a path that decodes to a control
    // character next to a character WHATWG URL parsing escapes
    // (/orders/a{b}|c%00) was labelled by its WHATWG form, not by the path
    // as it arrived like everywhere else.
    for (const kind of ["express", "hono"] as const) {
      test(`${kind}: every vector's operation`, async () => {
        const c = new Client({ baseUrl: srv.url, token: srv.token });
        let runs = 0;
        let h: HTTPServer;
        if (kind === "express") {
          const app = express();
          app.use(expressMiddleware({ client: c, log: () => {} }));
          app.use((_req, res) => { runs++; res.status(201).end(); });
          h = createServer(app);
        } else {
          const app = new Hono<{ Bindings: { incoming: IncomingMessage } }>();
          const handler = withIdempotency(async (_req: Request, _incoming: IncomingMessage) => { runs++; return new Response(null, { status: 201 }); }, {
            client: c, log: () => {}, target: (_req: Request, incoming: IncomingMessage) => incoming.url ?? "/",
          });
          app.all("*", (ctx) => handler(ctx.req.raw, ctx.env.incoming));
          h = serve({ fetch: app.fetch, port: 0, hostname: "127.0.0.1" }) as HTTPServer;
          await new Promise<void>((r) => (h.listening ? r() : h.once("listening", () => r())));
        }
        const url = h.listening ? `http://127.0.0.1:${(h.address() as AddressInfo).port}` : await listen(h);
        try {
          assert.ok(operationVectors.length > 0);
          for (const v of operationVectors) {
            const k = `operation-${randomUUID()}`;
            const target = v.target_base64 !== undefined ? Buffer.from(v.target_base64, "base64") : Buffer.from(v.target!, "latin1");
            const before = runs;
            const first = await rawAnswer(url, target, k);
            if (v.expect.refused_by?.includes("node")) {
              assert.equal(first.status, 400, v.name);
              await assert.rejects(c.get(k), (e: Any) => e.code === "key_not_found", v.name);
              continue;
            }
            assert.equal(first.status, 201, `${v.name}: ${first.head}`);
            assert.equal(runs, before + 1, `${v.name}: the handler ran once`);
            const rec = await c.get(k);
            assert.equal(rec.state, "completed", v.name);
            assert.equal(rec.operation, v.expect.legacy?.node ?? v.expect.operation, v.name);
            const again = await rawAnswer(url, target, k);
            assert.equal(again.status, 201, v.name);
            assert.match(again.head, /idempotent-replayed: true/i, v.name);
            assert.equal(runs, before + 1, `${v.name}: the retry is a replay`);
          }
        } finally {
          h.closeAllConnections();
          await new Promise<void>((r) => h.close(() => r()));
        }
      });
    }

    // An operation idem refuses (here from a route function that names a
    // control character) answers the caller 400 invalid_request, not
    // retryable, naming idem's field, without running the handler or
    // claiming anything. Before, it was 503 store_unavailable with
    // Retry-After: a retry that could never succeed.
    for (const kind of ["express", "hono"] as const) {
      test(`${kind}: a claim idem refuses as invalid is 400 invalid_request, not retryable`, async () => {
        const c = new Client({ baseUrl: srv.url, token: srv.token });
        let runs = 0;
        const route = () => "/orders/\u0001";
        let h: HTTPServer;
        if (kind === "express") {
          const app = express();
          app.use(expressMiddleware({ client: c, log: () => {}, route }));
          app.use((_req, res) => { runs++; res.status(201).end(); });
          h = createServer(app);
        } else {
          const app = new Hono();
          const handler = withIdempotency(async () => { runs++; return new Response(null, { status: 201 }); }, { client: c, log: () => {}, route });
          app.all("*", (ctx) => handler(ctx.req.raw));
          h = serve({ fetch: app.fetch, port: 0, hostname: "127.0.0.1" }) as HTTPServer;
          await new Promise<void>((r) => (h.listening ? r() : h.once("listening", () => r())));
        }
        const url = h.listening ? `http://127.0.0.1:${(h.address() as AddressInfo).port}` : await listen(h);
        try {
          const k = `refused-${randomUUID()}`;
          const res = await post(`${url}/orders/1`, k, { amount: 1 });
          assert.equal(res.status, 400, res.text);
          const p = JSON.parse(res.text);
          assert.equal(p.code, "invalid_request");
          assert.equal(p.retryable, false);
          assert.equal(res.headers.get("retry-after"), null);
          assert.equal(p.errors[0].field, "operation");
          assert.equal(runs, 0, "the handler must not run");
          await assert.rejects(c.get(k), (e: Any) => e.code === "key_not_found");
        } finally {
          h.closeAllConnections();
          await new Promise<void>((r) => h.close(() => r()));
        }
      });
    }
  });

  describe(`Prefer: wait=N on ${store}`, () => {
    let srv: Server;
    before(async () => {
      srv = await startServer(store);
    });
    after(async () => {
      await srv.stop();
    });

    for (const kind of ["express", "hono"] as const) {
      test(`${kind}: a duplicate with Prefer: wait=10 gets the first one's replay, not 409; without Prefer 409 at once`, async () => {
        // The attempt timeout (30 s) leaves room for the whole wait (10 s).
        const gate = new Gate();
        const app = await gatedApp(kind, new Client({ baseUrl: srv.url, token: srv.token, retry: { attemptTimeoutMs: 30_000 } }), gate);
        try {
          const id = randomUUID();
          const url = `${app.url}/orders/${id}/pay`;
          const k = `prefer-${id}`;
          const prefer = { Prefer: "wait=10" };
          const first = post(url, k, { amount: 1 }, prefer);
          await waitFor(() => app.effects.get(id) === 1, "the first request runs the handler");
          const short = await post(url, k, { amount: 1 }, { Prefer: "respond-async, wait=1" });
          assert.equal(short.status, 409, short.text);
          assert.equal(JSON.parse(short.text).code, "request_in_flight");
          assert.equal(short.headers.get("Preference-Applied"), "wait=1", "the wait ran out: the 409 says it was held");
          assert.ok(Number(short.headers.get("Retry-After")) >= 1);
          let heldDone = false;
          const held = post(url, k, { amount: 1 }, prefer).finally(() => (heldDone = true));
          await waitFor(async () => (await claimWaiters(srv)) === 1, "idem holds the duplicate's claim");
          assert.equal(heldDone, false);
          gate.open();
          const [r1, r2] = await Promise.all([first, held]);
          assert.equal(r1.status, 201, r1.text);
          assert.equal(r1.headers.get("Idempotent-Replayed"), null);
          // The first claim found the key free: idem says it was willing to wait, and the front door passes that on.
          assert.equal(r1.headers.get("Preference-Applied"), "wait=10");
          assert.equal(r2.status, 201, r2.text);
          assert.equal(r2.headers.get("Idempotent-Replayed"), "true");
          assert.equal(r2.headers.get("Preference-Applied"), "wait=10");
          assert.deepEqual(JSON.parse(r2.text), JSON.parse(r1.text));
          assert.equal(app.effects.get(id), 1, "the handler ran once");
          await waitFor(async () => (await claimWaiters(srv)) === 0, "no claim is held");

          // Without the preference: 409 at once, no Preference-Applied.
          gate.reset();
          const id2 = randomUUID();
          const url2 = `${app.url}/orders/${id2}/pay`;
          const first2 = post(url2, `prefer-${id2}`, { amount: 2 });
          await waitFor(() => app.effects.get(id2) === 1, "the first request runs the handler");
          const now = await post(url2, `prefer-${id2}`, { amount: 2 });
          assert.equal(now.status, 409);
          assert.equal(JSON.parse(now.text).code, "request_in_flight");
          assert.equal(now.headers.get("Preference-Applied"), null);
          gate.open();
          const done = await first2;
          assert.equal(done.status, 201);
          assert.equal(done.headers.get("Preference-Applied"), null);
          assert.equal(app.effects.get(id2), 1);
        } finally {
          gate.open();
          await app.close();
        }
      });
    }

    test("maxWaitSeconds caps N; 0 or less ignores Prefer; a malformed preference is none", () => {
      const fd = (maxWaitSeconds?: number) => new FrontDoor({ client: new Client({ baseUrl: srv.url }), ...(maxWaitSeconds === undefined ? {} : { maxWaitSeconds }) });
      assert.equal(fd().preferWait(["wait=10"]), 10);
      assert.equal(fd(5).preferWait(["wait=10"]), 5);
      assert.equal(fd(5).preferWait(["wait=3"]), 3);
      assert.equal(fd(0).preferWait(["wait=10"]), 0);
      assert.equal(fd(-1).preferWait(["wait=10"]), 0);
      assert.equal(fd().preferWait(["wait=abc"]), 0);
      assert.equal(fd().preferWait([]), 0);
      assert.equal(fd().preferWait(["wait=99999"]), 24 * 3600);
      assert.equal(fd().preferWait(["return=minimal", "Wait = 7 ; x=y"]), 7);
    });
  });

  describe(`plain express app on ${store}`, () => {
    let srv: Server;
    let app: App;
    before(async () => {
      srv = await startServer(store);
      app = await plainExpressApp(new Client({ baseUrl: srv.url, token: srv.token }));
    });
    after(async () => {
      await app.close();
      await srv.stop();
    });

    test("without expressErrorHandler a thrown or rejected handler still stores nothing", async () => {
      const c = new Client({ baseUrl: srv.url, token: srv.token });
      for (const path of ["/boom", "/reject"]) {
        const k = `ex-${randomUUID()}`;
        const res = await post(`${app.url}${path}`, k, {});
        assert.equal(res.status, 500, "Express's final handler answers");
        assert.equal((await c.get(k)).state, "in_flight", `${path}: no response was stored`);
      }
    });

    test("a body parser before the middleware: one side effect, replays", async () => {
      const id = randomUUID();
      const k = `pay-${id}`;
      const answers = await Promise.all(Array.from({ length: 10 }, () => post(`${app.url}/orders/${id}/pay`, k, { amount: 3 })));
      assert.equal(app.effects.get(id), 1);
      assert.ok(answers.every((a) => a.status === 201 || a.status === 409));
      const again = await post(`${app.url}/orders/${id}/pay`, k, { amount: 3 });
      assert.equal(again.headers.get("Idempotent-Replayed"), "true");
      assert.equal((await post(`${app.url}/orders/${id}/pay`, k, { amount: 4 })).status, 422);
    });
  });

  describe(`key scope on ${store}`, () => {
    let srv: Server;
    let closers: Array<() => Promise<void>> = [];
    const scopedApp = async (scoped: boolean) => {
      const effects = new Map<string, number>();
      const app = express();
      const client = new Client({ baseUrl: srv.url, token: srv.token });
      app.use(expressMiddleware({ client, log: () => {}, ...(scoped ? { scope: (req) => { const v = req.headers["x-account-id"]; return typeof v === "string" ? v : undefined; } } : {}) }));
      app.post("/pay", (req, res) => {
        const k = String(req.headers["idempotency-key"]);
        effects.set(k, (effects.get(k) ?? 0) + 1);
        res.status(201).json({ paid: k });
      });
      const h = createServer(app);
      const url = await listen(h);
      closers.push(() => new Promise((r) => { h.closeAllConnections(); h.close(() => r()); }));
      return { url, effects };
    };
    before(async () => {
      srv = await startServer(store);
    });
    after(async () => {
      for (const c of closers) await c();
      closers = [];
      await srv.stop();
    });

    test("without a scope option a key with ':' is the record key as it is: run once, replayed", async () => {
      const app = await scopedApp(false);
      const k = `order-confirm:${randomUUID()}`;
      const first = await post(`${app.url}/pay`, k, {});
      assert.equal(first.status, 201, first.text);
      const again = await post(`${app.url}/pay`, k, {});
      assert.equal(again.headers.get("Idempotent-Replayed"), "true");
      assert.equal(app.effects.get(k), 1);
    });

    test("with a scope option an unscoped key with ':' is 400 invalid_key: it could be a scoped caller's record", async () => {
      const app = await scopedApp(true);
      const id = randomUUID();
      const squat = await post(`${app.url}/pay`, `alice:${id}`, {});
      assert.equal(squat.status, 400, squat.text);
      assert.equal(JSON.parse(squat.text).code, "invalid_key");
      assert.equal(app.effects.size, 0, "the handler did not run");
      const own = await post(`${app.url}/pay`, id, {}, { "X-Account-Id": "alice" });
      assert.equal(own.status, 201, own.text);
      assert.equal(own.headers.get("Idempotent-Replayed"), null);
      const c = new Client({ baseUrl: srv.url, token: srv.token });
      assert.equal((await c.get(`alice:${id}`)).state, "completed");
    });
  });

  describe(`express writeHead forms on ${store}`, () => {
    let srv: Server;
    let url: string;
    let close: () => Promise<void>;
    let runs = 0;
    before(async () => {
      srv = await startServer(store);
      const app = express();
      app.use(expressMiddleware({ client: new Client({ baseUrl: srv.url, token: srv.token }), log: () => {} }));
      app.post("/flat", (_req, res) => {
        runs++;
        res.writeHead(201, ["Set-Cookie", "a=1", "Set-Cookie", "b=2", "Content-Type", "text/plain", "Link", "</a>", "Link", "</b>"]);
        res.end("flat");
      });
      app.post("/pairs", (_req, res) => {
        runs++;
        res.writeHead(201, [["Set-Cookie", "a=1"], ["Set-Cookie", "b=2"], ["Content-Type", "text/plain"]] as unknown as string[]);
        res.end("pairs");
      });
      const h = createServer(app);
      url = await listen(h);
      close = () => new Promise((r) => { h.closeAllConnections(); h.close(() => r()); });
    });
    after(async () => {
      await close();
      await srv.stop();
    });

    test("a body idem refuses to fingerprint (over its request limit) is 413 payload_too_large, not a 503 to retry for ever", async () => {
      // maxBodyBytes over the server's IDEM_MAX_BODY_BYTES (10 MiB): the
      // claim's document is refused 413. Before, the middleware answered 503
      // store_unavailable with Retry-After: retry later, for ever.
      const app = express();
      let ran = 0;
      app.use(expressMiddleware({ client: new Client({ baseUrl: srv.url, token: srv.token }), log: () => {}, maxBodyBytes: 12 << 20 }));
      app.post("/upload", (_req, res) => { ran++; res.status(201).end("ok"); });
      const h = createServer(app);
      const u = await listen(h);
      try {
        const body = JSON.stringify({ pad: "x".repeat((10 << 20) - 20) });
        const res = await fetch(`${u}/upload`, { method: "POST", headers: { "Idempotency-Key": `huge-${randomUUID()}`, "Content-Type": "application/json" }, body });
        assert.equal(res.status, 413);
        assert.equal((await res.json() as { code: string }).code, "payload_too_large");
        assert.equal(ran, 0);
      } finally {
        await new Promise<void>((r) => { h.closeAllConnections(); h.close(() => r()); });
      }
    });

    test("a status idem cannot store (799: Node.js sends 100-999, idem stores 100-599) is sent, stored as not replayable: its retry is 409, not a second run", async () => {
      // Before, complete was refused (400): with storeServerErrors the key
      // stayed in flight and the retry after the 1 s lease ran the handler
      // again; without it, 799 counted as a 5xx and the key was released.
      const c = new Client({ baseUrl: srv.url, token: srv.token });
      for (const storeServerErrors of [true, false]) {
        const app = express();
        let ran = 0;
        app.use(expressMiddleware({ client: c, log: () => {}, leaseSeconds: 1, storeServerErrors }));
        app.post("/odd", (_req, res) => { ran++; res.status(799).type("text/plain").send("odd"); });
        const h = createServer(app);
        const u = await listen(h);
        try {
          const k = `odd-${randomUUID()}`;
          const first = await post(`${u}/odd`, k, {});
          assert.equal(first.status, 799, "the handler's answer is sent as it is");
          assert.equal(first.text, "odd");
          const rec = await c.get(k);
          assert.equal(rec.state, "completed", "the outcome is recorded, as not replayable");
          assert.equal(rec.response?.status, 502);
          assert.equal(rec.response?.headers?.["Idem-Not-Replayable"], "response of status 799 not stored (outside 100-599)");
          assert.equal(rec.response?.body.length, 0);
          await new Promise((r) => setTimeout(r, 1100)); // past the claim's lease: an in-flight key would be taken over now
          const again = await post(`${u}/odd`, k, {});
          assert.equal(again.status, 409);
          assert.equal(JSON.parse(again.text).code, "response_not_replayable");
          // Before, the detail said the response was too large to store.
          assert.equal(JSON.parse(again.text).detail, notReplayableDetail);
          assert.equal(ran, 1, `the handler ran once (storeServerErrors ${storeServerErrors})`);
        } finally {
          await new Promise<void>((r) => { h.closeAllConnections(); h.close(() => r()); });
        }
      }
    });

    test("writeHead with a raw header array sends every field the handler wrote; the replay stores and sends the same", async () => {
      // Before, each field of the array replaced the one before of its
      // name (one cookie of two was sent), and the array-of-pairs form threw.
      for (const path of ["/flat", "/pairs"]) {
        const k = `wh-${randomUUID()}`;
        runs = 0;
        const res = await fetch(`${url}${path}`, { method: "POST", headers: { "Idempotency-Key": k, "Content-Type": "application/json" }, body: "{}" });
        assert.equal(res.status, 201, path);
        assert.deepEqual(res.headers.getSetCookie(), ["a=1", "b=2"], path);
        assert.equal(res.headers.get("Content-Type"), "text/plain", path);
        if (path === "/flat") assert.equal(res.headers.get("Link"), "</a>, </b>");
        await res.text();
        const again = await fetch(`${url}${path}`, { method: "POST", headers: { "Idempotency-Key": k, "Content-Type": "application/json" }, body: "{}" });
        assert.equal(again.headers.get("Idempotent-Replayed"), "true", path);
        assert.equal(again.headers.get("Content-Type"), "text/plain", path);
        if (path === "/flat") assert.equal(again.headers.get("Link"), null, "Link is not a stored header");
        assert.equal(await again.text(), path.slice(1));
        assert.equal(runs, 1, path);
      }
    });
  });

  describe(`storage quota on ${store}`, () => {
    // The tenant's records fill its storage_quota_bytes (1200 bytes; no
    // tenant cache, so every claim checks it): idem answers the next new key
    // 507 storage_quota_exceeded, and so must the front door — not
    // retryable, no Retry-After, the handler not run, nothing stored — while
    // a completed key still replays. Before, the refusal fell into the
    // fail-closed branch: 503 store_unavailable, retryable, for ever.
    let srv: Server;
    before(async () => {
      srv = await startServer(store, {}, { IDEM_TENANT_CACHE_TTL: "0" });
    });
    after(async () => {
      await srv.stop();
    });
    for (const [name, make] of [["express", expressApp], ["hono", honoApp]] as const) {
      test(`${name}: a new key over the quota is 507 storage_quota_exceeded, the handler not run`, async () => {
        const tenant = `full-${name}`;
        srv.createTenant(tenant, { "max-response-bytes": 400, "storage-quota-bytes": 1200 });
        const client = new Client({ baseUrl: srv.url, token: srv.mint(tenant, "keys:write keys:read") });
        const app = await make(client);
        try {
          const id = randomUUID();
          const stored: string[] = [];
          let refused: Awaited<ReturnType<typeof post>> | undefined;
          let key = "";
          for (let i = 0; i < 40; i++) {
            key = `fill-${i}`;
            const got = await post(`${app.url}/orders/${id}/pay`, key, { amount: 1 });
            if (got.status !== 201) {
              refused = got;
              break;
            }
            stored.push(key);
          }
          assert.ok(refused, "the tenant filled its quota and kept claiming new keys");
          assert.ok(stored.length > 0);
          assert.equal(app.effects.get(id), stored.length, "the handler ran for the stored keys only");
          assert.equal(refused.status, 507, refused.text);
          assert.equal(refused.headers.get("Content-Type"), "application/problem+json");
          const p = JSON.parse(refused.text);
          assert.equal(p.code, "storage_quota_exceeded");
          assert.equal(p.retryable, false);
          assert.equal(p.detail, storageQuotaDetail);
          assert.equal(refused.headers.get("Retry-After"), null);
          await assert.rejects(client.get(key), (err: Any) => err.code === "key_not_found");
          const replay = await post(`${app.url}/orders/${id}/pay`, stored[0], { amount: 1 });
          assert.equal(replay.status, 201, replay.text);
          assert.equal(replay.headers.get("Idempotent-Replayed"), "true");
          assert.equal(app.effects.get(id), stored.length);
        } finally {
          await app.close();
        }
      });
    }
  });

  describe(`refusals of the middleware's tenant and token on ${store}`, () => {
    let srv: Server;
    before(async () => {
      srv = await startServer(store);
    });
    after(async () => {
      await srv.stop();
    });
    /** Disables or enables tenant through the admin API with an operator token (the server drops its cached tenant at once). */
    const setDisabled = async (tenant: string, disabled: boolean) => {
      const res = await fetch(`${srv.url}/v1/admin/tenants/${tenant}`, {
        method: "PATCH",
        headers: { Authorization: `Bearer ${srv.mint("", "admin")}`, "Content-Type": "application/json" },
        body: JSON.stringify({ disabled }),
      });
      assert.equal(res.status, 200, await res.text());
    };
    for (const [name, make] of [["express", expressApp], ["hono", honoApp]] as const) {
      // An operator disables the middleware's tenant: idem refuses its
      // claims 403 tenant_unknown, and so must the front door — not
      // retryable, no Retry-After, the fixed detail, the handler not run,
      // nothing claimed. Enabled again, the same key runs once. Before, the
      // refusal fell into the fail-closed branch: 503 store_unavailable,
      // retryable, for as long as the tenant stayed disabled (issue 21,
      // hole 2's class).
      test(`${name}: the tenant disabled is 403 tenant_unknown, not retryable, the handler not run; enabled again the key runs once`, async () => {
        const tenant = `off-${name}`;
        srv.createTenant(tenant);
        const client = new Client({ baseUrl: srv.url, token: srv.mint(tenant, "keys:write keys:read") });
        const app = await make(client);
        try {
          const id = randomUUID();
          const key = `suspended-${id}`;
          await setDisabled(tenant, true);
          for (let i = 0; i < 2; i++) {
            const got = await post(`${app.url}/orders/${id}/pay`, key, { amount: 1 });
            assert.equal(got.status, 403, got.text);
            assert.equal(got.headers.get("Content-Type"), "application/problem+json");
            const p = JSON.parse(got.text);
            assert.deepEqual([p.code, p.title, p.retryable, p.detail], ["tenant_unknown", "Tenant unknown", false, tenantUnknownDetail]);
            assert.equal(got.headers.get("Retry-After"), null);
          }
          assert.equal(app.effects.get(id), undefined, "the handler must not run");
          await setDisabled(tenant, false);
          await assert.rejects(client.get(key), (err: Any) => err.code === "key_not_found", "nothing was claimed while the tenant was disabled");
          const first = await post(`${app.url}/orders/${id}/pay`, key, { amount: 1 });
          assert.equal(first.status, 201, first.text);
          const again = await post(`${app.url}/orders/${id}/pay`, key, { amount: 1 });
          assert.equal(again.status, 201, again.text);
          assert.equal(again.headers.get("Idempotent-Replayed"), "true");
          assert.equal(again.text, first.text);
          assert.equal(app.effects.get(id), 1, "the key ran the handler once");
        } finally {
          await app.close();
        }
      });

      // Pins the decision for idem's refusals of the middleware's own token
      // (docs/frontdoor.md rule 5): 401 unauthenticated (expired, a rotated
      // secret, a deleted tenant's) and 403 forbidden (without keys:write)
      // are a fault of the service's credentials that a rotation fixes, not
      // of the caller's request: the retryable 503 store_unavailable with
      // Retry-After, never a 401 or 403 blaming the caller, the handler not
      // run; once the token function hands out a good token the same key
      // runs once. (The behaviour the SDKs had: it passed before the
      // tenant_unknown change too.)
      test(`${name}: idem refusing the middleware's own token is the retryable 503; after the rotation the key runs once`, async () => {
        let current = "not-a-jwt";
        const app = await make(new Client({ baseUrl: srv.url, token: () => current }));
        try {
          const id = randomUUID();
          const key = `rotated-${id}`;
          for (const bad of ["not-a-jwt", srv.mint("t1", "keys:read")]) {
            current = bad;
            const got = await post(`${app.url}/orders/${id}/pay`, key, { amount: 1 });
            assert.equal(got.status, 503, got.text);
            const p = JSON.parse(got.text);
            assert.equal(p.code, "store_unavailable");
            assert.equal(p.retryable, true);
            assert.ok(Number(got.headers.get("Retry-After")) >= 1);
          }
          assert.equal(app.effects.get(id), undefined, "the handler must not run");
          current = srv.token;
          const first = await post(`${app.url}/orders/${id}/pay`, key, { amount: 1 });
          assert.equal(first.status, 201, first.text);
          const again = await post(`${app.url}/orders/${id}/pay`, key, { amount: 1 });
          assert.equal(again.headers.get("Idempotent-Replayed"), "true");
          assert.equal(app.effects.get(id), 1, "the key ran the handler once");
        } finally {
          await app.close();
        }
      });
    }
  });

  for (const [name, make] of [["express", expressApp], ["hono", honoApp]] as const) {
    describe(`${name} app on ${store}`, () => {
      let srv: Server;
      let app: App;
      before(async () => {
        // A 1 s lease keeps the orphan checks short.
        srv = await startServer(store, { "lease-seconds-default": 1 });
        app = await make(new Client({ baseUrl: srv.url, token: srv.token }));
      });
      after(async () => {
        await app.close();
        await srv.stop();
      });

      test("50 concurrent duplicates: one side effect, every success is the same answer", async () => {
        // One run is the promise while a lease holds: a 30 s lease here. The
        // suite's 1 s lease lapsed under load (50 claims on 2 busy cores,
        // renewals late) and a lapsed lease is taken over, as it must be:
        // 3 and 4 side effects, a test that asserted more than the promise.
        const held = await make(new Client({ baseUrl: srv.url, token: srv.token }), { leaseSeconds: 30 });
        try {
          await concurrentDuplicates(held);
        } finally {
          await held.close();
        }
      });

      async function concurrentDuplicates(app: App): Promise<void> {
        const id = randomUUID();
        const k = `pay-${id}`;
        const answers = await Promise.all(Array.from({ length: 50 }, () => post(`${app.url}/orders/${id}/pay`, k, { amount: 1000 })));
        assert.equal(app.effects.get(id), 1, "exactly one side effect");
        const ok = answers.filter((a) => a.status === 201);
        assert.ok(ok.length >= 1);
        for (const a of ok) assert.deepEqual(JSON.parse(a.text), { order: id, amount: 1000 });
        for (const a of answers.filter((a) => a.status !== 201)) {
          assert.equal(a.status, 409, a.text);
          assert.equal(JSON.parse(a.text).code, "request_in_flight");
          assert.ok(Number(a.headers.get("Retry-After")) >= 1);
        }
        // Afterwards every duplicate is a replay of the stored answer, Set-Cookie not among it.
        const replay = await post(`${app.url}/orders/${id}/pay`, `"${k}"`, { amount: 1000 });
        assert.equal(replay.status, 201);
        assert.equal(replay.headers.get("Idempotent-Replayed"), "true");
        assert.equal(replay.headers.get("Location"), `/orders/${id}`);
        assert.equal(replay.headers.get("Set-Cookie"), null);
        assert.deepEqual(JSON.parse(replay.text), { order: id, amount: 1000 });
        assert.equal(app.effects.get(id), 1);
      }

      test("a retry after a dropped answer is replayed: one side effect", async () => {
        const proxy = await droppingProxy(app.url);
        try {
          const id = randomUUID();
          const k = `pay-${id}`;
          await assert.rejects(post(`${proxy.url}/orders/${id}/pay`, k, { amount: 7 }), "the first answer is dropped");
          assert.equal(proxy.dropped(), 1);
          const retry = await post(`${proxy.url}/orders/${id}/pay`, k, { amount: 7 });
          assert.equal(retry.status, 201);
          assert.equal(retry.headers.get("Idempotent-Replayed"), "true");
          assert.deepEqual(JSON.parse(retry.text), { order: id, amount: 7 });
          assert.equal(app.effects.get(id), 1, "exactly one side effect");
        } finally {
          await proxy.close();
        }
      });

      test("a lost claim answer (idem → app) is recovered by the attempt id: one run, answered at once", async () => {
        // The app reaches idem through a proxy that drops the answer to the
        // first claim after idem took it.
        const idemProxy = await droppingProxy(srv.url);
        const lossy = await make(new Client({ baseUrl: idemProxy.url, token: srv.token, retry: { baseDelayMs: 50 } }));
        try {
          const id = randomUUID();
          const k = `pay-${id}`;
          // The middleware's claim retry carries the same attempt id: it gets
          // its own claim back, and the caller gets the answer at once.
          const res = await post(`${lossy.url}/orders/${id}/pay`, k, { amount: 5 });
          assert.equal(idemProxy.dropped(), 1);
          assert.equal(res.status, 201, res.text);
          assert.deepEqual(JSON.parse(res.text), { order: id, amount: 5 });
          assert.equal(lossy.effects.get(id), 1, "exactly one side effect");
          const replay = await post(`${lossy.url}/orders/${id}/pay`, k, { amount: 5 });
          assert.equal(replay.headers.get("Idempotent-Replayed"), "true");
          assert.equal(lossy.effects.get(id), 1);
        } finally {
          await lossy.close();
          await idemProxy.close();
        }
      });

      test("another body under the key is 422; a bad or missing key is 400; nothing runs", async () => {
        const id = randomUUID();
        const k = `pay-${id}`;
        assert.equal((await post(`${app.url}/orders/${id}/pay`, k, { amount: 1 })).status, 201);
        const mismatch = await post(`${app.url}/orders/${id}/pay`, k, { amount: 2 });
        assert.equal(mismatch.status, 422);
        assert.equal(mismatch.headers.get("Content-Type"), "application/problem+json");
        assert.equal(JSON.parse(mismatch.text).code, "fingerprint_mismatch");
        const missing = await post(`${app.url}/orders/${id}/pay`, undefined, { amount: 1 });
        assert.equal(missing.status, 400);
        assert.equal(JSON.parse(missing.text).code, "idempotency_key_missing");
        const bad = await post(`${app.url}/orders/${id}/pay`, "a b", { amount: 1 });
        assert.equal(JSON.parse(bad.text).code, "invalid_key");
        // Same key and body on another order of the same route: the path
        // is fingerprinted, so 422, not the first order's replay.
        const other = randomUUID();
        const otherPath = await post(`${app.url}/orders/${other}/pay`, k, { amount: 1 });
        assert.equal(otherPath.status, 422);
        assert.equal(JSON.parse(otherPath.text).code, "fingerprint_mismatch");
        assert.equal(app.effects.get(other), undefined);
        assert.equal(app.effects.get(id), 1);
      });

      test("a handler exception stores nothing: the claim is left in flight", async () => {
        // A 30 s lease: the claim left must still be in flight when looked
        // at; the suite's 1 s lease could lapse first on a busy machine (the
        // retry then took the orphan over and ran /boom again: 500, not 409).
        const held = await make(new Client({ baseUrl: srv.url, token: srv.token }), { leaseSeconds: 30 });
        try {
          const k = `boom-${randomUUID()}`;
          const first = await post(`${held.url}/boom`, k, {});
          assert.equal(first.status, 500);
          assert.equal(first.headers.get("Idempotent-Replayed"), null);
          const c = new Client({ baseUrl: srv.url, token: srv.token });
          const rec = await c.get(k);
          assert.equal(rec.state, "in_flight", "no response was stored");
          assert.ok(!rec.response);
          const again = await post(`${held.url}/boom`, k, {});
          assert.equal(again.status, 409);
          assert.equal(JSON.parse(again.text).code, "request_in_flight");
        } finally {
          await held.close();
        }
      });

      test("a response too large to store is sent once; its replay is 409 response_not_replayable, not a second run", async () => {
        const k = `big-${randomUUID()}`;
        const before = app.effects.get("big") ?? 0;
        const first = await post(`${app.url}/big`, k, {});
        assert.equal(first.status, 200);
        assert.equal(first.text.length, BIG);
        const rec = await new Client({ baseUrl: srv.url, token: srv.token }).get(k);
        assert.equal(rec.response?.status, 200);
        const why = /^response of (\d+) bytes not stored$/.exec(rec.response?.headers?.["Idem-Not-Replayable"] ?? "");
        assert.ok(why && Number(why[1]) > BIG, JSON.stringify(rec.response?.headers));
        const again = await post(`${app.url}/big`, k, {});
        assert.equal(again.status, 409);
        assert.equal(JSON.parse(again.text).code, "response_not_replayable");
        assert.equal(JSON.parse(again.text).detail, notReplayableDetail);
        assert.equal(app.effects.get("big"), before + 1);
      });

      test("a response the tenant's max_response_bytes refuses is stored without its body: its retry is 409, not a second run", async () => {
        // Before, nothing was stored: the key stayed in flight and the
        // retry after the 1 s lease ran the handler a second time.
        const tenant = `small-${randomUUID().slice(0, 8)}`;
        srv.createTenant(tenant, { "max-response-bytes": 60, "lease-seconds-default": 1 });
        const small = await make(new Client({ baseUrl: srv.url, token: srv.mint(tenant, "keys:write") }));
        try {
          const id = randomUUID();
          const k = `limit-${id}`;
          const first = await post(`${small.url}/orders/${id}/pay`, k, { amount: 3 });
          assert.equal(first.status, 201);
          assert.equal(JSON.parse(first.text).order, id);
          await new Promise((r) => setTimeout(r, 1100)); // past the claim's lease: an in-flight key would be taken over now
          const again = await post(`${small.url}/orders/${id}/pay`, k, { amount: 3 });
          assert.equal(again.status, 409);
          assert.equal(JSON.parse(again.text).code, "response_not_replayable");
          assert.equal(JSON.parse(again.text).detail, notReplayableDetail);
          assert.equal(small.effects.get(id), 1);
        } finally {
          await small.close();
        }
      });

      test("the caller hangs up mid-stream: never a truncated replay", async () => {
        // The hang-up is hidden from the handler (Express: the close of res
        // and req held back, res.destroyed false; Hono: the handler's
        // request has no signal of the caller's): it runs to its end and the
        // retry gets the whole answer. Before, both replayed "chunk0;" as a
        // complete 200.
        //
        // The retry waits until the key is completed: "not in flight" is not
        // that. Under load the 1 s lease lapsed while the handler still ran
        // (orphaned), then its lease keeper renewed it: the retry got 409
        // request_in_flight (or, sent before the renewal, would take the key
        // over): both legal answers to a retry while the first run is going.
        const k = `cut-${randomUUID()}`;
        const st = streamState(k);
        await hangUp(app.url, "/stream", k, st.first);
        const c = new Client({ baseUrl: srv.url, token: srv.token });
        await waitFor(async () => (await c.get(k)).state === "completed", "the key completed");
        const r = await post(`${app.url}/stream`, k, {});
        assert.equal(r.status, 200, r.text);
        assert.equal(r.headers.get("Idempotent-Replayed"), "true");
        assert.equal(r.text, fullStream, "the whole answer, never the part streamed before the hang-up");
        assert.equal(st.finished, 1, "the handler ran to its end");
        assert.equal(st.runs, 1, "one side effect");
      });

      test("a stream that breaks off part way stores nothing: 409 in flight, then the takeover runs it again", async () => {
        // Before, an Express handler's res.destroy() left the key in flight
        // for good (the lease renewed for ever): never taken over.
        const c = new Client({ baseUrl: srv.url, token: srv.token });
        for (const path of name === "express" ? ["/stream-destroys", "/stream-throws"] : ["/stream-breaks"]) {
          const k = `broke-${randomUUID()}`;
          const st = streamState(k);
          const first = await post(`${app.url}${path}`, k, {}).catch(() => undefined); // destroyed: no answer
          if (first) assert.equal(first.status, 500, `${path}: ${first.text}`);
          const rec = await c.get(k);
          // Orphaned once the 1 s lease is over (soon, on a busy machine):
          // still claimed, nothing stored.
          assert.ok(["in_flight", "orphaned"].includes(rec.state), `${path}: nothing stored, nothing released: ${rec.state}`);
          assert.ok(!rec.response, path);
          const end = Date.now() + 60_000;
          let r = await post(`${app.url}${path}`, k, {});
          while (r.status === 409) {
            assert.equal(JSON.parse(r.text).code, "request_in_flight", `${path}: ${r.text}`);
            assert.ok(Date.now() < end, `${path}: the orphan was never taken over`);
            await sleep(100);
            r = await post(`${app.url}${path}`, k, {});
          }
          assert.equal(r.status, 200, `${path}: ${r.text}`);
          assert.equal(r.headers.get("Idempotent-Replayed"), null, "a takeover runs the handler, no replay");
          assert.equal(r.text, fullStream, path);
          assert.equal(st.runs, 2, `${path}: the broken run and the takeover`);
          const again = await post(`${app.url}${path}`, k, {});
          assert.equal(again.headers.get("Idempotent-Replayed"), "true");
          assert.equal(again.text, fullStream);
          assert.equal(st.runs, 2);
        }
      });

      test("idem unreachable: 503 store_unavailable, the handler does not run", async () => {
        // A loopback port nothing listens on.
        const probe = createServer();
        const dead = await listen(probe);
        await new Promise<void>((r) => probe.close(() => r()));
        const down = await make(new Client({ baseUrl: dead, token: "t", retry: { maxAttempts: 1 } }));
        try {
          const id = randomUUID();
          const res = await post(`${down.url}/orders/${id}/pay`, `pay-${id}`, { amount: 1 });
          assert.equal(res.status, 503);
          assert.equal(JSON.parse(res.text).code, "store_unavailable");
          assert.ok(Number(res.headers.get("Retry-After")) >= 1);
          assert.equal(down.effects.get(id), undefined);
        } finally {
          await down.close();
        }
      });
    });
  }
}

/** A request body of 61 bytes, the Content-Length of the cut requests below. */
const cutBody = Buffer.from(JSON.stringify({ amount: 1000, currency: "usd", note: "x".repeat(19) }));
assert.equal(cutBody.length, 61);

/** An app whose POST /raw and /orders/:id/pay count a side effect per run; done counts the requests the app (middleware included) finished with. */
interface CutApp extends App {
  done: () => number;
  /** The status and body of the last answer the app gave (to a caller gone or not). */
  last: () => { status: number; body: string };
}

async function cutApp(kind: "express" | "hono", client: Client): Promise<CutApp> {
  const effects = new Map<string, number>();
  const effect = (id: string) => effects.set(id, (effects.get(id) ?? 0) + 1);
  let done = 0;
  let last = { status: 0, body: "" };
  let h: HTTPServer;
  if (kind === "express") {
    const app = express();
    app.use((_req, res, next) => {
      // Counts every way the request ends: the middleware's own answer, the handler's, an error handler's.
      const end = res.end.bind(res) as (...a: unknown[]) => express.Response;
      res.end = ((...a: unknown[]) => {
        last = { status: res.statusCode, body: a[0] instanceof Uint8Array ? Buffer.from(a[0]).toString("utf8") : typeof a[0] === "string" ? a[0] : "" };
        done++;
        return end(...a);
      }) as typeof res.end;
      next();
    });
    app.use(expressMiddleware({ client, log: () => {} }));
    app.post("/raw", (req, res) => {
      effect("raw");
      res.status(201).json({ length: (req as Any).rawBody.length });
    });
    app.post("/orders/:id/pay", (req, res) => {
      effect(req.params.id);
      res.status(201).json({ amount: (req.body as { amount: number }).amount });
    });
    app.use((_err: unknown, _req: express.Request, res: express.Response, _next: express.NextFunction) => {
      res.status(500).json({ error: "boom" });
    });
    h = createServer(app);
  } else {
    const app = new Hono();
    const raw = withIdempotency(async (req: Request) => {
      const b = await req.arrayBuffer();
      effect("raw");
      return Response.json({ length: b.byteLength }, { status: 201 });
    }, { client, log: () => {} });
    const pay = withIdempotency(async (req: Request, id: string) => {
      const body = (await req.json()) as { amount: number };
      effect(id);
      return Response.json({ amount: body.amount }, { status: 201 });
    }, { client, log: () => {}, route: () => "/orders/:id/pay" });
    const counted = async (f: () => Promise<Response>) => {
      try {
        const res = await f();
        last = { status: res.status, body: await res.clone().text() };
        return res;
      } catch (err) {
        last = { status: 500, body: String(err) }; // to the app's onError
        throw err;
      } finally {
        done++;
      }
    };
    app.post("/raw", (c) => counted(() => raw(c.req.raw)));
    app.post("/orders/:id/pay", (c) => counted(() => pay(c.req.raw, c.req.param("id"))));
    app.onError((_err, c) => c.json({ error: "boom" }, 500));
    h = serve({ fetch: app.fetch, port: 0, hostname: "127.0.0.1" }) as HTTPServer;
    await new Promise<void>((r) => (h.listening ? r() : h.once("listening", () => r())));
  }
  const url = h.listening ? `http://127.0.0.1:${(h.address() as AddressInfo).port}` : await listen(h);
  return { url, effects, done: () => done, last: () => last, close: () => new Promise((r) => { h.closeAllConnections(); h.close(() => r()); }) };
}

/** Sends POST path with key and Content-Length: 61, then only the first sent bytes of the body, and closes the connection. */
function cutRequest(url: string, path: string, key: string, contentType: string, sent: number): Promise<void> {
  const u = new URL(url);
  return new Promise((resolve, reject) => {
    const s = connect(Number(u.port), u.hostname, () => {
      s.write(Buffer.concat([Buffer.from(`POST ${path} HTTP/1.1\r\nHost: x\r\nIdempotency-Key: ${key}\r\nContent-Type: ${contentType}\r\n` +
        `Content-Length: ${cutBody.length}\r\n\r\n`), cutBody.subarray(0, sent)]), () => {
        s.end();
        s.destroy();
        resolve();
      });
    });
    s.on("error", reject);
  });
}

/** Sends a raw request (head lines without the request line's end) and returns the answer's status and body. */
function rawExchange(url: string, head: string, body: string): Promise<{ status: number; body: string }> {
  const u = new URL(url);
  return new Promise((resolve, reject) => {
    const s = connect(Number(u.port), u.hostname, () => {
      s.write(`${head}\r\nHost: x\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`);
    });
    const chunks: Buffer[] = [];
    s.on("data", (d: Buffer) => chunks.push(d));
    s.on("error", reject);
    s.on("close", () => {
      const text = Buffer.concat(chunks).toString("utf8");
      resolve({ status: Number(text.split(" ")[1]), body: text.slice(text.indexOf("\r\n\r\n") + 4) });
    });
  });
}

for (const store of stores()) {
  describe(`cut request bodies and the scope option on ${store}`, () => {
    let srv: Server;
    before(async () => {
      srv = await startServer(store);
    });
    after(async () => {
      await srv.stop();
    });

    for (const kind of ["express", "hono"] as const) {
      // A caller sends Content-Length: 61 and 0 or 10 bytes of the body,
      // then goes away: nothing is claimed (the key does not exist in idem)
      // and the handler does not run; the whole request with the same key
      // then runs once (201). A JSON body and an opaque one.
      test(`${kind}: a request body cut before its Content-Length claims nothing and runs nothing; the whole request then runs once`, async () => {
        const c = new Client({ baseUrl: srv.url, token: srv.token });
        const app = await cutApp(kind, c);
        try {
          for (const [path, ctype, id] of [["/orders/o1/pay", "application/json", "o1"], ["/raw", "application/octet-stream", "raw"]] as const) {
            for (const sent of [0, 10]) {
              const k = `cutbody-${randomUUID()}`;
              const before = app.done();
              await cutRequest(app.url, path, k, ctype, sent);
              await waitFor(() => app.done() > before, `${kind} finished with the cut request`);
              await assert.rejects(c.get(k), (e: Any) => e.code === "key_not_found", `${path} with ${sent} bytes claimed the key`);
              assert.equal(app.effects.get(id), undefined, `${path} with ${sent} bytes ran the handler`);
              // The front door's own refusal (to a caller who is gone), never an error passed to the app.
              assert.equal(app.last().status, 400, app.last().body);
              assert.equal(JSON.parse(app.last().body).code, "invalid_request");
              assert.equal(JSON.parse(app.last().body).detail, "the request body ended before its Content-Length");
              const res = await fetch(app.url + path, { method: "POST", headers: { "Idempotency-Key": k, "Content-Type": ctype }, body: cutBody });
              assert.equal(res.status, 201, await res.text());
              assert.equal(res.headers.get("Idempotent-Replayed"), null);
              assert.equal(app.effects.get(id), 1, "the whole request ran once");
              app.effects.clear();
            }
          }
        } finally {
          await app.close();
        }
      });

      // A scope option that throws (here: on a repeated X-Account-Id, as
      // docs/frontdoor.md rule 3 asks of it) is 400 invalid_key with the
      // error's message as detail; the handler does not run and nothing is
      // claimed, as in client/idemhttp. Before, the error escaped the
      // middleware and the app answered its own 500.
      test(`${kind}: a scope option that throws is 400 invalid_key with its message; nothing runs, nothing is claimed`, async () => {
        const c = new Client({ baseUrl: srv.url, token: srv.token });
        const effects = new Map<string, number>();
        const refuse = "send exactly one X-Account-Id";
        let h: HTTPServer;
        if (kind === "express") {
          const app = express();
          app.use(expressMiddleware({
            client: c, log: () => {},
            scope: (req) => {
              const v = req.headersDistinct["x-account-id"] ?? [];
              if (v.length !== 1) throw new Error(refuse);
              return v[0];
            },
          }));
          app.post("/pay", (_req, res) => {
            effects.set("pay", (effects.get("pay") ?? 0) + 1);
            res.status(201).json({ ok: true });
          });
          app.use((_err: unknown, _req: express.Request, res: express.Response, _next: express.NextFunction) => {
            res.status(500).json({ error: "boom" });
          });
          h = createServer(app);
        } else {
          const app = new Hono();
          const pay = withIdempotency(async () => {
            effects.set("pay", (effects.get("pay") ?? 0) + 1);
            return Response.json({ ok: true }, { status: 201 });
          }, {
            client: c, log: () => {},
            scope: (req: Request) => {
              // The Fetch API joins repeated fields with ", ": a comma is the trace of a second one.
              const v = req.headers.get("X-Account-Id");
              if (v === null || v.includes(",")) throw new Error(refuse);
              return v;
            },
          });
          app.post("/pay", (ctx) => pay(ctx.req.raw));
          app.onError((_err, ctx) => ctx.json({ error: "boom" }, 500));
          h = serve({ fetch: app.fetch, port: 0, hostname: "127.0.0.1" }) as HTTPServer;
          await new Promise<void>((r) => (h.listening ? r() : h.once("listening", () => r())));
        }
        const url = h.listening ? `http://127.0.0.1:${(h.address() as AddressInfo).port}` : await listen(h);
        try {
          const k = `scope-${randomUUID()}`;
          const r = await rawExchange(url, `POST /pay HTTP/1.1\r\nIdempotency-Key: ${k}\r\nContent-Type: application/json\r\n` +
            "X-Account-Id: acct1\r\nX-Account-Id: mallory", "{}");
          assert.equal(r.status, 400, r.body);
          const p = JSON.parse(r.body);
          assert.equal(p.code, "invalid_key");
          assert.equal(p.detail, refuse);
          assert.equal(effects.get("pay"), undefined, "the handler did not run");
          for (const rk of [k, `acct1:${k}`, `mallory:${k}`]) await assert.rejects(c.get(rk), (e: Any) => e.code === "key_not_found");
          const ok = await rawExchange(url, `POST /pay HTTP/1.1\r\nIdempotency-Key: ${k}\r\nContent-Type: application/json\r\nX-Account-Id: acct1`, "{}");
          assert.equal(ok.status, 201, ok.body);
          assert.equal(effects.get("pay"), 1);
        } finally {
          await new Promise<void>((r) => { h.closeAllConnections(); h.close(() => r()); });
        }
      });
    }
  });
}

for (const store of stores()) {
  // docs/frontdoor.md rule 8, in a real Express app: a handler that charges
  // and throws leaves its claim to run out (lease 1 s); idem's real
  // completer takes the key over and the resume endpoint answers "unknown,
  // ask again in 120 s" (or, for the other key, "needs a person"). The
  // caller's retry is 409 request_in_flight, retryable, with idem's
  // Retry-After — or 409 outcome_review, not retryable, without
  // Retry-After — and the handler does not run again; the completer keeps
  // the key. Before, both were the retryable 503 store_unavailable.
  describe(`a key idem's completer holds on ${store}`, () => {
    let srv: Server;
    let endpoint: HTTPServer;
    const calls = new Map<string, number>();
    before(async () => {
      srv = await startServer(store, {}, {
        IDEM_WEBHOOK_ALLOW_PRIVATE: "1", IDEM_COMPLETER_INTERVAL: "100ms",
        IDEM_COMPLETER_BACKOFF_BASE: "50ms", IDEM_COMPLETER_BACKOFF_CAP: "200ms",
      });
      // A resume endpoint that never resumes a key: "review" for a key whose name has it, else unknown for 120 s.
      endpoint = createServer((req, res) => {
        let raw = "";
        req.on("data", (c) => (raw += c));
        req.on("end", () => {
          const key = (JSON.parse(raw) as { key: string }).key;
          calls.set(key, (calls.get(key) ?? 0) + 1);
          const answer = key.includes("review") ? { outcome: "review", note: "the provider cannot say" } : { outcome: "unknown", retry_after_seconds: 120 };
          res.writeHead(200, { "Content-Type": "application/json" }).end(JSON.stringify(answer));
        });
      });
      const url = await listen(endpoint);
      const res = await fetch(`${srv.url}/v1/completers`, {
        method: "POST",
        headers: { Authorization: `Bearer ${srv.mint("t1", "tenant:admin")}`, "Content-Type": "application/json" },
        body: JSON.stringify({ url: `${url}/resume` }),
      });
      assert.equal(res.status, 201, await res.text());
    });
    after(async () => {
      await new Promise((r) => endpoint.close(r));
      await srv.stop();
    });
    const record = async (key: string): Promise<Any> => {
      const res = await fetch(`${srv.url}/v1/keys/${key}`, { headers: { Authorization: `Bearer ${srv.token}` } });
      assert.equal(res.status, 200);
      return res.json();
    };
    const waitHeld = async (key: string, state: string): Promise<Any> => {
      for (const end = Date.now() + 30_000; Date.now() < end; await sleep(20)) {
        const rec = await record(key);
        if (rec.completer?.state === state) return rec;
      }
      assert.fail(`the completer never held ${key} in state ${state}`);
    };

    test("express: 409 request_in_flight with idem's Retry-After, then 409 outcome_review; the handler never runs again", async () => {
      let charges = 0;
      const app = express();
      app.use(expressMiddleware({ client: new Client({ baseUrl: srv.url, token: srv.token }), leaseSeconds: 1, log: () => {} }));
      app.post("/charge", () => {
        charges++;
        throw new Error("the worker died after the charge");
      });
      app.use(expressErrorHandler());
      app.use((_err: unknown, _req: express.Request, res: express.Response, _next: express.NextFunction) => {
        res.status(500).end();
      });
      const server = createServer(app);
      const url = await listen(server);
      try {
        const id = randomUUID();
        const unknown = `held-unknown-${id}`;
        const review = `held-review-${id}`;
        for (const key of [unknown, review]) assert.equal((await post(`${url}/charge`, key, {})).status, 500);
        assert.equal(charges, 2);

        const held = await waitHeld(unknown, "unknown");
        for (let i = 0; i < 2; i++) {
          const got = await post(`${url}/charge`, unknown, {});
          assert.equal(got.status, 409, got.text);
          assert.equal(got.headers.get("Content-Type"), "application/problem+json");
          const p = JSON.parse(got.text);
          assert.deepEqual([p.code, p.retryable, p.detail], ["request_in_flight", true, outcomeUnknownDetail]);
          const ra = Number(got.headers.get("Retry-After"));
          assert.ok(ra >= 100 && ra <= 120, `Retry-After is idem's, the next completer attempt in 120 s: ${ra}`);
        }

        await waitHeld(review, "review");
        for (let i = 0; i < 2; i++) {
          const got = await post(`${url}/charge`, review, {});
          assert.equal(got.status, 409, got.text);
          const p = JSON.parse(got.text);
          assert.deepEqual([p.code, p.title, p.retryable, p.detail], ["outcome_review", "Outcome under review", false, outcomeReviewDetail]);
          assert.equal(got.headers.get("Retry-After"), null);
        }
        assert.equal(charges, 2, "the handler did not run again");
        const later = await record(unknown);
        assert.equal(later.completer.state, "unknown", "the completer still holds it");
        assert.equal(later.fencing_token, held.fencing_token, "no retry took it over");
        assert.equal(calls.get(unknown), 1, "the retries made no completer attempt");
      } finally {
        await new Promise((r) => server.close(r));
      }
    });
  });
}
