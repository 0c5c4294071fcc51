// The client keeps its connections alive and reuses them (issue 23, goal
// 3): Node's fetch (undici's global dispatcher) keeps connections alive,
// with no cap per origin, and the client reads every answer to its end, so
// the connection goes back to the pool. Against a loopback server counting
// the TCP connections it accepts, 200 sequential calls open one and 16
// callers × 50 calls about 16 (a little slack: a connection opened while
// another frees up is kept too).
import assert from "node:assert/strict";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { after, test } from "node:test";
import { Client } from "../src/index.js";

test("one client reuses its connections, sequentially and concurrently", async () => {
  let connections = 0;
  const srv = createServer((req, res) => {
    req.resume();
    req.on("end", () => {
      res.writeHead(200, { "Content-Type": "application/json" });
      res.end(JSON.stringify({ key: "k", state: "completed", fencing_token: 1, attempt: 1 }));
    });
  });
  srv.on("connection", () => connections++);
  await new Promise<void>((r) => srv.listen(0, "127.0.0.1", r));
  after(() => {
    srv.closeAllConnections();
    srv.close();
  });
  const c = new Client({ baseUrl: `http://127.0.0.1:${(srv.address() as AddressInfo).port}`, token: "t" });

  for (let i = 0; i < 200; i++) await c.get("k");
  const sequential = connections;
  assert.ok(sequential <= 2, `${sequential} connections for 200 sequential calls`);

  const callers = 16;
  const calls = 50;
  await Promise.all(Array.from({ length: callers }, async () => {
    for (let i = 0; i < calls; i++) await c.get("k");
  }));
  const opened = connections - sequential;
  assert.ok(opened <= 2 * callers, `${opened} new connections for ${callers}×${calls} concurrent calls`);
});
