// Express middleware: the front-door rules around Express route handlers.
import { tracingChannel } from "node:diagnostics_channel";
import type { IncomingMessage, ServerResponse } from "node:http";
import { FrontDoor, type FrontDoorOptions, type HandlerAnswer } from "./frontdoor.js";
import { FrontDoorError, cutBodyDetail, isJSON, pathRoute, splitTarget } from "./rules.js";

/** The parts of an Express request the middleware reads (structural, so that no Express types are needed). */
export interface ExpressRequest extends IncomingMessage {
  body?: unknown;
  rawBody?: Buffer;
  route?: { path?: unknown };
  baseUrl?: string;
  path?: string;
  originalUrl?: string;
}

/** Options of {@link expressMiddleware}. */
export interface ExpressOptions extends FrontDoorOptions {
  /**
   * The caller's key scope (e.g. the authenticated account id); keys become
   * escapeScope(scope) + ":" + key; undefined or "" leaves the key unscoped.
   * A header is one value only when it came once: take it from
   * `req.headersDistinct` and throw when there are several (a caller sending
   * `X-Account-Id` twice must not be scoped by one while the app serves it as
   * the other). A throw is 400 invalid_key with the error's message as
   * detail; the handler does not run and nothing is claimed
   * (docs/frontdoor.md rule 3).
   */
  scope?: (req: ExpressRequest) => string | undefined;
  /** The route label of a request (default: the route pattern when Express matched one — the middleware used on a route — else the path, {@link pathRoute}). */
  route?: (req: ExpressRequest) => string;
}

type Next = (err?: unknown) => void;

const failed = Symbol("idem.handlerFailed");

interface Tracked extends ServerResponse {
  [failed]?: (err: unknown) => void;
}

let traced = false;

/**
 * Subscribes once to Express's router tracing channel, so that an exception
 * of a handler after the middleware is seen even when no error middleware
 * is registered (router 2.3+); {@link expressErrorHandler} covers older
 * routers.
 */
function traceErrors(): void {
  if (traced) return;
  traced = true;
  try {
    tracingChannel("express.router.request").subscribe({
      start() {},
      end() {},
      asyncStart() {},
      asyncEnd() {},
      error(ctx: unknown) {
        const c = ctx as { res?: Tracked; error?: unknown };
        c.res?.[failed]?.(c.error);
      },
    });
  } catch {
    // no tracing channels: rely on expressErrorHandler
  }
}

/**
 * Error-handling middleware that tells the idempotency middleware a handler
 * threw, so that nothing is stored (the claim expires into an orphan) and
 * the error goes on to your error handlers. Register it after your routes
 * and before your own error handlers.
 */
export function expressErrorHandler(): (err: unknown, req: IncomingMessage, res: ServerResponse, next: Next) => void {
  return (err, _req, res, next) => {
    (res as Tracked)[failed]?.(err);
    next(err);
  };
}

function headerValues(req: IncomingMessage, name: string): string[] {
  const lower = name.toLowerCase();
  const out: string[] = [];
  const raw = req.rawHeaders;
  for (let i = 0; i + 1 < raw.length; i += 2) if (raw[i]!.toLowerCase() === lower) out.push(raw[i + 1]!);
  return out;
}

async function readBody(req: ExpressRequest, limit: number): Promise<Buffer> {
  if (Buffer.isBuffer(req.rawBody)) return req.rawBody;
  if (req.readableEnded) {
    // A body parser ran first without keeping the raw bytes: its result is all there is.
    if (req.body === undefined) return Buffer.alloc(0);
    return Buffer.isBuffer(req.body) ? req.body : Buffer.from(typeof req.body === "string" ? req.body : JSON.stringify(req.body));
  }
  const chunks: Buffer[] = [];
  let size = 0;
  try {
    for await (const chunk of req) {
      const b = Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk as string);
      size += b.length;
      if (size > limit) throw new FrontDoorError("payload_too_large", `the request body is larger than ${limit} bytes`);
      chunks.push(b);
    }
  } catch (err) {
    // The caller went away before its whole body arrived (Node.js fails the
    // read with "aborted", ECONNRESET) or the body could not be read: the
    // request is refused before anything is claimed, as a body that ended
    // early is below.
    if (err instanceof FrontDoorError) throw err;
    throw new FrontDoorError("invalid_request", cutBodyDetail);
  }
  // complete is false when the message ended before its Content-Length (or
  // its last chunk): what arrived is not the caller's body.
  if (!req.complete) throw new FrontDoorError("invalid_request", cutBodyDetail);
  return Buffer.concat(chunks);
}

