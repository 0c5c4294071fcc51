import type { IncomingMessage, ServerResponse } from "node:http";
import { type FrontDoorOptions } from "./frontdoor.js";
/** The parts of an Express request the middleware reads (structural, so that no Express types are needed). */
export interface ExpressRequest extends IncomingMessage {
    body?: unknown;
    rawBody?: Buffer;
    route?: {
        path?: unknown;
    };
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
/**
 * Error-handling middleware that tells the idempotency middleware a handler
 * threw, so that nothing is stored (the claim expires into an orphan) and
 * the error goes on to your error handlers. Register it after your routes
 * and before your own error handlers.
 */
export declare function expressErrorHandler(): (err: unknown, req: IncomingMessage, res: ServerResponse, next: Next) => void;
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
export declare function expressMiddleware(opts: ExpressOptions): (req: IncomingMessage, res: ServerResponse, next: Next) => void;
export {};
