"""Idempotency-Key middleware for ASGI apps (Starlette, FastAPI, any ASGI
app), following the front-door rules (docs/frontdoor.md):

    from idem import AsyncClient
    from idem.asgi import IdempotencyMiddleware

    app = FastAPI()
    app.add_middleware(IdempotencyMiddleware, client=AsyncClient(IDEM_URL, token=IDEM_TOKEN))

POST and PATCH need an Idempotency-Key; PUT and DELETE are protected when
they carry one. The handler of a new key runs once, its answer is buffered,
stored in idem and then sent; a retry gets the stored answer with
Idempotent-Replayed: true (a retry of exactly a request idem replayed, from
the replay cache for up to 2 s: ``replay_cache=ReplayCacheOptions(...)``,
idem._replaycache); a retry while the first runs gets 409
request_in_flight with Retry-After - unless it carries ``Prefer: wait=N``
(RFC 7240): then the claim asks idem to hold it (wait_seconds = min(N,
max_wait), within the attempt timeout less a second) and it gets the first
one's replay as soon as that completes (or runs the handler when that one
releases the key or loses its lease; 409 when the wait runs out), with
``Preference-Applied: wait=<applied>`` when idem held it; the same key with another request 422
fingerprint_mismatch; an unreachable idem 503 store_unavailable without
running the handler; the tenant's storage quota used up (idem refuses the
new key) 507 storage_quota_exceeded, not retryable, without running the
handler; the middleware's tenant disabled or deleted (idem refuses its
token 403 tenant_unknown) 403 tenant_unknown, not retryable, without
running the handler. A handler exception stores nothing and propagates. A caller
that goes away before its whole body arrived (``http.disconnect`` before
the last ``http.request`` message) is never claimed and the app does not
run (docs/frontdoor.md rule 4); with ``scope_header``, two scope header
fields or a list (a comma) in one are 400 invalid_key (rule 3).
A cut answer is never stored as the whole (docs/frontdoor.md rule 5, "A
cut answer"): the app under a claim never receives ``http.disconnect``, so
an app that stops when the caller hangs up (Starlette's StreamingResponse
does) runs to its end and its whole answer is stored for the retry; an app
whose stream raises part way is a handler that raised, and one that returns
before its last body message (``more_body`` never false) raises
IncompleteResponse: nothing stored, the claim left to expire.
The operation label uses the Starlette route pattern (e.g.
"POST /orders/{order_id}") when the app is a Starlette app, else the path
(frontdoor.path_route: the path as it arrived, escaped, when its decoding
holds a control character or bytes that are not UTF-8, as /pay%00 or
/pay%FF do; idem refuses those in a label). A claim idem refuses as
invalid (400 invalid_request) is 400 invalid_request, not retryable.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, MutableMapping, Sequence

from . import frontdoor
from ._async import AsyncClaim, AsyncClient
from ._errors import IdemError
from ._resume import DEFAULT_MAX_BODY_BYTES, AsyncResumeFunction, Endpoint
from ._middleware import (Answer, Options, Protected, Release, applied, caller_request_id, prepare, problem_answer,
                          not_replayable, refused_as_too_large, replay_answer, request_path, run_answer, run_failed,
                          to_store, wait_applied)
from ._replaycache import Lookup, ReplayCacheOptions, new_replay_cache
from ._types import Response
from .frontdoor import FrontDoorError


Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class IncompleteResponse(RuntimeError):
    """The app returned without finishing its response (no final
    ``http.response.body`` with ``more_body`` false): what it sent is not
    the whole answer, so nothing is stored and the claim is left to expire,
    as for an app that raised (an ASGI server treats it as an error too)."""


def _held(receive: Receive) -> Receive:
    """The app's receive under a claim: the request body, then nothing
    until the app is done. The caller hanging up (``http.disconnect``) is
    not passed on: an app that stopped at it (Starlette's StreamingResponse
    does) would return normally with part of its answer, which would be
    stored and replayed as the whole; run to its end, its whole answer is
    stored for the caller's retry. An app that waits for the disconnect to
    end its answer never ends under the middleware (its answer is buffered
    whole anyway)."""
    first = True

    async def held() -> Message:
        nonlocal first
        if first:
            first = False
            return await receive()
        never: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        return await never  # cancelled with the app's task (Starlette cancels its listener when the answer is done)

    return held


def starlette_route(scope: Scope) -> str | None:
    """The path pattern of the Starlette/FastAPI route that matches the
    request, when the scope's app is one; None otherwise."""
    router = getattr(scope.get("app"), "router", None)
    routes = getattr(router, "routes", None)
    if not routes:
        return None
    try:
        from starlette.routing import Match
    except ImportError:
        return None
    for r in routes:
        try:
            match, _ = r.matches(scope)
        except Exception:
            continue
        if match == Match.FULL:
            path = getattr(r, "path", None)
            return str(path) if path else None
    return None


