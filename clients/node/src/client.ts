import { randomUUID } from "node:crypto";
import type { Bounds, CallOptions } from "./bounds.js";
import { Codes, IdemError, type GiveUpReason, type NoSideEffect } from "./errors.js";
import { validateKey } from "./keys.js";
import { StoredResponse, type ResponseInit } from "./response.js";
import {
  FleetBudgetError,
  budgetSpent,
  headerRetryBudget,
  RetryBudget,
  attemptHeader,
  backoffMs,
  causeOf,
  headerAttempt,
  parseRetryAfter,
  realClock,
  retryAfterWaitMs,
  retryableStatus,
  retryableTransportError,
  withDefaults,
  type AttemptCause,
  type Clock,
  type EffectivePolicy,
  type LogicalCall,
  type RetryPolicy,
} from "./retry.js";
import { headerPreferenceApplied, preferWait } from "./rules.js";
import { run, type Claim, type RunOptions, type RunResult } from "./run.js";
import type { ClaimRequest, ClaimResult, KeyPage, KeyRecord, State, Tenant } from "./types.js";

export type { Bounds, CallOptions };

/** Describes one attempt of a call, as passed to {@link ClientOptions.onAttempt}. Never holds a token. */
export interface AttemptInfo {
  /** The call, e.g. `claim` or `complete`. */
  call: string;
  method: string;
  path: string;
  /** Counts from 1. */
  attempt: number;
  /** The HTTP status, 0 when no answer arrived. */
  status: number;
  /** The attempt's error, undefined on success. */
  error: IdemError | undefined;
  /** Whether another attempt follows, and the wait chosen before it. */
  retry: boolean;
  waitMs: number;
  /** Why no retry follows a retryable failure. */
  giveUp: GiveUpReason | undefined;
  /** The client's retry budget after this attempt (Infinity when off). */
  budgetLeft: number;
}

/** Configures a {@link Client}. */
export interface ClientOptions {
  /** The service's base URL, e.g. `https://idem.example.com` (a path prefix is kept). */
  baseUrl: string;
  /** A bearer token, or a function returning one per attempt (for tokens that rotate; its failure ends the call without retry). */
  token?: string | (() => string | Promise<string>);
  /** The retry policy; missing fields take the defaults. */
  retry?: RetryPolicy;
  /** Called after every attempt of every call (metrics, logs, tests). */
  onAttempt?: (info: AttemptInfo) => void;
  /** The fetch to use (default the global fetch). */
  fetch?: typeof fetch;
  /** The time source of the retry loop (tests). */
  clock?: Clock;
  /** The random source of the jitter, uniform in [0, 1) (tests). */
  random?: () => number;
  /** The User-Agent header. */
  userAgent?: string;
  /**
   * Send a random `attempt_id` with every claim, the same for all retries
   * of one logical claim (and all claims of one `run`), so that a claim
   * whose answer was lost gets its own attempt back (201, same fencing
   * token) instead of waiting out the lease behind 409 request_in_flight.
   * Default true; false for a server older than `attempt_id`.
   */
  attemptIds?: boolean;
}

/** Options of a claim. */
export interface ClaimOptions extends CallOptions {
  /** The attempt id of this logical claim (default: a random one when the client sends attempt ids). */
  attemptId?: string;
  /**
   * Asks the server to hold the claim while another request holds the key,
   * until that one completes (the replay), releases or loses its lease (this
   * claim gets the key): at most this many seconds, rounded down (under 1:
   * not sent), capped by the tenant's `max_wait_seconds`. Keep it below the
   * attempt timeout. {@link run} sets it itself.
   */
  waitSeconds?: number;
}

interface ApiCall {
  name: string;
  method: string;
  path: string;
  query?: URLSearchParams;
  body?: unknown;
}

interface CallResult {
  status: number;
  headers: Headers;
  data: unknown;
}

