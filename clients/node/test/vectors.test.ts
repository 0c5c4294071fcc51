// The shared vectors of testvectors/sdk and testvectors/frontdoor.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { describe, test } from "node:test";
import {
  Client, Codes, FrontDoorError, IdemError, RetryBudget, StoredResponse, backoffCeilingMs, backoffMs, checkIJSON, defaultStoredHeaders, fingerprintDocument,
  key, operation, parseKey, parseRetryAfter, problems, requirement, retryAfterWaitMs, scopedKey, storableStatus, storeStatus, storedHeaders,
  notReplayableDetail, mismatchDetail, preferWait, storageQuotaDetail, tenantUnknownDetail, validRequestId, validateKey, withDefaults,
  held, outcomeReviewDetail, callerAttempt, retryBudgetDetail, FrontDoor, FleetBudgetError, type RunOptions,
} from "../src/index.js";
import { attemptHeader, type AttemptCause } from "../src/retry.js";
import { repoRoot } from "./server.js";

// eslint-disable-next-line @typescript-eslint/no-explicit-any
type Any = any;
const load = (p: string): Any => JSON.parse(readFileSync(join(repoRoot, "testvectors", p), "utf8"));
const close = (a: number, b: number, what: string) => assert.ok(Math.abs(a - b) < 1e-6, `${what}: ${a} != ${b}`);

