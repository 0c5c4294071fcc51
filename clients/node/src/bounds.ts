// The bounds of one logical call, shared by the client core (client.ts) and
// the lifecycle helper (run.ts) without either importing the other's module
// for them.

/** Bounds one logical call: the caller's signal and one overall deadline, never reset per attempt. */
export interface CallOptions {
  /** Aborts the call (no retry follows). */
  signal?: AbortSignal;
  /** The overall deadline, epoch milliseconds. */
  deadline?: number;
  /** The overall deadline relative to now, in milliseconds (the earlier of the two wins). */
  timeoutMs?: number;
}

/** The time bounds of one logical call, resolved once. */
export interface Bounds {
  signal: AbortSignal | undefined;
  /** Epoch ms, Infinity for none. */
  deadline: number;
}
