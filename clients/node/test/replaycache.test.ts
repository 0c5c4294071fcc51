// The front door's replay cache (docs/frontdoor.md, "The replay cache"): a
// real Express app and a real Hono app (on @hono/node-server) in front of
// the real idem binary, on both stores. The claims that reach idem are
// counted at the front door's client (its onAttempt hook).
import { serve } from "@hono/node-server";
import express from "express";
import { Hono } from "hono";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { createServer, type Server as HTTPServer } from "node:http";
import { connect, type AddressInfo } from "node:net";
import { after, before, describe, test } from "node:test";
import { Client, ReplayCache, StoredResponse, expressErrorHandler, expressMiddleware, headerNotReplayable, withIdempotency, type ReplayCacheOptions } from "../src/index.js";
import { startServer, stores, type Server } from "./server.js";

interface App {
  url: string;
  /** Handler runs per order id. */
  effects: Map<string, number>;
  /** Claims the front door's client sent. */
  claims: () => number;
  close(): Promise<void>;
}

interface AppOptions {
  replayCache?: ReplayCacheOptions;
  /** Scope keys by the X-Account header. */
  scoped?: boolean;
}

/** A response body over a 16th of a 16 KiB cache. */
const BIG_PAD = 2000;

function counted(srv: Server, token: string): { client: Client; claims: () => number } {
  let n = 0;
  const client = new Client({ baseUrl: srv.url, token, onAttempt: (info) => {
    if (info.call === "claim") n++;
  } });
  return { client, claims: () => n };
}

function listen(srv: HTTPServer): Promise<string> {
  return new Promise((r) => srv.listen(0, "127.0.0.1", () => r(`http://127.0.0.1:${(srv.address() as AddressInfo).port}`)));
}

async function expressApp(srv: Server, token: string, o: AppOptions): Promise<App> {
  const { client, claims } = counted(srv, token);
  const effects = new Map<string, number>();
  const app = express();
  app.use(expressMiddleware({
    client, log: () => {}, ...(o.replayCache ? { replayCache: o.replayCache } : {}),
    ...(o.scoped ? { scope: (req) => String(req.headers["x-account"] ?? "") } : {}),
  }));
  app.post("/orders/:id/pay", (req, res) => {
    const id = req.params.id;
    const n = (effects.get(id) ?? 0) + 1;
    effects.set(id, n);
    res.status(201).set("Location", `/orders/${id}`).set("Set-Cookie", "s=1").json({ order: id, run: n, account: req.headers["x-account"] ?? "" });
  });
  app.post("/big/:id", (req, res) => {
    effects.set(req.params.id, (effects.get(req.params.id) ?? 0) + 1);
    res.status(201).json({ pad: "x".repeat(BIG_PAD) });
  });
  app.use(expressErrorHandler());
  const server = createServer(app);
  const url = await listen(server);
  return { url, effects, claims, close: () => new Promise((r) => server.close(() => r())) };
}

async function honoApp(srv: Server, token: string, o: AppOptions): Promise<App> {
  const { client, claims } = counted(srv, token);
  const effects = new Map<string, number>();
  const app = new Hono();
  const opts = { client, log: () => {}, ...(o.replayCache ? { replayCache: o.replayCache } : {}),
    ...(o.scoped ? { scope: (req: Request) => req.headers.get("X-Account") ?? "" } : {}) };
  const pay = withIdempotency(async (req: Request, id: string) => {
    const n = (effects.get(id) ?? 0) + 1;
    effects.set(id, n);
    return Response.json({ order: id, run: n, account: req.headers.get("X-Account") ?? "" },
      { status: 201, headers: { Location: `/orders/${id}`, "Set-Cookie": "s=1" } });
  }, { ...opts, route: () => "/orders/:id/pay" });
  app.post("/orders/:id/pay", (c) => pay(c.req.raw, c.req.param("id")));
  const big = withIdempotency(async (_req: Request, id: string) => {
    effects.set(id, (effects.get(id) ?? 0) + 1);
    return Response.json({ pad: "x".repeat(BIG_PAD) }, { status: 201 });
  }, { ...opts, route: () => "/big/:id" });
  app.post("/big/:id", (c) => big(c.req.raw, c.req.param("id")));
  const server = serve({ fetch: app.fetch, port: 0, hostname: "127.0.0.1" }) as HTTPServer;
  await new Promise<void>((r) => (server.listening ? r() : server.once("listening", () => r())));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return { url, effects, claims, close: () => new Promise((r) => server.close(() => r())) };
}