describe("testvectors/sdk", () => {
  const keys = load("sdk/keys.json");
  for (const v of keys.validate) {
    test(`keys.validate: ${v.name}`, () => {
      const err = validateKey(v.key);
      if (v.valid) assert.equal(err, null);
      else assert.equal(err?.code, v.error);
    });
  }
  for (const v of keys.derive) {
    test(`keys.derive: ${v.name}`, () => {
      if (v.error) assert.throws(() => key(...v.parts), (e: Any) => e.code === v.error);
      else assert.equal(key(...v.parts), v.key);
    });
  }

  const ra = load("sdk/retry_after.json");
  const now = Date.parse(ra.now);
  for (const c of ra.cases) {
    test(`retry_after: ${c.name}`, () => assert.equal((parseRetryAfter(c.header, now) ?? 0) / 1000, c.seconds));
  }

  // classification.json runs through the real retry loop in retry.test.ts.

  const bo = load("sdk/backoff.json");
  const p = withDefaults();
  test("backoff: the policy's defaults", () => {
    assert.equal(p.baseDelayMs, bo.base_seconds * 1000);
    assert.equal(p.maxDelayMs, bo.cap_seconds * 1000);
    assert.equal(p.maxAttempts, bo.max_attempts);
    assert.equal(p.retryAfterJitterMs, bo.retry_after_spread_seconds * 1000);
    assert.equal(p.minAttemptTimeMs, bo.min_attempt_seconds * 1000);
  });
  for (const v of bo.full_jitter) {
    test(`backoff.full_jitter: retry ${v.retry} random ${v.random}`, () => {
      close(backoffCeilingMs(p, v.retry) / 1000, v.ceiling_seconds, "ceiling");
      close(backoffMs(p, v.retry, () => v.random) / 1000, v.wait_seconds, "wait");
    });
  }
  for (const v of bo.retry_after) {
    test(`backoff.retry_after: ${v.retry_after_seconds} s random ${v.random}`, () => {
      close(retryAfterWaitMs(p, v.retry_after_seconds * 1000, () => v.random) / 1000, v.wait_seconds, "wait");
    });
  }
  for (const v of bo.fits) {
    test(`backoff.fits: ${v.name}`, async () => {
      const { Client } = await import("../src/index.js");
      const c = new Client({ baseUrl: "http://127.0.0.1:1", clock: { now: () => 0, sleep: async () => {} } });
      assert.equal(c.fits({ signal: undefined, deadline: v.left_ms === null ? Infinity : v.left_ms }, v.wait_ms), v.fits);
    });
  }

  const bu = load("sdk/budget.json");
  test("budget: the steps in order", () => {
    const b = new RetryBudget(bu.capacity, bu.retry_cost, bu.success_refund);
    bu.steps.forEach((s: Any, i: number) => {
      if (s.op === "take") assert.equal(b.take(), s.ok, `step ${i}`);
      else for (let j = 0; j < (s.repeat ?? 1); j++) b.success();
      assert.ok(Math.abs(b.left() - s.left) < 1e-9, `step ${i}: left ${b.left()} != ${s.left}`);
    });
  });

  const rp = load("sdk/replay.json");
  for (const v of rp.decode) {
    test(`replay.decode: ${v.name}`, () => {
      if (v.error) {
        assert.throws(() => StoredResponse.fromWire(v.response));
        return;
      }
      const r = StoredResponse.fromWire(v.response);
      assert.equal(r.status, v.status);
      assert.deepEqual({ ...r.headers }, v.headers);
      assert.equal(Buffer.from(r.body).toString("hex"), v.body_hex);
    });
  }
  for (const v of rp.encode) {
    test(`replay.encode: ${v.name}`, () => {
      const w = new StoredResponse(200, {}, new Uint8Array(Buffer.from(v.body_hex, "hex"))).toWire();
      assert.equal(w.body, v.body);
      assert.equal(w.body_encoding, v.body_encoding);
    });
  }
  for (const v of rp.claim_answers) {
    test(`replay.claim_answers: ${v.name}`, async () => {
      // A loopback server answers every claim as the vector says; completes
      // and releases succeed and are counted. An answer the client cannot
      // interpret is invalid_answer: the function never runs, nothing is
      // completed, released or replayed, the claim is not retried.
      let claims = 0;
      let writes = 0;
      const srv = createServer((req, res) => {
        req.resume();
        req.on("end", () => {
          if (!req.url!.endsWith("/claim")) {
            writes++;
            res.writeHead(200, { "Content-Type": "application/json" }).end('{"key":"k","state":"completed","fencing_token":3,"attempt":1}');
            return;
          }
          claims++;
          res.writeHead(v.status, { ...v.headers, "Content-Type": "application/json" }).end(v.body);
        });
      });
      await new Promise<void>((r) => srv.listen(0, "127.0.0.1", () => r()));
      const c = new Client({ baseUrl: `http://127.0.0.1:${(srv.address() as AddressInfo).port}`, token: "t" });
      const ran: string[] = [];
      const fn = async () => {
        ran.push("ran");
        return { status: 201, body: "ran" };
      };
      try {
        if (v.expect === "invalid") {
          await assert.rejects(c.claim("k", { operation: "op", request: {} }), (e: Any) => e instanceof IdemError && e.code === Codes.invalidAnswer);
          await assert.rejects(c.run("k", { operation: "op", request: {} }, fn), (e: Any) => e instanceof IdemError && e.code === Codes.invalidAnswer);
          assert.deepEqual(ran, [], "the function must not run on an answer the client cannot interpret");
          assert.equal(writes, 0, "nothing is completed or released");
          assert.equal(claims, 2, "not retried");
          return;
        }
        const cr = await c.claim("k", { operation: "op", request: {} });
        const res = await c.run("k", { operation: "op", request: {} }, fn);
        if (v.expect === "claim") {
          assert.ok(!cr.replayed && cr.fencingToken >= 1);
          assert.ok(!res.replayed);
          assert.deepEqual(ran, ["ran"]);
        } else {
          assert.equal(v.expect, "replay");
          assert.ok(cr.replayed && res.replayed);
          assert.deepEqual(ran, []);
          assert.equal(res.response.text(), "x");
        }
      } finally {
        srv.closeAllConnections();
        await new Promise<void>((r) => srv.close(() => r()));
      }
    });
  }
});

