// The framework-independent front-door protocol around a handler for the
// Node middleware (Express, fetch): the flow of docs/frontdoor.md over the
// rules of rules.ts, claiming through a narrow port (FrontDoorPort) that the
// idem Client satisfies, so the flow does not import the client core.
import { randomBytes } from "node:crypto";
import type { CallOptions } from "./bounds.js";
import { Codes, IdemError, NoSideEffect, isIdemError } from "./errors.js";
import { FleetBudgetError, headerAttempt } from "./retry.js";
import type { ResponseInit } from "./response.js";
import { StoredResponse } from "./response.js";
import { type Answer, budgetRefusal, callerAttempt, spentBudget, cutBodyDetail, defaultStoredHeaders, fingerprintDocument, type FingerprintRules, FrontDoorError, headerKey, headerNotReplayable, headerPreferenceApplied, headerReplayed, headerRequestId, held, type MethodRules, mismatchDetail, notReplayable, notReplayableDetail, operation, parseKey, parsePointer, preferWait, problemResponse, requirement, scopedKey, storableStatus, storageQuotaDetail, storedHeaders, storeStatus, tenantUnknownDetail, validRequestId } from "./rules.js";
import type { Claim, RunOptions, RunResult } from "./run.js";
import type { ClaimRequest } from "./types.js";
import { CacheLookup, type ReplayCache, type ReplayCacheOptions, newReplayCache } from "./replaycache.js";

/** What a front door needs of the idem client: its {@link Client.run} and complete ({@link Client} is one). */
export interface FrontDoorPort {
  run(
    key: string,
    req: ClaimRequest,
    fn: (claim: Claim) => Promise<ResponseInit | StoredResponse> | ResponseInit | StoredResponse,
    opts?: RunOptions,
  ): Promise<RunResult>;
  complete(key: string, fencingToken: number, response: ResponseInit | StoredResponse, opts?: CallOptions): Promise<unknown>;
}

/** Configures a front door (the Express middleware and the fetch wrapper). */
export interface FrontDoorOptions {
  /** The idem client the claims go through. */
  client: FrontDoorPort;
  /** Which methods need a key (default POST and PATCH required, other unsafe methods optional). */
  methods?: MethodRules;
  /** Store 5xx answers (default true, Stripe's behaviour); false releases the key on a 5xx so that the retry runs the handler again. */
  storeServerErrors?: boolean;
  /** The response headers stored and replayed (default {@link defaultStoredHeaders}). */
  headers?: readonly string[];
  /** Fingerprint rules: JSON pointers to leave out, request headers that take part. */
  fingerprint?: FingerprintRules;
  /** The lease asked for, in seconds (default the tenant's). */
  leaseSeconds?: number;
  /** The largest response (body plus stored headers) stored for replay (default 1 MiB, the tenant's default max_response_bytes); a larger one is sent but stored without its body, and its replay answers 409 response_not_replayable. */
  maxStoredBytes?: number;
  /** The largest request body read (default 8 MiB, under the idem server's default request limit, as the Go and Python middleware); larger gets 413 payload_too_large. */
  maxBodyBytes?: number;
  /** Retry-After of the 503 sent when idem cannot be reached, in seconds (default 1). */
  unavailableRetryAfterSeconds?: number;
  /** Receives what goes wrong with idem (never a token or a body); default console.error. */
  log?: (message: string, err: unknown) => void;
  /**
   * Caps how long, in seconds, a request with `Prefer: wait=N` is held while
   * another request with its key is in flight (the claim's `wait_seconds` =
   * min(N, maxWaitSeconds)): it then gets that request's replay instead of
   * 409. Undefined (default): no cap of the middleware's own (the tenant's
   * `max_wait_seconds` and the attempt timeout less a second still apply);
   * 0 or less: Prefer is ignored, 409 at once.
   */
  maxWaitSeconds?: number;
  /**
   * The replay cache (docs/frontdoor.md, "The replay cache"): a replay idem
   * answered is kept in memory and a retry of exactly that request is
   * answered from it without a claim, for at most `maxAgeSeconds` (2) and
   * never past the record's replay_until. On by default (4096 entries, 8
   * MiB); `{ off: true }` turns it off. The client must stay with one
   * tenant (a token function that switches tenants needs it off).
   */
  replayCache?: ReplayCacheOptions;
}

