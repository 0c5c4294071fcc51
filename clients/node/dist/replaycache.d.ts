import { StoredResponse } from "./response.js";
import type { RunResult } from "./run.js";
/** The replay cache's defaults and bound (as the Go front doors'). */
export declare const defaultReplayCacheEntries = 4096;
export declare const defaultReplayCacheBytes: number;
export declare const defaultReplayCacheMaxAgeSeconds = 2;
export declare const maxReplayCacheMaxAgeSeconds = 60;
/** Configures a front door's replay cache; the default is on, {@link defaultReplayCacheEntries} entries, {@link defaultReplayCacheBytes} bytes, {@link defaultReplayCacheMaxAgeSeconds}. */
export interface ReplayCacheOptions {
    /** Turns the cache off: every replay is a claim in idem. */
    off?: boolean;
    /** Bounds the entries (default {@link defaultReplayCacheEntries}). */
    maxEntries?: number;
    /** Bounds the bytes the entries hold: stored headers, body and key (default {@link defaultReplayCacheBytes}). A response over a 16th of it is not cached. */
    maxBytes?: number;
    /**
     * The longest an entry is served, in seconds from the claim that brought
     * it (default {@link defaultReplayCacheMaxAgeSeconds}, at most
     * {@link maxReplayCacheMaxAgeSeconds}): how long a tenant deleted or
     * disabled may still see its completed keys replayed by this front door.
     */
    maxAgeSeconds?: number;
}
/** A cache's counters and its size now. */
export interface ReplayCacheStats {
    /** Replays answered from the cache. */
    hits: number;
    /** Lookups that went to idem (no entry, another document or operation, or expired). */
    misses: number;
    /** Replays of idem put in the cache. */
    stores: number;
    /** Entries dropped for room (not for age). */
    evictions: number;
    entries: number;
    bytes: number;
}
/** A bounded LRU of completed answers. */
export declare class ReplayCache {
    readonly clock: () => number;
    readonly maxEntries: number;
    readonly maxBytes: number;
    readonly maxEntry: number;
    readonly maxAgeMs: number;
    private readonly entries;
    private bytes;
    private hits;
    private misses;
    private stores;
    private evictions;
    constructor(opts?: ReplayCacheOptions, clock?: () => number);
    stats(): ReplayCacheStats;
    /** The stored response for exactly this request, if one is cached and still valid now. */
    get(key: string, operation: string, doc: string): StoredResponse | undefined;
    /** Caches resp for the request until until (this cache's clock), evicting the least recently used entries for room; a response too large for the cache, or marked not replayable, is not cached. */
    put(key: string, operation: string, doc: string, resp: StoredResponse, until: number): void;
    /** Drops every entry: idem refused the front door's tenant (tenant_unknown), so its replays are refused too from now on. */
    clear(): void;
    private remove;
}
/** The cache of a front door with opts (undefined: the defaults); undefined when off. */
export declare function newReplayCache(opts: ReplayCacheOptions | undefined): ReplayCache | undefined;
/** A protected request's place in its front door's replay cache (no cache: off, and every method does nothing). */
export declare class CacheLookup {
    private readonly cache;
    private readonly key;
    private readonly operation;
    private readonly doc;
    private claimedAt;
    constructor(cache: ReplayCache | undefined, key: string, operation: string, document: unknown);
    /**
     * The stored response of exactly this request, when cached; undefined
     * for a request with Prefer: wait=N (wait > 0: idem's answer to it
     * carries Preference-Applied, which the cache cannot know). Then the
     * lookup notes the time before the claim, from which an entry brought by
     * it lives, so that it ends no later than the replay window idem saw.
     */
    cached(wait: number): StoredResponse | undefined;
    /** Keeps idem's replay res: until the replay window idem saw ends (res.replayLeftMs, from before the claim was sent) and no longer than the cache's max age; a replay without replayLeftMs is not kept. */
    replayed(res: RunResult): void;
    /** Drops the cache when idem refused the tenant (tenant_unknown: deleted or disabled): its completed keys are not replayed from now on. */
    refused(err: unknown): void;
}