/**
 * Express middleware with Stripe-style Idempotency-Key semantics
 * (docs/frontdoor.md): POST and PATCH need a key, PUT and DELETE are protected
 * when they carry one; the handler runs once per key; its answer is stored
 * before it is sent and replayed verbatim with `Idempotent-Replayed: true`;
 * 409 request_in_flight (unless the request carries `Prefer: wait=N`: then
 * it gets the first one's replay when that completes, see
 * {@link FrontDoorOptions.maxWaitSeconds}), 422 fingerprint_mismatch, 400
 * for a bad key; 503
 * store_unavailable when idem cannot be reached, 507 storage_quota_exceeded
 * (not retryable) when idem refuses a new key for the tenant's storage quota,
 * 403 tenant_unknown (not retryable) when idem refuses the middleware's
 * tenant as disabled or deleted (in each case the handler does not run).
 *
 * It reads the raw body itself (keep it before body parsers, or have them
 * save `req.rawBody`), keeps it as `req.rawBody`, and sets `req.body` to the
 * parsed value of a JSON body. A handler exception stores nothing; see
 * {@link expressErrorHandler}. So does a handler that destroys its response
 * (`res.destroy()`) before ending it. The caller going away is hidden from the
 * handler until it has ended its answer (the `close` of res and req held back,
 * `destroyed` false), so a handler that would stop writing at it runs to its
 * end and its whole answer is stored (docs/frontdoor.md rule 5, "A cut answer").
 */
export function expressMiddleware(opts: ExpressOptions): (req: IncomingMessage, res: ServerResponse, next: Next) => void {
  const fd = new FrontDoor(opts);
  traceErrors();
  return (rq, res, next) => {
    const req = rq as ExpressRequest;
    const url = new URL(req.originalUrl ?? req.url ?? "/", "http://localhost");
    const target = splitTarget(req.originalUrl ?? req.url ?? "/");
    const route = opts.route ? opts.route(req)
      : typeof req.route?.path === "string" ? (req.baseUrl ?? "") + req.route.path
      : pathRoute(url.pathname, target.path);
    fd.serve({
      method: req.method ?? "GET",
      route,
      path: target.path,
      query: target.query,
      header: (name) => headerValues(req, name),
      body: async (limit) => {
        const b = await readBody(req, limit);
        req.rawBody = b;
        if (b.length > 0 && isJSON(req.headers["content-type"])) req.body = JSON.parse(b.toString("utf8"));
        return b;
      },
      scope: opts.scope ? () => opts.scope!(req) : undefined,
      scoped: opts.scope !== undefined,
    }, () => capture(res as Tracked, next)).then((outcome) => {
      if (outcome.kind === "pass") {
        next();
      } else if (outcome.kind === "answer") {
        restore(res as Tracked);
        const a = outcome.answer;
        res.statusCode = a.status;
        for (const [k, v] of a.headers) res.setHeader(k, v);
        res.end(a.body);
      } else {
        release(res as Tracked, outcome.headers);
      }
    }, (err: unknown) => {
      if (handlerFailed.has(res)) return; // the handler's exception went its own way through Express
      next(err);
    });
  };
}

