"""idem: the Python SDK of the idem idempotency service.

    from idem import Claim, Client, Response, derive_key

    order_id = "4711"
    order = {"id": order_id, "amount": 1000}

    def confirm(claim: Claim) -> Response:
        # Your side effect here (charge, email): it runs once per key, a
        # takeover sees claim.recovery_point, a replay does not run it.
        return Response(201, {"Content-Type": "application/json"}, b'{"ok":true}')

    with Client("https://idem.example.com", token=token) as idem:
        key = derive_key("order-confirm", order_id)  # event-derived, never random per attempt
        result = idem.run(key, confirm, operation="POST /orders/confirm", request=order)
        print(result.replayed, result.response.status)   # False 201, then True 201 on a retry

``Client`` and ``AsyncClient`` wrap every call of the HTTP contract in the
retry contract of the docs; ``run`` does claim -> your function ->
checkpoint -> complete; ``idem.asgi`` and ``idem.wsgi`` give a web app
Stripe-style Idempotency-Key semantics, and the resume endpoint idem's
completer calls for an orphaned key (ResumeMiddleware: the same function
run() runs, resumed from its last checkpoint). idem makes retries safe within one
tenant's key scope and replay window; it does not promise exactly-once
execution on its own.
"""

from ._async import AsyncClaim, AsyncClient
from ._client import Claim, Client, LeaseLost
from ._core import RENEWAL_POINT, AttemptInfo
from ._errors import (
    FieldError,
    FleetBudgetExhausted,
    IdemError,
    InvalidAnswer,
    InvalidKeyError,
    NoSideEffect,
    ProblemError,
    TokenError,
    TransportError,
    error_code,
)
from ._keys import MAX_KEY_BYTES, derive_key, validate_key
from ._resume import (RESUME_EVENT_TYPE, SIGNATURE_TOLERANCE, AsyncResumeFunction, ResumeAnswer, ResumeCall,
                      ResumeFunction, ResumeResult, decode_call, verify_signature)
from ._replaycache import ReplayCacheOptions, ReplayCacheStats
from ._retry import HEADER_ATTEMPT, RetryBudget, RetryPolicy, parse_retry_after
from ._types import ClaimResult, KeyPage, Record, Response, RunResult

__all__ = [
    "AsyncClaim", "AsyncClient", "AttemptInfo", "Claim", "ClaimResult", "Client", "FieldError", "FleetBudgetExhausted",
    "HEADER_ATTEMPT", "IdemError",
    "InvalidAnswer", "InvalidKeyError", "KeyPage", "LeaseLost", "MAX_KEY_BYTES", "NoSideEffect", "ProblemError", "RENEWAL_POINT",
    "RESUME_EVENT_TYPE", "SIGNATURE_TOLERANCE", "AsyncResumeFunction", "ResumeAnswer", "ResumeCall", "ResumeFunction",
    "ResumeResult", "Record", "ReplayCacheOptions", "ReplayCacheStats", "Response", "RetryBudget", "RetryPolicy", "RunResult", "TokenError", "TransportError",
    "decode_call", "derive_key", "error_code", "parse_retry_after", "validate_key", "verify_signature",
]