/** What a front door needs of one request, whatever the framework. */
export interface FrontRequest {
  method: string;
  /** The route pattern when the framework knows it, else the path. */
  route: string;
  /** The request path as received, without the query. */
  path: string;
  query: string;
  /** The values of a request header, one per field line. */
  header(name: string): string[];
  /**
   * Reads the whole body; rejects with FrontDoorError(payload_too_large) over
   * the limit, FrontDoorError(invalid_request, {@link cutBodyDetail}) for a
   * body cut before its Content-Length (or failing to read).
   */
  body(limit: number): Promise<Uint8Array>;
  /**
   * The caller's key scope (e.g. the account id), if configured: the scope,
   * or a function that gives it, called once the request has a key. A
   * function that throws refuses the request: 400 invalid_key with the
   * error's message as detail, nothing claimed, the handler not run (as
   * client/idemhttp's Options.Scope returning an error).
   */
  scope?: string | undefined | (() => string | undefined);
  /**
   * Whether the front door scopes keys (its scope option is set): then an
   * unscoped request's key may hold no ":" (scopedKey), so that it can never
   * be a scoped caller's record key. A front door that never scopes keeps
   * such keys as they are, as before.
   */
  scoped?: boolean;
}

/** A handler's buffered answer. */
export interface HandlerAnswer {
  status: number;
  /** The header values by name (as the framework spells them). */
  header(name: string): string[];
  body: Uint8Array;
}

/** The outcome of {@link FrontDoor.serve}. */
export type Outcome =
  /** Not protected: run the handler as usual. */
  | { kind: "pass" }
  /** Send this answer (a replay or a refusal); the handler did not run. */
  | { kind: "answer"; answer: Answer }
  /** The handler ran; send its answer (it was stored unless logged otherwise), with these headers added (Preference-Applied). */
  | { kind: "ran"; headers: [string, string][] };

/** Preference-Applied: wait=<seconds> when idem held the claim (RFC 7240: only an honoured preference is named), else nothing. */
function applied(seconds: number): [string, string][] {
  return seconds > 0 ? [[headerPreferenceApplied, `wait=${seconds}`]] : [];
}

/**
 * The scope of a request: a scope option's value, or its function's. A
 * scope function that throws (a repeated or missing account header, say:
 * docs/frontdoor.md rule 3) is a request that cannot be scoped, refused
 * 400 invalid_key with its message, never the app's own 500: the error
 * does not escape the middleware, and nothing is claimed.
 */
function scopeOf(scope: string | undefined | (() => string | undefined)): string | undefined {
  if (typeof scope !== "function") return scope;
  try {
    return scope();
  } catch (err) {
    if (err instanceof FrontDoorError) throw err;
    const message = err instanceof Error ? err.message : String(err);
    throw new FrontDoorError("invalid_key", message || "the key cannot be scoped to the caller");
  }
}

/** The answer of a replay: the stored status, headers and body, marked Idempotent-Replayed (the same from idem and from the replay cache). */
function replay(r: StoredResponse, waitApplied: number): Outcome {
  const headers: [string, string][] = Object.entries(r.headers);
  headers.push([headerReplayed, "true"], ["Content-Length", String(r.body.length)], ...applied(waitApplied));
  return { kind: "answer", answer: { status: r.status || 200, headers, body: r.body } };
}

/** A 5xx answer released under storeServerErrors: false. */
class Released extends NoSideEffect {}

/**
 * The framework-independent front door: parses the key, builds the
 * fingerprint document, claims through {@link Client.run} without waiting,
 * runs the handler once on a new claim or takeover, stores its answer and
 * only then lets it be sent, replays completed keys, and maps every refusal
 * to its problem. A handler exception stores nothing (the claim expires
 * into an orphan) and propagates.
 */
export class FrontDoor {
  private readonly o: Required<Omit<FrontDoorOptions, "methods" | "leaseSeconds" | "fingerprint" | "maxWaitSeconds" | "replayCache">> &
    Pick<FrontDoorOptions, "methods" | "leaseSeconds" | "fingerprint" | "maxWaitSeconds">;
  /** The replay cache; undefined: off. */
  readonly replayCache: ReplayCache | undefined;

  constructor(opts: FrontDoorOptions) {
    this.o = {
      storeServerErrors: true,
      headers: defaultStoredHeaders,
      maxBodyBytes: 8 << 20,
      maxStoredBytes: 1 << 20,
      unavailableRetryAfterSeconds: 1,
      log: (message, err) => console.error(`idem: ${message}:`, err instanceof Error ? err.message : err),
      ...opts,
    };
    for (const p of opts.fingerprint?.exclude ?? []) parsePointer(p);
    this.replayCache = newReplayCache(opts.replayCache);
  }

