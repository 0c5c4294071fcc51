import { Codes, IdemError } from "./errors.js";

/**
 * The retry policy of every call a {@link Client} makes. A field left out
 * takes its default, the same as the Go SDK's and the docs' retry contract.
 */
export interface RetryPolicy {
  /** Attempts of one call, the first included. Default 3; 1 disables retries. */
  maxAttempts?: number;
  /** Full-jitter backoff: the wait before retry n (n = 0, 1, …) is uniform in [0, min(maxDelayMs, baseDelayMs·2^n)). Default 1000. */
  baseDelayMs?: number;
  /** Cap of the backoff. Default 30000. */
  maxDelayMs?: number;
  /** Bound of one attempt (connect, send, read the whole answer), never past the call's deadline. Default 10000; 0 for none. */
  attemptTimeoutMs?: number;
  /** The least time an attempt is worth: no retry when the time left cannot fit the wait plus this. Default 100. */
  minAttemptTimeMs?: number;
  /** Spread added to a Retry-After wait, uniform in [0, this), so that a crowd told "1 second" does not return at once. Default 1000; 0 for none. */
  retryAfterJitterMs?: number;
  /** Retry HTTP 500 too. Off by default: a 500 says the server failed unexpectedly; repeating rarely helps. */
  retry500?: boolean;
  /** Longest total wait of `run` for another holder of the key (409 request_in_flight), never past the deadline. Default 60000; 0 for no waiting. */
  inFlightWaitMs?: number;
  /** Client-wide retry budget: a token bucket, full at start. Default 10; 0 switches the budget off. */
  budgetCapacity?: number;
  /** Tokens one retry costs. Default 1. */
  budgetRetryCost?: number;
  /** Tokens a sane answer (2xx, or a non-retryable 4xx) puts back, up to the capacity. Default 0.1. */
  budgetSuccessRefund?: number;
  /** Bounds one whole call (its attempts, waits and `run`'s in-flight waits) when the call gives no sooner deadline. Default 0: none. The presets set it. */
  callDeadlineMs?: number;
}

/** A {@link RetryPolicy} with every field filled in. */
export type EffectivePolicy = Required<RetryPolicy>;

/** The defaults of {@link RetryPolicy}. */
export const defaultRetryPolicy: Readonly<EffectivePolicy> = Object.freeze({
  maxAttempts: 3,
  baseDelayMs: 1000,
  maxDelayMs: 30_000,
  attemptTimeoutMs: 10_000,
  minAttemptTimeMs: 100,
  retryAfterJitterMs: 1000,
  retry500: false,
  inFlightWaitMs: 60_000,
  budgetCapacity: 10,
  budgetRetryCost: 1,
  budgetSuccessRefund: 0.1,
  callDeadlineMs: 0,
});

/**
 * The preset for a call a person waits on (/docs/retries#presets): 10 s for
 * the whole call, 3 attempts of at most 3 s, waits of 0.2 s growing to 2 s,
 * at most 5 s waiting for another holder of the key, the per-process budget
 * as by default (10 retries, 0.1 back per success).
 */
export const interactive: Readonly<RetryPolicy> = Object.freeze({
  callDeadlineMs: 10_000, maxAttempts: 3, attemptTimeoutMs: 3000, baseDelayMs: 200, maxDelayMs: 2000,
  inFlightWaitMs: 5000, budgetCapacity: 10, budgetSuccessRefund: 0.1,
});

/**
 * The preset for a job nobody waits on: 10 minutes for the whole call, 10
 * attempts of at most 30 s, waits of 1 s growing to 60 s, up to 5 minutes
 * waiting for another holder of the key, a per-process budget of 100
 * retries (0.5 back per success).
 */
export const background: Readonly<RetryPolicy> = Object.freeze({
  callDeadlineMs: 600_000, maxAttempts: 10, attemptTimeoutMs: 30_000, baseDelayMs: 1000, maxDelayMs: 60_000,
  inFlightWaitMs: 300_000, budgetCapacity: 100, budgetSuccessRefund: 0.5,
});

/** The `Idem-Attempt` request header (/docs/retries#attempt): "1", "2;cause=timeout". */
export const headerAttempt = "Idem-Attempt";

/** Why the attempt before a retry failed: the `cause` of `Idem-Attempt`. */
export type AttemptCause = "timeout" | "network" | "unavailable" | "throttled" | "server-error" | "in-flight";

/** The attempts of one logical call across the HTTP calls that make it. @internal */
export interface LogicalCall {
  attempts: number;
  cause: AttemptCause | undefined;
  /** The first retryable failure's error. */
  original: IdemError | undefined;
}

/** The `Idem-Attempt` value of attempt n after a failure of cause. */
export function attemptHeader(n: number, cause?: AttemptCause): string {
  return n <= 1 || !cause ? String(Math.max(1, n)) : `${n};cause=${cause}`;
}