class IdempotencyMiddleware:
    """ASGI middleware that gives app Stripe-style Idempotency-Key
    semantics on top of an idem AsyncClient. ``route(scope)`` names the
    route pattern for the operation label (default: the Starlette route,
    else the path)."""

    def __init__(self, app: ASGIApp, client: AsyncClient, *, route: Callable[[Scope], str | None] | None = None,
                 required_methods: Sequence[str] | None = None, optional_methods: Sequence[str] | None = None,
                 scope_header: str | None = None, store_5xx: bool = True, stored_headers: Sequence[str] | None = None,
                 lease: float | None = None, timeout: float | None = 10.0, max_body_bytes: int = 8 << 20,
                 max_stored_bytes: int = 1 << 20, max_wait: float | None = None,
                 replay_cache: ReplayCacheOptions | None = None) -> None:
        self.app = app
        self.client = client
        #: The replay cache (None: off); its client must stay with one tenant.
        self.replay_cache = new_replay_cache(replay_cache)
        self.route = route or starlette_route
        self.opts = Options(required_methods, optional_methods, scope_header, store_5xx, stored_headers, lease, timeout,
                            max_body_bytes, max_stored_bytes, max_wait)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or frontdoor.requirement(scope["method"], self.opts.required_methods,
                                                            self.opts.optional_methods) == "pass":
            await self.app(scope, receive, send)
            return
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope.get("headers", [])]
        body = b""
        more = True
        while more and len(body) <= self.opts.max_body_bytes:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            body += msg.get("body", b"")
            more = bool(msg.get("more_body"))
        replayed_body = False
        truncated = more  # too large to protect, and the rest is unread: an unprotected request reads on

        async def replay_receive() -> Message:
            nonlocal replayed_body
            if not replayed_body:
                replayed_body = True
                return {"type": "http.request", "body": body, "more_body": truncated}
            return await receive()

        rid = caller_request_id(headers)
        decoded = scope.get("root_path", "") + scope["path"]
        path = request_path(scope.get("raw_path"), decoded)
        try:
            prot = prepare(self.opts, scope["method"], self.route(scope) or frontdoor.path_route(decoded, path),
                           scope.get("query_string", b"").decode("latin-1"), headers, body, path=path)
        except FrontDoorError as e:
            await self._send(problem_answer(e, rid), send)
            return
        if prot is None:
            await self.app(scope, replay_receive, send)
            return
        await self._send(await self._protected(prot, scope, replay_receive, rid), send)

    async def _protected(self, prot: Protected, scope: Scope, receive: Receive, rid: str) -> Answer:
        # A replay of exactly this request the cache holds is answered without a claim (idem._replaycache).
        cached = Lookup(self.replay_cache, prot.key, prot.operation, prot.document)
        hit = cached.cached(prot.wait)
        if hit is not None:
            return replay_answer(hit, rid)
        ran: list[Answer] = []

        tokens: list[int] = []

        async def handler(claim: AsyncClaim) -> Response:
            tokens.append(claim.fencing_token)
            ans = await self._run_app(scope, _held(receive))
            ran.append(ans)
            return to_store(self.opts, ans)

        try:
            res = await self.client.run(prot.key, handler, operation=prot.operation, request=prot.document,
                                        lease=self.opts.lease, no_wait=True, wait=prot.wait, timeout=self.opts.timeout,
                                        attempt=prot.attempt)
        except Release:
            return ran[0]
        except IdemError as err:
            cached.refused(err)
            if refused_as_too_large(err, ran):
                try:
                    await self.client.complete(prot.key, tokens[-1], not_replayable(self.opts, ran[0]), timeout=self.opts.timeout)
                    return ran[0]
                except IdemError as cerr:
                    err = cerr
            return applied(run_failed(err, ran, rid), wait_applied(err))
        cached.replayed(res)
        return applied(run_answer(res, ran, rid), res.wait_applied)

    async def _run_app(self, scope: Scope, receive: Receive) -> Answer:
        status = 500
        headers: list[tuple[str, str]] = []
        chunks: list[bytes] = []
        finished = False

        async def capture(msg: Message) -> None:
            nonlocal status, headers, finished
            if finished:
                return
            if msg["type"] == "http.response.start":
                status = int(msg["status"])
                headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in msg.get("headers", [])
                           if k.lower() != b"content-length"]
            elif msg["type"] == "http.response.body":
                chunks.append(bytes(msg.get("body", b"")))
                finished = not msg.get("more_body", False)

        await self.app(scope, receive, capture)
        if not finished:
            raise IncompleteResponse("idem: the app returned without finishing its response; nothing stored, "
                                     "the claim is left to expire")
        return Answer(status, headers, b"".join(chunks))

    @staticmethod
    async def _send(ans: Answer, send: Send) -> None:
        headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in ans.headers if k.lower() != "content-length"]
        headers.append((b"content-length", str(len(ans.body)).encode()))
        await send({"type": "http.response.start", "status": ans.status, "headers": headers})
        await send({"type": "http.response.body", "body": ans.body, "more_body": False})


