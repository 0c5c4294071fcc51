import { IdemError } from "./errors.js";
/** The longest key the service accepts, in bytes. */
export declare const maxKeyBytes = 255;
/**
 * Checks a key the way the service does: 1–255 bytes, each printable ASCII
 * (0x21–0x7E). Returns an {@link IdemError} of code `invalid_key`, or null.
 */
export declare function validateKey(key: string): IdemError | null;
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
export declare function key(...parts: string[]): string;
