// The retry loop against a scripted HTTP server on loopback, with a fake
// clock so that no test sleeps on real time for a backoff.
import assert from "node:assert/strict";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { Client, IdemError, type AttemptInfo, type Clock, type RetryPolicy } from "../src/index.js";
import { repoRoot } from "./server.js";

type Step = (req: IncomingMessage, res: ServerResponse) => void;

const problem = (status: number, code: string, headers: Record<string, string> = {}): Step => (_req, res) => {
  res.writeHead(status, { "Content-Type": "application/problem+json", ...headers });
  res.end(JSON.stringify({ type: `urn:idem:problem:${code}`, title: code, status, code, retryable: status >= 500 || code === "request_in_flight" }));
};
const ok: Step = (_req, res) => {
  res.writeHead(200, { "Content-Type": "application/json" });
  res.end(JSON.stringify({ key: "k", state: "completed", fencing_token: 1, attempt: 1 }));
};
const drop: Step = (req) => req.socket.destroy();
const hang: Step = () => {};

/** A loopback server answering the n-th request with steps[n] (the last step repeats). */
async function scripted(steps: Step[]): Promise<{ url: string; count: () => number }> {
  let n = 0;
  const srv = createServer((req, res) => {
    req.resume();
    const step = steps[Math.min(n, steps.length - 1)]!;
    n++;
    req.on("end", () => step(req, res));
  });
  await new Promise<void>((r) => srv.listen(0, "127.0.0.1", r));
  after(() => {
    srv.closeAllConnections();
    srv.close();
  });
  return { url: `http://127.0.0.1:${(srv.address() as AddressInfo).port}`, count: () => n };
}

/** A clock whose sleeps return at once and advance its time. */
function fakeClock(): Clock & { waits: number[] } {
  let t = Date.now();
  const waits: number[] = [];
  return {
    waits,
    now: () => t,
    async sleep(ms: number, signal?: AbortSignal) {
      if (signal?.aborted) throw signal.reason;
      waits.push(ms);
      t += ms;
    },
  };
}

function client(url: string, retry: RetryPolicy = {}, random = () => 0.5) {
  const clock = fakeClock();
  const attempts: AttemptInfo[] = [];
  const c = new Client({ baseUrl: url, token: "t", retry, clock, random, onAttempt: (a) => attempts.push(a) });
  return { c, clock, attempts };
}

async function rejects(p: Promise<unknown>): Promise<IdemError> {
  try {
    await p;
  } catch (err) {
    assert.ok(err instanceof IdemError, `want IdemError, got ${String(err)}`);
    return err;
  }
  assert.fail("the call succeeded");
}

