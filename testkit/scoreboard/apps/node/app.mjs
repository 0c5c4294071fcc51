// The scoreboard's Node apps: one counting endpoint, the conformance kit's
// target contract (conformance/kit.go), wrapped in one Idempotency-Key
// implementation as its README wires it.
//
//   SB_IMPL=idem-express               Express 5 + idem's expressMiddleware on the routes
//   SB_IMPL=idem-fetch                 Hono on @hono/node-server + idem's withIdempotency
//   SB_IMPL=express-idempotency        Express 4 + express-idempotency (in-memory data adapter)
//   SB_IMPL=node-idempotency-nestjs    NestJS 10 (Express platform) + @node-idempotency/nestjs (memory storage)
//
// The endpoint: POST /orders and /orders/:id perform one side effect (a
// counter, after ?delay_ms=N) and answer 201 (or ?status=N) with
// {"order": N, "echo": <the JSON body or null>}, Location and ETag (and
// Set-Cookie for idem's front doors, as the reference upstream); GET /count
// answers {"count": N}. SB_EXPIRY_SECONDS, when set, is the key expiry given
// to an implementation that has one. IDEM_URL and IDEM_TOKEN reach idem for
// idem's front doors.
//
// idem's front doors load the SDK from the tree (clients/node/dist) and the
// frameworks from clients/node/node_modules; the other implementations are
// loaded from SB_NODE_MODULES, the directory scripts/scoreboard installed
// them into (none of their code is part of this repository).
//
// It prints one line on stdout, `SB_LISTENING http://127.0.0.1:PORT <name>@<version>`;
// everything else goes to stderr.
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

console.log = console.info = console.debug = console.error;

const env = process.env;
const impl = env.SB_IMPL ?? "";
const expiry = Number(env.SB_EXPIRY_SECONDS || 0);
const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..", "..", "..");
const nodeClient = join(repoRoot, "clients", "node");
const requireTree = createRequire(join(nodeClient, "package.json"));
const requireOutside = env.SB_NODE_MODULES ? createRequire(join(env.SB_NODE_MODULES, "package.json")) : null;

function fail(msg) {
  process.stderr.write(`app.mjs: ${msg}\n`);
  process.exit(2);
}

const [host, port] = (() => {
  const a = env.SB_ADDR || "127.0.0.1:0";
  const i = a.lastIndexOf(":");
  return [a.slice(0, i), Number(a.slice(i + 1))];
})();

function versionOf(name) {
  if (!requireOutside) fail("SB_NODE_MODULES is not set");
  const pkg = JSON.parse(readFileSync(join(env.SB_NODE_MODULES, "node_modules", name, "package.json"), "utf8"));
  return `${name}@${pkg.version}`;
}

function announce(p, version) {
  process.stdout.write(`SB_LISTENING http://127.0.0.1:${p} ${version}\n`);
}

let count = 0;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** The side effect and its answer, after the delay the query asks for. */
async function order(rawBody, query) {
  const delay = Math.min(Number(query.get("delay_ms") || 0) || 0, 60000);
  if (delay > 0) await sleep(delay);
  const n = ++count;
  let status = Number(query.get("status") || 201);
  if (!Number.isInteger(status) || status < 200 || status > 599) status = 201;
  let echo = null;
  try {
    echo = rawBody && rawBody.length ? JSON.parse(rawBody.toString("utf8")) : null;
  } catch {
    echo = null;
  }
  const headers = { "Content-Type": "application/json", Location: `/orders/${n}`, ETag: `"order-${n}"` };
  if (impl.startsWith("idem-")) headers["Set-Cookie"] = `session=order-${n}`;
  return { status, headers, body: { order: n, echo } };
}

function queryOf(req) {
  return new URL(req.originalUrl ?? req.url, "http://x").searchParams;
}

// ---------------------------------------------------------------- idem

async function idemClient() {
  const sdk = await import(pathToFileURL(join(nodeClient, "dist", "index.js")).href);
  for (const k of ["IDEM_URL", "IDEM_TOKEN"]) if (!env[k]) fail(`missing environment: ${k}`);
  return { sdk, client: new sdk.Client({ baseUrl: env.IDEM_URL, token: env.IDEM_TOKEN }) };
}