/**
 * The calls that finish a claim. idem's fleet retry budget does not cover
 * them, and the client ignores it for them: `Idem-Retry-Budget: exhausted`
 * is no reason to stop, and an older server's 429 `retry_budget_exhausted`
 * is retried after its `Retry-After`, within the deadline and the policy
 * (attempts, backoff). Nor do they spend or meet the client's own retry
 * budget: failed claims empty it in an outage. Given up, a complete would
 * leave work that ran unrecorded and its key in flight, to run again after
 * the lease; each admitted claim has one of them, so their retries stay
 * bounded (/docs/retries#finishing).
 */
const finishingCalls: ReadonlySet<string> = new Set(["checkpoint", "complete", "release"]);

function keyPath(key: string, suffix = ""): string {
  return "/v1/keys/" + encodeURIComponent(key) + suffix;
}

/**
 * A client of one idem service. Every call runs in one retry loop: the
 * allowlist (connection refused/reset, timeouts, 408, 429, 502, 503, 504),
 * full jitter (1 s base, 30 s cap) or the server's Retry-After, at most 3
 * attempts, one overall deadline, and a retry budget shared by all calls of
 * the client. Safe for concurrent use.
 */
export class Client {
  /** The effective retry policy, defaults filled in. */
  readonly policy: EffectivePolicy;
  /** The logical call of each run's claim that got 409 request_in_flight, by its bounds, until its next claim. */
  private readonly waitingClaims = new WeakMap<Bounds, LogicalCall>();
  /** @internal */
  readonly clock: Clock;
  /** @internal */
  readonly random: () => number;
  /** @internal */
  readonly attemptIds: boolean;
  private readonly base: string;
  private readonly token: (() => string | Promise<string>) | undefined;
  private readonly budget: RetryBudget;
  private readonly onAttempt: ((info: AttemptInfo) => void) | undefined;
  private readonly fetchFn: typeof fetch;
  private readonly userAgent: string;

  constructor(opts: ClientOptions) {
    const u = new URL(opts.baseUrl);
    if (u.protocol !== "http:" && u.protocol !== "https:") {
      throw new TypeError(`idem base URL ${opts.baseUrl}: the scheme must be http or https`);
    }
    this.base = opts.baseUrl.replace(/\/+$/, "");
    const tok = opts.token;
    this.token = typeof tok === "string" ? () => tok : tok;
    this.policy = withDefaults(opts.retry);
    this.budget = new RetryBudget(this.policy.budgetCapacity, this.policy.budgetRetryCost, this.policy.budgetSuccessRefund);
    this.onAttempt = opts.onAttempt;
    this.fetchFn = opts.fetch ?? globalThis.fetch;
    this.clock = opts.clock ?? realClock;
    this.random = opts.random ?? Math.random;
    this.userAgent = opts.userAgent ?? "idem-node-client/0.1";
    this.attemptIds = opts.attemptIds ?? true;
  }

  /** The tokens left in the client-wide retry budget (Infinity when off). */
  retryBudgetLeft(): number {
    return this.budget.left();
  }

  /** Resolves the bounds of a call. @internal */
  bounds(o: CallOptions = {}): Bounds {
    let deadline = o.deadline ?? Infinity;
    if (o.timeoutMs !== undefined) deadline = Math.min(deadline, this.clock.now() + o.timeoutMs);
    if (this.policy.callDeadlineMs > 0) deadline = Math.min(deadline, this.clock.now() + this.policy.callDeadlineMs);
    return { signal: o.signal, deadline };
  }

  /**
   * Runs fn under the idempotency protocol for key — claim, fn, checkpoint,
   * complete, with a lease keeper, replays and release on a declared
   * {@link NoSideEffect}; see {@link run}.
   */
  run(
    key: string,
    req: ClaimRequest,
    fn: (claim: Claim) => Promise<ResponseInit | StoredResponse> | ResponseInit | StoredResponse,
    opts: RunOptions = {},
  ): Promise<RunResult> {
    return run(this, key, req, fn, opts);
  }

