// The faultcheck app of the Node front doors (testkit/faultcheck/PROTOCOL.md).
//
// The counting handler of the protocol, wrapped in idem's own middleware as a
// user wires it:
//
//   FC_FRONTDOOR=express  an Express 5 app with expressMiddleware (and expressErrorHandler)
//   FC_FRONTDOOR=fetch    a Hono app on @hono/node-server with withIdempotency around the handler
//
// Plain ESM, no build step. The SDK is the repository's built
// clients/node/dist (so the SDK under test is the one in the tree), the
// frameworks those of clients/node/node_modules; FC_REPO_ROOT names another
// checkout (default: the one this file is in).
//
//   FC_FRONTDOOR=express FC_ADDR=127.0.0.1:0 FC_LOG=/tmp/fc.jsonl IDEM_URL=http://127.0.0.1:8080 IDEM_TOKEN=... \
//     node testkit/faultcheck/apps/node/fcapp.mjs
//
// It prints exactly one line on stdout, `FC_LISTENING http://127.0.0.1:PORT`;
// everything else goes to stderr. The token is never logged.
import { createHash } from "node:crypto";
import { appendFileSync, openSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

// stdout carries the listening line and nothing else: whatever a library
// prints with console.log goes to stderr.
console.log = console.info = console.debug = console.error;

const repoRoot = process.env.FC_REPO_ROOT || resolve(dirname(fileURLToPath(import.meta.url)), "..", "..", "..", "..");
const nodeClient = join(repoRoot, "clients", "node");
const requireFramework = createRequire(join(nodeClient, "package.json"));
const { Client, expressErrorHandler, expressMiddleware, withIdempotency } = await import(pathToFileURL(join(nodeClient, "dist", "index.js")).href);

function fail(msg) {
  process.stderr.write(`fcapp: ${msg}\n`);
  process.exit(2);
}

const env = process.env;
const frontdoor = env.FC_FRONTDOOR ?? "";
if (frontdoor !== "express" && frontdoor !== "fetch") fail(`FC_FRONTDOOR must be express or fetch, not ${JSON.stringify(frontdoor)}`);
for (const k of ["FC_LOG", "IDEM_URL", "IDEM_TOKEN"]) if (!env[k]) fail(`missing environment: ${k}`);
const addr = env.FC_ADDR || "127.0.0.1:0";
const cut = addr.lastIndexOf(":");
const host = addr.slice(0, cut) || "127.0.0.1";
const port = Number(addr.slice(cut + 1));
const scopeHeader = env.FC_SCOPE_HEADER ? env.FC_SCOPE_HEADER.toLowerCase() : "";
const storeServerErrors = env.FC_RELEASE_5XX !== "1";
const client = new Client({ baseUrl: env.IDEM_URL, token: env.IDEM_TOKEN });

// The side-effect log: one JSON object per line, each line one write(2)
// on an O_APPEND descriptor (synchronous: the line is in the file before the
// handler goes on, so a run killed right after its start line still left it).
const logFd = openSync(env.FC_LOG, "a");
let runs = 0;

function record(rec) {
  appendFileSync(logFd, JSON.stringify(rec) + "\n");
}

class BadMode extends Error {}

function count(s, min) {
  if (!/^\d+$/.test(s)) throw new BadMode(s);
  const n = Number(s);
  if (n < min) throw new BadMode(s);
  return n;
}

function parseMode(mode) {
  const p = mode.split(":");
  if (p.length === 1 && p[0] === "ok") return { kind: "ok", status: 201 };
  if (p.length === 1 && p[0] === "raise") return { kind: "raise" };
  if (p.length === 2 && p[0] === "slow") return { kind: "slow", status: 201, ms: count(p[1], 0) };
  if (p.length === 2 && p[0] === "status") {
    const n = count(p[1], 200); // as the Go app: no 1xx, which are not final answers
    if (n > 999) throw new BadMode(mode);
    return { kind: "status", status: n };
  }
  if (p.length === 3 && p[0] === "stream") return { kind: "stream", status: 200, chunks: count(p[1], 1), ms: count(p[2], 0) };
  if (p.length === 2 && p[0] === "cutstream") return { kind: "cutstream", status: 200, chunks: count(p[1], 1), ms: 20 };
  throw new BadMode(mode);
}

/** body cut into n pieces of (nearly) equal length, in order. */
function pieces(body, n) {
  const out = [];
  for (let i = 0; i < n; i++) out.push(body.subarray(Math.floor((i * body.length) / n), Math.floor(((i + 1) * body.length) / n)));
  return out;
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Waits ms; resolves true at once when signal aborts (the caller is gone), false after the wait. */
function pause(ms, signal) {
  if (signal.aborted) return Promise.resolve(true);
  return new Promise((r) => {
    const done = (cancelled) => {
      clearTimeout(timer);
      signal.removeEventListener("abort", onAbort);
      r(cancelled);
    };
    const onAbort = () => done(true);
    const timer = setTimeout(() => done(false), ms);
    signal.addEventListener("abort", onAbort);
  });
}

class HandlerRaised extends Error {}

/**
 * The app's answer to a handler exception (its error handler's, after the
 * middleware, which stores nothing for it): RFC 9457, as every error answer
 * of a careful app, so that the checker can hold every refusal to
 * problem+json.
 */
const problem500 = JSON.stringify({ type: "about:blank", title: "Internal Server Error", status: 500, detail: "the handler raised" });

/**
 * One invocation of the counting handler: writes its start line when made,
 * its end line when end() is called (after the last byte was handed to the
 * framework), an abort line otherwise.
 */
class Run {
  constructor(key, scope, raw) {
    this.id = `${process.pid}-${++runs}`;
    this.scope = scope;
    this.req = this.modeText = this.pad = "";
    this.badBody = false;
    try {
      const doc = JSON.parse(raw.toString("utf8"));
      if (doc === null || typeof doc !== "object" || Array.isArray(doc)) throw new Error("not an object");
      this.req = String(doc.req ?? "");
      this.modeText = String(doc.mode ?? "");
      this.pad = String(doc.pad ?? "");
    } catch {
      this.badBody = true;
    }
    record({ ev: "start", run: this.id, key, scope, req: this.req, mode: this.modeText, t: Date.now() });
    this.body = Buffer.from(JSON.stringify({ run: this.id, req: this.req, scope, pad: this.pad }));
  }

  mode() {
    if (this.badBody) throw new BadMode("the body is not a JSON object");
    return parseMode(this.modeText);
  }

  end(status) {
    record({ ev: "end", run: this.id, status, body_sha256: createHash("sha256").update(this.body).digest("hex"), len: this.body.length });
  }

  abort(why) {
    record({ ev: "abort", run: this.id, why });
  }
}

function headerText(v) {
  // Node joins a custom header sent on several lines with ", ", as the Fetch API does.
  return Array.isArray(v) ? v.join(", ") : (v ?? "");
}

/**
 * The caller's scope from FC_SCOPE_HEADER, for the middleware's scope
 * option: undefined without the header (unscoped); the header given more
 * than once throws, as an app must not guess which caller it is (protocol
 * v1.1). rawHeaders: Node (and the Fetch API) join the field lines.
 */
function scopeOf(rawHeaders) {
  const values = [];
  for (let i = 0; i + 1 < rawHeaders.length; i += 2) if (rawHeaders[i].toLowerCase() === scopeHeader) values.push(rawHeaders[i + 1]);
  if (values.length > 1) throw new Error(`the scope header ${env.FC_SCOPE_HEADER} is repeated`);
  return values[0];
}

function announce(p) {
  process.stdout.write(`FC_LISTENING http://127.0.0.1:${p}\n`);
}

// ---------------------------------------------------------------- Express

function expressApp() {
  const express = requireFramework("express");
  const app = express();
  app.set("env", "production");
  app.set("x-powered-by", false);
  app.get("/fc/healthz", (_req, res) => {
    res.type("text/plain").send("ok");
  });
  app.use(expressMiddleware({
    client,
    storeServerErrors,
    ...(scopeHeader ? { scope: (req) => scopeOf(req.rawHeaders) } : {}),
  }));

  const write = (res, chunk) => new Promise((ok, ko) => res.write(chunk, (err) => (err ? ko(err) : ok())));

  async function handler(req, res) {
    const scope = scopeHeader ? headerText(req.headers[scopeHeader]) : "";
    const run = new Run(headerText(req.headers["idempotency-key"]), scope, req.rawBody ?? Buffer.alloc(0));
    let mode;
    try {
      mode = run.mode();
    } catch (err) {
      if (!(err instanceof BadMode)) throw err;
      res.status(400).setHeader("Content-Type", "application/json");
      res.send(run.body);
      run.end(400);
      return;
    }
    if (mode.kind === "raise") {
      run.abort("raise");
      throw new HandlerRaised("raise mode");
    }
    if (mode.kind === "slow") await sleep(mode.ms);
    if (mode.kind === "stream" || mode.kind === "cutstream") {
      // res.write with a pause between pieces, each piece handed over (its
      // callback without error) before the next; end after res.end
      // returned. The caller gone (res closes before its end), the handler
      // stops between pieces and ends its answer there, short, as a
      // streaming handler does.
      const parts = pieces(run.body, mode.chunks);
      const cutAt = mode.kind === "cutstream" ? Math.floor(mode.chunks / 2) : -1;
      const gone = new AbortController();
      res.once("close", () => { if (!res.writableFinished) gone.abort(); });
      res.status(200).setHeader("Content-Type", "application/json");
      try {
        for (let i = 0; i < parts.length; i++) {
          if (i > 0 && await pause(mode.ms, gone.signal)) {
            run.abort("cancelled");
            res.end();
            return;
          }
          if (i === cutAt) {
            run.abort("cutstream");
            throw new HandlerRaised(`cutstream after ${cutAt} of ${mode.chunks} pieces`);
          }
          await write(res, parts[i]);
        }
      } catch (err) {
        if (!(err instanceof HandlerRaised)) run.abort(`write: ${err?.message ?? err}`);
        throw err;
      }
      res.end();
      run.end(200);
      return;
    }
    // The body is handed over by res.send; the middleware holds it until
    // it is stored, so end is written here, before the store.
    // (setHeader: Express's res.type would add "; charset=utf-8".)
    res.status(mode.status).setHeader("Content-Type", "application/json");
    res.send(run.body);
    run.end(mode.status);
  }

  app.route("/fc/*rest").post(handler).put(handler).patch(handler);
  app.use(expressErrorHandler());
  app.use((err, req, res, _next) => {
    if (!(err instanceof HandlerRaised)) process.stderr.write(`fcapp: ${req.method} ${req.path}: ${err?.stack ?? err}\n`);
    if (res.headersSent) {
      res.destroy();
      return;
    }
    res.status(500).setHeader("Content-Type", "application/problem+json");
    res.send(Buffer.from(problem500));
  });
  const srv = app.listen(port, host, (err) => {
    if (err) fail(`listen: ${err.message}`);
    announce(srv.address().port);
  });
}

// ---------------------------------------------------------------- fetch (Hono)

function fetchApp() {
  const { Hono } = requireFramework("hono");
  const { serve } = requireFramework("@hono/node-server");
  const app = new Hono();
  app.get("/fc/healthz", (c) => c.text("ok"));

  const handler = withIdempotency(async (req) => {
    const scope = scopeHeader ? req.headers.get(scopeHeader) ?? "" : "";
    const run = new Run(req.headers.get("idempotency-key") ?? "", scope, Buffer.from(await req.arrayBuffer()));
    let mode;
    try {
      mode = run.mode();
    } catch (err) {
      if (!(err instanceof BadMode)) throw err;
      const res = new Response(run.body, { status: 400, headers: { "Content-Type": "application/json" } });
      run.end(400);
      return res;
    }
    if (mode.kind === "raise") {
      run.abort("raise");
      throw new HandlerRaised("raise mode");
    }
    if (mode.kind === "slow") await sleep(mode.ms);
    if (mode.kind === "stream" || mode.kind === "cutstream") {
      // Pulled one piece at a time (highWaterMark 0): pull runs again only
      // when the reader wants more, so the pull after the last piece knows
      // that piece was taken; end is written there, before the close.
      const parts = pieces(run.body, mode.chunks);
      const cutAt = mode.kind === "cutstream" ? Math.floor(mode.chunks / 2) : -1;
      let i = 0;
      const body = new ReadableStream({
        async pull(ctrl) {
          if (i === parts.length) {
            run.end(200);
            ctrl.close();
            return;
          }
          // The caller gone (the request's signal aborts), the handler stops
          // between pieces and ends its body there, short, as a streaming
          // handler does.
          if (i > 0 && await pause(mode.ms, req.signal)) {
            run.abort("cancelled");
            ctrl.close();
            return;
          }
          if (i === cutAt) {
            run.abort("cutstream");
            ctrl.error(new HandlerRaised(`cutstream after ${cutAt} of ${mode.chunks} pieces`));
            return;
          }
          ctrl.enqueue(new Uint8Array(parts[i++]));
        },
        cancel(reason) {
          run.abort(`cancelled: ${reason?.message ?? reason}`);
        },
      }, { highWaterMark: 0 });
      return new Response(body, { status: 200, headers: { "Content-Type": "application/json" } });
    }
    if (mode.status < 200 || mode.status > 599) {
      // The Fetch API has no status outside 200-599: new Response throws,
      // and the handler fails as a user's would. Checked here because
      // @hono/node-server's Response (it replaces the global one) builds
      // the real one only when the body is read, after this handler.
      run.abort(`the Fetch API refuses status ${mode.status}`);
      throw new RangeError(`init["status"] must be in the range of 200 to 599, inclusive (got ${mode.status})`);
    }
    const res = new Response(run.body, { status: mode.status, headers: { "Content-Type": "application/json" } });
    run.end(mode.status);
    return res;
  }, {
    client,
    storeServerErrors,
    route: (_req, c) => c.req.routePath,
    target: (_req, c) => c.env.incoming.url,
    ...(scopeHeader ? { scope: (_req, c) => scopeOf(c.env.incoming.rawHeaders) } : {}),
  });

  app.on(["POST", "PUT", "PATCH"], "/fc/*", (c) => handler(c.req.raw, c));
  app.onError((err, c) => {
    if (!(err instanceof HandlerRaised)) process.stderr.write(`fcapp: ${c.req.method} ${c.req.path}: ${err?.stack ?? err}\n`);
    return c.body(problem500, 500, { "Content-Type": "application/problem+json" });
  });
  serve({ fetch: app.fetch, port, hostname: host }, (info) => announce(info.port));
}

if (frontdoor === "express") expressApp();
else fetchApp();