  /**
   * Serves one request. runHandler runs the handler once with the request
   * body and resolves to its buffered answer (or rejects with its exception).
   */
  async serve(req: FrontRequest, runHandler: (body: Uint8Array) => Promise<HandlerAnswer>): Promise<Outcome> {
    const rid = req.header(headerRequestId)[0];
    const requestId = validRequestId(rid) ? rid! : randomBytes(16).toString("hex");
    const refuse = (e: FrontDoorError): Outcome => ({ kind: "answer", answer: problemResponse(e, requestId) });

    const need = requirement(req.method, this.o.methods);
    if (need === "pass") return { kind: "pass" };
    let k: string | null;
    let body: Uint8Array;
    let doc: Record<string, unknown>;
    try {
      k = parseKey(req.header(headerKey));
      if (k === null) {
        if (need === "required") throw new FrontDoorError("idempotency_key_missing", `${req.method.toUpperCase()} requires an ${headerKey} header`);
        return { kind: "pass" };
      }
      if (req.scope || req.scoped) k = scopedKey(scopeOf(req.scope), k);
      body = await req.body(this.o.maxBodyBytes);
      doc = fingerprintDocument({ path: req.path, query: req.query, contentType: req.header("Content-Type")[0], body, header: req.header }, this.o.fingerprint);
    } catch (err) {
      if (err instanceof FrontDoorError) return refuse(err);
      throw err;
    }

    const wait = this.preferWait(req.header("Prefer"));
    const op = operation(req.method, req.route);
    // A replay of exactly this request the cache holds is answered without a claim (replaycache.ts).
    const cached = new CacheLookup(this.replayCache, k, op, doc);
    const hit = cached.cached(wait);
    if (hit) return replay(hit, 0);
    // Rule 9: the caller's retry goes on with the claim, so idem's fleet retry budget counts it.
    const attempt = callerAttempt(req.header(headerAttempt));
    let ran = false;
    let token = 0;
    let answer: HandlerAnswer | undefined;
    let result;
    try {
      result = await this.o.client.run(k, { operation: op, request: doc, ...(this.o.leaseSeconds ? { leaseSeconds: this.o.leaseSeconds } : {}) },
        async (claim) => {
          ran = true;
          token = claim.fencingToken;
          const a = await runHandler(body);
          answer = a;
          // The handler ran: an answer idem cannot store is recorded as not replayable, never released.
          if (!storableStatus(a.status)) return notReplayable(a.status, 0);
          if (!storeStatus(a.status, this.o.storeServerErrors)) throw new Released("handler answered 5xx; key released");
          return this.stored(a);
        }, { noWait: true, ...(wait > 0 ? { waitSeconds: wait } : {}), ...(attempt.number > 1 ? { attempt } : {}) });
    } catch (err) {
      if (ran) {
        if (err instanceof Released) return { kind: "ran", headers: [] };
        if (answer && isIdemError(err, Codes.payloadTooLarge)) {
          // The tenant's max_response_bytes is under maxStoredBytes: store
          // the answer without its body, as one over maxStoredBytes, so that
          // the retry is 409 response_not_replayable instead of a second
          // run once the claim's lease is over.
          try {
            await this.o.client.complete(k, token, notReplayable(answer.status, this.size(answer)));
            return { kind: "ran", headers: [] };
          } catch (cerr) {
            err = cerr;
          }
        }
        if (err instanceof IdemError) {
          this.o.log("the handler ran but its response was not stored", err);
          return { kind: "ran", headers: [] };
        }
        throw err; // the handler's exception: the claim is left to expire
      }
      cached.refused(err);
      const out = refuse(this.claimRefusal(err));
      if (out.kind === "answer") out.answer.headers.push(...applied(err instanceof IdemError ? err.waitAppliedSeconds : 0));
      return out;
    }
    if (!result.replayed) return { kind: "ran", headers: applied(result.waitAppliedSeconds) };
    if (Object.hasOwn(result.response.headers, headerNotReplayable)) {
      return refuse(new FrontDoorError("response_not_replayable", notReplayableDetail));
    }
    cached.replayed(result);
    return replay(result.response, result.waitAppliedSeconds);
  }

  /** The wait to ask idem for: the request's Prefer: wait=N within maxWaitSeconds (and a day), 0 without one or when maxWaitSeconds is 0 or less. */
  preferWait(fields: readonly string[]): number {
    const n = preferWait(fields);
    const cap = this.o.maxWaitSeconds;
    if (n <= 0 || (cap !== undefined && cap <= 0)) return 0;
    const wait = Math.min(n, 24 * 3600);
    return cap === undefined ? wait : Math.min(wait, cap);
  }

  /** The response to store for a handler's answer: the whole of it, or without its body (marked) when it is over maxStoredBytes. */
  private stored(a: HandlerAnswer): StoredResponse {
    const size = this.size(a);
    if (size <= this.o.maxStoredBytes) return new StoredResponse(a.status, storedHeaders(a.header, this.o.headers), a.body);
    return notReplayable(a.status, size);
  }