  /**
   * Claims key for a request (POST /v1/keys/{key}/claim): a fresh claim or
   * a takeover (201), or the replay of a completed request (200, `replayed`
   * true, the stored response decoded). A held key throws `request_in_flight`
   * (with `retryAfterMs` = lease left), another request under the key
   * `fingerprint_mismatch`. Most callers want {@link run} instead.
   */
  async claim(key: string, req: ClaimRequest, opts: ClaimOptions = {}): Promise<ClaimResult> {
    return this.claimWithin(key, req, this.bounds(opts), opts.attemptId ?? this.newAttemptId(), opts.waitSeconds);
  }

  /** A fresh attempt id when the client sends them. @internal */
  newAttemptId(): string | undefined {
    return this.attemptIds ? randomUUID() : undefined;
  }

  /** @internal */
  async claimWithin(key: string, req: ClaimRequest, b: Bounds, attemptId: string | undefined, waitSeconds?: number,
    seed?: { number: number; cause?: string | undefined }): Promise<ClaimResult> {
    checkKey("claim", key);
    const body: Record<string, unknown> = {};
    if (req.operation !== undefined) body.operation = req.operation;
    if (req.fingerprint !== undefined) body.fingerprint = req.fingerprint;
    if (req.request !== undefined) body.request = req.request;
    if (req.leaseSeconds !== undefined && req.leaseSeconds > 0) body.lease_seconds = Math.ceil(req.leaseSeconds);
    if (attemptId !== undefined) body.attempt_id = attemptId;
    if (waitSeconds !== undefined && waitSeconds >= 1) body.wait_seconds = Math.floor(waitSeconds);
    // run's claims after a 409 request_in_flight (same bounds) continue
    // one logical call: Idem-Attempt counts on, cause in-flight.
    // A front door's seed (its caller's Idem-Attempt): the claim is that
    // attempt, and its retries count on from it.
    const lc: LogicalCall = this.waitingClaims.get(b) ??
      (seed && seed.number > 1 ? { attempts: seed.number - 1, cause: seed.cause as AttemptCause | undefined, original: undefined }
        : { attempts: 0, cause: undefined, original: undefined });
    this.waitingClaims.delete(b);
    let res: CallResult;
    try {
      res = await this.call({ name: "claim", method: "POST", path: keyPath(key, "/claim"), body }, b, lc);
    } catch (err) {
      if (err instanceof IdemError && err.code === Codes.requestInFlight) {
        lc.cause = "in-flight";
        lc.original ??= err;
        // No claim after a wait either when idem says the budget is spent.
        if (err.fleetBudgetSpent) throw new FleetBudgetError("claim", lc.attempts, "in-flight", lc.original, undefined);
        this.waitingClaims.set(b, lc);
      }
      throw err;
    }
    checkClaimAnswer(res.status, res.headers, res.data);
    const record = res.data as KeyRecord & { resumed?: boolean };
    const replayed = res.status === 200;
    let response: StoredResponse | undefined;
    if (replayed) {
      try {
        response = StoredResponse.fromWire(record.response!);
      } catch (err) {
        throw new IdemError({ status: res.status, code: Codes.invalidAnswer, title: "Invalid answer", call: "claim",
          detail: `the replayed response cannot be decoded: ${err instanceof IdemError ? err.detail : String(err)}`, cause: err });
      }
    }
    return {
      record,
      replayed,
      resumed: record.resumed === true,
      fencingToken: record.fencing_token,
      attempt: record.attempt,
      response,
      waitAppliedSeconds: waitApplied(res.headers),
      leaseLeftMs: leaseLeftMs(record.lease_expires_at, res.headers.get("Date")),
      replayLeftMs: replayed ? Math.max(leaseLeftMs(record.replay_until, res.headers.get("Date")) - 1000, 0) : 0,
    };
  }

