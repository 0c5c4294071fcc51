// The resume endpoint idem's completer calls for an orphaned key (issue 24,
// the page "When a worker dies", /docs/worker-dies/): verify the Standard Webhooks signature, decode the
// call, run the application's resume function with a Claim holding the
// fencing token idem took the key over with, and answer the outcome.
import { createHmac, randomBytes, timingSafeEqual } from "node:crypto";
import type { IncomingMessage, ServerResponse } from "node:http";
import type { Client } from "./client.js";
import { isNoSideEffect } from "./errors.js";
import type { ExpressRequest } from "./express.js";
import { readLimited } from "./fetch.js";
import { FrontDoorError, checkIJSON, headerRequestId, problemResponse, validRequestId, type Answer } from "./rules.js";
import { validateKey } from "./keys.js";
import { StoredResponse, type ResponseInit, type WireResponse } from "./response.js";
import { Claim } from "./run.js";
import type { ResumeCall } from "./types.js";

/** The body `type` of a completer call. */
export const resumeEventType = "key.resume";

/** The Standard Webhooks tolerance: a call whose timestamp is further than this from now is refused. */
export const signatureToleranceSeconds = 300;

export type { ResumeCall } from "./types.js";

const answerMark = Symbol.for("idem.resumeAnswer");

/**
 * An answer of a resume function other than "completed" (which is a
 * response): {@link ResumeAnswer.notDone}, {@link ResumeAnswer.unknown},
 * {@link ResumeAnswer.review}.
 */
export class ResumeAnswer {
  readonly [answerMark] = true;

  private constructor(
    readonly outcome: "not_done" | "unknown" | "review",
    /** With `unknown`: when to ask again, whole seconds (undefined: idem's backoff). */
    readonly retryAfterSeconds?: number,
    /** With `review`: what the person should look at. */
    readonly note?: string,
  ) {}

  /** Nothing happened (no external effect took place): idem releases the key and the client's next retry runs it afresh. */
  static notDone(): ResumeAnswer {
    return new ResumeAnswer("not_done");
  }

  /** The outcome is not known yet (the PSP is down, say): idem keeps the key held and asks again, after retryAfterSeconds if given. */
  static unknown(opts: { retryAfterSeconds?: number } = {}): ResumeAnswer {
    const s = opts.retryAfterSeconds;
    if (s !== undefined && !(Number.isFinite(s) && s > 0)) throw new RangeError("idem: retryAfterSeconds must be a positive number");
    return new ResumeAnswer("unknown", s === undefined ? undefined : Math.ceil(s));
  }

  /** A person must decide (note says what to check): idem marks the key for review. */
  static review(note: string): ResumeAnswer {
    if (typeof note !== "string" || note.trim() === "") throw new RangeError("idem: a review needs a note");
    return new ResumeAnswer("review", undefined, note);
  }

  /** The protocol's answer object. @internal */
  toWire(): Record<string, unknown> {
    if (this.outcome === "unknown") return this.retryAfterSeconds === undefined ? { outcome: "unknown" } : { outcome: "unknown", retry_after_seconds: this.retryAfterSeconds };
    if (this.outcome === "review") return { outcome: "review", note: this.note };
    return { outcome: "not_done" };
  }
}

function isResumeAnswer(v: unknown): v is ResumeAnswer {
  return typeof v === "object" && v !== null && (v as Record<symbol, unknown>)[answerMark] === true;
}

/**
 * What a resume function returns: a response (status, headers, body) when
 * the work is done — idem completes the key with it — or a
 * {@link ResumeAnswer}. Throwing {@link NoSideEffect} is `not_done`, as it
 * releases the key in `run`; any other exception is `unknown`, never
 * `not_done` or `completed`.
 */
export type ResumeResult = ResponseInit | StoredResponse | ResumeAnswer;

/**
 * The application's resume function: the same function `run` runs, given a
 * {@link Claim} under idem's fencing token whose `recoveryPoint` /
 * `recoveryData` are the last checkpoint's, so that it skips the steps
 * already done; `call` holds the rest of the completer's call.
 */
