// The lifecycle helper against the real server binary, on both stores.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { createServer, request as httpRequest } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, describe, test } from "node:test";
import { Client, IdemError, NoSideEffect, StoredResponse, renewalPoint, type AttemptInfo } from "../src/index.js";
import { startServer, stores, type Server } from "./server.js";

const newKey = (name: string) => `${name}-${randomUUID()}`;

/** A loopback proxy to target that resets the connection of the first claim after target answered it. */
async function claimDroppingProxy(target: string): Promise<{ url: string; close: () => void }> {
  const t = new URL(target);
  let dropped = false;
  const srv = createServer((req, res) => {
    const drop = !dropped && req.url?.endsWith("/claim") === true;
    if (drop) dropped = true;
    const up = httpRequest({ host: t.hostname, port: t.port, method: req.method, path: req.url, headers: req.headers }, (ur) => {
      if (drop) {
        ur.resume();
        ur.on("end", () => req.socket.destroy());
        return;
      }
      res.writeHead(ur.statusCode ?? 502, ur.headers);
      ur.pipe(res);
    });
    req.pipe(up);
  });
  await new Promise<void>((r) => srv.listen(0, "127.0.0.1", r));
  return { url: `http://127.0.0.1:${(srv.address() as AddressInfo).port}`, close: () => { srv.closeAllConnections(); srv.close(); } };
}

/** A loopback proxy to target that answers checkpoints 503 while cut is set. */
async function cuttingProxy(target: string): Promise<{ url: string; cut: (on: boolean) => void; close: () => void }> {
  const t = new URL(target);
  let cut = false;
  const srv = createServer((req, res) => {
    if (cut && req.url?.endsWith("/checkpoint")) {
      req.resume();
      res.writeHead(503, { "Content-Type": "application/problem+json" }).end('{"code":"store_unavailable","status":503}');
      return;
    }
    const up = httpRequest({ host: t.hostname, port: t.port, method: req.method, path: req.url, headers: req.headers }, (ur) => {
      res.writeHead(ur.statusCode ?? 502, ur.headers);
      ur.pipe(res);
    });
    req.pipe(up);
  });
  await new Promise<void>((r) => srv.listen(0, "127.0.0.1", r));
  return {
    url: `http://127.0.0.1:${(srv.address() as AddressInfo).port}`,
    cut: (on) => { cut = on; },
    close: () => { srv.closeAllConnections(); srv.close(); },
  };
}

/** The server's idem_claim_waiters gauge: claims it holds now, waiting for a key in flight. */
async function claimWaiters(url: string): Promise<number> {
  const text = await (await fetch(url + "/metrics")).text();
  const m = /^idem_claim_waiters (\S+)$/m.exec(text);
  return m ? Number(m[1]) : 0;
}

