"""The resume endpoint idem's completer calls for an orphaned key (issue 24,
the completer protocol): verify the Standard Webhooks signature, decode the
call strictly, run the application's resume function with a Claim under the
fencing token idem took the key over with, and answer the outcome. The
framework adapters are idem.wsgi (ResumeMiddleware, install_flask_resume)
and idem.asgi (ResumeEndpoint, ResumeMiddleware)."""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import json
import logging
import math
import re
import secrets as _secrets
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Mapping, Sequence, Union

from . import frontdoor
from ._errors import InvalidKeyError, NoSideEffect
from ._keys import validate_key
from ._middleware import Answer
from ._types import ClaimResult, Record, Response
from .frontdoor import FrontDoorError

if TYPE_CHECKING:
    from ._async import AsyncClaim, AsyncClient
    from ._client import Claim, Client

log = logging.getLogger("idem.resume")

#: The body ``type`` of a completer call.
RESUME_EVENT_TYPE = "key.resume"
#: The Standard Webhooks tolerance, seconds: a call whose timestamp is
#: further than this from now is refused.
SIGNATURE_TOLERANCE = 300
#: The largest call body read by default (8 MiB); larger: 413.
DEFAULT_MAX_BODY_BYTES = 8 << 20

UNAUTHENTICATED = "unauthenticated"
METHOD_NOT_ALLOWED = "method_not_allowed"


@dataclass(frozen=True)
class ResumeCall:
    """One decoded, verified call of idem's completer."""

    #: The call's webhook-id: unique per attempt.
    webhook_id: str
    tenant: str
    key: str
    #: The claim's operation, e.g. "POST /orders".
    operation: str
    #: This resume attempt, 1-based, of at most max_attempts.
    attempt: int
    max_attempts: int
    #: The token idem took the key over with: checkpoints carry it; the late original worker's is stale.
    fencing_token: int
    #: The last checkpoint's name, None when the key was never checkpointed.
    recovery_point: str | None
    #: The last checkpoint's data verbatim, None when none.
    recovery_data: Any
    #: When the completer's lease on the key runs out.
    lease_expires_at: datetime
    #: After this idem marks the key for review instead of asking again.
    deadline: datetime


@dataclass(frozen=True)
class ResumeAnswer:
    """An answer of a resume function other than "completed" (which is a
    Response): ResumeAnswer.not_done(), .unknown(retry_after), .review(note)."""

    outcome: str
    #: With unknown: when to ask again, whole seconds (None: idem's backoff).
    retry_after: int | None = None
    #: With review: what the person should look at.
    note: str = ""

    @classmethod
    def not_done(cls) -> ResumeAnswer:
        """Nothing happened (no external effect took place): idem releases
        the key and the client's next retry runs it afresh."""
        return cls("not_done")

    @classmethod
    def unknown(cls, retry_after: float | None = None) -> ResumeAnswer:
        """The outcome is not known yet (the PSP is down, say): idem keeps
        the key held and asks again, after retry_after seconds if given."""
        if retry_after is not None and not (math.isfinite(retry_after) and retry_after > 0):
            raise ValueError("idem: retry_after must be a positive number of seconds")
        return cls("unknown", None if retry_after is None else math.ceil(retry_after))

    @classmethod
    def review(cls, note: str) -> ResumeAnswer:
        """A person must decide (note says what to check): idem marks the key for review."""
        if not isinstance(note, str) or not note.strip():
            raise ValueError("idem: a review needs a note")
        return cls("review", note=note)

    def to_wire(self) -> dict[str, Any]:
        """The protocol's answer object."""
        if self.outcome == "unknown":
            return {"outcome": "unknown"} if self.retry_after is None else {"outcome": "unknown", "retry_after_seconds": self.retry_after}
        if self.outcome == "review":
            return {"outcome": "review", "note": self.note}
        return {"outcome": "not_done"}