describe("retry loop", () => {
  test("retries an allowlisted status with full jitter and succeeds", async () => {
    const s = await scripted([problem(503, "store_unavailable"), problem(502, "unknown"), ok]);
    const { c, clock, attempts } = client(s.url, {}, () => 0.5);
    const rec = await c.get("k");
    assert.equal(rec.state, "completed");
    assert.equal(s.count(), 3);
    // Full jitter, base 1 s, cap 30 s: uniform [0, 1000) then [0, 2000).
    assert.deepEqual(clock.waits, [500, 1000]);
    assert.deepEqual(attempts.map((a) => [a.status, a.retry]), [[503, true], [502, true], [200, false]]);
  });

  test("backoff is capped at maxDelayMs", async () => {
    const s = await scripted([problem(504, "unknown")]);
    const { c, clock } = client(s.url, { maxAttempts: 8, budgetCapacity: 0 }, () => 0.999999);
    const err = await rejects(c.get("k"));
    assert.equal(err.giveUp, "attempts");
    assert.equal(err.attempts, 8);
    assert.equal(s.count(), 8);
    const ceilings = clock.waits.map((w) => Math.ceil(w / 1000) * 1000);
    assert.deepEqual(ceilings, [1000, 2000, 4000, 8000, 16000, 30000, 30000]);
  });

  for (const [status, code] of [[500, "internal"], [400, "invalid_request"], [401, "unauthenticated"], [409, "lease_lost"], [409, "already_completed"], [422, "fingerprint_mismatch"]] as const) {
    test(`${status} ${code} is final`, async () => {
      const s = await scripted([problem(status, code, { "Retry-After": "1" }), ok]);
      const { c, clock } = client(s.url);
      const err = await rejects(c.get("k"));
      assert.equal(err.status, status);
      assert.equal(err.code, code);
      assert.equal(err.giveUp, undefined);
      assert.equal(s.count(), 1);
      assert.deepEqual(clock.waits, []);
    });
  }

  test("500 is retried with retry500", async () => {
    const s = await scripted([problem(500, "internal"), ok]);
    const { c } = client(s.url, { retry500: true });
    await c.get("k");
    assert.equal(s.count(), 2);
  });

  test("Retry-After in seconds replaces the backoff, plus the spread", async () => {
    const s = await scripted([problem(429, "rate_limited", { "Retry-After": "3" }), ok]);
    const { c, clock } = client(s.url, {}, () => 0.25);
    await c.get("k");
    assert.deepEqual(clock.waits, [3000 + 250]);
  });

  test("Retry-After as an HTTP-date", async () => {
    const clock = fakeClock();
    const when = new Date(Math.ceil((clock.now() + 5000) / 1000) * 1000);
    const s = await scripted([problem(503, "store_unavailable", { "Retry-After": when.toUTCString() }), ok]);
    const c = new Client({ baseUrl: s.url, clock, random: () => 0, retry: {} });
    await c.get("k");
    assert.equal(clock.waits.length, 1);
    assert.ok(clock.waits[0]! > 4000 && clock.waits[0]! <= 6000, `wait ${clock.waits[0]}`);
  });

  test("one overall deadline: no retry when the wait cannot fit", async () => {
    const s = await scripted([problem(503, "store_unavailable", { "Retry-After": "2" }), ok]);
    const { c, clock } = client(s.url);
    const err = await rejects(c.get("k", { timeoutMs: 1500 }));
    assert.equal(err.giveUp, "deadline");
    assert.equal(err.status, 503);
    assert.equal(s.count(), 1);
    assert.deepEqual(clock.waits, []);
  });

  test("the retry budget is shared by the calls of a client and refilled by successes", async () => {
    const s = await scripted([problem(503, "store_unavailable")]);
    const { c } = client(s.url);
    // 3 attempts per call: 2 retries each; the 10 tokens last 5 calls.
    for (let i = 0; i < 5; i++) assert.equal((await rejects(c.get("k"))).giveUp, "attempts");
    assert.ok(c.retryBudgetLeft() < 1e-6);
    const before = s.count();
    const err = await rejects(c.get("k"));
    assert.equal(err.giveUp, "budget");
    assert.equal(s.count() - before, 1, "no retry without budget");
    assert.equal(s.count(), 16);
  });

  test("successes put 0.1 back", async () => {
    const s = await scripted([problem(503, "x"), problem(503, "x"), ok]);
    const { c } = client(s.url);
    await c.get("k");
    assert.ok(Math.abs(c.retryBudgetLeft() - 8.1) < 1e-9, String(c.retryBudgetLeft()));
  });

  test("connection refused is retried", async () => {
    // A port nothing listens on: take one, close it.
    const probe = createServer();
    await new Promise<void>((r) => probe.listen(0, "127.0.0.1", r));
    const dead = (probe.address() as AddressInfo).port;
    await new Promise<void>((r) => probe.close(() => r()));
    const { c, attempts } = client(`http://127.0.0.1:${dead}`);
    const err = await rejects(c.get("k"));
    assert.equal(err.code, "network");
    assert.equal(err.giveUp, "attempts");
    assert.equal(attempts.length, 3);
    assert.ok(attempts.slice(0, 2).every((a) => a.retry));
  });

  test("a connection closed before the answer is retried", async () => {
    const s = await scripted([drop, ok]);
    const { c } = client(s.url);
    await c.get("k");
    assert.equal(s.count(), 2);
  });

  test("an attempt that times out is retried within the deadline", async () => {
    const s = await scripted([hang, ok]);
    const { c, attempts } = client(s.url, { attemptTimeoutMs: 200 });
    await c.get("k");
    assert.equal(s.count(), 2);
    assert.equal(attempts[0]!.error?.code, "network");
  });

  test("the caller's abort ends the call without a retry", async () => {
    const s = await scripted([hang]);
    const { c } = client(s.url);
    const ac = new AbortController();
    setTimeout(() => ac.abort(), 100);
    const err = await rejects(c.get("k", { signal: ac.signal }));
    assert.equal(err.giveUp, "aborted");
    assert.ok(s.count() <= 1, "no retry after the abort");
  });

  test("an invalid key fails before any request", async () => {
    const s = await scripted([ok]);
    const { c } = client(s.url);
    const err = await rejects(c.get("bad key"));
    assert.equal(err.code, "invalid_key");
    assert.equal(s.count(), 0);
  });
});