  /** What storing a handler's answer whole takes: its body and stored headers. */
  private size(a: HandlerAnswer): number {
    let size = a.body.length;
    for (const [k, v] of Object.entries(storedHeaders(a.header, this.o.headers))) size += Buffer.byteLength(k) + Buffer.byteLength(v);
    return size;
  }

  /**
   * Maps a claim that did not let the handler run to its refusal; a
   * retryable one whose idem answer said the fleet retry budget is spent
   * says so too (rule 9).
   */
  private claimRefusal(err: unknown): FrontDoorError {
    const e = this.refusal(err);
    return spentBudget(e, err instanceof IdemError && err.fleetBudgetSpent);
  }

  /** The refusal of claimRefusal. */
  private refusal(err: unknown): FrontDoorError {
    // idem's fleet retry budget (rule 9): a claim stopped after a failure
    // of its own (its retry refused, or the failure saying the budget is
    // spent) is that failure's answer, saying the budget is spent; the
    // caller's retry refused is 429 retry_budget_exhausted.
    if (err instanceof FleetBudgetError) return spentBudget(this.claimRefusal(err.original), true);
    if (err instanceof IdemError && err.code === Codes.retryBudgetExhausted) return budgetRefusal(err.retryAfterMs);
    if (err instanceof IdemError) {
      if (err.code === Codes.requestInFlight) return new FrontDoorError("request_in_flight", "a request with this idempotency key is being processed; retry later", err.retryAfterMs);
      // idem's completer holds the key (rule 8): in flight while it finds
      // out what the first request did, a refusal for a person once it
      // gave up; never the retryable 503 (idem is up and answered).
      const h = held(err.code, err.retryAfterMs);
      if (h) return h;
      if (err.code === Codes.fingerprintMismatch) return new FrontDoorError("fingerprint_mismatch", mismatchDetail);
      if (err.code === Codes.invalidKey) return new FrontDoorError("invalid_key", err.detail);
      if (err.code === Codes.payloadTooLarge) {
        // The server's request limit (IDEM_MAX_BODY_BYTES) is under maxBodyBytes: a retry cannot succeed.
        return new FrontDoorError("payload_too_large", "the request body is too large for the idempotency service to fingerprint");
      }
      // idem is up and refused a new record: 503 would have the caller retry what cannot succeed.
      if (err.code === Codes.storageQuotaExceeded) return new FrontDoorError("storage_quota_exceeded", storageQuotaDetail);
      if (err.code === Codes.tenantUnknown) {
        // idem is up and refused the middleware's tenant (disabled or
        // deleted): no retry succeeds until an operator enables it, so not
        // the retryable 503 (issue 21, hole 2's class).
        this.o.log("the idempotency service refused the middleware's tenant (it does not exist or is disabled)", err);
        return new FrontDoorError("tenant_unknown", tenantUnknownDetail);
      }
      if (err.code === Codes.unauthenticated || err.code === Codes.forbidden) {
        // idem refused the middleware's own token (expired, a rotated
        // secret, a deleted tenant's, without keys:write): a fault of this
        // service's credentials that a rotation fixes, not of the caller's
        // request. Fail closed with the retryable 503 (nothing was claimed,
        // so the retry is safe), never a 401 or 403 that would blame the
        // caller's own credentials.
        this.o.log("the idempotency service refused the middleware's token (check its expiry, tenant and the keys:write scope); failing closed", err);
        return this.unavailable(err);
      }
      if (err.code === Codes.invalidRequest && err.fields[0]?.field === "request") {
        return new FrontDoorError("invalid_request", `the request body cannot be fingerprinted: ${err.fields[0].message}`);
      }
      if (err.code === Codes.invalidRequest) {
        // idem refused the claim itself (an operation from a route function
        // it does not accept, say): the same claim is refused again, so not
        // the retryable 503.
        this.o.log("the idempotency service refused the claim", err);
        return new FrontDoorError("invalid_request", `the idempotency service refused the claim of this request: ${err.detail}`, 0,
          err.fields.map((f) => ({ field: f.field, message: f.message })));
      }
    }
    this.o.log("the idempotency service is unavailable; failing closed", err);
    return this.unavailable(err);
  }

  /** The retryable 503 store_unavailable (fail closed), Retry-After the longer of unavailableRetryAfterSeconds and idem's hint. */
  private unavailable(err: unknown): FrontDoorError {
    const ra = Math.max(this.o.unavailableRetryAfterSeconds * 1000, err instanceof IdemError ? err.retryAfterMs : 0);
    return new FrontDoorError("store_unavailable", "the request was not processed; retry later with the same idempotency key", ra);
  }
}