#: What a resume function returns: a Response when the work is done (idem
#: completes the key with it) or a ResumeAnswer. Raising NoSideEffect (or a
#: type in no_side_effect) is not_done, as it releases the key in run();
#: any other exception is unknown, never not_done or completed.
ResumeResult = Union[Response, ResumeAnswer]
#: The resume function of a WSGI app: the function Client.run runs, with the call.
ResumeFunction = Callable[["Claim", ResumeCall], ResumeResult]
#: The resume function of an ASGI app: the function AsyncClient.run runs, with the call.
AsyncResumeFunction = Callable[["AsyncClaim", ResumeCall], Awaitable[ResumeResult]]


def _secret_key(secret: str) -> bytes:
    """The HMAC key of an endpoint secret, ``whsec_`` and standard padded
    base64 (the prefix optional, as in the Standard Webhooks libraries);
    ValueError on a bad one: a misconfiguration, not a bad call."""
    b64 = secret[len("whsec_"):] if secret.startswith("whsec_") else secret
    try:
        key = base64.b64decode(b64.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as e:
        raise ValueError("idem: the resume endpoint's secret must be whsec_ and standard padded base64") from e
    if not key:
        raise ValueError("idem: the resume endpoint's secret is empty")
    return key


def _keys(secret: str | Sequence[str]) -> list[bytes]:
    keys = [_secret_key(s) for s in ([secret] if isinstance(secret, str) else secret)]
    if not keys:
        raise ValueError("idem: the resume endpoint needs a secret")
    return keys


def verify_signature(secret: str | Sequence[str], webhook_id: str | None, timestamp: str | None,
                     signature: str | None, body: bytes, now: float | None = None) -> str | None:
    """Verify a Standard Webhooks signature: one of the space-separated
    ``v1,<base64>`` values of signature must be the HMAC-SHA256, keyed by
    one of the secrets (several while rotating), of ``id.timestamp.body``
    (compared in constant time), and timestamp (unix seconds) within
    SIGNATURE_TOLERANCE of now. Returns why it refuses, None when it verifies."""
    keys = _keys(secret)
    if not webhook_id or not timestamp or not signature:
        return "the webhook-id, webhook-timestamp or webhook-signature header is missing"
    if not re.fullmatch(r"[0-9]{1,15}", timestamp):
        return "the webhook-timestamp is not unix seconds"
    if abs((time.time() if now is None else now) - int(timestamp)) > SIGNATURE_TOLERANCE:
        return f"the webhook-timestamp is more than {SIGNATURE_TOLERANCE} seconds from now"
    sent: list[bytes] = []
    for part in signature.split(" "):
        if not part.startswith("v1,"):
            continue  # another scheme (v1a, ...) or a join artefact
        try:
            sent.append(base64.b64decode(part[3:].rstrip(","), validate=True))
        except (binascii.Error, ValueError):
            continue
    msg = f"{webhook_id}.{timestamp}.".encode() + body
    for key in keys:
        want = hmac.new(key, msg, hashlib.sha256).digest()
        if any(hmac.compare_digest(s, want) for s in sent):
            return None
    return "no webhook-signature matches the call"


_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})")
_MAX_INT = (1 << 63) - 1


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate member {k!r}")
        out[k] = v
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def decode_call(webhook_id: str, body: bytes) -> ResumeCall:
    """Decode a completer call's body strictly: one I-JSON object of type
    key.resume, every member the protocol names present with its type (a
    valid key, positive integers, RFC 3339 times). Members it does not name
    are ignored, as Standard Webhooks receivers do, so that a newer idem
    that adds one does not turn every resume into "unknown". Raises
    FrontDoorError invalid_request."""
    def bad(detail: str) -> FrontDoorError:
        return FrontDoorError(frontdoor.INVALID_REQUEST, detail)

    try:
        v = json.loads(body.decode("utf-8"), object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError) as e:
        raise bad("the call body is not one JSON value in UTF-8 (I-JSON: no duplicate member names)") from e
    if not isinstance(v, dict):
        raise bad("the call body is not a JSON object")

    def string(name: str, nullable: bool = False) -> Any:
        x = v.get(name)
        if nullable and name in v and x is None:
            return None
        if not isinstance(x, str):
            raise bad(f"{name} must be a string{' or null' if nullable else ''}")
        return x

    def integer(name: str) -> int:
        x = v.get(name)
        if type(x) is not int or not 1 <= x <= _MAX_INT:
            raise bad(f"{name} must be a positive integer")
        return x

    def when(name: str) -> datetime:
        x = string(name)
        if not _RFC3339.fullmatch(x):
            raise bad(f"{name} must be an RFC 3339 time")
        try:
            return datetime.fromisoformat(x.upper().replace("Z", "+00:00"))
        except ValueError as e:
            raise bad(f"{name} must be an RFC 3339 time") from e

    if v.get("type") != RESUME_EVENT_TYPE:
        raise bad(f'type must be "{RESUME_EVENT_TYPE}"')
    key = string("key")
    try:
        validate_key(key)
    except InvalidKeyError as e:
        raise bad("key is not a valid idempotency key") from e
    if "recovery_data" not in v:
        raise bad("recovery_data is missing (null when none)")
    return ResumeCall(
        webhook_id=webhook_id, tenant=string("tenant"), key=key, operation=string("operation"),
        attempt=integer("attempt"), max_attempts=integer("max_attempts"), fencing_token=integer("fencing_token"),
        recovery_point=string("recovery_point", nullable=True), recovery_data=v["recovery_data"],
        lease_expires_at=when("lease_expires_at"), deadline=when("deadline"),
    )


