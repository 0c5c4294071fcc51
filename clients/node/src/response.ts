import { Codes, IdemError } from "./errors.js";

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

const strictUtf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });
const encoder = new TextEncoder();

/**
 * A stored response: the status, headers and body bytes that a completed
 * request answered with and that a replay returns verbatim.
 */
export class StoredResponse {
  readonly status: number;
  readonly headers: Readonly<Record<string, string>>;
  /** The body bytes, decoded from the wire's utf8 or base64 form. */
  readonly body: Uint8Array;

  constructor(status: number, headers: Record<string, string> = {}, body: string | Uint8Array = new Uint8Array()) {
    this.status = status;
    this.headers = Object.freeze({ ...headers });
    this.body = typeof body === "string" ? encoder.encode(body) : body;
  }

  /** Builds a StoredResponse from what a function answered. */
  static from(r: ResponseInit | StoredResponse): StoredResponse {
    return r instanceof StoredResponse ? r : new StoredResponse(r.status, r.headers, r.body);
  }

  /** Decodes the contract's response object (utf8 or base64 body). */
  static fromWire(w: WireResponse): StoredResponse {
    switch (w.body_encoding ?? "utf8") {
      case "utf8":
        return new StoredResponse(w.status, w.headers ?? {}, w.body ?? "");
      case "base64": {
        const body = w.body ?? "";
        if (!/^[A-Za-z0-9+/]*={0,2}$/.test(body) || body.length % 4 !== 0) {
          throw new IdemError({ code: Codes.unknown, title: "Invalid stored response", detail: "the body_encoding is base64 but the body is not standard padded base64" });
        }
        return new StoredResponse(w.status, w.headers ?? {}, new Uint8Array(Buffer.from(body, "base64")));
      }
      default:
        throw new IdemError({ code: Codes.unknown, title: "Invalid stored response", detail: `unknown body_encoding ${JSON.stringify(w.body_encoding)}` });
    }
  }

  /** Encodes the response as the contract's object: UTF-8 text when the body is valid UTF-8, base64 otherwise. */
  toWire(): WireResponse {
    const w: WireResponse = { status: this.status, body: "", body_encoding: "utf8" };
    if (Object.keys(this.headers).length > 0) w.headers = { ...this.headers };
    try {
      w.body = strictUtf8.decode(this.body);
    } catch {
      w.body = Buffer.from(this.body).toString("base64");
      w.body_encoding = "base64";
    }
    return w;
  }

  /** The body as UTF-8 text. */
  text(): string {
    return new TextDecoder().decode(this.body);
  }

  /** The body parsed as JSON. */
  json<T = unknown>(): T {
    return JSON.parse(this.text()) as T;
  }
}
