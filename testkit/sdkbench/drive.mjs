// One phase of scripts/bench-sdk for the Node SDK (issue 23, goal 3).
//
//     node drive.mjs MODE URL TOKEN SECONDS CONCURRENCY
//
// MODE "default" is the client as a new user makes it (`new Client({
// baseUrl, token })`, Node's global fetch), shared by CONCURRENCY async
// loops; "fresh" is the baseline, the same client on a fetch whose undici
// agent has keep-alive off (pipelining 0: a new connection per call). Each
// loop runs claim → complete on fresh keys for SECONDS; the driver prints
// one JSON line: pairs, wall seconds, the process's CPU over the loop, and
// the price of decoding one real complete answer (JSON.parse), which the
// front door never reads.
import { performance } from "node:perf_hooks";
import { randomBytes } from "node:crypto";
import diagnostics from "node:diagnostics_channel";
import { Client } from "../../clients/node/dist/index.js";

const [mode, url, tok, secsArg, concArg] = process.argv.slice(2);
const secs = Number(secsArg);
const conc = Number(concArg);
const req = { amount: 1200, currency: "eur", customer: "cus_123" };
const resp = { status: 201, headers: { "Content-Type": "application/json" }, body: '{"id":"ord_1","amount":1200}' };

// Node bundles undici without exporting it: its Agent class is the global
// dispatcher's constructor (set once fetch has run).
await fetch(url + "/healthz").then((r) => r.arrayBuffer()).catch(() => {});
const Agent = globalThis[Symbol.for("undici.globalDispatcher.1")]?.constructor;
if (!Agent) throw new Error("drive.mjs: no undici global dispatcher");

let fetchFn = undefined;
if (mode === "fresh") {
  const noKeepAlive = new Agent({ pipelining: 0 });
  fetchFn = (input, init) => fetch(input, { ...init, dispatcher: noKeepAlive });
} else if (mode !== "default") {
  throw new Error(`drive.mjs: unknown mode ${mode}`);
}
const client = new Client({ baseUrl: url, token: tok, ...(fetchFn ? { fetch: fetchFn } : {}) });
// The TCP connections undici opens, counted from its diagnostics channel
// (an observation only). scripts/bench-sdk checks it against ss.
let connects = 0;
diagnostics.subscribe("undici:client:connected", () => connects++);
const prefix = randomBytes(4).toString("hex");
const stop = performance.now() + secs * 1000;
let pairs = 0;

async function work(i) {
  for (let n = 0; performance.now() < stop; n++) {
    const key = `${prefix}-${i}-${n}`;
    const cr = await client.claim(key, { operation: "POST /orders", request: req });
    await client.complete(key, cr.fencingToken, resp);
    pairs++;
  }
}

connects = 0;
const c0 = process.cpuUsage();
const t0 = performance.now();
await Promise.all(Array.from({ length: conc }, (_, i) => work(i)));
const wall = (performance.now() - t0) / 1000;
const c1 = process.cpuUsage(c0);
const phaseConnects = connects;

// One real complete answer, for the decode price.
const key = `${prefix}-sample`;
const cr = await client.claim(key, { request: req });
const raw = await (await fetch(`${url}/v1/keys/${key}/complete`, {
  method: "POST",
  headers: { Authorization: `Bearer ${tok}`, "Content-Type": "application/json" },
  body: JSON.stringify({ fencing_token: cr.fencingToken, response: { status: 201, headers: resp.headers, body: resp.body, body_encoding: "utf8" } }),
})).text();
const n = 50000;
const d0 = process.cpuUsage();
let sink = 0;
for (let i = 0; i < n; i++) sink += JSON.parse(raw).fencing_token;
const d1 = process.cpuUsage(d0);

console.log(JSON.stringify({
  lang: "node", mode, connects: phaseConnects, pairs, wall: +wall.toFixed(3), cpu: +((c1.user + c1.system) / 1e6).toFixed(3), pid: process.pid,
  complete_answer_bytes: raw.length, decode_complete_us: +(((d1.user + d1.system) / n)).toFixed(2), sink: sink > 0,
}));
process.exit(0);