def claim_result(call: ResumeCall) -> ClaimResult:
    """The ClaimResult a resume's Claim is made of: a takeover under the
    call's token, with its recovery point (the attempt is the completer's)."""
    rec = Record(key=call.key, state="in_flight", operation=call.operation, fencing_token=call.fencing_token,
                 attempt=call.attempt, lease_expires_at=call.lease_expires_at, recovery_point=call.recovery_point or "",
                 recovery_data=call.recovery_data)
    return ClaimResult(record=rec, resumed=True)


def _json(doc: Mapping[str, Any]) -> Answer:
    body = json.dumps(doc).encode("utf-8")
    return Answer(200, [("Content-Type", "application/json"), ("Cache-Control", "no-store"),
                        ("Content-Length", str(len(body)))], body)


#: The most webhook-ids a resume endpoint remembers to refuse a replayed
#: call; past it the oldest are forgotten first.
MAX_SEEN_RESUME_IDS = 4096


class _SeenIds:
    """The webhook-ids of the verified calls, remembered for twice the
    signature tolerance: a signed call replayed while its timestamp is still
    accepted is refused (idem sends each attempt with a new id)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._until: dict[str, float] = {}  # insertion order: oldest first

    def add(self, wid: str, now: float) -> bool:
        """Whether wid is new at now (unix seconds); remembers it."""
        with self._lock:
            while self._until:
                oldest, until = next(iter(self._until.items()))
                if len(self._until) < MAX_SEEN_RESUME_IDS and until > now:
                    break
                del self._until[oldest]
            if wid in self._until:
                return False
            self._until[wid] = now + 2 * SIGNATURE_TOLERANCE
            return True


class Endpoint:
    """What the WSGI and ASGI resume endpoints share: the checks before the
    resume function runs and the mapping of what it did to the answer."""

    def __init__(self, secret: str | Sequence[str], *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 no_side_effect: tuple[type[BaseException], ...] = (), now: Callable[[], float] | None = None) -> None:
        self.secrets = [secret] if isinstance(secret, str) else list(secret)
        _keys(self.secrets)  # refuse a bad secret now, not at the first call
        self.max_body_bytes = max_body_bytes
        self.no_side_effect = no_side_effect
        self.now = now or time.time
        self.seen = _SeenIds()

    @staticmethod
    def request_id(headers: Mapping[str, str]) -> str:
        rid = headers.get("x-request-id")
        return rid if rid and frontdoor.valid_request_id(rid) else _secrets.token_hex(16)

    def refuse(self, err: FrontDoorError, rid: str) -> Answer:
        status, headers, body = frontdoor.problem(err, rid)
        if err.code == METHOD_NOT_ALLOWED:
            headers.append(("Allow", "POST"))
        return Answer(status, headers, body)

    def check(self, method: str, headers: Mapping[str, str], body: bytes, too_large: bool, cut: bool) -> ResumeCall | Answer:
        """The verified, decoded call, or the refusal to answer (405, 413,
        400 for a cut body, 401 for a bad signature, 400 for a bad call).
        headers: lower-case names."""
        rid = self.request_id(headers)
        if method.upper() != "POST":
            return self.refuse(FrontDoorError(METHOD_NOT_ALLOWED, "the resume endpoint takes POST"), rid)
        if too_large:
            return self.refuse(FrontDoorError(frontdoor.PAYLOAD_TOO_LARGE, f"the request body is larger than {self.max_body_bytes} bytes"), rid)
        if cut:
            return self.refuse(FrontDoorError(frontdoor.INVALID_REQUEST, "the request body ended before its Content-Length"), rid)
        wid = headers.get("webhook-id")
        why = verify_signature(self.secrets, wid, headers.get("webhook-timestamp"), headers.get("webhook-signature"), body, self.now())
        if why:
            return self.refuse(FrontDoorError(UNAUTHENTICATED, why), rid)
        if not self.seen.add(wid or "", self.now()):
            return self.refuse(FrontDoorError(UNAUTHENTICATED, "the call's webhook-id was already seen: a replay"), rid)
        try:
            return decode_call(wid or "", body)
        except FrontDoorError as e:
            return self.refuse(e, rid)

    def failed(self, call: ResumeCall, err: BaseException) -> Answer:
        """The answer when the resume function raised: not_done for a
        declared NoSideEffect, else unknown (it may have done part of the work)."""
        if isinstance(err, NoSideEffect) or (self.no_side_effect and isinstance(err, self.no_side_effect)):
            return _json({"outcome": "not_done"})
        log.warning("idem: the resume function of key %r raised %s; answered unknown", call.key, type(err).__name__, exc_info=err)
        return _json({"outcome": "unknown"})

    def answered(self, call: ResumeCall, result: object) -> Answer:
        """The answer for what the resume function returned."""
        if isinstance(result, ResumeAnswer):
            return _json(result.to_wire())
        if isinstance(result, Response) and type(result.status) is int and 100 <= result.status <= 599:
            return _json({"outcome": "completed", "response": result.to_wire()})
        log.warning("idem: the resume function of key %r returned %s, neither a Response (status 100-599) nor a "
                    "ResumeAnswer; answered unknown", call.key, type(result).__name__)
        return _json({"outcome": "unknown"})

    def run(self, client: Client, resume: ResumeFunction, call: ResumeCall) -> Answer:
        """Run a sync resume function for a verified call."""
        from ._client import Claim

        claim = Claim(client, call.key, claim_result(call), None)
        claim.resume = call
        # claim.lease_lost is set when the completer's lease on the key ends
        # (the call's lease_expires_at), as the Go SDK's context ends then:
        # the next attempt may take the key with a new token, so a long
        # function checking it between steps stops rather than work beside
        # that attempt. A hang-up of idem does not set it.
        timer = threading.Timer(self.lease_left(call), claim.lease_lost.set)
        timer.daemon = True
        timer.start()
        try:
            result = resume(claim, call)
        except Exception as err:
            return self.failed(call, err)
        finally:
            timer.cancel()
        return self.answered(call, result)

    def lease_left(self, call: ResumeCall) -> float:
        """Seconds until the completer's lease on the key ends (0 when it has)."""
        return max(0.0, call.lease_expires_at.timestamp() - self.now())

    async def run_async(self, client: AsyncClient, resume: AsyncResumeFunction, call: ResumeCall) -> Answer:
        """Run an async resume function for a verified call."""
        from ._async import AsyncClaim

        claim = AsyncClaim(client, call.key, claim_result(call), None)
        claim.resume = call
        # As in run: claim.lease_lost is set at the call's lease_expires_at.
        timer = asyncio.get_running_loop().call_later(self.lease_left(call), claim.lease_lost.set)
        try:
            result = await resume(claim, call)
        except Exception as err:
            return self.failed(call, err)
        finally:
            timer.cancel()
        return self.answered(call, result)
