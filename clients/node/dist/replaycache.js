// The front door's replay cache (docs/frontdoor.md, "The replay cache"):
// the rules and defaults of the Go front doors' (client/frontdoor/replaycache.go).
//
// A completed record is immutable until its replay window ends: idem never
// completes a key twice (fencing), never releases or resolves a completed
// one (already_completed), and keeps it until replay_until. So the answer
// idem gave one request for a key is the answer it gives every later
// request with the same key, operation and fingerprint document until then,
// and the front door may give it itself, without a claim. What idem can
// still change meanwhile is the tenant: deleted (its records with it) or
// disabled, a replay becomes 403 tenant_unknown. The cache sees that within
// maxAgeSeconds: an entry lives no longer than that from the claim that
// brought it, and never past the record's replay_until (on the idem
// server's clock).
//
// What is cached, and only that: the stored response of a replay idem
// answered (never the answer of a run this front door stored itself: what
// idem replays is what is then known to be stored, whole), not one marked
// not replayable, keyed by the record key (scope included; one cache per
// front door, whose client is of one tenant) and matched on the operation
// and the SHA-256 of the exact fingerprint document sent with the claim: a
// request whose document differs by a byte goes to idem, which answers it
// (422 fingerprint_mismatch, or a replay when its canonical form is the
// same). A request with Prefer: wait=N also goes to idem: idem's answer
// then carries Preference-Applied, which the cache cannot know.
//
// The LRU is a Map (insertion order) rather than a library: it bounds bytes
// as well as entries, and the SDK adds no dependency for it.
import { createHash } from "node:crypto";
import { isIdemError, Codes } from "./errors.js";
import { StoredResponse } from "./response.js";
import { headerNotReplayable } from "./rules.js";
/** The replay cache's defaults and bound (as the Go front doors'). */
export const defaultReplayCacheEntries = 4096;
export const defaultReplayCacheBytes = 8 << 20;
export const defaultReplayCacheMaxAgeSeconds = 2;
export const maxReplayCacheMaxAgeSeconds = 60;
/** A bounded LRU of completed answers. */
export class ReplayCache {
    clock;
    maxEntries;
    maxBytes;
    maxEntry;
    maxAgeMs;
    entries = new Map(); // least recently used first
    bytes = 0;
    hits = 0;
    misses = 0;
    stores = 0;
    evictions = 0;
    constructor(opts = {}, clock = () => performance.now()) {
        this.clock = clock;
        this.maxEntries = opts.maxEntries && opts.maxEntries > 0 ? opts.maxEntries : defaultReplayCacheEntries;
        this.maxBytes = opts.maxBytes && opts.maxBytes > 0 ? opts.maxBytes : defaultReplayCacheBytes;
        this.maxEntry = Math.max(Math.floor(this.maxBytes / 16), 1);
        const age = opts.maxAgeSeconds && opts.maxAgeSeconds > 0 ? opts.maxAgeSeconds : defaultReplayCacheMaxAgeSeconds;
        this.maxAgeMs = Math.min(age, maxReplayCacheMaxAgeSeconds) * 1000;
    }
    stats() {
        return { hits: this.hits, misses: this.misses, stores: this.stores, evictions: this.evictions, entries: this.entries.size, bytes: this.bytes };
    }
    /** The stored response for exactly this request, if one is cached and still valid now. */
    get(key, operation, doc) {
        const e = this.entries.get(key);
        if (!e) {
            this.misses++;
            return undefined;
        }
        if (this.clock() >= e.until) {
            this.remove(key, e);
            this.misses++;
            return undefined;
        }
        if (e.operation !== operation || e.doc !== doc) {
            // Another request with the key: idem answers it (a mismatch). The entry stays, valid for its own request.
            this.misses++;
            return undefined;
        }
        this.entries.delete(key);
        this.entries.set(key, e); // most recently used
        this.hits++;
        return e.resp;
    }
    /** Caches resp for the request until until (this cache's clock), evicting the least recently used entries for room; a response too large for the cache, or marked not replayable, is not cached. */
    put(key, operation, doc, resp, until) {
        if (Object.hasOwn(resp.headers, headerNotReplayable))
            return;
        let size = Buffer.byteLength(key) + Buffer.byteLength(operation) + resp.body.length + 128;
        for (const [k, v] of Object.entries(resp.headers))
            size += Buffer.byteLength(k) + Buffer.byteLength(v) + 16;
        if (size > this.maxEntry)
            return;
        // A copy: the entry outlives the answer it came with.
        const kept = new StoredResponse(resp.status, { ...resp.headers }, new Uint8Array(resp.body));
        const old = this.entries.get(key);
        if (old)
            this.remove(key, old);
        this.entries.set(key, { operation, doc, resp: kept, until, size });
        this.bytes += size;
        this.stores++;
        while (this.entries.size > this.maxEntries || this.bytes > this.maxBytes) {
            const [k, e] = this.entries.entries().next().value;
            this.remove(k, e);
            this.evictions++;
        }
    }
    /** Drops every entry: idem refused the front door's tenant (tenant_unknown), so its replays are refused too from now on. */
    clear() {
        this.entries.clear();
        this.bytes = 0;
    }
    remove(key, e) {
        this.entries.delete(key);
        this.bytes -= e.size;
    }
}
/** The cache of a front door with opts (undefined: the defaults); undefined when off. */
export function newReplayCache(opts) {
    return opts?.off ? undefined : new ReplayCache(opts);
}
/** A protected request's place in its front door's replay cache (no cache: off, and every method does nothing). */
export class CacheLookup {
    cache;
    key;
    operation;
    doc;
    claimedAt = 0;
    constructor(cache, key, operation, document) {
        this.cache = cache;
        this.key = key;
        this.operation = operation;
        // The document as the claim sends it (the client's own encoding).
        this.doc = cache ? createHash("sha256").update(JSON.stringify(document)).digest("base64") : "";
    }
    /**
     * The stored response of exactly this request, when cached; undefined
     * for a request with Prefer: wait=N (wait > 0: idem's answer to it
     * carries Preference-Applied, which the cache cannot know). Then the
     * lookup notes the time before the claim, from which an entry brought by
     * it lives, so that it ends no later than the replay window idem saw.
     */
    cached(wait) {
        if (!this.cache)
            return undefined;
        const resp = wait > 0 ? undefined : this.cache.get(this.key, this.operation, this.doc);
        if (!resp)
            this.claimedAt = this.cache.clock();
        return resp;
    }
    /** Keeps idem's replay res: until the replay window idem saw ends (res.replayLeftMs, from before the claim was sent) and no longer than the cache's max age; a replay without replayLeftMs is not kept. */
    replayed(res) {
        const left = res.replayLeftMs ?? 0;
        if (this.cache && res.replayed && left > 0) {
            this.cache.put(this.key, this.operation, this.doc, res.response, this.claimedAt + Math.min(left, this.cache.maxAgeMs));
        }
    }
    /** Drops the cache when idem refused the tenant (tenant_unknown: deleted or disabled): its completed keys are not replayed from now on. */
    refused(err) {
        if (this.cache && isIdemError(err, Codes.tenantUnknown))
            this.cache.clear();
    }
}