interface Hidden {
  target: ServerResponse | IncomingMessage;
  emit: (event: string | symbol, ...args: unknown[]) => boolean;
  held: [string | symbol, unknown[]][];
  destroyed?: { own: PropertyDescriptor | undefined; real: () => boolean };
}

interface Capture {
  writeHead: ServerResponse["writeHead"];
  write: ServerResponse["write"];
  end: ServerResponse["end"];
  destroy: ServerResponse["destroy"];
  chunks: Buffer[];
  /** What hideHangUp hid, put back by restore. */
  hidden: Hidden[];
}

const captured = new WeakMap<ServerResponse, Capture>();
const handlerFailed = new WeakSet<ServerResponse>();

function toBuffer(chunk: unknown, encoding?: unknown): Buffer | undefined {
  if (chunk === undefined || chunk === null || typeof chunk === "function") return undefined;
  if (Buffer.isBuffer(chunk)) return chunk;
  if (chunk instanceof Uint8Array) return Buffer.from(chunk);
  return Buffer.from(String(chunk), typeof encoding === "string" ? (encoding as BufferEncoding) : "utf8");
}

/**
 * Hides the caller going away from the handler until restore(): the
 * `close` of res, the `close` and `aborted` of its request are held back
 * (and emitted by restore, so that the handler's cleanup still runs), and
 * `destroyed` of both reads false. A handler that stops writing when its
 * caller leaves (`res.on("close")`, `res.destroyed`) would end its answer
 * early, and that part would be stored and replayed as the whole; it runs
 * to its end instead, and its whole answer is stored for the caller's
 * retry (docs/frontdoor.md rule 5, "A cut answer").
 */
function hideHangUp(res: ServerResponse, orig: Capture): void {
  const req = (res as ServerResponse & { req?: IncomingMessage }).req;
  for (const [target, events] of [[res, ["close"]], [req, ["close", "aborted"]]] as const) {
    if (!target) continue;
    const emit = target.emit;
    orig.hidden.push({ target, emit, held: [] });
    const h = orig.hidden[orig.hidden.length - 1]!;
    target.emit = function (this: unknown, event: string | symbol, ...args: unknown[]): boolean {
      if ((events as readonly (string | symbol)[]).includes(event)) {
        h.held.push([event, args]);
        return true;
      }
      return emit.call(target, event, ...args);
    } as typeof target.emit;
    const own = Object.getOwnPropertyDescriptor(target, "destroyed");
    let real = (target as { destroyed: boolean }).destroyed;
    h.destroyed = { own, real: () => real };
    Object.defineProperty(target, "destroyed", { configurable: true, enumerable: true, get: () => false, set: (v: boolean) => (real = v) });
  }
}

/** Puts back what hideHangUp hid, then emits the events it held back. */
function unhide(orig: Capture): void {
  const hidden = orig.hidden;
  orig.hidden = [];
  for (const h of hidden) {
    h.target.emit = h.emit;
    if (h.destroyed) {
      delete (h.target as { destroyed?: boolean }).destroyed;
      if (h.destroyed.own) Object.defineProperty(h.target, "destroyed", { ...h.destroyed.own, value: h.destroyed.real() });
    }
  }
  for (const h of hidden) for (const [event, args] of h.held) h.target.emit(event, ...args);
}

/**
 * Runs the rest of the Express chain with res buffered: writeHead, write
 * and end are held back until the answer is stored, and the caller going
 * away is hidden from the handler (hideHangUp). Resolves with the buffered
 * answer when the handler ends it; rejects when a handler throws or
 * destroys its response before ending it.
 */
