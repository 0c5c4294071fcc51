import { createHash } from "node:crypto";
import { Codes, IdemError } from "./errors.js";

/** The longest key the service accepts, in bytes. */
export const maxKeyBytes = 255;

const encoder = new TextEncoder();

function invalidKey(detail: string): IdemError {
  return new IdemError({ code: Codes.invalidKey, title: "Invalid key", detail });
}

/**
 * Checks a key the way the service does: 1–255 bytes, each printable ASCII
 * (0x21–0x7E). Returns an {@link IdemError} of code `invalid_key`, or null.
 */
export function validateKey(key: string): IdemError | null {
  if (key === "") return invalidKey("the key is empty");
  const bytes = encoder.encode(key);
  if (bytes.length > maxKeyBytes) {
    return invalidKey(`the key is ${bytes.length} bytes long; at most ${maxKeyBytes} are allowed`);
  }
  for (let i = 0; i < bytes.length; i++) {
    const c = bytes[i]!;
    if (c < 0x21 || c > 0x7e) {
      return invalidKey(`byte ${i} of the key (0x${c.toString(16).toUpperCase().padStart(2, "0")}) is outside printable ASCII 0x21-0x7E`);
    }
  }
  return null;
}

/**
 * Builds an idempotency key from the parts that identify one business
 * intent: `key("order-confirm", orderId)` gives `order-confirm:ord_42`.
 * Derive keys from the event being handled (an order id, a message id, the
 * caller's own Idempotency-Key), never from a value minted per attempt: a
 * retry must send the same key.
 *
 * Parts are joined with `:`. Inside a part, `:`, `%` and every byte
 * (UTF-8) outside printable ASCII are percent-encoded, so different part
 * lists never give the same key. A result longer than 255 bytes is
 * shortened deterministically: its first 183 bytes, then `:sha256=` and the
 * hex SHA-256 of the whole unshortened key. No part at all, or an empty
 * part, throws (an empty order id is a bug that would merge intents).
 */
export function key(...parts: string[]): string {
  if (parts.length === 0) throw invalidKey("a key needs at least one part");
  let out = "";
  parts.forEach((p, i) => {
    if (p === "") throw invalidKey(`part ${i} of the key is empty`);
    if (i > 0) out += ":";
    for (const c of encoder.encode(p)) {
      if (c < 0x21 || c > 0x7e || c === 0x3a || c === 0x25) {
        out += "%" + c.toString(16).toUpperCase().padStart(2, "0");
      } else {
        out += String.fromCharCode(c);
      }
    }
  });
  if (out.length > maxKeyBytes) {
    const suffix = ":sha256=";
    const sum = createHash("sha256").update(out, "latin1").digest("hex");
    out = out.slice(0, maxKeyBytes - suffix.length - sum.length) + suffix + sum;
  }
  return out;
}
