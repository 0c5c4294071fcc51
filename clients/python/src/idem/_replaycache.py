"""The middleware's replay cache (docs/frontdoor.md, "The replay cache"):
the rules and defaults of the Go front doors' (client/frontdoor/replaycache.go).

A completed record is immutable until its replay window ends: idem never
completes a key twice (fencing), never releases or resolves a completed one
(already_completed), and keeps it until replay_until. So the answer idem
gave one request for a key is the answer it gives every later request with
the same key, operation and fingerprint document until then, and the
middleware may give it itself, without a claim. What idem can still change
meanwhile is the tenant: deleted (its records with it) or disabled, a
replay becomes 403 tenant_unknown. The cache sees that within max_age: an
entry lives no longer than max_age from the claim that brought it, and
never past the record's replay_until (on the idem server's clock).

What is cached, and only that: the stored response of a replay idem
answered (never the answer of a run this middleware stored itself: what
idem replays is what is then known to be stored, whole), not one marked not
replayable, keyed by the record key (scope included; one cache per
middleware, whose client is of one tenant) and matched on the operation and
the SHA-256 of the exact fingerprint document sent with the claim: a
request whose document differs by a byte goes to idem, which answers it
(422 fingerprint_mismatch, or a replay when its canonical form is the
same). A request with Prefer: wait=N also goes to idem: idem's answer then
carries Preference-Applied, which the cache cannot know.

The LRU is an OrderedDict rather than a library: it bounds bytes as well as
entries, and the SDK adds no dependency for it.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

from . import frontdoor
from ._core import dumps
from ._errors import IdemError, ProblemError
from ._types import Response, RunResult

#: The defaults and bound of the replay cache (as the Go front doors').
DEFAULT_REPLAY_CACHE_ENTRIES = 4096
DEFAULT_REPLAY_CACHE_BYTES = 8 << 20
DEFAULT_REPLAY_CACHE_MAX_AGE = 2.0
MAX_REPLAY_CACHE_MAX_AGE = 60.0


@dataclass(frozen=True)
class ReplayCacheOptions:
    """The configuration of a middleware's replay cache. The default is on,
    DEFAULT_REPLAY_CACHE_ENTRIES entries, DEFAULT_REPLAY_CACHE_BYTES bytes,
    DEFAULT_REPLAY_CACHE_MAX_AGE seconds."""

    #: Turns the cache off: every replay is a claim in idem.
    off: bool = False
    #: Bounds the entries (0: DEFAULT_REPLAY_CACHE_ENTRIES).
    max_entries: int = 0
    #: Bounds the bytes the entries hold: stored headers, body and key (0: DEFAULT_REPLAY_CACHE_BYTES). A response
    #: over a 16th of it is not cached.
    max_bytes: int = 0
    #: The longest an entry is served, seconds from the claim that brought it (0: DEFAULT_REPLAY_CACHE_MAX_AGE, at
    #: most MAX_REPLAY_CACHE_MAX_AGE): how long a tenant deleted or disabled may still see its completed keys
    #: replayed by this middleware.
    max_age: float = 0.0


@dataclass(frozen=True)
class ReplayCacheStats:
    """A cache's counters and its size now."""

    #: Replays answered from the cache; misses are lookups that went to idem (no entry, another document or
    #: operation, or expired).
    hits: int
    misses: int
    #: Replays of idem put in the cache; evictions are entries dropped for room (not for age).
    stores: int
    evictions: int
    entries: int
    bytes: int


@dataclass
class _Entry:
    operation: str
    doc: bytes
    resp: Response
    until: float  # time.monotonic()
    size: int


