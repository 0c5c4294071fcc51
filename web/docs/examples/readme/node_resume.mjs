// A resume endpoint for idem's completer, in Express: npm install --install-links ./clients/node express
import express from "express";
import { Client, ResumeAnswer, expressResumeHandler } from "@idem-dev/idem";

const idem = new Client({ baseUrl: process.env.IDEM_URL, token: process.env.IDEM_TOKEN });
let charges = 0;

// The order's steps, written once: run() runs them for a request, the resume
// endpoint for an orphan (its worker died part way) from its last checkpoint.
async function placeOrder(claim, order) {
  let charge = claim.recoveryData?.charge;
  if (!charge) {
    charge = `ch_${++charges}`; // your side effect: charge the card here
    console.log(`charged ${order.amount} (charge ${charges})`);
    await claim.checkpoint("charged", { order, charge });
  }
  if (claim.recoveryPoint !== "emailed") {
    console.log(`emailed the receipt of ${charge}`); // and the next one
    await claim.checkpoint("emailed", { order, charge });
  }
  return { status: 201, headers: { "Content-Type": "application/json" }, body: JSON.stringify({ order: order.id, charge }) };
}

const app = express();
// Before body parsers (the signature covers the raw body) and before an
// app.use(expressMiddleware(...)): the completer's call has no Idempotency-Key.
app.post("/idem/resume", expressResumeHandler({
  client: idem,
  secret: process.env.IDEM_RESUME_SECRET, // the endpoint's whsec_ secret
  resume: (claim, call) => call.recoveryPoint === null
    ? ResumeAnswer.review("no checkpoint: was the card charged? check the PSP") // died around the charge
    : placeOrder(claim, call.recoveryData.order), // resumes after the last step done
}));
app.post("/orders/:id", express.json(), async (req, res) => {
  const order = { id: req.params.id, amount: req.body.amount };
  const r = await idem.run(`order-${order.id}`, { operation: "POST /orders/:id", request: order }, (claim) => placeOrder(claim, order));
  res.status(r.response.status).set(r.response.headers).send(Buffer.from(r.response.body));
});
app.listen(Number(process.env.PORT ?? 8000), "127.0.0.1");
