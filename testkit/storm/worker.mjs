// A Node storm worker: one process of the storm test's fleet, its callers
// each with a Client of its own (the interactive preset, so each has its
// own per-process retry budget), on the process's one fetch pool.
//
// The protocol is cmd/loadgen/stormworker.go's: the configuration in
// STORM_WORKER (JSON), "ready" on stdout, the start (Unix ms) read from
// stdin, one logical call (client.run: claim, the work, complete) per
// caller per period on fresh keys, the work being one POST to the sink (the
// ledger of side effects), and at the end one JSON line of per-second
// counts. Run by scripts/bench-storm through `loadgen storm`; not a test of
// its own.

import { createInterface } from "node:readline";
import { setTimeout as sleep } from "node:timers/promises";

import { Client, interactive } from "../../clients/node/dist/index.js";

const giveUps = { fleet_budget: "fleet_refused", fleet_signal: "fleet_signal", budget: "process_refused" };
const fields = ["calls", "succeeded", "attempts", "first", "fleet_refused", "fleet_signal", "process_refused", "side_effects"];

const cfg = JSON.parse(process.env.STORM_WORKER);
const secs = Array.from({ length: cfg.seconds + 60 }, () => Object.fromEntries(fields.map((f) => [f, 0])));
let start = 0;
const at = () => secs[Math.max(0, Math.min(Math.floor((Date.now() - start) / 1000), secs.length - 1))];

const hook = (info) => {
  const s = at();
  s.attempts++;
  if (info.attempt === 1) s.first++;
  if (info.giveUp in giveUps) s[giveUps[info.giveUp]]++;
};

const mine = [];
for (let i = cfg.index; i < cfg.total; i += cfg.stride) mine.push(i);
const n = mine.length;
const clients = Array.from({ length: n }, () => new Client({ baseUrl: cfg.base, token: cfg.token, retry: interactive, onAttempt: hook }));

const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
process.stdout.write("ready\n");
start = Number((await lines.next()).value);
await sleep(Math.max(0, start - Date.now()));
const lateMs = Date.now() - start;
const end = start + cfg.run_ms;
const calls = new Set();
const errors = {};

async function call(c, i, seq, s) {
  const key = `storm-node-${i}-${seq}`;
  try {
    await c.run(key, { operation: "POST /orders", request: { caller: i, seq } }, async () => {
      const r = await fetch(`${cfg.sink}/effect/${key}`, { method: "POST", signal: AbortSignal.timeout(10_000) });
      await r.arrayBuffer();
      if (r.status !== 204) throw new Error(`sink: status ${r.status}`);
      at().side_effects++;
      return { status: 201, body: '{"ok":true}' };
    });
  } catch (e) {
    const why = `${e?.constructor?.name}:${e?.code ?? e?.cause ?? ""}:${e?.giveUp ?? ""}`;
    errors[why] = (errors[why] ?? 0) + 1;
    return;
  }
  s.succeeded++;
}

async function caller(c, i) {
  let next = start + (cfg.period_ms * i) / cfg.total;
  for (let seq = 0; ; seq++) {
    await sleep(Math.max(0, next - Date.now()));
    if (Date.now() >= end) return;
    next += cfg.period_ms;
    const s = at();
    s.calls++;
    const p = call(c, i, seq, s);
    calls.add(p);
    p.finally(() => calls.delete(p));
  }
}

await Promise.all(clients.map((c, j) => caller(c, mine[j])));
while (calls.size > 0) await Promise.all([...calls]);
const totals = Object.fromEntries(fields.map((f) => [f, secs.reduce((t, x) => t + x[f], 0)]));
process.stdout.write(JSON.stringify({ sdk: "node", callers: n, late_ms: lateMs, errors, seconds: secs.slice(0, cfg.seconds), totals }) + "\n");
process.exit(0);