class ReplayCache:
    """A bounded LRU of completed answers, safe for concurrent use (the
    WSGI middleware serves threads)."""

    def __init__(self, opts: ReplayCacheOptions, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_entries = opts.max_entries if opts.max_entries > 0 else DEFAULT_REPLAY_CACHE_ENTRIES
        self.max_bytes = opts.max_bytes if opts.max_bytes > 0 else DEFAULT_REPLAY_CACHE_BYTES
        self.max_entry = max(self.max_bytes // 16, 1)
        self.max_age = min(opts.max_age if opts.max_age > 0 else DEFAULT_REPLAY_CACHE_MAX_AGE, MAX_REPLAY_CACHE_MAX_AGE)
        self.clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, _Entry] = OrderedDict()  # least recently used first
        self._bytes = 0
        self._hits = self._misses = self._stores = self._evictions = 0

    def stats(self) -> ReplayCacheStats:
        with self._lock:
            return ReplayCacheStats(self._hits, self._misses, self._stores, self._evictions, len(self._entries), self._bytes)

    def get(self, key: str, operation: str, doc: bytes) -> Response | None:
        """The stored response for exactly this request, if one is cached
        and still valid now."""
        now = self.clock()
        with self._lock:
            e = self._entries.get(key)
            if e is None:
                self._misses += 1
                return None
            if now >= e.until:
                self._remove(key)
                self._misses += 1
                return None
            if e.operation != operation or e.doc != doc:
                # Another request with the key: idem answers it (a mismatch). The entry stays, valid for its own request.
                self._misses += 1
                return None
            self._entries.move_to_end(key)
            self._hits += 1
            return e.resp

    def put(self, key: str, operation: str, doc: bytes, resp: Response, until: float) -> None:
        """Cache resp for the request until until (monotonic), evicting the
        least recently used entries for room. A response too large for the
        cache, or marked not replayable, is not cached."""
        if frontdoor.HEADER_NOT_REPLAYABLE in resp.headers:
            return
        size = len(key) + len(operation) + len(resp.body) + 128 + sum(len(k) + len(v) + 16 for k, v in resp.headers.items())
        if size > self.max_entry:
            return
        # A copy: the entry outlives the answer it came with.
        e = _Entry(operation, doc, Response(resp.status, dict(resp.headers), bytes(resp.body)), until, size)
        with self._lock:
            if key in self._entries:
                self._remove(key)
            self._entries[key] = e
            self._bytes += size
            self._stores += 1
            while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
                self._remove(next(iter(self._entries)))
                self._evictions += 1

    def clear(self) -> None:
        """Drop every entry: idem refused the middleware's tenant
        (tenant_unknown), so its replays are refused too from now on."""
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def _remove(self, key: str) -> None:
        self._bytes -= self._entries.pop(key).size


def new_replay_cache(opts: ReplayCacheOptions | None) -> ReplayCache | None:
    """The cache of a middleware with opts (None: the defaults); None when off."""
    opts = opts or ReplayCacheOptions()
    return None if opts.off else ReplayCache(opts)


class Lookup:
    """A protected request's place in its middleware's replay cache (a
    cache of None: off, and every method does nothing)."""

    __slots__ = ("cache", "key", "operation", "doc", "claimed_at")

    def __init__(self, cache: ReplayCache | None, key: str, operation: str, document: Any) -> None:
        self.cache, self.key, self.operation = cache, key, operation
        # The document as the claim sends it (the client's own encoding).
        self.doc = hashlib.sha256(dumps(document)).digest() if cache is not None else b""
        self.claimed_at = 0.0

    def cached(self, wait: float) -> Response | None:
        """The stored response of exactly this request, when cached; None
        for a request with Prefer: wait=N (wait > 0: idem's answer to it
        carries Preference-Applied, which the cache cannot know). Then the
        lookup notes the time before the claim, from which an entry brought
        by it lives, so that it ends no later than the replay window idem
        saw."""
        if self.cache is None:
            return None
        resp = None if wait > 0 else self.cache.get(self.key, self.operation, self.doc)
        if resp is None:
            self.claimed_at = self.cache.clock()
        return resp

    def replayed(self, res: RunResult) -> None:
        """Keep idem's replay res: until the replay window idem saw ends
        (res.replay_left from before the claim was sent) and no longer than
        the cache's max_age. A replay without replay_left is not kept."""
        if self.cache is not None and res.replayed and res.replay_left > 0:
            self.cache.put(self.key, self.operation, self.doc, res.response,
                           self.claimed_at + min(res.replay_left, self.cache.max_age))

    def refused(self, err: IdemError) -> None:
        """Drop the cache when idem refused the tenant (tenant_unknown:
        deleted or disabled): its completed keys are not replayed from now on."""
        if self.cache is not None and isinstance(err, ProblemError) and err.code == frontdoor.TENANT_UNKNOWN:
            self.cache.clear()