  /**
   * Saves a recovery point (a phase name and optional JSON data) on a
   * claimed key and renews its lease (POST /v1/keys/{key}/checkpoint). A
   * stale token throws `lease_lost`.
   */
  async checkpoint(key: string, fencingToken: number, recoveryPoint: string, data?: unknown, opts: CallOptions & { leaseSeconds?: number } = {}): Promise<KeyRecord> {
    return this.checkpointWithin(key, fencingToken, recoveryPoint, data, opts.leaseSeconds, this.bounds(opts));
  }

  /** @internal */
  async checkpointWithin(key: string, fencingToken: number, recoveryPoint: string, data: unknown, leaseSeconds: number | undefined, b: Bounds): Promise<KeyRecord> {
    checkKey("checkpoint", key);
    const body: Record<string, unknown> = { fencing_token: fencingToken, recovery_point: recoveryPoint };
    if (data !== undefined) body.data = data;
    if (leaseSeconds !== undefined && leaseSeconds > 0) body.lease_seconds = Math.ceil(leaseSeconds);
    const res = await this.call({ name: "checkpoint", method: "POST", path: keyPath(key, "/checkpoint"), body }, b);
    return res.data as KeyRecord;
  }

  /**
   * Stores the response of a claimed key and ends the claim (POST
   * /v1/keys/{key}/complete). Repeating it with the same token and response
   * is a no-op, which makes it safe to retry; another response throws
   * `already_completed`, a stale token `lease_lost`, a response over the
   * tenant's limit `payload_too_large` (the claim stays).
   */
  async complete(key: string, fencingToken: number, response: ResponseInit | StoredResponse, opts: CallOptions = {}): Promise<KeyRecord> {
    return this.completeWithin(key, fencingToken, response, this.bounds(opts));
  }

  /** @internal */
  async completeWithin(key: string, fencingToken: number, response: ResponseInit | StoredResponse, b: Bounds): Promise<KeyRecord> {
    checkKey("complete", key);
    const body = { fencing_token: fencingToken, response: StoredResponse.from(response).toWire() };
    const res = await this.call({ name: "complete", method: "POST", path: keyPath(key, "/complete"), body }, b);
    return res.data as KeyRecord;
  }

  /**
   * Removes a claimed key whose attempt left no side effect, so that the
   * next claim starts afresh (POST /v1/keys/{key}/release). A stale token
   * throws `lease_lost`; an absent key `key_not_found`.
   */
  async release(key: string, fencingToken: number, opts: CallOptions = {}): Promise<void> {
    return this.releaseWithin(key, fencingToken, this.bounds(opts));
  }

  /** @internal */
  async releaseWithin(key: string, fencingToken: number, b: Bounds): Promise<void> {
    checkKey("release", key);
    await this.call({ name: "release", method: "POST", path: keyPath(key, "/release"), body: { fencing_token: fencingToken } }, b);
  }

  /** Returns the full record of key (GET /v1/keys/{key}); an absent key throws `key_not_found`. */
  async get(key: string, opts: CallOptions = {}): Promise<KeyRecord> {
    checkKey("get key", key);
    const res = await this.call({ name: "get key", method: "GET", path: keyPath(key) }, this.bounds(opts));
    return res.data as KeyRecord;
  }

  /** Returns one page of the tenant's records, newest first (GET /v1/keys). */
  async list(opts: CallOptions & { state?: State; limit?: number; cursor?: string } = {}): Promise<KeyPage> {
    const q = new URLSearchParams();
    if (opts.state) q.set("state", opts.state);
    if (opts.limit && opts.limit > 0) q.set("limit", String(opts.limit));
    if (opts.cursor) q.set("cursor", opts.cursor);
    const res = await this.call({ name: "list keys", method: "GET", path: "/v1/keys", query: q }, this.bounds(opts));
    return res.data as KeyPage;
  }

