import os

from idem import Claim, Client, Response, derive_key

order = {"id": "4711", "amount": 1000}
charges = []


def charge(order: dict) -> None:
    charges.append(order["amount"])  # your side effect: charge the card here


def confirm(claim: Claim) -> Response:
    if claim.recovery_point != "charged":  # a takeover skips what is done
        charge(order)
        claim.checkpoint("charged")
    return Response(201, {"Content-Type": "application/json"}, b'{"ok":true}')


with Client(os.environ["IDEM_URL"], token=os.environ["IDEM_TOKEN"]) as idem:
    key = derive_key("order-confirm", order["id"])  # event-derived, never random per attempt
    for attempt in (1, 2):  # the second run is a retry of the same event
        result = idem.run(key, confirm, operation="POST /orders/confirm", request=order, timeout=20)
        # result.replayed: the key was done already, result.response is the stored answer
        print(f"run {attempt} of {key}: replayed={result.replayed} status={result.response.status} charges={len(charges)}")