class ResumeEndpoint:
    """The resume endpoint idem's completer calls (the completer protocol,
    idem._resume) as an ASGI app, for a Starlette ``Route`` or ``Mount``;
    ResumeMiddleware serves it at a path in front of a whole app.

    A call whose Standard Webhooks signature does not verify, or whose
    timestamp is more than five minutes away, is 401 unauthenticated
    (problem+json) and resume does not run; a body that is not a valid call
    is 400 invalid_request. A verified call runs ``await resume(claim,
    call)``: the function AsyncClient.run runs, given an AsyncClaim under
    the call's fencing token whose recovery_point / recovery_data are the
    last checkpoint's (its checkpoints go through client and renew idem's
    lease; no lease keeper runs), so the steps already done are skipped. It
    answers 200: a Response is ``completed`` (a body that is not UTF-8 as
    base64); ResumeAnswer.not_done() or a raised NoSideEffect (or a type
    in no_side_effect) ``not_done``; ResumeAnswer.unknown(retry_after)
    ``unknown``; ResumeAnswer.review(note) ``review``; any other exception
    or value ``unknown`` (logged): the function may have done part of its
    work, so it is never reported as not_done or completed. A completer
    that hangs up before its body arrived gets nothing and nothing runs."""

    def __init__(self, client: AsyncClient, *, secret: str | Sequence[str], resume: AsyncResumeFunction,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, no_side_effect: tuple[type[BaseException], ...] = (),
                 now: Callable[[], float] | None = None) -> None:
        self.client = client
        self.resume = resume
        self.endpoint = Endpoint(secret, max_body_bytes=max_body_bytes, no_side_effect=no_side_effect, now=now)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            raise RuntimeError(f"idem: the resume endpoint serves HTTP, not {scope['type']!r}")
        ep = self.endpoint
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        body = b""
        more = True
        while more and len(body) <= ep.max_body_bytes:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            body += msg.get("body", b"")
            more = bool(msg.get("more_body"))
        checked = ep.check(scope["method"], headers, body, len(body) > ep.max_body_bytes, False)
        ans = checked if isinstance(checked, Answer) else await ep.run_async(self.client, self.resume, checked)
        await IdempotencyMiddleware._send(ans, send)


class ResumeMiddleware:
    """The resume endpoint (ResumeEndpoint) at ``path`` in front of an ASGI
    app; anything else goes on to app. Add it after the idempotency
    middleware, so that it is the outer layer and that middleware never
    sees the completer's call (it carries no Idempotency-Key):

        app.add_middleware(IdempotencyMiddleware, client=idem)
        app.add_middleware(ResumeMiddleware, client=idem, secret=RESUME_SECRET, resume=resume)
    """

    def __init__(self, app: ASGIApp, *, client: AsyncClient, secret: str | Sequence[str], resume: AsyncResumeFunction,
                 path: str = "/idem/resume", **options: Any) -> None:
        self.app = app
        self.path = path
        self.endpoint = ResumeEndpoint(client, secret=secret, resume=resume, **options)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path") == self.path:
            await self.endpoint(scope, receive, send)
            return
        await self.app(scope, receive, send)