export type ResumeFunction = (claim: Claim, call: ResumeCall) => Promise<ResumeResult> | ResumeResult;

/** Options of {@link ResumeHandler}, {@link expressResumeHandler} and {@link fetchResumeHandler}. */
export interface ResumeOptions {
  /** The idem client the claim's checkpoints go through. */
  client: Client;
  /** The endpoint's signing secret (`whsec_<base64>`), or several while rotating one: a call signed with any verifies. */
  secret: string | readonly string[];
  resume: ResumeFunction;
  /** The largest call body read (default 8 MiB); larger: 413 payload_too_large. */
  maxBodyBytes?: number;
  /** Receives the resume function's exceptions (answered `unknown`) and bad answers (never a secret or a body); default console.error. */
  log?: (message: string, err: unknown) => void;
  /** The clock the timestamp is checked against, ms since the epoch (tests). */
  now?: () => number;
}

/** What the resume handler needs of one HTTP request, whatever the framework. */
export interface ResumeRequest {
  method: string;
  /** A request header's value (fields of one name joined), undefined when absent. */
  header(name: string): string | undefined;
  /** Reads the whole body within limit; rejects with FrontDoorError payload_too_large or invalid_request. */
  body(limit: number): Promise<Uint8Array>;
  /**
   * Aborts when the completer's call goes away. The handler does not pass
   * it on: the resume function runs until the completer's lease on the key
   * ends (the call's `leaseExpiresAt`), as in the Go and Python SDKs, so a
   * hang-up never cuts its work between an external call and its
   * checkpoint.
   */
  signal?: AbortSignal;
}

/**
 * Decodes an endpoint secret: `whsec_` and the base64 key (the prefix is
 * optional, as in the Standard Webhooks libraries). Throws on a secret that
 * is not base64 or empty: a misconfiguration, not a bad call.
 */
function secretKey(secret: string): Buffer {
  const b64 = secret.startsWith("whsec_") ? secret.slice(6) : secret;
  if (b64 === "" || !/^[A-Za-z0-9+/]*={0,2}$/.test(b64) || b64.length % 4 !== 0) {
    throw new TypeError("idem: the resume endpoint's secret must be whsec_ and standard padded base64");
  }
  return Buffer.from(b64, "base64");
}

/**
 * Verifies a Standard Webhooks signature: one of the space-separated
 * `v1,<base64>` values of `signature` must be the HMAC-SHA256, keyed by one
 * of the secrets, of `id.timestamp.body` (compared in constant time), and
 * `timestamp` (unix seconds) within {@link signatureToleranceSeconds} of
 * nowMs. Returns why it refuses, or undefined when it verifies.
 */
export function verifySignature(secrets: string | readonly string[], id: string | undefined, timestamp: string | undefined,
  signature: string | undefined, body: Uint8Array, nowMs: number = Date.now()): string | undefined {
  const keys = (typeof secrets === "string" ? [secrets] : secrets).map(secretKey);
  if (!id || !timestamp || !signature) return "the webhook-id, webhook-timestamp or webhook-signature header is missing";
  if (!/^[0-9]{1,15}$/.test(timestamp)) return "the webhook-timestamp is not unix seconds";
  if (Math.abs(nowMs / 1000 - Number(timestamp)) > signatureToleranceSeconds) {
    return `the webhook-timestamp is more than ${signatureToleranceSeconds} seconds from now`;
  }
  const sent: Buffer[] = [];
  for (const part of signature.split(" ")) {
    if (!part.startsWith("v1,")) continue; // another scheme (v1a, …) or a join artefact
    sent.push(Buffer.from(part.slice(3).replace(/,$/, ""), "base64"));
  }
  for (const key of keys) {
    const want = createHmac("sha256", key).update(`${id}.${timestamp}.`).update(body).digest();
    for (const s of sent) if (s.length === want.length && timingSafeEqual(s, want)) return undefined;
  }
  return "no webhook-signature matches the call";
}

const strictUtf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });
const rfc3339 = /^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$/;

