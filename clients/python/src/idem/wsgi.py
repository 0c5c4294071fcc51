"""Idempotency-Key middleware for WSGI apps (Flask, Django, any WSGI app),
following the front-door rules (docs/frontdoor.md):

    from idem import Client
    from idem.wsgi import IdempotencyMiddleware, flask_route

    install_flask(app, Client(IDEM_URL, token=IDEM_TOKEN))                        # Flask
    application = install_django(get_wsgi_application(), Client(...))              # Django
    app = IdempotencyMiddleware(app, Client(...))                                  # any WSGI app

POST and PATCH need an Idempotency-Key; PUT and DELETE are protected when
they carry one. The handler of a new key runs once, its answer is stored in
idem and then sent; a retry gets the stored answer with
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
running the handler. A handler exception stores nothing and propagates; so does a body
iterator (a Flask generator) that raises part way: what it produced is
never stored. A WSGI app cannot see the caller hang up (the middleware
reads its whole body iterator before sending), so a cut connection never
cuts what is stored (docs/frontdoor.md rule 5, "A cut answer").

WSGI joins repeated header fields into one, so two Idempotency-Key fields
arrive as a list and are refused like one. A body sent chunked (no
CONTENT_LENGTH) is read to its end when the server sets
wsgi.input_terminated (gunicorn, werkzeug), within max_body_bytes (413
beyond); without either, the body is empty for the fingerprint and the app
alike. A body that ends before its CONTENT_LENGTH (the caller went away
part way; the server's input ends with the connection) or fails to read is
400 invalid_request: nothing is claimed and the app does not run, so the
caller's real retry runs it with the whole body (docs/frontdoor.md rule 4).
With ``scope_header``, the scope header must hold one value: the server
has joined repeated fields with "," already, so a value with a comma is
refused 400 invalid_key (docs/frontdoor.md rule 3). start_response follows PEP 3333: a second call with exc_info replaces
the status and headers until a body byte was produced, then re-raises.
"""

from __future__ import annotations

import io
import logging
from typing import Any, Callable, Iterable, Sequence

from . import frontdoor
from ._client import Claim, Client
from ._errors import IdemError
from ._resume import DEFAULT_MAX_BODY_BYTES, Endpoint, ResumeFunction
from ._middleware import (Answer, Options, Protected, Release, applied, caller_request_id, prepare, problem_answer,
                          not_replayable, refused_as_too_large, replay_answer, request_path, run_answer, run_failed,
                          to_store, wait_applied)
from ._replaycache import Lookup, ReplayCacheOptions, new_replay_cache
from ._types import Response
from .frontdoor import FrontDoorError

log = logging.getLogger("idem.middleware")

Environ = dict[str, Any]
StartResponse = Callable[..., Any]
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]


def flask_route(app: Any) -> Callable[[Environ], str | None]:
    """The route of a request in a Flask (werkzeug) app: the URL rule that
    matches, e.g. "/orders/<int:order_id>", for the operation label."""
    def route(environ: Environ) -> str | None:
        try:
            rule, _ = app.url_map.bind_to_environ(environ).match(return_rule=True)
            return str(rule.rule)
        except Exception:
            return None
    return route


#: The environ key under which a framework marks that the handler raised.
HANDLER_EXCEPTION = "idem.handler_exception"


def install_flask(app: Any, client: Client, **options: Any) -> IdempotencyMiddleware:
    """Wrap a Flask app's wsgi_app in the middleware, with the Flask route
    as the operation label. Flask turns a view's exception into a 500 page
    before the middleware sees it; a got_request_exception receiver marks
    the request, so that such a 500 is not stored and the claim is left to
    expire like any handler exception (docs/frontdoor.md rule 5)."""
    from flask import got_request_exception, request

    def mark(sender: Any, exception: BaseException, **extra: Any) -> None:
        request.environ[HANDLER_EXCEPTION] = exception

    got_request_exception.connect(mark, app, weak=False)
    mw = IdempotencyMiddleware(app.wsgi_app, client, route=flask_route(app), **options)
    app.wsgi_app = mw
    return mw


def django_route(environ: Environ) -> str | None:
    """The route of a request in a Django project: the URL pattern that
    matches, e.g. "/charges/<int:account>", for the operation label."""
    from django.urls import Resolver404, resolve

    try:
        return "/" + str(resolve(str(environ.get("PATH_INFO", "/"))).route).lstrip("^")
    except Resolver404:
        return None