/** The `Idem-Attempt` cause of a failed attempt. */
export function causeOf(err: IdemError): AttemptCause {
  if (err.code === Codes.requestInFlight) return "in-flight";
  if (err.status === 503) return "unavailable";
  if (err.status === 429) return "throttled";
  if (err.status === 408) return "timeout";
  if (err.status >= 500) return "server-error";
  const c = err.cause;
  if (c instanceof Error && (c.name === "TimeoutError" || (c.cause instanceof Error && c.cause.name === "TimeoutError"))) return "timeout";
  return "network";
}

/**
 * The error of a call whose retry idem refused with 429
 * `retry_budget_exhausted`: the tenant's retries use its fleet retry
 * budget. No further attempt was sent. Its code, status and detail are the
 * original failure's (`original`: the 503, the timeout), so a caller
 * handles the outage as before; `attemptCause` names it, `refusal` is the
 * 429 (its `retryAfterMs` says when the budget has room again), or
 * undefined when no retry was sent at all because the failure's answer
 * said the budget is spent (`Idem-Retry-Budget: exhausted`).
 */
export class FleetBudgetError extends IdemError {
  readonly original: IdemError;
  readonly refusal: IdemError | undefined;
  readonly attemptCause: AttemptCause | undefined;

  constructor(call: string, attempts: number, attemptCause: AttemptCause | undefined, original: IdemError, refusal: IdemError | undefined) {
    const why = refusal ? "the tenant's fleet retry budget refused the retry" : "idem said the tenant's fleet retry budget is spent";
    super({ status: original.status, code: original.code, type: original.type, title: original.title,
      detail: `${original.detail || original.title} (stopped: ${why}; original cause ${attemptCause ?? "unknown"})`,
      retryable: false, retryAfterMs: (refusal ?? original).retryAfterMs, requestId: (refusal ?? original).requestId, call, cause: original });
    this.name = "FleetBudgetError";
    this.original = original;
    this.refusal = refusal;
    this.attemptCause = attemptCause;
    this.finish(attempts, "fleet_budget");
  }
}

/** The response header by which idem says, on a retryable failure, that the tenant's fleet retry budget is spent. */
export const headerRetryBudget = "Idem-Retry-Budget";

/** Whether an `Idem-Retry-Budget` value says the budget is spent (the RFC 9651 Token `exhausted`; parameters ignored). */
export function budgetSpent(value: string | null): boolean {
  return value !== null && value.split(";", 1)[0]!.trim() === "exhausted";
}

/** Fills the missing fields of p with the defaults. */
export function withDefaults(p: RetryPolicy = {}): EffectivePolicy {
  const out: EffectivePolicy = { ...defaultRetryPolicy };
  for (const [k, v] of Object.entries(p) as [keyof RetryPolicy, unknown][]) {
    if (v !== undefined) (out as Record<string, unknown>)[k] = v;
  }
  if (!(out.maxAttempts >= 1)) out.maxAttempts = 1;
  if (!(out.baseDelayMs > 0)) out.baseDelayMs = defaultRetryPolicy.baseDelayMs;
  out.maxDelayMs = Math.max(out.maxDelayMs, out.baseDelayMs);
  return out;
}

/**
 * The ceiling of the full-jitter wait before retry n (0 for the first
 * retry): min(maxDelayMs, baseDelayMs·2^n). The wait itself is uniform in
 * [0, ceiling).
 */
export function backoffCeilingMs(p: Pick<EffectivePolicy, "baseDelayMs" | "maxDelayMs">, n: number): number {
  return Math.min(p.maxDelayMs, p.baseDelayMs * 2 ** Math.max(0, n));
}

/** The full-jitter wait before retry n, drawn with random (default Math.random). */
export function backoffMs(p: Pick<EffectivePolicy, "baseDelayMs" | "maxDelayMs">, n: number, random: () => number = Math.random): number {
  return random() * backoffCeilingMs(p, n);
}

/** The wait for an answer that carried Retry-After: the server's delay plus the policy's spread. */
export function retryAfterWaitMs(p: Pick<EffectivePolicy, "retryAfterJitterMs">, retryAfterMs: number, random: () => number = Math.random): number {
  return retryAfterMs + (p.retryAfterJitterMs > 0 ? random() * p.retryAfterJitterMs : 0);
}

const retryStatuses = new Set([408, 429, 502, 503, 504]);

/** Reports whether an HTTP status is on the retry allowlist: 408, 429, 502, 503, 504 (and 500 with retry500). */
export function retryableStatus(status: number, retry500 = false): boolean {
  return retryStatuses.has(status) || (retry500 && status === 500);
}

const months = "(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)";
// The three HTTP-date forms of RFC 9110 §5.6.7: IMF-fixdate, the obsolete
// RFC 850 form and asctime (which has no zone: it is GMT).
const imfFixdate = new RegExp(`^(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), \\d{2} ${months} \\d{4} \\d{2}:\\d{2}:\\d{2} GMT$`);
const rfc850Date = new RegExp(`^(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday), \\d{2}-${months}-\\d{2} \\d{2}:\\d{2}:\\d{2} GMT$`);
const asctimeDate = new RegExp(`^(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) ${months} [ \\d]\\d \\d{2}:\\d{2}:\\d{2} \\d{4}$`);