  /** Returns the caller's own tenant (GET /v1/tenant). */
  async getTenant(opts: CallOptions = {}): Promise<Tenant> {
    const res = await this.call({ name: "get tenant", method: "GET", path: "/v1/tenant" }, this.bounds(opts));
    return res.data as Tenant;
  }

  /** Runs one call under the retry policy. */
  private async call(ac: ApiCall, b: Bounds, lc: LogicalCall = { attempts: 0, cause: undefined, original: undefined }): Promise<CallResult> {
    const p = this.policy;
    const payload = ac.body === undefined ? undefined : JSON.stringify(ac.body);
    let target = this.base + ac.path;
    const qs = ac.query?.toString();
    if (qs) target += "?" + qs;

    // A write that finishes a claim is outside idem's fleet retry budget
    // (finishingCalls): given up, it would leave work that ran unrecorded.
    const finishing = finishingCalls.has(ac.name);
    for (let attempt = 1; ; attempt++) {
      lc.attempts++;
      const { result, error } = await this.attempt(ac, target, payload, b, attemptHeader(lc.attempts, lc.cause));
      const info: AttemptInfo = {
        call: ac.name, method: ac.method, path: ac.path, attempt, status: result?.status ?? error?.status ?? 0,
        error, retry: false, waitMs: 0, giveUp: undefined, budgetLeft: 0,
      };
      if (!error) {
        this.budget.success();
        info.budgetLeft = this.budget.left();
        this.report(info);
        return result!;
      }
      error.call = ac.name;
      if (error.code === Codes.retryBudgetExhausted && !finishing) {
        // idem's fleet budget refused this retry: stop now, and report
        // what failed before, not the refusal.
        info.giveUp = "fleet_budget";
        info.budgetLeft = this.budget.left();
        this.report(info);
        if (lc.original) throw new FleetBudgetError(ac.name, lc.attempts, lc.cause, lc.original, error);
        throw error.finish(attempt, undefined);
      }
      // (An older server's 429 retry_budget_exhausted of a finishing write
      // is a 429 like any other: retried after its Retry-After.)
      const retryable = !b.signal?.aborted && (error.status === 0 ? error.retryable : retryableStatus(error.status, p.retry500));
      if (!retryable) {
        // The service answered sensibly: it is healthy.
        if (error.status > 0 && error.status < 500) this.budget.success();
        info.budgetLeft = this.budget.left();
        this.report(info);
        throw error.finish(attempt, b.signal?.aborted ? "aborted" : undefined);
      }
      lc.cause = causeOf(error);
      lc.original ??= error;
      if (error.fleetBudgetSpent && !finishing) {
        // idem says the fleet budget is spent: a retry would only be
        // refused (an attempt reaching idem all the same), so stop now as
        // for the refusal, with the original cause.
        info.giveUp = "fleet_signal";
        info.budgetLeft = this.budget.left();
        this.report(info);
        throw new FleetBudgetError(ac.name, lc.attempts, lc.cause, lc.original, undefined);
      }
      const wait = error.retryAfterMs > 0 ? retryAfterWaitMs(p, error.retryAfterMs, this.random) : backoffMs(p, attempt - 1, this.random);
      let giveUp: GiveUpReason | undefined;
      if (attempt >= p.maxAttempts) giveUp = "attempts";
      else if (!this.fits(b, wait)) giveUp = "deadline";
      else if (!finishing && !this.budget.take()) giveUp = "budget";
      info.giveUp = giveUp;
      info.retry = giveUp === undefined;
      info.waitMs = info.retry ? wait : 0;
      info.budgetLeft = this.budget.left();
      this.report(info);
      if (giveUp) throw error.finish(attempt, giveUp);
      try {
        await this.clock.sleep(wait, b.signal);
      } catch {
        throw error.finish(attempt, "aborted");
      }
    }
  }

