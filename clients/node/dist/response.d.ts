/** A response as the contract carries it: the body as text or base64. */
export interface WireResponse {
    status: number;
    headers?: Record<string, string>;
    body: string;
    body_encoding?: "utf8" | "base64";
}
/** What a function run by `run` answers: the body as text or bytes. */
export interface ResponseInit {
    status: number;
    headers?: Record<string, string>;
    body?: string | Uint8Array;
}
/**
 * A stored response: the status, headers and body bytes that a completed
 * request answered with and that a replay returns verbatim.
 */
export declare class StoredResponse {
    readonly status: number;
    readonly headers: Readonly<Record<string, string>>;
    /** The body bytes, decoded from the wire's utf8 or base64 form. */
    readonly body: Uint8Array;
    constructor(status: number, headers?: Record<string, string>, body?: string | Uint8Array);
    /** Builds a StoredResponse from what a function answered. */
    static from(r: ResponseInit | StoredResponse): StoredResponse;
    /** Decodes the contract's response object (utf8 or base64 body). */
    static fromWire(w: WireResponse): StoredResponse;
    /** Encodes the response as the contract's object: UTF-8 text when the body is valid UTF-8, base64 otherwise. */
    toWire(): WireResponse;
    /** The body as UTF-8 text. */
    text(): string;
    /** The body parsed as JSON. */
    json<T = unknown>(): T;
}
