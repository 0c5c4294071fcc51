// Next.js route handler: app/payments/route.js (npm install --install-links ./clients/node)
import { Client, withIdempotency } from "@idem-dev/idem";

const idem = new Client({ baseUrl: process.env.IDEM_URL, token: process.env.IDEM_TOKEN });
const charges = [];
async function charge(payment) { // your side effect: runs once per key
  charges.push(payment);
  console.log(`charged ${payment.amount} (charge ${charges.length})`);
  return { charge: `ch_${charges.length}`, amount: payment.amount };
}

export const POST = withIdempotency(async (req) => Response.json(await charge(await req.json()), { status: 201 }), { client: idem });