/**
 * Decodes a completer call's body strictly: one I-JSON object of type
 * key.resume, every member the protocol names present with its type (a
 * valid key, positive safe integers, RFC 3339 times). Members it does not
 * name are ignored, as Standard Webhooks receivers do, so that a newer idem
 * that adds one does not turn every resume into "unknown". Throws
 * FrontDoorError invalid_request.
 */
export function decodeResumeCall(webhookId: string, body: Uint8Array): ResumeCall {
  const bad = (detail: string) => new FrontDoorError("invalid_request", detail);
  let text: string;
  try {
    text = strictUtf8.decode(body);
    checkIJSON(text);
  } catch {
    throw bad("the call body is not one JSON value in UTF-8 (I-JSON: no duplicate member names)");
  }
  const v: unknown = JSON.parse(text);
  if (typeof v !== "object" || v === null || Array.isArray(v)) throw bad("the call body is not a JSON object");
  const o = v as Record<string, unknown>;
  const has = (name: string) => Object.prototype.hasOwnProperty.call(o, name);
  const str = (name: string, nullable = false): string | null => {
    const x = o[name];
    if (nullable && x === null) return null;
    if (typeof x !== "string") throw bad(`${name} must be a string${nullable ? " or null" : ""}`);
    return x;
  };
  const int = (name: string): number => {
    const x = o[name];
    if (typeof x !== "number" || !Number.isSafeInteger(x) || x < 1) throw bad(`${name} must be a positive integer`);
    return x;
  };
  const time = (name: string): Date => {
    const x = str(name)!;
    const ms = Date.parse(x);
    if (!rfc3339.test(x) || !Number.isFinite(ms)) throw bad(`${name} must be an RFC 3339 time`);
    return new Date(ms);
  };
  if (o.type !== resumeEventType) throw bad(`type must be "${resumeEventType}"`);
  const key = str("key")!;
  if (validateKey(key)) throw bad("key is not a valid idempotency key");
  if (!has("recovery_data")) throw bad("recovery_data is missing (null when none)");
  const call: ResumeCall = {
    webhookId,
    tenant: str("tenant")!,
    key,
    operation: str("operation")!,
    attempt: int("attempt"),
    maxAttempts: int("max_attempts"),
    fencingToken: int("fencing_token"),
    recoveryPoint: str("recovery_point", true),
    recoveryData: o.recovery_data,
    leaseExpiresAt: time("lease_expires_at"),
    deadline: time("deadline"),
  };
  return call;
}

function jsonAnswer(doc: unknown): Answer {
  return {
    status: 200,
    headers: [["Content-Type", "application/json"], ["Cache-Control", "no-store"]],
    body: new TextEncoder().encode(JSON.stringify(doc)),
  };
}

/** The response a resume function returned, or undefined when it is not one (then the answer is unknown). */
function asResponse(r: unknown): StoredResponse | undefined {
  if (r instanceof StoredResponse) return r;
  if (typeof r !== "object" || r === null) return undefined;
  const s = (r as { status?: unknown }).status;
  if (typeof s !== "number" || !Number.isInteger(s) || s < 100 || s > 599) return undefined;
  try {
    return StoredResponse.from(r as ResponseInit);
  } catch {
    return undefined;
  }
}

/** The most webhook-ids a {@link ResumeHandler} remembers to refuse a replayed call; past it the oldest are forgotten first. */
export const maxSeenResumeIds = 4096;

/**
 * The webhook-ids of the verified calls, remembered for twice the
 * signature tolerance: a signed call replayed while its timestamp is still
 * accepted is refused (idem sends each attempt with a new id).
 */
class SeenIds {
  private readonly until = new Map<string, number>(); // insertion order: oldest first

  /** Whether id is new at nowMs; remembers it. */
  add(id: string, nowMs: number): boolean {
    for (const [old, until] of this.until) {
      if (this.until.size < maxSeenResumeIds && until > nowMs) break;
      this.until.delete(old);
    }
    if (this.until.has(id)) return false;
    this.until.set(id, nowMs + 2 * signatureToleranceSeconds * 1000);
    return true;
  }
}