def install_django(application: WSGIApp, client: Client, **options: Any) -> IdempotencyMiddleware:
    """Wrap a Django WSGI application (get_wsgi_application()) in the
    middleware, with the Django URL pattern as the operation label:

        application = install_django(get_wsgi_application(), Client(IDEM_URL, token=IDEM_TOKEN))

    Django turns a view's exception into a 500 page; a
    got_request_exception receiver marks the request so that such a 500 is
    not stored and the claim is left to expire (docs/frontdoor.md rule 5)."""
    from django.core.signals import got_request_exception

    def mark(sender: Any, request: Any = None, **extra: Any) -> None:
        if request is not None:
            request.META[HANDLER_EXCEPTION] = True

    got_request_exception.connect(mark, weak=False, dispatch_uid="idem.wsgi.install_django")
    options.setdefault("route", django_route)
    return IdempotencyMiddleware(application, client, **options)


class _Chain(io.RawIOBase):
    """The bytes already read, then the rest of the original input stream."""

    def __init__(self, head: bytes, rest: Any) -> None:
        self._head = io.BytesIO(head)
        self._rest = rest

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        view = memoryview(buf).cast("B")
        data = self._head.read(len(view))
        if not data:
            data = bytes(self._rest.read(len(view)))
        view[: len(data)] = data
        return len(data)


class _HandlerFailed(Exception):
    """The handler raised (and a framework answered for it): nothing is stored."""

    def __init__(self, answer: Answer) -> None:
        super().__init__("the handler raised")
        self.answer = answer


def _native(environ: Environ, name: str) -> str:
    """An environ string as PEP 3333 has it: the bytes that arrived, read
    as Latin-1. werkzeug's development server hands the request line over
    as the Latin-1 reading of its UTF-8 encoding instead (http.server reads
    it as Latin-1, werkzeug encodes that as UTF-8 again): undone here, or a
    byte outside ASCII would give another fingerprint than under gunicorn
    or in the Go and Node front doors (testvectors/frontdoor/targets.json)."""
    value = str(environ.get(name) or "")
    if str(environ.get("SERVER_SOFTWARE", "")).startswith("Werkzeug/"):
        try:
            return value.encode("latin-1").decode("utf-8")
        except UnicodeError:
            return value
    return value


def _headers(environ: Environ) -> list[tuple[str, str]]:
    out = []
    for k, v in environ.items():
        if k.startswith("HTTP_"):
            out.append((k[5:].replace("_", "-").title(), str(v)))
    if environ.get("CONTENT_TYPE"):
        out.append(("Content-Type", environ["CONTENT_TYPE"]))
    return out


def _read_body(environ: Environ, limit: int) -> tuple[bytes, bool]:
    """The request body, at most limit + 1 bytes (more is refused as too
    large), and whether it was cut: shorter than its CONTENT_LENGTH (the
    server's input ends where the connection did: the caller went away
    before sending it all) or failing to read (a broken chunked body, a
    reset connection). A cut body is never claimed (prepare)."""
    stream = environ.get("wsgi.input")
    if stream is None:
        return b"", False
    length = environ.get("CONTENT_LENGTH") or ""
    try:
        if length.strip().isdigit():
            want = min(int(length), limit + 1)
            body = bytes(stream.read(want))
            return body, len(body) < want
        if environ.get("wsgi.input_terminated"):
            return bytes(stream.read(limit + 1)), False
    except Exception as e:  # whatever the server's input raises (OSError, werkzeug's ClientDisconnected, ...)
        log.info("idem: the request body could not be read: %s", type(e).__name__)
        return b"", True
    return b"", False


