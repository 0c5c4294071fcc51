"""The connection pool of the httpx clients the SDK makes (issue 23, goal 3).

httpcore's pool (under httpx, 1.0.x) re-walks every pooled connection
whenever a request is added or released, once more per queued request, and
once more per idle connection (its keep-alive check counts the whole list
for each), and it hands one idle connection to every queued request at once
so that all but one fail, re-queue and walk again. With as many kept
connections as callers the walk grows with their square: at 64 callers a
Client spent 2.2x, an AsyncClient 4.2x, the CPU per claim + complete of the
same client with keep-alive off (docs/benchmarks.md, "Python and Node";
encode/httpcore#1035). The pools here assign in one pass: each connection
is probed once, an idle connection goes to one request, a connection
already handed to a request that has not started on it is neither handed
on nor closed as surplus.

Only a pool whose class is httpcore's own, of a 1.x httpcore with the
fields this walk reads, is switched; anything else keeps httpcore's walk.
"""

from __future__ import annotations

from typing import Any

import httpcore
import httpx

_FIELDS = ("_connections", "_requests", "_max_connections", "_max_keepalive_connections")


def _assign(self: Any) -> list[Any]:
    """httpcore's _assign_requests_to_connections in one pass (called under
    the pool's lock, no I/O: the connections to close are returned)."""
    closing: list[Any] = []
    live: list[Any] = []
    for c in self._connections:
        if c.is_closed():
            continue
        if c.has_expired():
            closing.append(c)
        else:
            live.append(c)
    # Connections handed to a request that has not started on them yet
    # still look idle and available: they are spoken for.
    taken = {id(r.connection) for r in self._requests if r.connection is not None}
    idle = [c for c in live if id(c) not in taken and c.is_idle()]
    surplus = len(idle) - self._max_keepalive_connections
    if surplus > 0:
        drop = {id(c) for c in idle[:surplus]}
        closing.extend(idle[:surplus])
        idle = idle[surplus:]
        live = [c for c in live if id(c) not in drop]
    self._connections[:] = live
    available = [c for c in live if id(c) not in taken and c.is_available()]
    for pr in [r for r in self._requests if r.is_queued()]:
        origin = pr.request.url.origin
        i = next((i for i, c in enumerate(available) if c.can_handle_request(origin)), -1)
        if i >= 0:
            c = available[i]
            if c.is_idle():  # an HTTP/1.1 connection takes one request; HTTP/2 multiplexes
                available.pop(i)
                if c in idle:
                    idle.remove(c)
            pr.assign_to_connection(c)
        elif len(self._connections) < self._max_connections:
            c = self.create_connection(origin)
            self._connections.append(c)
            pr.assign_to_connection(c)
        elif idle:
            old = idle.pop(0)
            if old in available:
                available.remove(old)
            self._connections.remove(old)
            closing.append(old)
            c = self.create_connection(origin)
            self._connections.append(c)
            pr.assign_to_connection(c)
    return closing


class SyncPool(httpcore.ConnectionPool):
    """httpcore.ConnectionPool with the one-pass walk."""

    _assign_requests_to_connections = _assign


class AsyncPool(httpcore.AsyncConnectionPool):
    """httpcore.AsyncConnectionPool with the one-pass walk."""

    _assign_requests_to_connections = _assign


def _switch(transport: Any, stock: type, ours: type) -> None:
    pool = getattr(transport, "_pool", None)
    if type(pool) is stock and httpcore.__version__.startswith("1.") and all(hasattr(pool, f) for f in _FIELDS):
        pool.__class__ = ours  # a subclass with no state of its own: every setting of httpx's pool is kept


def sync_transport(limits: httpx.Limits) -> httpx.HTTPTransport:
    """httpx's default transport with limits, on the one-pass pool."""
    t = httpx.HTTPTransport(limits=limits)
    _switch(t, httpcore.ConnectionPool, SyncPool)
    return t


def async_transport(limits: httpx.Limits) -> httpx.AsyncHTTPTransport:
    """httpx's default async transport with limits, on the one-pass pool."""
    t = httpx.AsyncHTTPTransport(limits=limits)
    _switch(t, httpcore.AsyncConnectionPool, AsyncPool)
    return t
