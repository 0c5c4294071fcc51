// Hono on Node.js behind idem: npm install --install-links ./clients/node hono @hono/node-server
import { serve } from "@hono/node-server";
import { Hono } from "hono";
import { Client, withIdempotency } from "@idem-dev/idem";

const idem = new Client({ baseUrl: process.env.IDEM_URL, token: process.env.IDEM_TOKEN });
const charges = [];
async function handler(req, c) { // your side effect: runs once per key
  const payment = { id: c.req.param("id"), ...(await req.json()) };
  charges.push(payment);
  console.log(`charged ${payment.amount} (charge ${charges.length})`);
  return Response.json({ charge: `ch_${charges.length}`, ...payment }, { status: 201 });
}

const pay = withIdempotency(handler, {
  client: idem,
  route: (_req, c) => c.req.routePath, // the operation label: "POST /payments/:id"
  target: (_req, c) => c.env.incoming.url, // the request-target as it arrived, for the fingerprint
});
const app = new Hono();
app.post("/payments/:id", (c) => pay(c.req.raw, c));
serve({ fetch: app.fetch, hostname: "127.0.0.1", port: Number(process.env.PORT ?? 8000) });