class IdempotencyMiddleware:
    """WSGI middleware that gives app Stripe-style Idempotency-Key
    semantics on top of an idem Client. ``route(environ)`` names the route
    pattern for the operation label (default: the path)."""

    def __init__(self, app: WSGIApp, client: Client, *, route: Callable[[Environ], str | None] | None = None,
                 required_methods: Sequence[str] | None = None, optional_methods: Sequence[str] | None = None,
                 scope_header: str | None = None, store_5xx: bool = True, stored_headers: Sequence[str] | None = None,
                 lease: float | None = None, timeout: float | None = 10.0, max_body_bytes: int = 8 << 20,
                 max_stored_bytes: int = 1 << 20, max_wait: float | None = None,
                 replay_cache: ReplayCacheOptions | None = None) -> None:
        self.app = app
        self.client = client
        #: The replay cache (None: off); its client must stay with one tenant.
        self.replay_cache = new_replay_cache(replay_cache)
        self.route = route
        self.opts = Options(required_methods, optional_methods, scope_header, store_5xx, stored_headers, lease, timeout,
                            max_body_bytes, max_stored_bytes, max_wait)

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        method = str(environ.get("REQUEST_METHOD", "GET"))
        if frontdoor.requirement(method, self.opts.required_methods, self.opts.optional_methods) == "pass":
            return self.app(environ, start_response)
        headers = _headers(environ)
        original = environ.get("wsgi.input")
        body, cut = _read_body(environ, self.opts.max_body_bytes)
        if len(body) > self.opts.max_body_bytes and original is not None:
            environ["wsgi.input"] = _Chain(body, original)  # too large to protect; an unprotected request reads it all
        else:
            environ["wsgi.input"] = io.BytesIO(body)
            environ["CONTENT_LENGTH"] = str(len(body))
        decoded = _native(environ, "SCRIPT_NAME") + _native(environ, "PATH_INFO")
        # The decoded path as bytes for a server without a raw target: PEP
        # 3333's Latin-1 reading; werkzeug's, undone by _native, is real
        # text, which may hold U+FFFD for bytes that were not UTF-8.
        path = request_path(_native(environ, "RAW_URI") or _native(environ, "REQUEST_URI"),
                            decoded.encode("latin-1") if all(ord(c) <= 0xFF for c in decoded) else decoded.encode("utf-8"))
        rid = caller_request_id(headers)
        try:
            prot = prepare(self.opts, method, (self.route(environ) if self.route else None) or frontdoor.path_route(decoded, path),
                           _native(environ, "QUERY_STRING"), headers, body, path=path, cut=cut)
        except FrontDoorError as e:
            return self._send(problem_answer(e, rid), start_response)
        if prot is None:
            return self.app(environ, start_response)
        return self._send(self._protected(prot, environ, rid), start_response)

    def _protected(self, prot: Protected, environ: Environ, rid: str) -> Answer:
        # A replay of exactly this request the cache holds is answered without a claim (idem._replaycache).
        cached = Lookup(self.replay_cache, prot.key, prot.operation, prot.document)
        hit = cached.cached(prot.wait)
        if hit is not None:
            return replay_answer(hit, rid)
        ran: list[Answer] = []

        tokens: list[int] = []

        def handler(claim: Claim) -> Response:
            tokens.append(claim.fencing_token)
            ans = self._run_app(environ)
            if environ.get(HANDLER_EXCEPTION) is not None:
                raise _HandlerFailed(ans)
            ran.append(ans)
            return to_store(self.opts, ans)

        try:
            res = self.client.run(prot.key, handler, operation=prot.operation, request=prot.document,
                                  lease=self.opts.lease, no_wait=True, wait=prot.wait, timeout=self.opts.timeout,
                                  attempt=prot.attempt)
        except _HandlerFailed as failed:
            log.warning("idem: the handler raised; nothing stored, the claim is left to expire")
            return failed.answer
        except Release:
            return ran[0]
        except IdemError as err:
            cached.refused(err)
            if refused_as_too_large(err, ran):
                try:
                    self.client.complete(prot.key, tokens[-1], not_replayable(self.opts, ran[0]), timeout=self.opts.timeout)
                    return ran[0]
                except IdemError as cerr:
                    err = cerr
            return applied(run_failed(err, ran, rid), wait_applied(err))
        cached.replayed(res)
        return applied(run_answer(res, ran, rid), res.wait_applied)

    def _run_app(self, environ: Environ) -> Answer:
        state: dict[str, Any] = {}
        chunks: list[bytes] = []

        def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], None]:
            # PEP 3333, as a server does: with exc_info, re-raise once the
            # headers count as sent (a body byte was written or yielded; the
            # middleware buffers, but the app must see what a server shows
            # it), else replace status and headers (the app's error page is
            # the answer); a second call without exc_info is an error.
            if exc_info is not None:
                try:
                    if chunks:
                        raise exc_info[1].with_traceback(exc_info[2])
                finally:
                    exc_info = None
            elif state:
                raise AssertionError("start_response called a second time without exc_info")
            state["status"], state["headers"] = status, list(headers)
            return write

        def write(data: bytes) -> None:
            if data:
                chunks.append(bytes(data))

        result = self.app(environ, start)
        try:
            for chunk in result:
                write(chunk)
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
        status = int(str(state.get("status", "500")).split(" ", 1)[0])
        return Answer(status, [(k, v) for k, v in state.get("headers", []) if k.lower() != "content-length"], b"".join(chunks))

    @staticmethod
    def _send(ans: Answer, start_response: StartResponse) -> Iterable[bytes]:
        from http import HTTPStatus

        try:
            reason = HTTPStatus(ans.status).phrase
        except ValueError:
            reason = "Unknown"
        headers = [(k, v) for k, v in ans.headers if k.lower() != "content-length"]
        headers.append(("Content-Length", str(len(ans.body))))
        start_response(f"{ans.status} {reason}", headers)
        return [ans.body]


