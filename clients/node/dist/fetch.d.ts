import { type FrontDoorOptions } from "./frontdoor.js";
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
/** Reads the body of req within limit, as FrontDoorError payload_too_large / invalid_request when it cannot. @internal */
export declare function readLimited(req: Request, limit: number): Promise<Uint8Array>;
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
export declare function withIdempotency<A extends unknown[]>(handler: (req: Request, ...rest: A) => Response | Promise<Response>, opts: FetchOptions<A>): (req: Request, ...rest: A) => Promise<Response>;
