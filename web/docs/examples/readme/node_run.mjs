import { Client, NoSideEffect, key } from "@idem-dev/idem";

const idem = new Client({ baseUrl: process.env.IDEM_URL, token: process.env.IDEM_TOKEN });
const order = { id: "4711", amount: 1000 };
const charges = [];
const psp = { // your payment provider
  async charge(order) {
    if (order.amount <= 0) throw new NoSideEffect("declined: nothing was charged");
    return { id: `ch_${charges.push(order.amount)}` };
  },
};

const k = key("order-confirm", order.id); // event-derived, never random per attempt

for (const attempt of [1, 2]) { // the second run is a retry of the same event
  const result = await idem.run(k, { operation: "POST /orders/confirm", request: order },
    async (claim) => {
      if (claim.recoveryPoint !== "charged") {       // a takeover resumes after the last checkpoint
        const charge = await psp.charge(order);      // a decline throws NoSideEffect: the key is released
        await claim.checkpoint("charged", { charge: charge.id });
      }
      return { status: 201, headers: { "Content-Type": "application/json" }, body: JSON.stringify({ ok: true }) };
    },
    { timeoutMs: 20_000 });                          // one overall deadline
  // result.replayed: true when the key was already completed: your function did not run
  // result.response.json(): the (stored) response, body decoded from utf8 or base64
  console.log(`run ${attempt} of ${k}: replayed=${result.replayed} status=${result.response.status} body=${JSON.stringify(result.response.json())} charges=${charges.length}`);
}