/**
 * The resume endpoint, framework-free: {@link expressResumeHandler} and
 * {@link fetchResumeHandler} mount it. A call whose signature does not
 * verify, or is older or newer than five minutes, or whose webhook-id the
 * handler already verified (a replay; the last {@link maxSeenResumeIds}
 * ids are remembered for ten minutes), is 401 unauthenticated
 * (problem+json) and the resume function does not run; a body that is not
 * a valid call is 400 invalid_request. A verified call runs the resume
 * function with a {@link Claim} under the call's fencing token (its
 * checkpoints renew idem's lease and move the recovery point on; no lease
 * keeper runs: the completer holds the key until `call.leaseExpiresAt`),
 * and answers 200 with the outcome. `claim.signal` aborts at
 * `call.leaseExpiresAt`, not when idem hangs up: the function runs until
 * the completer's lease ends even after a timed-out call, so work that
 * made its external call still reaches its checkpoint. The outcomes:
 *
 * - a response → `completed` with it (a body that is not UTF-8 as base64);
 * - {@link ResumeAnswer.notDone} or a thrown {@link NoSideEffect} → `not_done`;
 * - {@link ResumeAnswer.unknown} → `unknown` (with `retry_after_seconds`);
 * - {@link ResumeAnswer.review} → `review` with the note;
 * - any other exception, or a value that is none of these → `unknown`
 *   (logged): the function may have done part of the work, so it is never
 *   reported as `not_done` or `completed`.
 */
export class ResumeHandler {
  private readonly o: Required<Omit<ResumeOptions, "secret">> & { secrets: readonly string[] };
  private readonly seen = new SeenIds();

  constructor(opts: ResumeOptions) {
    const secrets = typeof opts.secret === "string" ? [opts.secret] : [...opts.secret];
    if (secrets.length === 0) throw new TypeError("idem: the resume endpoint needs a secret");
    secrets.forEach(secretKey); // refuse a bad secret now, not at the first call
    this.o = {
      client: opts.client,
      secrets,
      resume: opts.resume,
      maxBodyBytes: opts.maxBodyBytes ?? 8 << 20,
      log: opts.log ?? ((message, err) => console.error(`idem: ${message}:`, err instanceof Error ? err.message : err)),
      now: opts.now ?? Date.now,
    };
  }

  /** Serves one call of the completer. */
  async handle(req: ResumeRequest): Promise<Answer> {
    const rid = req.header(headerRequestId);
    const requestId = validRequestId(rid) ? rid! : randomBytes(16).toString("hex");
    const refuse = (e: FrontDoorError): Answer => problemResponse(e, requestId);
    if (req.method !== "POST") {
      const a = refuse(new FrontDoorError("method_not_allowed", "the resume endpoint takes POST"));
      a.headers.push(["Allow", "POST"]);
      return a;
    }
    let body: Uint8Array;
    try {
      body = await req.body(this.o.maxBodyBytes);
    } catch (err) {
      if (err instanceof FrontDoorError) return refuse(err);
      throw err;
    }
    const id = req.header("webhook-id");
    const why = verifySignature(this.o.secrets, id, req.header("webhook-timestamp"), req.header("webhook-signature"), body, this.o.now());
    if (why) return refuse(new FrontDoorError("unauthenticated", why));
    if (!this.seen.add(id!, this.o.now())) return refuse(new FrontDoorError("unauthenticated", "the call's webhook-id was already seen: a replay"));
    let call: ResumeCall;
    try {
      call = decodeResumeCall(id!, body);
    } catch (err) {
      if (err instanceof FrontDoorError) return refuse(err);
      throw err;
    }
    return jsonAnswer(await this.run(call));
  }

