// The app of scripts/bench-mwreplay for the Node middleware (issue 23,
// goal 2): POST /orders behind idem's middleware, answering 201 with a
// small JSON order, served on 127.0.0.1:0.
//
//     node replayapp.mjs express|fetch IDEM_URL TOKEN on|off SEED
//
// express is an Express 5 app with expressMiddleware; fetch is a Hono app
// on @hono/node-server with withIdempotency. on|off is the replay cache
// (the default, or { off: true }). It prints "LISTENING http://127.0.0.1:PORT"
// on stdout once it serves, and "SEEDED" once its handler ran SEED times
// (the keys loadgen sends once before it measures its replays).
import { createRequire } from "node:module";
import { Client, expressMiddleware, withIdempotency } from "../../clients/node/dist/index.js";

const require = createRequire(new URL("../../clients/node/package.json", import.meta.url));
const [kind, idemURL, token, cache, seed] = process.argv.slice(2);
const client = new Client({ baseUrl: idemURL, token });
const replayCache = { off: cache === "off" };
let orders = 0;
const nextOrder = () => {
  if (++orders === Number(seed)) console.log("SEEDED");
  return orders;
};
const listening = (port) => console.log(`LISTENING http://127.0.0.1:${port}`);

if (kind === "express") {
  const express = require("express");
  const app = express();
  app.use(expressMiddleware({ client, replayCache }));
  app.post("/orders", (req, res) => res.status(201).json({ order: nextOrder(), amount: req.body?.amount }));
  const srv = app.listen(0, "127.0.0.1", () => listening(srv.address().port));
} else if (kind === "fetch") {
  const { Hono } = require("hono");
  const { serve } = require("@hono/node-server");
  const app = new Hono();
  const order = withIdempotency(async (req) => {
    const body = await req.json();
    return Response.json({ order: nextOrder(), amount: body.amount }, { status: 201 });
  }, { client, replayCache, route: () => "/orders" });
  app.post("/orders", (c) => order(c.req.raw));
  serve({ fetch: app.fetch, port: 0, hostname: "127.0.0.1" }, (info) => listening(info.port));
} else {
  throw new Error(`replayapp.mjs: unknown kind ${kind}`);
}
