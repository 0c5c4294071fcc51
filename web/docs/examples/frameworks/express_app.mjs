// Express behind idem: npm install --install-links ./clients/node express
import express from "express";
import { Client, expressMiddleware } from "@idem-dev/idem";

const app = express();
const idem = new Client({ baseUrl: process.env.IDEM_URL, token: process.env.IDEM_TOKEN });
app.use(expressMiddleware({ client: idem }));
const charges = [];

app.post("/charges", (req, res) => {
  const order = req.body; // the middleware read the body and parsed its JSON
  charges.push(order); // the side effect: runs once per key
  console.log(`charged ${order.amount} (charge ${charges.length})`);
  res.status(201).json({ charge: `ch_${charges.length}`, amount: order.amount });
});

app.listen(Number(process.env.PORT ?? 8000), "127.0.0.1");
