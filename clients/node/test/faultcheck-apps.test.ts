// The fault checker's Node app (testkit/faultcheck/apps/node/fcapp.mjs)
// speaks its protocol (testkit/faultcheck/PROTOCOL.md): each front door
// (express: Express 5 with expressMiddleware, fetch: Hono with
// withIdempotency) is started as the runner starts it, a subprocess against
// the real server on both stores, and its answers and side-effect log are
// checked, so the app cannot rot.
import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { connect } from "node:net";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { repoRoot, startServer, stores, type Server } from "./server.js";

const appPath = join(repoRoot, "testkit", "faultcheck", "apps", "node", "fcapp.mjs");

type Rec = { ev: string; run: string; [k: string]: unknown };

interface FCApp {
  url: string;
  records(): Rec[];
  /** The start lines of key, and the end lines of those runs. */
  runsOf(key: string): { starts: Rec[]; ends: Rec[] };
  /** Stops the app; resolves with what it wrote on stdout after the listening line. */
  stop(): Promise<string>;
}

async function startApp(frontdoor: string, srv: Server, extra: Record<string, string> = {}): Promise<FCApp> {
  const dir = mkdtempSync(join(tmpdir(), "fcapp-node-"));
  const log = join(dir, "effects.jsonl");
  const env: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(process.env)) if (!k.startsWith("FC_") && !k.startsWith("IDEM_")) env[k] = v;
  Object.assign(env, { FC_ADDR: "127.0.0.1:0", FC_LOG: log, FC_FRONTDOOR: frontdoor, IDEM_URL: srv.url, IDEM_TOKEN: srv.token, ...extra });
  const child: ChildProcess = spawn(process.execPath, [appPath], { env, stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  let err = "";
  child.stderr!.on("data", (b: Buffer) => { if (err.length < 20_000) err += b.toString(); });
  const exited = new Promise<void>((r) => child.once("exit", () => r()));
  const url = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`the app did not report FC_LISTENING within 60 s:\n${err}`)), 60_000);
    child.stdout!.on("data", (b: Buffer) => {
      out += b.toString();
      const nl = out.indexOf("\n");
      if (nl >= 0 && timer) {
        clearTimeout(timer);
        const line = out.slice(0, nl);
        out = out.slice(nl + 1);
        if (!/^FC_LISTENING http:\/\/127\.0\.0\.1:\d+$/.test(line)) reject(new Error(`not a listening line: ${JSON.stringify(line)}`));
        resolve(line.split(" ")[1]!);
      }
    });
    child.once("exit", (code) => { clearTimeout(timer); reject(new Error(`the app exited (${code}) before listening:\n${err}`)); });
  });
  const records = (): Rec[] => existsSync(log) ? readFileSync(log, "utf8").split("\n").filter((l) => l !== "").map((l) => JSON.parse(l) as Rec) : [];
  return {
    url,
    records,
    runsOf(key) {
      const recs = records();
      const starts = recs.filter((r) => r.ev === "start" && r.key === key);
      const ids = new Set(starts.map((s) => s.run));
      return { starts, ends: recs.filter((r) => r.ev === "end" && ids.has(r.run)) };
    },
    async stop() {
      child.kill("SIGTERM");
      await exited;
      rmSync(dir, { recursive: true, force: true });
      return out;
    },
  };
}

interface Answer { status: number; headers: Headers; body: Buffer }

async function post(app: FCApp, key: string, mode: string, pad = "p", headers: Record<string, string> = {}): Promise<Answer> {
  const res = await fetch(app.url + "/fc/pay", {
    method: "POST",
    headers: { "Content-Type": "application/json", "Idempotency-Key": key, ...headers },
    body: JSON.stringify({ req: key, mode, pad }),
  });
  return { status: res.status, headers: res.headers, body: Buffer.from(await res.arrayBuffer()) };
}

/** Sends a raw HTTP/1.1 request (header lines as given: a field may repeat); resolves with the answer's status. */
function rawPost(app: FCApp, headerLines: string[], body: string): Promise<number> {
  const u = new URL(app.url);
  return new Promise((resolve, reject) => {
    const s = connect(Number(u.port), u.hostname, () => {
      s.write(["POST /fc/pay HTTP/1.1", "Host: x", "Content-Type: application/json", `Content-Length: ${Buffer.byteLength(body)}`,
        "Connection: close", ...headerLines, "", body].join("\r\n"));
    });
    let got = "";
    s.on("data", (b: Buffer) => { got += b.toString(); });
    s.on("end", () => resolve(Number(/^HTTP\/1\.1 (\d{3})/.exec(got)?.[1] ?? 0)));
    s.on("error", reject);
  });
}