describe("testvectors/frontdoor", () => {
  for (const v of load("frontdoor/keys.json").vectors) {
    test(`keys: ${v.name}`, () => {
      let got: Any;
      try {
        const k = parseKey(v.header_values);
        // Vectors without a scope test parsing only, as in Go and Python.
        got = { key: k === null || v.scope === undefined ? k : scopedKey(v.scope, k) };
      } catch (err) {
        assert.ok(err instanceof FrontDoorError, String(err));
        got = { error: err.code };
      }
      assert.deepEqual(got, v.expect);
    });
  }

  for (const v of load("frontdoor/fingerprint.json").vectors) {
    test(`fingerprint: ${v.name}`, () => {
      const body = v.body_base64 !== undefined ? Buffer.from(v.body_base64, "base64") : Buffer.from(v.body ?? "", "utf8");
      const hs = new Map<string, string[]>(Object.entries(v.headers ?? {}).map(([k, vals]) => [k.toLowerCase(), vals as string[]]));
      let got: Any;
      try {
        const doc = fingerprintDocument({ path: v.path, query: v.query ?? "", contentType: v.content_type, body, header: (n) => hs.get(n.toLowerCase()) ?? [] }, v.rules ?? {});
        got = { operation: operation(v.method, v.route), document: doc };
      } catch (err) {
        assert.ok(err instanceof FrontDoorError, String(err));
        got = { error: err.code };
      }
      const want = { ...v.expect };
      delete want.fingerprint;
      assert.deepEqual(got, want);
    });
  }

  const pol = load("frontdoor/policy.json");
  test("policy: default stored headers", () => assert.deepEqual([...defaultStoredHeaders], pol.default_stored_headers));
  for (const v of pol.requirements) test(`policy.requirements: ${v.method}`, () => assert.equal(requirement(v.method), v.expect));
  for (const v of pol.store) {
    test(`policy.store: ${v.status} store_5xx=${v.store_5xx}`, () => assert.equal(!storableStatus(v.status) ? "not_replayable" : storeStatus(v.status, v.store_5xx) ? "store" : "release", v.expect));
  }
  for (const v of pol.stored_headers) {
    test(`policy.stored_headers: ${v.name}`, () => {
      const h = new Map<string, string[]>(Object.entries(v.response_headers).map(([k, vals]) => [k.toLowerCase(), vals as string[]]));
      assert.deepEqual(storedHeaders((n) => h.get(n.toLowerCase()) ?? [], v.allow ?? undefined), v.expect);
    });
  }
  test("policy.problems: the fixed details are the vectors'", () => {
    // The vectors hold each fixed detail once; the constants must say the same.
    const fixed = Object.fromEntries(pol.problems.filter((v: { detail?: string }) => v.detail !== undefined).map((v: { code: string; detail: string }) => [v.code, v.detail]));
    assert.deepEqual(fixed, { fingerprint_mismatch: mismatchDetail, response_not_replayable: notReplayableDetail, storage_quota_exceeded: storageQuotaDetail, tenant_unknown: tenantUnknownDetail, outcome_review: outcomeReviewDetail, retry_budget_exhausted: retryBudgetDetail });
  });
  for (const v of pol.problems) {
    const known = (problems as Record<string, { status: number; title: string; retryable: boolean }>)[v.code];
    if (!known) {
      // Only the gateway answers these; every other code must be in the table.
      test(`policy.problems: ${v.code} is gateway-only`, () => assert.ok(["upstream_unavailable", "upstream_timeout", "server_busy"].includes(v.code), v.code));
      continue;
    }
    test(`policy.problems: ${v.code}`, async () => {
      const { problemResponse } = await import("../src/index.js");
      const a = problemResponse(new FrontDoorError(v.code, ""), "rid");
      const body = JSON.parse(Buffer.from(a.body).toString());
      assert.equal(a.status, v.status);
      assert.equal(body.title, v.title);
      assert.equal(body.retryable, v.retryable);
      assert.equal(body.type, v.type);
      assert.equal(body.instance, "urn:idem:request:rid");
      assert.equal(a.headers.some(([k]) => k === "Retry-After"), v.retry_after);
    });
  }
  // Rule 8: idem's answers for a key its completer holds, through held() and problemResponse.
  assert.ok(pol.held.length > 0);
  for (const v of pol.held) {
    test(`policy.held: ${v.name}`, async () => {
      const { problemResponse } = await import("../src/index.js");
      const e = held(v.idem.code, (v.idem.retry_after_seconds ?? 0) * 1000);
      assert.ok(e, v.name);
      const a = problemResponse(e, "rid");
      const body = JSON.parse(Buffer.from(a.body).toString());
      assert.equal(a.status, v.expect.status);
      assert.equal(body.code, v.expect.code);
      assert.equal(body.retryable, v.expect.retryable);
      assert.equal(body.detail, v.expect.detail);
      assert.equal(a.headers.find(([k]) => k === "Retry-After")?.[1] ?? null, v.expect.retry_after);
    });
  }
  test("policy.held: only the completer's codes", () => assert.equal(held("request_in_flight", 1000), undefined));
  // Rule 9: the caller's Idem-Attempt, what the front door's claim says
  // (run's attempt option, sent as the client's own header), and idem's
  // answers to the claim through FrontDoor.serve over a port that answers
  // them.
  const door = (run: (opts?: RunOptions) => Promise<never>) => new FrontDoor({
    client: { run: (_k, _r, _fn, opts) => run(opts), complete: async () => undefined }, log: () => undefined,
  });
  const request = (attempt: readonly string[]) => ({
    method: "POST", route: "/x", path: "/x", query: "", body: async () => new TextEncoder().encode("{}"),
    header: (n: string) => n.toLowerCase() === "idempotency-key" ? ["k"] : n.toLowerCase() === "idem-attempt" ? [...attempt] : n.toLowerCase() === "content-type" ? ["application/json"] : [],
  });
  assert.ok(pol.attempts.length > 0);
  for (const v of pol.attempts) {
    test(`policy.attempts: ${v.name}`, async () => {
      const a = callerAttempt(v.fields);
      assert.deepEqual([a.number, a.cause ?? null], [v.expect.number, v.expect.cause]);
      let sent = "";
      await door(async (opts) => {
        const n = opts?.attempt?.number ?? 1;
        sent = attemptHeader(n, opts?.attempt?.cause as AttemptCause | undefined);
        throw new IdemError({ status: 503, code: Codes.storeUnavailable, retryable: true });
      }).serve(request(v.fields), async () => { throw new Error("not run"); });
      assert.equal(sent, v.expect.forward ?? "1");
    });
  }
  assert.ok(pol.budget.length > 0);
  for (const v of pol.budget) {
    test(`policy.budget: ${v.name}`, async () => {
      const status = ({ retry_budget_exhausted: 429, store_unavailable: 503, request_in_flight: 409 } as Record<string, number>)[v.idem.code] ?? 422;
      let err: IdemError = new IdemError({ status, code: v.idem.code, retryable: status !== 422, retryAfterMs: (v.idem.retry_after_seconds ?? 0) * 1000,
        fleetBudgetSpent: v.idem.spent });
      // What the client throws on the signal of a failure of the claim's own.
      if (v.idem.spent && !v.idem.seeded && status !== 422) err = new FleetBudgetError("claim", 1, "unavailable", err, undefined);
      const out = await door(async () => { throw err; }).serve(request([]), async () => { throw new Error("not run"); });
      assert.equal(out.kind, "answer");
      if (out.kind !== "answer") return;
      const body = JSON.parse(Buffer.from(out.answer.body).toString());
      const h = (n: string) => out.answer.headers.find(([k]) => k === n)?.[1] ?? null;
      assert.deepEqual([out.answer.status, body.code, body.retryable], [v.expect.status, v.expect.code, v.expect.retryable]);
      assert.equal(h("Retry-After"), v.expect.retry_after);
      assert.equal(h("Idem-Retry-Budget") === "exhausted", v.expect.signal);
      if (v.expect.detail !== null) assert.equal(body.detail, v.expect.detail);
    });
  }
  assert.ok(pol.prefer_wait.length > 0);
  for (const v of pol.prefer_wait) test(`policy.prefer_wait: ${JSON.stringify(v.fields)}`, () => assert.equal(preferWait(v.fields), v.expect));
  for (const v of pol.request_ids) test(`policy.request_ids: ${JSON.stringify(v.header).slice(0, 30)}`, () => assert.equal(validRequestId(v.header), v.kept));
  test("I-JSON check accepts what JSON.parse accepts minus the I-JSON violations", () => {
    checkIJSON('{"a":[1,2.5e3,-0,"\\ud83d\\ude00"]}');
    assert.throws(() => checkIJSON('{"a":1,"a":2}'));
  });
});