// testvectors/sdk/classification.json through the real retry loop: each
// failure is answered once by a scripted loopback server (or made on the
// transport), and the number of requests tells whether it was retried.
describe("classification vectors through the retry loop", () => {
  const created: Step = (_req, res) => {
    res.writeHead(201, { "Content-Type": "application/json" });
    res.end(JSON.stringify({ key: "k", state: "in_flight", fencing_token: 1, attempt: 1 }));
  };
  const cases = JSON.parse(readFileSync(join(repoRoot, "testvectors", "sdk", "classification.json"), "utf8")).cases as {
    name: string; transport?: string; status?: number; code?: string; policy?: { retry_500?: boolean }; retry: boolean; how?: string;
  }[];
  for (const v of cases) {
    test(v.name, async () => {
      const retry: RetryPolicy = { attemptTimeoutMs: 300, retry500: v.policy?.retry_500 === true };
      if (v.transport === "connection_refused") {
        const probe = createServer();
        await new Promise<void>((r) => probe.listen(0, "127.0.0.1", r));
        const port = (probe.address() as AddressInfo).port;
        await new Promise<void>((r) => probe.close(() => r()));
        const { c, attempts } = client(`http://127.0.0.1:${port}`, retry);
        await rejects(c.get("k"));
        assert.equal(attempts.length > 1, v.retry);
        return;
      }
      if (v.transport === "token_error") {
        const s = await scripted([ok]);
        const c = new Client({ baseUrl: s.url, token: () => { throw new Error("vault down"); }, clock: fakeClock(), retry });
        await rejects(c.get("k"));
        assert.equal(s.count(), 0);
        assert.equal(v.retry, false);
        return;
      }
      const first: Step = v.transport === "connection_reset" || v.transport === "eof" ? drop
        : v.transport === "timeout" ? hang
        : problem(v.status!, v.code!, { "Retry-After": "1" });
      if (v.how === "in_flight") {
        // run() claims again after Retry-After; the plain call does not.
        const s = await scripted([first, created, ok]);
        const { c } = client(s.url, retry);
        const res = await c.run("k", { operation: "POST /x" }, () => ({ status: 200 }));
        assert.equal(res.replayed, false);
        assert.equal(s.count(), 3, "claim 409, claim again, complete");
        const s2 = await scripted([first, ok]);
        await rejects(client(s2.url, retry).c.get("k"));
        assert.equal(s2.count(), 1);
        return;
      }
      const s = await scripted([first, ok]);
      const { c } = client(s.url, retry);
      try {
        await c.get("k");
      } catch (err) {
        assert.ok(err instanceof IdemError);
      }
      assert.equal(s.count() === 2, v.retry, `requests: ${s.count()}`);
    });
  }
});


test("a Retry-After past setTimeout's range (24.8 days) is waited, not retried at once", async () => {
  // Node fires a timer over 2^31-1 ms after 1 ms: the real clock retried
  // at once what the server said to leave alone for weeks.
  const srv = await scripted([problem(503, "store_unavailable", { "Retry-After": "3000000" })]);
  const ctl = new AbortController();
  const c = new Client({ baseUrl: srv.url, token: "t" }); // the real clock, no deadline
  const call = c.get("k", { signal: ctl.signal });
  await new Promise((r) => setTimeout(r, 300));
  ctl.abort(new Error("test over"));
  await assert.rejects(call);
  assert.equal(srv.count(), 1);
});
