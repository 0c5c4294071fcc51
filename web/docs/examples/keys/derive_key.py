# Three ways to derive a key, best first. The values stand in for your own
# order, payout, webhook event, request and job.
import uuid


class Job:
    """A stored job: its key is minted once and saved with it."""

    idempotency_key = None


order_id, payout_batch_id, account = "4711", "pb_9", "acct_3"
provider, event_id, customer_id = "stripe", "evt_1Q", "cus_7"
headers = {"Idempotency-Key": "c0ffee-12"}  # the request your API received
job = Job()

# 1. Event-derived: the same event always maps to the same key.
print(f"order-confirm-{order_id}")            # one confirmation per order
print(f"payout-{payout_batch_id}-{account}")  # one payout per account and batch
print(f"webhook-{provider}-{event_id}")       # one handling per delivered event

# 2. Request-scoped: the caller sent one (Stripe-style Idempotency-Key header).
print(f"api-{customer_id}-{headers['Idempotency-Key']}")

# 3. Last resort: a random UUID minted ONCE, stored with the job, reused by every retry.
for attempt in range(3):
    job.idempotency_key = job.idempotency_key or f"job-{uuid.uuid4()}"
    print(job.idempotency_key)  # the same key on every attempt