  /** Reports whether a wait plus a minimal attempt fits before the deadline. @internal */
  fits(b: Bounds, waitMs: number): boolean {
    return b.deadline - this.clock.now() >= waitMs + this.policy.minAttemptTimeMs;
  }

  /** The policy's per-attempt timeout cut to the time left before the deadline, in ms (Infinity for none). @internal */
  attemptTimeoutMs(b: Bounds): number {
    const timeout = this.policy.attemptTimeoutMs > 0 ? this.policy.attemptTimeoutMs : Infinity;
    return Math.min(timeout, b.deadline - this.clock.now());
  }

  /** Sends one HTTP request and reads the whole answer within the attempt's timeout. */
  private async attempt(ac: ApiCall, target: string, payload: string | undefined, b: Bounds, attempt: string): Promise<{ result?: CallResult; error?: IdemError }> {
    if (b.signal?.aborted) {
      return { error: new IdemError({ code: Codes.network, title: "Aborted", detail: "the call was aborted", cause: b.signal.reason }) };
    }
    const timeout = this.attemptTimeoutMs(b);
    const signals: AbortSignal[] = [];
    if (b.signal) signals.push(b.signal);
    if (Number.isFinite(timeout)) signals.push(AbortSignal.timeout(Math.max(1, Math.ceil(timeout))));
    const signal = signals.length === 0 ? undefined : signals.length === 1 ? signals[0] : AbortSignal.any(signals);

    const headers: Record<string, string> = {
      Accept: "application/json, application/problem+json",
      "User-Agent": this.userAgent,
      [headerAttempt]: attempt,
    };
    if (payload !== undefined) headers["Content-Type"] = "application/json";
    if (this.token) {
      let tok: string;
      try {
        tok = await this.token();
      } catch (err) {
        return { error: new IdemError({ code: Codes.unknown, title: "Token source failed", detail: "the token source failed", cause: err }) };
      }
      if (tok) headers.Authorization = `Bearer ${tok}`;
    }
    let resp: Response;
    try {
      resp = await this.fetchFn(target, { method: ac.method, headers, body: payload, signal: signal ?? null });
    } catch (err) {
      return { error: networkError(err, b) };
    }
    let text: string;
    try {
      text = await resp.text();
    } catch (err) {
      // An answer arrived but could not be read whole: retry only what the
      // status would have allowed.
      const e = networkError(err, b);
      const retryable = e.retryable && retryableStatus(resp.status, this.policy.retry500);
      return { error: new IdemError({ status: 0, code: Codes.network, title: "Answer cut short", detail: `the ${resp.status} answer could not be read`, retryable, cause: err }) };
    }
    if (resp.status >= 200 && resp.status < 300) {
      let data: unknown = null;
      if (text) {
        try {
          data = JSON.parse(text);
        } catch (err) {
          return { error: new IdemError({ status: resp.status, code: Codes.invalidAnswer, title: "Invalid answer", detail: "the answer is not JSON", cause: err }) };
        }
      }
      return { result: { status: resp.status, headers: resp.headers, data } };
    }
    return { error: this.problem(resp, text) };
  }

  /** Turns a non-2xx answer into an IdemError. */
  private problem(resp: Response, text: string): IdemError {
    let pd: Record<string, unknown> = {};
    try {
      const v: unknown = JSON.parse(text);
      if (v && typeof v === "object" && !Array.isArray(v)) pd = v as Record<string, unknown>;
    } catch {
      // not a problem document: a proxy's page, say
    }
    const str = (k: string) => (typeof pd[k] === "string" ? (pd[k] as string) : undefined);
    return new IdemError({
      status: resp.status,
      code: str("code") || Codes.unknown,
      type: str("type"),
      title: str("title") ?? (resp.statusText || `HTTP ${resp.status}`),
      detail: str("detail"),
      retryable: typeof pd.retryable === "boolean" ? pd.retryable : retryableStatus(resp.status, this.policy.retry500),
      retryAfterMs: parseRetryAfter(resp.headers.get("Retry-After"), this.clock.now()) ?? 0,
      requestId: resp.headers.get("X-Request-Id") ?? "",
      waitAppliedSeconds: waitApplied(resp.headers),
      fleetBudgetSpent: budgetSpent(resp.headers.get(headerRetryBudget)),
      fields: Array.isArray(pd.errors) ? (pd.errors as { field: string; message: string }[]) : [],
    });
  }

