// Express behind idem: npm install --install-links ./clients/node express
import express from "express";
import { Client, expressMiddleware, expressErrorHandler } from "@idem-dev/idem";

const charges = [];
async function charge(payment) { // your side effect: runs once per key and account
  charges.push(payment);
  console.log(`charged ${payment.amount} (charge ${charges.length})`);
  return { charge: `ch_${charges.length}`, amount: payment.amount };
}

const idem = new Client({ baseUrl: process.env.IDEM_URL, token: process.env.IDEM_TOKEN });
const app = express();
app.use(expressMiddleware({ client: idem, scope: (req) => req.get("X-Account-Id") }));
app.post("/payments", async (req, res) => res.status(201).json(await charge(req.body)));
app.use(expressErrorHandler()); // optional when Express runs router 2.3+ (npm ls router): exceptions are seen through its tracing channel
app.listen(Number(process.env.PORT ?? 8000), "127.0.0.1");
