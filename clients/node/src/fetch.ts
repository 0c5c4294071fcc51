// A wrapper for fetch-style handlers (Request → Response): Hono, Next.js
// route handlers, Bun/Deno-style servers.
import { FrontDoor, type FrontDoorOptions } from "./frontdoor.js";
import { FrontDoorError, cutBodyDetail, pathRoute, splitTarget, type Answer } from "./rules.js";

/** Options of {@link withIdempotency}; `route` and `scope` see the handler's extra arguments (a Hono context, say). */
export interface FetchOptions<A extends unknown[]> extends FrontDoorOptions {
  /** The route label (default the URL's path, {@link pathRoute}). With Hono: `(req, c) => c.req.routePath`. */
  route?: (req: Request, ...rest: A) => string;
  /**
   * The caller's key scope (e.g. the authenticated account id); keys become
   * escapeScope(scope) + ":" + key; undefined or "" leaves the key unscoped.
   * The Fetch API joins repeated header fields with ", ": throw on a comma in
   * a header that scopes the key (a caller sending `X-Account-Id` twice must
   * not be scoped by one while the app serves it as the other). A throw is 400
   * invalid_key with the error's message as detail; the handler does not run
   * and nothing is claimed (docs/frontdoor.md rule 3).
   */
  scope?: (req: Request, ...rest: A) => string | undefined;
  /**
   * The request-target as it arrived (path and query, e.g. Node.js's
   * `req.url`), for the fingerprint document. Default: the path and query of
   * `req.url`, which the Fetch API has normalized (' " < > { } and more
   * escaped): the same request bytes then fingerprint otherwise than in the
   * Express, Go and Python front doors. With Hono on @hono/node-server:
   * `(req, c) => c.env.incoming.url`.
   */
  target?: (req: Request, ...rest: A) => string;
}

const nullBodyStatus = new Set([101, 204, 205, 304]);

function toResponse(status: number, headers: Headers | [string, string][], body: Uint8Array): Response {
  return new Response(nullBodyStatus.has(status) || body.length === 0 ? null : body, { status, headers });
}

function answer(a: Answer): Response {
  return toResponse(a.status, a.headers, a.body);
}

/** Reads the body of req within limit, as FrontDoorError payload_too_large / invalid_request when it cannot. @internal */
export async function readLimited(req: Request, limit: number): Promise<Uint8Array> {
  const declared = Number(req.headers.get("Content-Length") ?? "0");
  if (declared > limit) throw new FrontDoorError("payload_too_large", `the request body is larger than ${limit} bytes`);
  if (!req.body) return new Uint8Array();
  const chunks: Uint8Array[] = [];
  let size = 0;
  const reader = req.body.getReader();
  for (;;) {
    let next: Awaited<ReturnType<typeof reader.read>>;
    try {
      next = await reader.read();
    } catch {
      // The caller went away before its whole body arrived (the runtime
      // errors the body stream) or it could not be read: refused before
      // anything is claimed.
      throw new FrontDoorError("invalid_request", cutBodyDetail);
    }
    const { done, value } = next;
    if (done) break;
    size += value.length;
    if (size > limit) {
      await reader.cancel();
      throw new FrontDoorError("payload_too_large", `the request body is larger than ${limit} bytes`);
    }
    chunks.push(value);
  }
  // A body stream that ended before the declared Content-Length is a cut
  // body too, whichever way the runtime reports it.
  if (req.headers.has("Content-Length") && size < declared) throw new FrontDoorError("invalid_request", cutBodyDetail);
  return Buffer.concat(chunks);
}

/**
 * Wraps a fetch-style handler with Stripe-style Idempotency-Key semantics
 * (docs/frontdoor.md): the handler runs once per key, its answer is stored
 * before it is returned and replayed verbatim with `Idempotent-Replayed:
 * true`; 409 request_in_flight (unless the request carries `Prefer: wait=N`:
 * then it gets the first one's replay when that completes, see
 * {@link FrontDoorOptions.maxWaitSeconds}), 422 fingerprint_mismatch, 400 for a bad
 * key (and 400 invalid_request, not retryable, for a claim idem refuses as
 * invalid), 503 store_unavailable when idem cannot be reached, 507
 * storage_quota_exceeded (not retryable) when idem refuses a new key for the
 * tenant's storage quota, 403 tenant_unknown (not retryable) when idem refuses the middleware's tenant as disabled or
 * deleted (in each case the handler does not run). A handler exception stores nothing and propagates;
 * so does a response stream that errors part way. The handler's request has no abort signal of the caller's: a
 * caller who goes away does not cut the answer stored for its retry (the handler runs to its end; one that reads the
 * framework's own request, `c.req.raw.signal`, still sees the abort).
 *
 *     import { Client, withIdempotency } from "@idem-dev/idem";
 *
 *     const client = new Client({ baseUrl: process.env.IDEM_URL!, token: process.env.IDEM_TOKEN });
 *     // Your side effect (charge the card): runs once per Idempotency-Key.
 *     async function pay(order: { amount: number }) { return { charge: "ch_1", amount: order.amount }; }
 *     export const POST = withIdempotency(async (req) => Response.json(await pay(await req.json()), { status: 201 }), { client });
 */
export function withIdempotency<A extends unknown[]>(
  handler: (req: Request, ...rest: A) => Response | Promise<Response>,
  opts: FetchOptions<A>,
): (req: Request, ...rest: A) => Promise<Response> {
  const fd = new FrontDoor(opts);
  return async (req, ...rest) => {
    const url = new URL(req.url);
    const target = opts.target ? splitTarget(opts.target(req, ...rest)) : { path: url.pathname, query: url.search.slice(1) };
    let ran: Response | undefined;
    let ranBody: Uint8Array = new Uint8Array();
    const outcome = await fd.serve({
      method: req.method,
      route: opts.route ? opts.route(req, ...rest) : pathRoute(url.pathname, target.path),
      path: target.path,
      query: target.query,
      header: (name) => {
        const v = req.headers.get(name);
        return v === null ? [] : [v];
      },
      body: (limit) => readLimited(req, limit),
      scope: opts.scope ? () => opts.scope!(req, ...rest) : undefined,
      scoped: opts.scope !== undefined,
    }, async (body) => {
      // The handler's request carries no signal of the caller's: a handler
      // (or its response stream) that stopped when the caller went away
      // would end its answer early, and that part would be stored and
      // replayed as the whole. It runs to its end instead, and its whole
      // answer is stored for the caller's retry (docs/frontdoor.md rule 5,
      // "A cut answer").
      const init: RequestInit & { duplex?: string } = { method: req.method, headers: req.headers };
      if (body.length > 0) init.body = body;
      const res = await handler(new Request(req.url, init), ...rest);
      ran = res;
      // A response stream that errors part way rejects here: a handler that
      // raised, nothing stored (the claim expires into an orphan).
      ranBody = new Uint8Array(await res.arrayBuffer());
      return {
        status: res.status,
        header: (name) => {
          if (name.toLowerCase() === "set-cookie") return res.headers.getSetCookie();
          const v = res.headers.get(name);
          return v === null ? [] : [v];
        },
        body: ranBody,
      };
    });
    if (outcome.kind === "pass") return handler(req, ...rest);
    if (outcome.kind === "answer") return answer(outcome.answer);
    const r = ran as Response | undefined;
    if (!r) throw new Error("idem: the handler's answer is missing");
    const headers = new Headers(r.headers);
    for (const [k, v] of outcome.headers) headers.set(k, v);
    return toResponse(r.status, headers, ranBody);
  };
}