for (const store of stores()) {
  describe(`run on ${store}`, () => {
    let srv: Server;
    let slowLease: string; // a token of a tenant whose lease is 1 s
    let crowdLease: string; // a token of a tenant whose lease is 3 s
    before(async () => {
      srv = await startServer(store);
      srv.createTenant("lease1", { "lease-seconds-default": 1 });
      slowLease = srv.mint("lease1", "keys:write keys:read");
      srv.createTenant("lease3", { "lease-seconds-default": 3 });
      crowdLease = srv.mint("lease3", "keys:write keys:read");
    });
    after(() => srv.stop());

    const client = (token = srv.token, onAttempt?: (a: AttemptInfo) => void) =>
      new Client({ baseUrl: srv.url, token, ...(onAttempt ? { onAttempt } : {}) });

    test("claims, runs, completes; the next run replays the typed response without running", async () => {
      const c = client();
      const k = newKey("order");
      let runs = 0;
      const req = { operation: "POST /orders", request: { amount: 1000, currency: "usd" } };
      const first = await c.run(k, req, async (claim) => {
        runs++;
        assert.equal(claim.attempt, 1);
        assert.equal(claim.resumed, false);
        assert.equal(claim.recoveryPoint, "");
        await claim.checkpoint("charged", { charge: "ch_1" });
        return { status: 201, headers: { "Content-Type": "application/json" }, body: '{"id":"ord_1"}' };
      });
      assert.equal(first.replayed, false);
      assert.equal(first.response.status, 201);
      // Same request, other key order: the server's JCS fingerprint matches.
      const again = await c.run(k, { operation: "POST /orders", request: { currency: "usd", amount: 1000 } }, () => {
        runs++;
        return { status: 500 };
      });
      assert.equal(runs, 1);
      assert.equal(again.replayed, true);
      assert.ok(again.response instanceof StoredResponse);
      assert.equal(again.response.status, 201);
      assert.equal(again.response.headers["Content-Type"], "application/json");
      assert.deepEqual(again.response.json(), { id: "ord_1" });
      assert.equal(again.fencingToken, first.fencingToken);
      const rec = await c.get(k);
      assert.equal(rec.state, "completed");
    });

    test("a binary body is stored as base64 and replayed byte for byte", async () => {
      const c = client();
      const k = newKey("bin");
      const body = new Uint8Array([0, 0xff, 0xfe, 0x80, 0x41, 0xc3]);
      await c.run(k, { operation: "POST /files" }, () => ({ status: 200, headers: { "Content-Type": "application/octet-stream" }, body }));
      const rec = await c.get(k);
      assert.equal(rec.response?.body_encoding, "base64");
      const replay = await c.run(k, { operation: "POST /files" }, () => assert.fail("must not run"));
      assert.deepEqual(replay.response.body, body);
    });

    test("another request under the same key is fingerprint_mismatch", async () => {
      const c = client();
      const k = newKey("fp");
      await c.run(k, { operation: "POST /orders", request: { amount: 1 } }, () => ({ status: 201 }));
      await assert.rejects(c.run(k, { operation: "POST /orders", request: { amount: 2 } }, () => assert.fail("must not run")),
        (err: unknown) => err instanceof IdemError && err.status === 422 && err.code === "fingerprint_mismatch");
    });

    test("a declared NoSideEffect releases the key; the next run starts afresh", async () => {
      const c = client();
      const k = newKey("decline");
      const declined = new NoSideEffect("card declined", { cause: new Error("402 from the PSP") });
      await assert.rejects(c.run(k, { operation: "POST /pay" }, () => { throw declined; }), (err) => err === declined);
      await assert.rejects(c.get(k), (err: unknown) => err instanceof IdemError && err.code === "key_not_found");
      const second = await c.run(k, { operation: "POST /pay" }, (claim) => {
        assert.equal(claim.attempt, 1);
        return { status: 201, body: "ok" };
      });
      assert.equal(second.replayed, false);
    });

    test("any other error leaves the claim; a run without waiting gets request_in_flight", async () => {
      const c = client();
      const k = newKey("crash");
      const boom = new Error("PSP timeout after the charge");
      await assert.rejects(c.run(k, { operation: "POST /pay" }, () => { throw boom; }), (err) => err === boom);
      assert.equal((await c.get(k)).state, "in_flight");
      await assert.rejects(c.run(k, { operation: "POST /pay" }, () => assert.fail("must not run"), { noWait: true }),
        (err: unknown) => err instanceof IdemError && err.status === 409 && err.code === "request_in_flight" && err.retryAfterMs >= 1000);
    });

    test("request_in_flight is waited out within the deadline: the takeover resumes from the checkpoint", async () => {
      const c = client(slowLease);
      const k = newKey("takeover");
      await assert.rejects(c.run(k, { operation: "POST /pay" }, async (claim) => {
        await claim.checkpoint("charged", { charge: "ch_9" });
        throw new Error("crashed after the charge");
      }));
      const res = await c.run(k, { operation: "POST /pay" }, (claim) => {
        assert.equal(claim.resumed, true);
        assert.equal(claim.attempt, 2);
        assert.equal(claim.recoveryPoint, "charged");
        assert.deepEqual(claim.recoveryData, { charge: "ch_9" });
        return { status: 201, body: "resumed" };
      }, { timeoutMs: 10_000 });
      assert.equal(res.resumed, true);
      assert.equal(res.response.text(), "resumed");
    });

    test("the wait for another holder stops at the deadline", async () => {
      const c = client();
      const k = newKey("deadline");
      await assert.rejects(c.run(k, { operation: "POST /pay" }, () => { throw new Error("crash"); }));
      const start = Date.now();
      await assert.rejects(c.run(k, { operation: "POST /pay" }, () => assert.fail("must not run"), { timeoutMs: 1500 }),
        (err: unknown) => err instanceof IdemError && err.code === "request_in_flight" && err.giveUp === "deadline");
      assert.ok(Date.now() - start < 1500, "gave up without sleeping past the deadline");
    });

    test("a run on a key in flight is held by the server and replays as soon as the holder completes", async () => {
      // The holder's lease is 30 s, so waiting out its Retry-After would take
      // half a minute: run asks the server to hold its claim instead.
      const c = client();
      const k = newKey("held");
      const req = { operation: "POST /pay", request: { amount: 9 } };
      const holder = await c.claim(k, { ...req, leaseSeconds: 30 });
      let ran = 0;
      const pending = c.run(k, req, () => { ran++; return { status: 201, body: "not me" }; }, { timeoutMs: 30_000 });
      let settled = false;
      void pending.then(() => { settled = true; }, () => { settled = true; });
      const until = Date.now() + 10_000;
      while (await claimWaiters(srv.url) !== 1) { // the server holds run's claim
        assert.ok(Date.now() < until && !settled, "run's claim was not held by the server");
        await new Promise((r) => setTimeout(r, 5));
      }
      const start = Date.now();
      await c.complete(k, holder.fencingToken, { status: 201, body: "paid" });
      const res = await pending;
      assert.ok(Date.now() - start < 5000, "answered when the holder completed, not at the lease's end");
      assert.equal(res.replayed, true);
      assert.equal(res.response.text(), "paid");
      assert.equal(ran, 0);
    });

    test("noWait asks for no hold: request_in_flight at once", async () => {
      const c = client();
      const k = newKey("nowait");
      await c.claim(k, { operation: "op", leaseSeconds: 30 });
      const start = Date.now();
      await assert.rejects(c.run(k, { operation: "op" }, () => assert.fail("must not run"), { noWait: true }),
        (err: unknown) => err instanceof IdemError && err.code === "request_in_flight");
      assert.ok(Date.now() - start < 5000);
      assert.equal(await claimWaiters(srv.url), 0);
    });

    test("the lease keeper renews a slow function's lease; nobody takes it over", async () => {
      const c = client(slowLease);
      const other = client(slowLease);
      const k = newKey("slow");
      const res = await c.run(k, { operation: "POST /slow" }, async () => {
        // Three leases long; the keeper renews every third of a lease.
        for (let i = 0; i < 6; i++) {
          await new Promise((r) => setTimeout(r, 500));
          await assert.rejects(other.claim(k, { operation: "POST /slow" }),
            (err: unknown) => err instanceof IdemError && err.code === "request_in_flight");
        }
        return { status: 200, body: "slow" };
      });
      assert.equal(res.attempt, 1);
      assert.equal((await c.get(k)).state, "completed");
    });

    test("a lease that cannot be renewed for a whole lease aborts claim.signal; the late complete is lease_lost", async () => {
      const proxy = await cuttingProxy(srv.url);
      try {
        const c = new Client({ baseUrl: proxy.url, token: slowLease });
        const other = client(slowLease);
        const k = newKey("lost");
        let reason: unknown;
        await assert.rejects(c.run(k, { operation: "POST /lost" }, async (claim) => {
          proxy.cut(true); // renewals fail from now on
          await new Promise<void>((r) => claim.signal.addEventListener("abort", () => r(), { once: true }));
          reason = claim.signal.reason;
          // The lease ran out on the service too: another caller takes over.
          const taken = await other.claim(k, { operation: "POST /lost" });
          assert.equal(taken.resumed, true);
          return { status: 200, body: "too late" };
        }), (err: unknown) => err instanceof IdemError && err.code === "lease_lost");
        assert.ok(reason instanceof IdemError && reason.code === "lease_lost", String(reason));
      } finally {
        proxy.close();
      }
    });

    test("a claim whose answer was lost gets its own attempt back by its attempt id, not 409", async () => {
      const proxy = await claimDroppingProxy(srv.url);
      try {
        const statuses: number[] = [];
        // The default 30 s lease: without the attempt id the retry would wait it out past the deadline.
        const c = new Client({ baseUrl: proxy.url, token: srv.token, retry: { baseDelayMs: 50 }, onAttempt: (a) => statuses.push(a.status) });
        const k = newKey("lostanswer");
        let runs = 0;
        const res = await c.run(k, { operation: "POST /pay", request: { amount: 1 } }, () => {
          runs++;
          return { status: 201, body: "paid" };
        }, { timeoutMs: 5000 });
        assert.equal(runs, 1);
        assert.equal(res.attempt, 1);
        assert.deepEqual(statuses, [0, 201, 200], "claim lost, claim recovered, complete");
        assert.equal((await c.get(k)).state, "completed");
      } finally {
        proxy.close();
      }
    });

    test("50 concurrent runs of one key run the function once; all get its response", async () => {
      // The 409s carry Retry-After = the lease left: a 3 s lease keeps the
      // wait short, yet long enough that a loaded machine cannot let it run
      // out under the holder (which would rightly hand the key to another).
      const c = client(crowdLease);
      const k = newKey("crowd");
      let runs = 0;
      const results = await Promise.all(Array.from({ length: 50 }, () =>
        c.run(k, { operation: "POST /crowd", request: { n: 1 } }, async () => {
          runs++;
          await new Promise((r) => setTimeout(r, 200));
          return { status: 201, body: "once" };
        }, { timeoutMs: 30_000 })));
      assert.equal(runs, 1);
      assert.equal(results.filter((r) => !r.replayed).length, 1);
      for (const r of results) assert.equal(r.response.text(), "once");
    });

    test("every 409 other than request_in_flight is final: already_completed, a stale token", async () => {
      const attempts: AttemptInfo[] = [];
      const c = client(srv.token, (a) => attempts.push(a));
      const k = newKey("stale");
      const claim = await c.claim(k, { operation: "POST /x" });
      await c.complete(k, claim.fencingToken, { status: 200, body: "a" });
      attempts.length = 0;
      await assert.rejects(c.complete(k, claim.fencingToken, { status: 200, body: "b" }),
        (err: unknown) => err instanceof IdemError && err.status === 409 && err.code === "already_completed" && err.attempts === 1);
      assert.equal(attempts.length, 1);
      await assert.rejects(c.checkpoint(k, claim.fencingToken + 1, "p"),
        (err: unknown) => err instanceof IdemError && err.status === 409);
    });

    test("the work ran: its complete outlives a caller that aborts during it, and a deadline fn nearly spent", async () => {
      // Before, the complete was cut short: the response was lost, the key
      // stayed in flight, and the next run after the lease ran fn again.
      const k1 = newKey("abort-complete");
      const ctl = new AbortController();
      const aborting = new Client({ baseUrl: srv.url, token: srv.token, fetch: (input, init) => {
        if (String(input).endsWith("/complete")) ctl.abort(new Error("the caller hung up"));
        return fetch(input, init);
      } });
      let runs = 0;
      const req = { operation: "POST /orders", request: { n: 7 } };
      const res = await aborting.run(k1, req, () => { runs++; return { status: 201, body: "done" }; }, { signal: ctl.signal });
      assert.equal(res.replayed, false);
      assert.equal((await client().get(k1)).state, "completed");
      const again = await client().run(k1, req, () => { runs++; return { status: 500 }; });
      assert.equal(again.replayed, true);
      assert.equal(again.response.text(), "done");
      assert.equal(runs, 1);

      const k2 = newKey("late-complete");
      const slow = new Client({ baseUrl: srv.url, token: srv.token, fetch: async (input, init) => {
        if (String(input).endsWith("/complete")) await new Promise((r) => setTimeout(r, 150)); // a slow network
        return fetch(input, init);
      } });
      const deadline = Date.now() + 1000;
      await slow.run(k2, req, async () => {
        await new Promise((r) => setTimeout(r, deadline - Date.now() - 20));
        return { status: 201, body: "late" };
      }, { deadline });
      assert.equal((await client().get(k2)).state, "completed");
    });

    for (const skewMs of [-10_000, 10_000]) {
      test(`the lease keeper renews the tenant's default lease in time with this host's clock ${skewMs / 1000} s off the server's`, async () => {
        // Before, the lease was read as lease_expires_at less Date.now(): 10 s
        // behind, a 1 s lease looked like 11 s (10 s ahead, spent: 30 s), the
        // first renewal came after it had run out, and another request took
        // the key over and ran the work a second time. The work waits (at
        // most 3 s) until the keeper's first renewal reaches the server,
        // which must come while the lease still runs (a third of it, about
        // 0.5 s), and another claim then finds the key in flight.
        const tenant = `brief${skewMs > 0 ? "a" : "b"}${randomUUID().slice(0, 6)}`;
        srv.createTenant(tenant, { "lease-seconds-default": 1 });
        const tok = srv.mint(tenant, "keys:write");
        const k = newKey("skew");
        const req = { operation: "POST /reports", request: { n: 1 } };
        const other = new Client({ baseUrl: srv.url, token: tok });
        let runs = 0;
        const realNow = Date.now;
        Date.now = () => realNow() + skewMs; // this host's clock, off the server's
        try {
          const res = await new Client({ baseUrl: srv.url, token: tok }).run(k, req, async () => {
            runs++;
            const end = performance.now() + 3000;
            let rec = await other.get(k);
            while (rec.recovery_point !== renewalPoint) {
              assert.ok(performance.now() < end, "the keeper did not renew the 1 s lease");
              await new Promise((r) => setTimeout(r, 20));
              rec = await other.get(k);
            }
            assert.equal(rec.state, "in_flight", "renewed before the lease ran out");
            await assert.rejects(other.claim(k, req, { attemptId: "someone-else" }),
              (err: unknown) => err instanceof IdemError && err.code === "request_in_flight", "the keeper renewed the lease: no takeover");
            return { status: 201, body: "once" };
          });
          assert.equal(res.replayed, false);
        } finally {
          Date.now = realNow;
        }
        assert.equal(runs, 1);
      });
    }
  });
}