  private report(info: AttemptInfo): void {
    if (!this.onAttempt) return;
    try {
      this.onAttempt(info);
    } catch {
      // a hook must not break the call
    }
  }
}

/** Wraps a fetch failure: retryable when it is on the transport allowlist and the caller did not abort. */
function networkError(err: unknown, b: Bounds): IdemError {
  const aborted = b.signal?.aborted === true;
  const retryable = !aborted && retryableTransportError(err);
  const cause = err instanceof Error && err.cause instanceof Error ? err.cause : err;
  return new IdemError({ code: Codes.network, title: "No answer", detail: cause instanceof Error ? cause.message : String(cause), retryable, cause: err });
}

function positiveInt(v: unknown): boolean {
  return typeof v === "number" && Number.isSafeInteger(v) && v >= 1;
}

/**
 * Throws IdemError(invalid_answer) unless a claim's answer is one the
 * client can act on: a claim (201, state in_flight, a fencing token and an
 * attempt) or a replay (200, state completed, a response whose status idem
 * can have stored). Running the function on a claim without a fencing
 * token, or replaying a response the server did not send, would do what
 * idempotency prevents; such an answer comes from something that is not an
 * idem server speaking the contract (a misrouted proxy, say).
 */
function checkClaimAnswer(status: number, headers: Headers, data: unknown): void {
  const bad = (why: string) => new IdemError({ status, code: Codes.invalidAnswer, title: "Invalid answer", call: "claim", detail: `the ${status} answer to a claim ${why}` });
  if (status !== 200 && status !== 201) throw bad("is neither a claim (201) nor a replay (200)");
  if (data === null || typeof data !== "object" || Array.isArray(data)) throw bad("is not a JSON object");
  const d = data as Record<string, unknown>;
  if (status === 201) {
    if (headers.get("Idempotent-Replayed") === "true") throw bad("is marked Idempotent-Replayed");
    if (d.state !== "in_flight") throw bad(`has state ${JSON.stringify(d.state)}, not in_flight`);
    if (!positiveInt(d.fencing_token)) throw bad("has no fencing token");
    if (!positiveInt(d.attempt)) throw bad("has no attempt");
    return;
  }
  if (d.state !== "completed") throw bad(`has state ${JSON.stringify(d.state)}, not completed`);
  const r = d.response;
  if (r === null || typeof r !== "object" || Array.isArray(r)) throw bad("replays no stored response");
  const st = (r as Record<string, unknown>).status;
  if (!(typeof st === "number" && Number.isInteger(st) && st >= 100 && st <= 599)) throw bad(`replays a response of status ${JSON.stringify(st)}`);
}

/** The wait the server says it applied to a claim (`Preference-Applied: wait=N`), 0 when none. */
function waitApplied(h: Headers): number {
  const v = h.get(headerPreferenceApplied);
  return v === null ? 0 : Math.max(preferWait([v]), 0);
}

function checkKey(call: string, key: string): void {
  const err = validateKey(key);
  if (err) {
    err.call = call;
    throw err.finish(0, undefined);
  }
}

/** A time of the record (lease_expires_at, replay_until) less the answer's Date, in ms; 0 when either is missing or unreadable. */
function leaseLeftMs(expires: string | null | undefined, date: string | null): number {
  const exp = expires ? Date.parse(expires) : NaN;
  const at = date ? Date.parse(date) : NaN;
  return Number.isFinite(exp) && Number.isFinite(at) ? Math.max(exp - at, 0) : 0;
}