async function idemExpress() {
  const { sdk, client } = await idemClient();
  const express = requireTree("express");
  const app = express();
  app.set("x-powered-by", false);
  const mw = sdk.expressMiddleware({ client });
  const handler = async (req, res) => {
    const a = await order(req.rawBody ?? Buffer.alloc(0), queryOf(req));
    res.status(a.status).set(a.headers).send(Buffer.from(JSON.stringify(a.body)));
  };
  app.post(["/orders", "/orders/:id"], mw, handler);
  app.get("/count", (_req, res) => res.json({ count }));
  app.use(sdk.expressErrorHandler());
  const srv = app.listen(port, host, () => announce(srv.address().port, "idem-express@tree"));
}

async function idemFetch() {
  const { sdk, client } = await idemClient();
  const { Hono } = requireTree("hono");
  const { serve } = requireTree("@hono/node-server");
  const app = new Hono();
  const handler = sdk.withIdempotency(async (req) => {
    const a = await order(Buffer.from(await req.arrayBuffer()), new URL(req.url).searchParams);
    return new Response(JSON.stringify(a.body), { status: a.status, headers: a.headers });
  }, { client, route: (_req, c) => c.req.routePath });
  app.post("/orders", (c) => handler(c.req.raw, c));
  app.post("/orders/:id", (c) => handler(c.req.raw, c));
  app.get("/count", (c) => c.json({ count }));
  serve({ fetch: app.fetch, port, hostname: host }, (info) => announce(info.port, "idem-fetch@tree"));
}

// ---------------------------------------------------------------- outside

function expressIdempotency() {
  const express = requireOutside("express");
  const idempotency = requireOutside("express-idempotency");
  const app = express();
  app.use(express.json());
  app.post("*", idempotency.idempotency());
  const handler = async (req, res) => {
    if (idempotency.getSharedIdempotencyService().isHit(req)) return;
    const a = await order(req.body === undefined ? null : Buffer.from(JSON.stringify(req.body)), queryOf(req));
    res.status(a.status).set(a.headers).send(JSON.stringify(a.body));
  };
  app.post(["/orders", "/orders/:id"], handler);
  app.get("/count", (_req, res) => res.json({ count }));
  const srv = app.listen(port, host, () => announce(srv.address().port, versionOf("express-idempotency")));
}

async function nestjs() {
  requireOutside("reflect-metadata");
  const { Module, Controller, Post, Get, Req, Res } = requireOutside("@nestjs/common");
  const { NestFactory } = requireOutside("@nestjs/core");
  const { NodeIdempotencyModule, Idempotent, StorageAdapterEnum } = requireOutside("@node-idempotency/nestjs");
  // Plain JavaScript: the decorators a TypeScript controller would carry,
  // applied by hand.
  class Orders {
    async create(req, res) {
      const a = await order(req.body === undefined ? null : Buffer.from(JSON.stringify(req.body)), queryOf(req));
      res.status(a.status);
      for (const [h, v] of Object.entries(a.headers)) res.setHeader(h, v);
      return a.body;
    }
    count() {
      return { count };
    }
  }
  const method = (name, decorators) => Reflect.decorate(decorators, Orders.prototype, name, Object.getOwnPropertyDescriptor(Orders.prototype, name));
  Req()(Orders.prototype, "create", 0);
  Res({ passthrough: true })(Orders.prototype, "create", 1);
  method("create", [Post(["orders", "orders/:id"]), Idempotent()]);
  method("count", [Get("count")]);
  Reflect.decorate([Controller()], Orders);
  class AppModule {}
  const options = { storage: { adapter: StorageAdapterEnum.memory }, ...(expiry ? { cacheTTLMS: expiry * 1000 } : {}) };
  Reflect.decorate([Module({ imports: [NodeIdempotencyModule.forRootAsync(options)], controllers: [Orders] })], AppModule);
  const app = await NestFactory.create(AppModule, { logger: ["error"] });
  await app.listen(port, host);
  announce(app.getHttpServer().address().port, versionOf("@node-idempotency/nestjs"));
}

switch (impl) {
  case "idem-express": await idemExpress(); break;
  case "idem-fetch": await idemFetch(); break;
  case "express-idempotency": expressIdempotency(); break;
  case "node-idempotency-nestjs": await nestjs(); break;
  default: fail(`SB_IMPL must be idem-express, idem-fetch, express-idempotency or node-idempotency-nestjs, not ${JSON.stringify(impl)}`);
}