  /** Runs the resume function for a verified call and maps what it did to the protocol's answer. */
  private async run(call: ResumeCall): Promise<Record<string, unknown>> {
    // The claim's signal aborts when the completer's lease on the key ends
    // (then the next attempt may take the key with a new token), never
    // when idem hangs up: a completer that timed out, or whose replica
    // died, leaves the function to reach its checkpoint, which the next
    // attempt resumes from, instead of cutting it after an external call
    // that the next attempt would then repeat.
    const signal = AbortSignal.timeout(Math.max(0, call.leaseExpiresAt.getTime() - this.o.now()));
    const claim = new Claim(this.o.client, call.key, call.fencingToken, call.attempt, true, undefined, call.recoveryPoint ?? "",
      call.recoveryData === null ? undefined : call.recoveryData, signal, call);
    let result: unknown;
    try {
      result = await this.o.resume(claim, call);
    } catch (err) {
      if (isNoSideEffect(err)) return { outcome: "not_done" };
      this.o.log(`the resume function of key ${call.key} threw; answered unknown`, err);
      return { outcome: "unknown" };
    }
    if (isResumeAnswer(result)) return result.toWire();
    const response = asResponse(result);
    if (!response) {
      this.o.log(`the resume function of key ${call.key} returned neither a response (status 100-599) nor a ResumeAnswer; answered unknown`, result === undefined ? "undefined" : typeof result);
      return { outcome: "unknown" };
    }
    const wire: WireResponse = response.toWire();
    return { outcome: "completed", response: wire };
  }
}

type Next = (err?: unknown) => void;

/** Reads an Express request's raw body: the bytes a body parser kept as req.rawBody, else the stream. */
async function rawBody(req: ExpressRequest, limit: number): Promise<Uint8Array> {
  if (Buffer.isBuffer(req.rawBody)) return req.rawBody;
  if (req.readableEnded) {
    // A body parser ran first and kept no raw bytes: the signature covers
    // bytes that are gone. A mounting mistake, not a bad call.
    throw new Error("idem: the resume handler needs the raw body: mount it before body parsers, or have them keep req.rawBody");
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
    if (err instanceof FrontDoorError) throw err;
    throw new FrontDoorError("invalid_request", "the request body ended before its Content-Length");
  }
  if (!req.complete) throw new FrontDoorError("invalid_request", "the request body ended before its Content-Length");
  return Buffer.concat(chunks);
}

/**
 * The resume endpoint as an Express handler (see {@link ResumeHandler}):
 *
 *     app.post("/idem/resume", expressResumeHandler({ client, secret: process.env.IDEM_RESUME_SECRET!, resume }));
 *
 * It reads the raw body itself: register it before body parsers (or have
 * them keep `req.rawBody`), and before `expressMiddleware` when that is
 * `app.use`d (the completer's call carries no Idempotency-Key).
 */
export function expressResumeHandler(opts: ResumeOptions): (req: IncomingMessage, res: ServerResponse, next: Next) => void {
  const h = new ResumeHandler(opts);
  return (rq, res, next) => {
    const req = rq as ExpressRequest;
    const gone = new AbortController();
    res.once("close", () => {
      if (!res.writableEnded) gone.abort(new Error("idem: the completer's call went away"));
    });
    h.handle({
      method: req.method ?? "GET",
      header: (name) => {
        const v = req.headers[name.toLowerCase()];
        return Array.isArray(v) ? v.join(" ") : v;
      },
      body: (limit) => rawBody(req, limit),
      signal: gone.signal,
    }).then((a) => {
      res.statusCode = a.status;
      for (const [k, v] of a.headers) res.setHeader(k, v);
      res.setHeader("Content-Length", a.body.length);
      res.end(a.body);
    }, next);
  };
}

/**
 * The resume endpoint as a fetch-style handler (Hono, Next.js route
 * handlers; see {@link ResumeHandler}):
 *
 *     const resumeEndpoint = fetchResumeHandler({ client, secret, resume });
 *     app.post("/idem/resume", (c) => resumeEndpoint(c.req.raw));   // Hono
 */
export function fetchResumeHandler(opts: ResumeOptions): (req: Request) => Promise<Response> {
  const h = new ResumeHandler(opts);
  return async (req) => {
    const a = await h.handle({
      method: req.method,
      header: (name) => req.headers.get(name) ?? undefined,
      body: (limit) => readLimited(req, limit),
      signal: req.signal,
    });
    return new Response(a.body, { status: a.status, headers: a.headers });
  };
}