/** POSTs body over a connection of its own; the answer's bytes as they came, less the Date line. */
function raw(url: string, path: string, key: string, body: string): Promise<string> {
  const u = new URL(url);
  return new Promise((resolve, reject) => {
    const s = connect(Number(u.port), u.hostname, () => {
      s.write(`POST ${path} HTTP/1.1\r\nHost: x\r\nIdempotency-Key: ${key}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`);
    });
    const chunks: Buffer[] = [];
    s.on("data", (c) => chunks.push(c));
    s.on("error", reject);
    s.on("close", () => resolve(Buffer.concat(chunks).toString("latin1").replace(/^date: [^\r\n]*\r\n/gim, "")));
  });
}

const statusOf = (answer: string) => Number(answer.split(" ", 2)[1]);
const isReplayed = (answer: string) => /^idempotent-replayed: true\r$/im.test(answer.split("\r\n\r\n", 1)[0] + "\r");

async function post(url: string, key: string, extra: Record<string, string> = {}) {
  const res = await fetch(url, { method: "POST", headers: { "Content-Type": "application/json", "Idempotency-Key": key, ...extra }, body: '{"amount":1}' });
  return { status: res.status, headers: res.headers, text: await res.text() };
}

for (const store of stores()) {
  describe(`replay cache on ${store}`, () => {
    let srv: Server;
    before(async () => {
      srv = await startServer(store);
    });
    after(async () => {
      await srv.stop();
    });
    const adminPatch = async (tenant: string, patch: unknown) => {
      const res = await fetch(`${srv.url}/v1/admin/tenants/${tenant}`, {
        method: "PATCH",
        headers: { Authorization: `Bearer ${srv.mint("", "admin")}`, "Content-Type": "application/json" },
        body: JSON.stringify(patch),
      });
      assert.equal(res.status, 200, await res.text());
    };
    /** A fresh tenant and a keys:write token of it. */
    const ownTenant = (settings: Record<string, number> = {}): [string, string] => {
      const tenant = `rc-${randomUUID().slice(0, 8)}`;
      srv.createTenant(tenant, settings);
      return [tenant, srv.mint(tenant, "keys:write keys:read")];
    };

    for (const [name, make] of [["express", expressApp], ["hono", honoApp]] as const) {
      // A replay idem answered is answered again from the cache, byte for
      // byte idem's replay (status, headers, body, Idempotent-Replayed),
      // without a claim; another body or path with the key is idem's 422
      // and the entry stays for its own request; the handler ran once.
      // Off, every replay is a claim. Without the cache the second replay
      // was a claim; without the fingerprint match the 422 was the first
      // request's answer.
      for (const off of [false, true]) {
        test(`${name}: a cached replay is byte for byte idem's, another fingerprint is idem's 422 (off=${off})`, async () => {
          const app = await make(srv, srv.token, { replayCache: { off } });
          try {
            const key = `cache-${randomUUID()}`;
            const first = await raw(app.url, "/orders/o1/pay", key, '{"amount":1}');
            assert.equal(statusOf(first), 201, first);
            const fromIdem = await raw(app.url, "/orders/o1/pay", key, '{"amount":1}');
            assert.ok(isReplayed(fromIdem), fromIdem);
            assert.equal(app.claims(), 2, "the first replay is idem's");

            let again = await raw(app.url, "/orders/o1/pay", key, '{"amount":1}');
            assert.equal(again, fromIdem, "a cached replay is byte for byte idem's");
            let want = off ? 3 : 2;
            assert.equal(app.claims(), want, `off=${off}: a cached replay makes no claim`);

            for (const [path, body] of [["/orders/o1/pay", '{"amount":2}'], ["/orders/o2/pay", '{"amount":1}']]) {
              const other = await raw(app.url, path!, key, body!);
              assert.equal(statusOf(other), 422, other);
              assert.match(other, /"code": ?"fingerprint_mismatch"/);
            }
            want += 2;
            assert.equal(app.claims(), want, "another fingerprint goes to idem");

            again = await raw(app.url, "/orders/o1/pay", key, '{"amount":1}');
            assert.equal(again, fromIdem);
            assert.equal(app.claims(), want + (off ? 1 : 0), "the entry stays for its own request");
            assert.equal(app.effects.get("o1"), 1, "the handler ran once");
          } finally {
            await app.close();
          }
        });
      }

      // One key under two scopes is two records: each scope's replays,
      // cached or not, are its own run's answer; a front door of another
      // tenant with the same key runs its own handler. A cache keyed by the
      // caller's key alone answered scope b with scope a's run.
      test(`${name}: never shared across scopes or tenants`, async () => {
        const app = await make(srv, srv.token, { scoped: true, replayCache: { maxAgeSeconds: 60 } });
        const [, token2] = ownTenant();
        const other = await make(srv, token2, { scoped: true, replayCache: { maxAgeSeconds: 60 } });
        try {
          const key = `scoped-${randomUUID()}`;
          const url = `${app.url}/orders/o1/pay`;
          const a = await post(url, key, { "X-Account": "a" });
          assert.equal(a.status, 201, a.text);
          assert.equal((await post(url, key, { "X-Account": "a" })).headers.get("Idempotent-Replayed"), "true");
          const before = app.claims();
          assert.equal((await post(url, key, { "X-Account": "a" })).text, a.text);
          assert.equal(app.claims(), before, "scope a's replay is cached");

          const b = await post(url, key, { "X-Account": "b" });
          assert.equal(b.status, 201, b.text);
          assert.equal(b.headers.get("Idempotent-Replayed"), null, "scope b ran its own request");
          assert.notEqual(b.text, a.text);
          for (let i = 0; i < 2; i++) {
            assert.equal((await post(url, key, { "X-Account": "b" })).text, b.text);
            assert.equal((await post(url, key, { "X-Account": "a" })).text, a.text);
          }
          assert.equal(app.effects.get("o1"), 2);

          const t2 = await post(`${other.url}/orders/o1/pay`, key, { "X-Account": "a" });
          assert.equal(t2.status, 201, t2.text);
          assert.equal(t2.headers.get("Idempotent-Replayed"), null);
          assert.equal(other.effects.get("o1"), 1, "another tenant's front door ran its own handler");
        } finally {
          await app.close();
          await other.close();
        }
      });

      // An entry is served no longer than maxAgeSeconds from the claim that
      // brought it: every replay answered without a claim was sent within
      // that of the answer that brought the entry, and later a replay is a
      // claim again. An entry that ignored its max age (the record's
      // window is a day) was served for the whole test.
      test(`${name}: an entry ends at its max age`, async () => {
        const maxAge = 1.5;
        const app = await make(srv, srv.token, { replayCache: { maxAgeSeconds: maxAge } });
        try {
          const key = `age-${randomUUID()}`;
          const url = `${app.url}/orders/o1/pay`;
          await post(url, key);
          await post(url, key);
          const brought = performance.now(); // the entry's life began before
          let hits = 0;
          const deadline = Date.now() + 30_000;
          for (;;) {
            assert.ok(Date.now() < deadline, "the entry was never dropped");
            const before = app.claims();
            const sent = performance.now();
            const r = await post(url, key);
            assert.equal(r.headers.get("Idempotent-Replayed"), "true", r.text);
            if (app.claims() > before) break;
            hits++;
            assert.ok(sent < brought + maxAge * 1000, `a cached replay ${(sent - brought).toFixed(0)} ms after the claim`);
          }
          assert.ok(hits > 0, "the entry was served within its max age");
          assert.equal(app.effects.get("o1"), 1);
        } finally {
          await app.close();
        }
      });

      // With a replay window of 3 s and a max age of a minute, a cached
      // replay is served no later than the record's replay_until (on the
      // server's clock, a second early); once the window is over the
      // request runs again, as without a cache.
      test(`${name}: an entry ends at the record's replay_until`, async () => {
        const [, token] = ownTenant({ "replay-window-seconds": 3 });
        const app = await make(srv, token, { replayCache: { maxAgeSeconds: 60 } });
        try {
          const key = `window-${randomUUID()}`;
          const url = `${app.url}/orders/o1/pay`;
          const first = await post(url, key);
          assert.equal(first.status, 201, first.text);
          const rec = await new Client({ baseUrl: srv.url, token }).get(key);
          const until = Date.parse(rec.replay_until!);
          let replays = 0;
          const deadline = Date.now() + 30_000;
          while (app.effects.get("o1") === 1) {
            assert.ok(Date.now() < deadline, `the request never ran again after replay_until ${rec.replay_until}`);
            const sent = Date.now();
            const got = await post(url, key);
            assert.equal(got.status, 201, got.text);
            if (got.headers.get("Idempotent-Replayed") === "true") {
              replays++;
              assert.equal(got.text, first.text);
              assert.ok(sent < until, `a replay of a request sent at ${sent}, after replay_until ${rec.replay_until}`);
            }
          }
          assert.ok(replays > 0, "the key was replayed within its window");
          assert.equal(app.effects.get("o1"), 2, "once more after the window, once only");
        } finally {
          await app.close();
        }
      });

      // The tenant disabled, a key the cache holds is replayed for at most
      // its max age from the claim that brought it, then refused 403
      // tenant_unknown as idem refuses it; enabled again, it replays.
      test(`${name}: a disabled tenant's key is not served past the max age`, async () => {
        const [tenant, token] = ownTenant();
        const maxAge = 1.5;
        const app = await make(srv, token, { replayCache: { maxAgeSeconds: maxAge } });
        try {
          const key = `disabled-${randomUUID()}`;
          const url = `${app.url}/orders/o1/pay`;
          await post(url, key);
          assert.equal((await post(url, key)).headers.get("Idempotent-Replayed"), "true");
          const brought = performance.now();
          await adminPatch(tenant, { disabled: true });
          const deadline = Date.now() + 30_000;
          for (;;) {
            assert.ok(Date.now() < deadline, "the disabled tenant's key was replayed for 30 s");
            const sent = performance.now();
            const r = await post(url, key);
            if (r.status === 403) {
              assert.equal(JSON.parse(r.text).code, "tenant_unknown");
              break;
            }
            assert.equal(r.headers.get("Idempotent-Replayed"), "true", r.text);
            assert.ok(sent < brought + maxAge * 1000, `a disabled tenant's key replayed ${(sent - brought).toFixed(0)} ms after the claim`);
          }
          await adminPatch(tenant, { disabled: false });
          assert.equal((await post(url, key)).headers.get("Idempotent-Replayed"), "true");
          assert.equal(app.effects.get("o1"), 1);
        } finally {
          await app.close();
        }
      });

      // The tenant disabled, the first request the cache cannot answer is
      // refused 403 tenant_unknown by idem, and that drops the cache: the
      // completed key is refused too (with a max age of a minute).
      test(`${name}: the cache is dropped when idem refuses the tenant`, async () => {
        const [tenant, token] = ownTenant();
        const app = await make(srv, token, { replayCache: { maxAgeSeconds: 60 } });
        try {
          const key = `kept-${randomUUID()}`;
          const url = `${app.url}/orders/o1/pay`;
          await post(url, key);
          assert.equal((await post(url, key)).headers.get("Idempotent-Replayed"), "true");
          await adminPatch(tenant, { disabled: true });
          for (const k of [`other-${randomUUID()}`, key]) {
            const r = await post(url, k);
            assert.equal(r.status, 403, r.text);
            assert.equal(JSON.parse(r.text).code, "tenant_unknown");
          }
          await adminPatch(tenant, { disabled: false });
          const again = await post(url, key);
          assert.equal(again.headers.get("Idempotent-Replayed"), "true", again.text);
          assert.equal(app.effects.get("o1"), 1);
        } finally {
          await app.close();
        }
      });

      // With room for two entries the third key's replay evicts the least
      // recently used, whose next replay is a claim again; an answer over a
      // 16th of maxBytes is never cached.
      test(`${name}: the cache's bounds hold`, async () => {
        const app = await make(srv, srv.token, { replayCache: { maxEntries: 2, maxBytes: 16384, maxAgeSeconds: 60 } });
        try {
          const id = randomUUID();
          const replay = async (k: string, wantClaim: boolean, path = "/orders/o1/pay") => {
            const before = app.claims();
            const got = await post(app.url + path, `${k}-${id}`);
            assert.equal(got.headers.get("Idempotent-Replayed"), "true", `${k}: ${got.status} ${got.text}`);
            assert.equal(app.claims() > before, wantClaim, `${k}: claimed in idem`);
          };
          for (const k of ["a", "b", "c"]) await post(`${app.url}/orders/o1/pay`, `${k}-${id}`);
          await replay("a", true);
          await replay("b", true);
          await replay("a", false);
          await replay("c", true); // evicts b
          await replay("a", false);
          await replay("c", false);
          await replay("b", true);

          assert.equal((await post(`${app.url}/big/b1`, `big-${id}`)).status, 201);
          await replay("big", true, "/big/b1");
          await replay("big", true, "/big/b1");
        } finally {
          await app.close();
        }
      });
    }
  });
}

