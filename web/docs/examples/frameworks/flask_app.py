# Flask behind idem: pip install ./clients/python flask
import os

from flask import Flask, request

from idem import Client
from idem.wsgi import install_flask

app = Flask(__name__)
idem = Client(os.environ["IDEM_URL"], token=os.environ["IDEM_TOKEN"])
install_flask(app, idem)
charges = []


@app.post("/charges")
def charge():
    order = request.get_json()
    charges.append(order)  # the side effect: runs once per key
    print(f"charged {order['amount']} (charge {len(charges)})", flush=True)
    return {"charge": f"ch_{len(charges)}", "amount": order["amount"]}, 201


app.run(host="127.0.0.1", port=int(os.environ.get("PORT", "8000")), threaded=True)
