# A resume endpoint for idem's completer, in Flask: pip install ./clients/python flask
import json
import os

from flask import Flask, request

from idem import Claim, Client, Response, ResumeAnswer, ResumeCall
from idem.wsgi import install_flask_resume

idem = Client(os.environ["IDEM_URL"], token=os.environ["IDEM_TOKEN"])
charges = []


def place_order(claim: Claim, order: dict) -> Response:
    """The order's steps, written once: run() runs them for a request, the
    resume endpoint for an orphan (its worker died part way) from its last
    checkpoint."""
    charge = (claim.recovery_data or {}).get("charge")
    if not charge:
        charges.append(order["amount"])  # your side effect: charge the card here
        charge = f"ch_{len(charges)}"
        print(f"charged {order['amount']} (charge {len(charges)})", flush=True)
        claim.checkpoint("charged", {"order": order, "charge": charge})
    if claim.recovery_point != "emailed":
        print(f"emailed the receipt of {charge}", flush=True)  # and the next one
        claim.checkpoint("emailed", {"order": order, "charge": charge})
    return Response(201, {"Content-Type": "application/json"}, json.dumps({"order": order["id"], "charge": charge}).encode())


def resume(claim: Claim, call: ResumeCall) -> Response | ResumeAnswer:
    if call.recovery_point is None:  # died around the charge
        return ResumeAnswer.review("no checkpoint: was the card charged? check the PSP")
    return place_order(claim, call.recovery_data["order"])  # resumes after the last step done


app = Flask("shop")


@app.post("/orders/<order_id>")
def orders(order_id: str) -> tuple[bytes, int, dict[str, str]]:
    order = {"id": order_id, "amount": request.get_json()["amount"]}
    r = idem.run(f"order-{order_id}", lambda claim: place_order(claim, order), operation="POST /orders/<order_id>", request=order)
    return r.response.body, r.response.status, dict(r.response.headers)


# Outermost (after install_flask, if you use it): the completer's call has no Idempotency-Key.
install_flask_resume(app, idem, secret=os.environ["IDEM_RESUME_SECRET"], resume=resume)  # its whsec_ secret

if __name__ == "__main__":
    app.run("127.0.0.1", int(os.environ.get("PORT", "8000")))