// The cache itself, on a clock of its own: the byte bound evicts the least
// recently used, an entry over a 16th of maxBytes is not kept, one marked
// not replayable is never kept, a lookup with another operation or
// document misses without dropping the entry, and an entry ends at its until.
test("replay cache bounds (unit)", () => {
  let now = 0;
  const c = new ReplayCache({ maxBytes: 16 * 300, maxAgeSeconds: 60 }, () => now);
  const resp = new StoredResponse(201, { "Content-Type": "application/json" }, "x".repeat(100));
  for (let i = 0; i < 40; i++) {
    c.put(`k${i}`, "POST /a", "d", resp, 10_000);
    assert.ok(c.stats().bytes <= 16 * 300);
  }
  const s = c.stats();
  assert.ok(s.evictions > 0 && s.entries > 0 && s.entries < 40, JSON.stringify(s));
  assert.equal(c.get("k0", "POST /a", "d"), undefined);
  assert.equal(c.get("k39", "POST /a", "d")?.status, 201);
  c.put("huge", "POST /a", "d", new StoredResponse(201, {}, "x".repeat(300)), 10_000);
  assert.equal(c.get("huge", "POST /a", "d"), undefined);
  c.put("nr", "POST /a", "d", new StoredResponse(201, { [headerNotReplayable]: "too large" }), 10_000);
  assert.equal(c.get("nr", "POST /a", "d"), undefined);
  assert.equal(c.get("k39", "POST /b", "d"), undefined);
  assert.equal(c.get("k39", "POST /a", "e"), undefined);
  assert.equal(c.get("k39", "POST /a", "d")?.status, 201, "a mismatch leaves the entry");
  now = 10_000;
  assert.equal(c.get("k39", "POST /a", "d"), undefined, "an entry ends at its until");
});