function capture(res: Tracked, next: Next): Promise<HandlerAnswer> {
  return new Promise<HandlerAnswer>((resolve, reject) => {
    const orig: Capture = { writeHead: res.writeHead, write: res.write, end: res.end, destroy: res.destroy, chunks: [], hidden: [] };
    captured.set(res, orig);
    let settled = false;
    const answer = (): HandlerAnswer => ({
      status: res.statusCode,
      header: (name) => {
        const v = res.getHeader(name);
        return v === undefined ? [] : Array.isArray(v) ? v.map(String) : [String(v)];
      },
      body: Buffer.concat(orig.chunks),
    });
    res[failed] = (err) => {
      res[failed] = undefined;
      if (settled) return;
      settled = true;
      handlerFailed.add(res);
      restore(res); // the error handlers answer as usual
      reject(err);
    };
    hideHangUp(res, orig);
    // The handler destroying its response before ending it broke off its
    // answer: a handler that failed, as one that throws.
    res.destroy = function (this: ServerResponse, err?: Error) {
      res[failed]?.(err ?? new Error("idem: the handler destroyed its response before ending it"));
      return orig.destroy.call(res, err);
    } as ServerResponse["destroy"];
    res.writeHead = function (this: ServerResponse, status: number, ...rest: unknown[]) {
      res.statusCode = status;
      const hs = rest.find((x) => x && typeof x === "object") as Record<string, string | string[] | number> | string[] | undefined;
      if (typeof rest[0] === "string") res.statusMessage = rest[0];
      // As Node does: the fields given here replace those set before under
      // their names, and several fields of one name in the raw array form
      // (flat, or [name, value] pairs) are all sent.
      const fields = new Map<string, { name: string; values: string[] }>();
      const add = (name: unknown, value: unknown) => {
        const n = String(name);
        const f = fields.get(n.toLowerCase()) ?? { name: n, values: [] };
        f.values.push(...(Array.isArray(value) ? value.map(String) : [String(value)]));
        fields.set(n.toLowerCase(), f);
      };
      if (Array.isArray(hs)) {
        if (hs.length > 0 && Array.isArray(hs[0])) for (const pair of hs as unknown as unknown[][]) add(pair[0], pair[1]);
        else for (let i = 0; i + 1 < hs.length; i += 2) add(hs[i], hs[i + 1]);
      } else if (hs) {
        for (const [k, v] of Object.entries(hs)) add(k, v);
      }
      for (const f of fields.values()) res.setHeader(f.name, f.values.length === 1 ? f.values[0]! : f.values);
      return res;
    } as ServerResponse["writeHead"];
    res.write = function (chunk: unknown, encoding?: unknown, cb?: unknown) {
      const b = toBuffer(chunk, encoding);
      if (b) orig.chunks.push(b);
      const done = typeof encoding === "function" ? encoding : cb;
      if (typeof done === "function") queueMicrotask(() => (done as () => void)());
      return true;
    } as ServerResponse["write"];
    res.end = function (chunk?: unknown, encoding?: unknown, cb?: unknown) {
      const b = toBuffer(chunk, encoding);
      if (b) orig.chunks.push(b);
      const done = [chunk, encoding, cb].find((x) => typeof x === "function");
      if (typeof done === "function") res.once("finish", done as () => void);
      res[failed] = undefined;
      if (!settled) {
        settled = true;
        resolve(answer());
      }
      return res;
    } as ServerResponse["end"];
    next();
  });
}

/** Puts back the real writeHead, write and end of res; returns what the handler wrote. */
function restore(res: Tracked): Capture | undefined {
  const orig = captured.get(res);
  if (!orig) return undefined;
  captured.delete(res);
  res.writeHead = orig.writeHead;
  res.write = orig.write;
  res.end = orig.end;
  res.destroy = orig.destroy;
  unhide(orig);
  return orig;
}

/** Restores res and sends what the handler wrote, with the headers the front door adds. */
function release(res: Tracked, headers: [string, string][] = []): void {
  const orig = restore(res);
  if (!orig || res.writableEnded || res.destroyed) return; // destroyed: the caller went away
  if (!res.headersSent) for (const [k, v] of headers) res.setHeader(k, v);
  const body = Buffer.concat(orig.chunks);
  orig.chunks = [];
  if (!res.headersSent) res.setHeader("Content-Length", body.length);
  res.end(body);
}
