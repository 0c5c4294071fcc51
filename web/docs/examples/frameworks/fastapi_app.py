# FastAPI behind idem: pip install ./clients/python fastapi uvicorn
import os

import uvicorn
from fastapi import FastAPI

from idem import AsyncClient
from idem.asgi import IdempotencyMiddleware

app = FastAPI()
idem = AsyncClient(os.environ["IDEM_URL"], token=os.environ["IDEM_TOKEN"])
app.add_middleware(IdempotencyMiddleware, client=idem)
charges = []


@app.post("/charges", status_code=201)
async def charge(order: dict) -> dict:
    charges.append(order)  # the side effect: runs once per key
    print(f"charged {order['amount']} (charge {len(charges)})", flush=True)
    return {"charge": f"ch_{len(charges)}", "amount": order["amount"]}


uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("PORT", "8000")))