/** Parses an HTTP-date to epoch milliseconds; NaN when it is none. */
export function parseHttpDate(v: string): number {
  if (imfFixdate.test(v)) return Date.parse(v);
  if (rfc850Date.test(v)) {
    // Two-digit years: RFC 9110 says a year more than 50 years ahead is in the past.
    const m = /-(\d{2}) /.exec(v)!;
    const yy = Number(m[1]);
    const nowYear = new Date().getUTCFullYear();
    let year = Math.floor(nowYear / 100) * 100 + yy;
    if (year > nowYear + 50) year -= 100;
    return Date.parse(v.replace(/^\w+, (\d{2})-(\w{3})-\d{2} /, `$1 $2 ${year} `));
  }
  if (asctimeDate.test(v)) {
    const [, mon, day, time, year] = /^\w{3} (\w{3}) +(\d+) (\S+) (\d{4})$/.exec(v)!;
    return Date.parse(`${day} ${mon} ${year} ${time} GMT`);
  }
  return NaN;
}

/**
 * Reads a Retry-After header: delay-seconds or an HTTP-date (relative to
 * nowMs). Returns the delay in milliseconds, 0 for a date in the past or a
 * zero delay, and null when absent or unreadable.
 */
export function parseRetryAfter(value: string | null | undefined, nowMs: number = Date.now()): number | null {
  if (value === null || value === undefined) return null;
  const v = value.trim();
  if (v === "") return null;
  if (/^\d+$/.test(v)) return Math.min(Number(v), 2 ** 31) * 1000;
  const when = parseHttpDate(v);
  if (Number.isNaN(when)) return null;
  return Math.max(0, when - nowMs);
}

/** The client-wide token bucket of retries. */
export class RetryBudget {
  private tokens: number;
  private readonly off: boolean;

  constructor(
    private readonly capacity: number,
    private readonly cost: number,
    private readonly refund: number,
  ) {
    this.off = !(capacity > 0);
    this.tokens = this.off ? Infinity : capacity;
  }

  /** Spends the cost of one retry; false when the bucket cannot pay it. */
  take(): boolean {
    if (this.off) return true;
    if (this.tokens + 1e-9 < this.cost) return false; // tolerate float sums like 10 × 0.1
    this.tokens = Math.max(this.tokens - this.cost, 0);
    return true;
  }

  /** Puts back the refund of a sane answer, up to the capacity. */
  success(): void {
    if (!this.off) this.tokens = Math.min(this.capacity, this.tokens + this.refund);
  }

  /** The tokens left (Infinity when the budget is off). */
  left(): number {
    return this.tokens;
  }
}

/**
 * The time source of a client: `now` for deadlines, `sleep` for the waits
 * between attempts. Tests inject a fake one to run the retry loop without
 * real sleeps.
 */
export interface Clock {
  now(): number;
  /** Waits ms or until signal aborts; rejects with the signal's reason then. */
  sleep(ms: number, signal?: AbortSignal): Promise<void>;
}

/** The longest a Node.js timer waits: a longer one fires after 1 ms. */
const maxTimerMs = 2 ** 31 - 1;

/** The real clock. A wait past a timer's range (a Retry-After of weeks) is slept in steps, never cut to 1 ms. */
export const realClock: Clock = {
  now: () => Date.now(),
  sleep(ms: number, signal?: AbortSignal): Promise<void> {
    return new Promise((resolve, reject) => {
      if (signal?.aborted) {
        reject(signal.reason);
        return;
      }
      const end = Date.now() + Math.max(0, ms);
      let timer: NodeJS.Timeout;
      const onAbort = () => {
        clearTimeout(timer);
        reject(signal?.reason);
      };
      const arm = () => {
        timer = setTimeout(() => {
          if (Date.now() < end) {
            arm();
            return;
          }
          signal?.removeEventListener("abort", onAbort);
          resolve();
        }, Math.min(Math.max(0, end - Date.now()), maxTimerMs));
      };
      arm();
      signal?.addEventListener("abort", onAbort, { once: true });
    });
  },
};

const retryableCodes = new Set([
  "ECONNREFUSED",
  "ECONNRESET",
  "EPIPE",
  "ETIMEDOUT",
  "ECONNABORTED",
  "UND_ERR_SOCKET",
  "UND_ERR_CONNECT_TIMEOUT",
  "UND_ERR_HEADERS_TIMEOUT",
  "UND_ERR_BODY_TIMEOUT",
  "UND_ERR_CLOSED",
]);

/**
 * Reports whether an error of fetch (no HTTP answer, or an answer cut
 * short) is on the allowlist: connection refused, connection reset or
 * closed before the answer, and timeouts.
 */
export function retryableTransportError(err: unknown): boolean {
  for (let e = err, depth = 0; e && typeof e === "object" && depth < 8; e = (e as { cause?: unknown }).cause, depth++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string" && retryableCodes.has(code)) return true;
    const name = (e as { name?: unknown }).name;
    if (name === "TimeoutError") return true;
    if (Array.isArray((e as { errors?: unknown }).errors)) {
      // AggregateError of happy-eyeballs connects.
      if (((e as { errors: unknown[] }).errors).some((x) => retryableTransportError(x))) return true;
    }
  }
  return false;
}