class ResumeMiddleware:
    """The resume endpoint idem's completer calls (the completer protocol,
    idem._resume), in front of a WSGI app: a request to ``path`` is served
    here, anything else goes on to app (None: every request is the
    endpoint's). Put it outermost, so that the idempotency middleware never
    sees the completer's call (it carries no Idempotency-Key):
    install_flask_resume after install_flask does.

    A call whose Standard Webhooks signature does not verify, or whose
    timestamp is more than five minutes away, is 401 unauthenticated
    (problem+json) and resume does not run; a body that is not a valid call
    is 400 invalid_request. A verified call runs ``resume(claim, call)``:
    the function Client.run runs, given a Claim under the call's fencing
    token whose recovery_point / recovery_data are the last checkpoint's
    (its checkpoints go through client and renew idem's lease; no lease
    keeper runs), so the steps already done are skipped. It answers 200:
    a Response is ``completed`` (a body that is not UTF-8 as base64);
    ResumeAnswer.not_done() or a raised NoSideEffect (or a type in
    no_side_effect) ``not_done``; ResumeAnswer.unknown(retry_after)
    ``unknown``; ResumeAnswer.review(note) ``review``; any other exception
    or value ``unknown`` (logged): the function may have done part of its
    work, so it is never reported as not_done or completed."""

    def __init__(self, app: WSGIApp | None, client: Client, *, secret: str | Sequence[str], resume: ResumeFunction,
                 path: str = "/idem/resume", max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 no_side_effect: tuple[type[BaseException], ...] = (), now: Callable[[], float] | None = None) -> None:
        self.app = app
        self.client = client
        self.resume = resume
        self.path = path
        self.endpoint = Endpoint(secret, max_body_bytes=max_body_bytes, no_side_effect=no_side_effect, now=now)

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        if self.app is not None and environ.get("PATH_INFO", "") != self.path:
            return self.app(environ, start_response)
        ep = self.endpoint
        headers = {k[5:].replace("_", "-").lower(): str(v) for k, v in environ.items() if k.startswith("HTTP_")}
        body, cut = _read_body(environ, ep.max_body_bytes)
        checked = ep.check(str(environ.get("REQUEST_METHOD", "GET")), headers, body, len(body) > ep.max_body_bytes, cut)
        ans = checked if isinstance(checked, Answer) else ep.run(self.client, self.resume, checked)
        return IdempotencyMiddleware._send(ans, start_response)


def resume_app(client: Client, *, secret: str | Sequence[str], resume: ResumeFunction, **options: Any) -> ResumeMiddleware:
    """The resume endpoint as a WSGI app of its own (every path is the
    endpoint), for a dispatcher to mount; see ResumeMiddleware."""
    return ResumeMiddleware(None, client, secret=secret, resume=resume, **options)


def install_flask_resume(app: Any, client: Client, *, secret: str | Sequence[str], resume: ResumeFunction,
                         path: str = "/idem/resume", **options: Any) -> ResumeMiddleware:
    """Serve the resume endpoint at path of a Flask app (ResumeMiddleware
    around app.wsgi_app). Call it after install_flask, so that it is the
    outer layer and the idempotency middleware never sees the completer's
    call."""
    mw = ResumeMiddleware(app.wsgi_app, client, secret=secret, resume=resume, path=path, **options)
    app.wsgi_app = mw
    return mw