async function waitFor(cond: () => boolean, what: string): Promise<void> {
  const deadline = Date.now() + 30_000;
  while (!cond()) {
    if (Date.now() > deadline) throw new Error(`timed out: ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

const newKey = () => "fc-" + randomBytes(8).toString("hex");
const sha = (b: Buffer) => createHash("sha256").update(b).digest("hex");
const bodyOf = (run: unknown, req: string, scope: string, pad: string) => Buffer.from(JSON.stringify({ run, req, scope, pad }));

for (const store of stores()) {
  for (const frontdoor of ["express", "fetch"]) {
    describe(`faultcheck ${frontdoor} app on ${store}`, () => {
      let srv: Server;
      let app: FCApp;
      before(async () => {
        srv = await startServer(store);
        app = await startApp(frontdoor, srv);
      });
      after(async () => {
        const out = await app?.stop();
        await srv?.stop();
        assert.equal(out, "", "the app wrote more than the listening line on stdout");
      });

      test("ok runs once, its duplicate replays byte for byte", async () => {
        const health = await fetch(app.url + "/fc/healthz");
        assert.equal(await health.text(), "ok");
        const key = newKey();
        const first = await post(app, key, "ok", "x".repeat(100));
        assert.equal(first.status, 201, first.body.toString());
        assert.equal(first.headers.get("content-type"), "application/json");
        const { starts, ends } = app.runsOf(key);
        assert.equal(starts.length, 1);
        assert.equal(ends.length, 1);
        const s = starts[0]!;
        assert.deepEqual([s.key, s.scope, s.req, s.mode, typeof s.t], [key, "", key, "ok", "number"]);
        assert.deepEqual(first.body, bodyOf(s.run, key, "", "x".repeat(100)));
        assert.deepEqual(ends[0], { ev: "end", run: s.run, status: 201, body_sha256: sha(first.body), len: first.body.length });

        const again = await post(app, key, "ok", "x".repeat(100));
        assert.equal(again.headers.get("idempotent-replayed"), "true");
        assert.equal(again.status, 201);
        assert.deepEqual(again.body, first.body);
        assert.equal(app.runsOf(key).starts.length, 1, "the duplicate did not run the handler");
      });

      test("raise writes start and no end, and stores nothing", async () => {
        const key = newKey();
        const r = await post(app, key, "raise");
        assert.equal(r.status, 500);
        assert.equal(r.headers.get("content-type"), "application/problem+json");
        assert.equal((JSON.parse(r.body.toString()) as { status: number }).status, 500);
        const { starts, ends } = app.runsOf(key);
        assert.equal(starts.length, 1);
        assert.deepEqual(ends, []);
        assert.equal(app.records().filter((r) => r.ev === "abort" && r.run === starts[0]!.run).length, 1);
        const again = await post(app, key, "raise");
        assert.equal(again.status, 409);
        assert.equal((JSON.parse(again.body.toString()) as { code: string }).code, "request_in_flight");
        assert.equal(app.runsOf(key).starts.length, 1);
      });

      test("stream:4:10 answers the full body", async () => {
        const key = newKey();
        const t0 = Date.now();
        const r = await post(app, key, "stream:4:10", "s".repeat(1000));
        assert.ok(Date.now() - t0 >= 30, "three pauses of 10 ms between four pieces");
        assert.equal(r.status, 200);
        const { starts, ends } = app.runsOf(key);
        assert.equal(starts.length, 1);
        assert.equal(ends.length, 1);
        assert.deepEqual(r.body, bodyOf(starts[0]!.run, key, "", "s".repeat(1000)));
        assert.deepEqual([ends[0]!.status, ends[0]!.body_sha256, ends[0]!.len], [200, sha(r.body), r.body.length]);
        const again = await post(app, key, "stream:4:10", "s".repeat(1000));
        assert.equal(again.headers.get("idempotent-replayed"), "true");
        assert.deepEqual([again.status, again.body], [200, r.body]);
      });

      test("cutstream writes no end and stores nothing", async () => {
        const key = newKey();
        const r = await post(app, key, "cutstream:4");
        assert.equal(r.status, 500);
        assert.equal(r.headers.get("content-type"), "application/problem+json");
        const { starts, ends } = app.runsOf(key);
        assert.equal(starts.length, 1);
        assert.deepEqual(ends, []);
        assert.equal((await post(app, key, "cutstream:4")).status, 409);
      });

      test("slow, and a 503 stored and replayed", async () => {
        const t0 = Date.now();
        assert.equal((await post(app, newKey(), "slow:200")).status, 201);
        assert.ok(Date.now() - t0 >= 200);
        const key = newKey();
        const r = await post(app, key, "status:503");
        assert.equal(r.status, 503);
        const again = await post(app, key, "status:503");
        assert.equal(again.headers.get("idempotent-replayed"), "true");
        assert.deepEqual([again.status, again.body], [503, r.body]);
        const { starts, ends } = app.runsOf(key);
        assert.equal(starts.length, 1);
        assert.deepEqual(ends.map((e) => e.body_sha256), [sha(r.body)]);
      });

      test("a repeated scope header fails the scope option: refused, the handler does not run", async () => {
        const scoped = await startApp(frontdoor, srv, { FC_SCOPE_HEADER: "X-Account-Id" });
        try {
          const key = newKey();
          const status = await rawPost(scoped, [`Idempotency-Key: ${key}`, "X-Account-Id: acct-a", "X-Account-Id: mallory"],
            JSON.stringify({ req: key, mode: "ok", pad: "" }));
          assert.ok(status >= 400, `refused, not ${status}`);
          assert.deepEqual(scoped.runsOf(key).starts, []);
          // One field line is the caller's scope.
          const one = await rawPost(scoped, [`Idempotency-Key: ${key}`, "X-Account-Id: acct-a"], JSON.stringify({ req: key, mode: "ok", pad: "" }));
          assert.equal(one, 201);
          assert.deepEqual(scoped.runsOf(key).starts.map((s) => s.scope), ["acct-a"]);
        } finally {
          assert.equal(await scoped.stop(), "");
        }
      });

      test("a caller gone mid-stream is hidden from the handler: it runs to its end, and the retry replays the whole answer", async () => {
        // docs/frontdoor.md rule 5, "A cut answer": the front door keeps a
        // started handler from seeing its caller go, so the stream is not
        // cancelled (no abort line) and its whole answer is stored.
        const key = newKey();
        const body = JSON.stringify({ req: key, mode: "stream:40:50", pad: "" });
        const u = new URL(app.url);
        const sock = connect(Number(u.port), u.hostname);
        sock.on("error", () => {});
        sock.write(["POST /fc/pay HTTP/1.1", "Host: x", "Content-Type: application/json", `Content-Length: ${Buffer.byteLength(body)}`,
          `Idempotency-Key: ${key}`, "", body].join("\r\n"));
        await waitFor(() => app.runsOf(key).starts.length === 1, "the handler started");
        await new Promise((r) => setTimeout(r, 200));
        sock.destroy();
        const run = app.runsOf(key).starts[0]!.run;
        await waitFor(() => app.records().some((r) => r.ev === "end" && r.run === run), "the handler's end line");
        assert.deepEqual(app.records().filter((r) => r.run === run && r.ev === "abort"), [], "the stream was not cancelled");
        const end = app.records().find((r) => r.ev === "end" && r.run === run)!;
        let replay: Answer;
        for (;;) {
          replay = await post(app, key, "stream:40:50", "");
          if (replay.status !== 409) break; // the answer is being stored
          await new Promise((r) => setTimeout(r, 50));
        }
        assert.equal(replay.headers.get("idempotent-replayed"), "true");
        assert.equal(createHash("sha256").update(replay.body).digest("hex"), end.body_sha256, "the replay is the whole answer");
        assert.equal(app.runsOf(key).starts.length, 1, "the handler ran once");
      });

      test("scope header and released 5xx", async () => {
        const scoped = await startApp(frontdoor, srv, { FC_SCOPE_HEADER: "X-Account-Id", FC_RELEASE_5XX: "1" });
        try {
          let key = newKey();
          const a = await post(scoped, key, "ok", "p", { "X-Account-Id": "acct-a" });
          const b = await post(scoped, key, "ok", "p", { "X-Account-Id": "acct-b" });
          assert.deepEqual([a.status, b.status], [201, 201]);
          assert.deepEqual([JSON.parse(a.body.toString()).scope, JSON.parse(b.body.toString()).scope], ["acct-a", "acct-b"]);
          const { starts, ends } = scoped.runsOf(key);
          assert.deepEqual(starts.map((s) => s.scope).sort(), ["acct-a", "acct-b"]);
          assert.equal(ends.length, 2);
          const replay = await post(scoped, key, "ok", "p", { "X-Account-Id": "acct-b" });
          assert.equal(replay.headers.get("idempotent-replayed"), "true");
          assert.deepEqual(replay.body, b.body);

          key = newKey();
          const first = await post(scoped, key, "status:503", "p", { "X-Account-Id": "acct-a" });
          const second = await post(scoped, key, "status:503", "p", { "X-Account-Id": "acct-a" });
          assert.deepEqual([first.status, second.status], [503, 503]);
          assert.equal(second.headers.get("idempotent-replayed"), null, "a released 5xx runs the handler again");
          assert.equal(scoped.runsOf(key).starts.length, 2);
          assert.notEqual(JSON.parse(first.body.toString()).run, JSON.parse(second.body.toString()).run);
        } finally {
          assert.equal(await scoped.stop(), "");
        }
      });
    });
  }
}
