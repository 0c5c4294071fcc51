export { Client, type AttemptInfo, type CallOptions, type ClaimOptions, type ClientOptions } from "./client.js";
export { Codes, IdemError, NoSideEffect, isIdemError, isNoSideEffect, type Code, type FieldError, type GiveUpReason } from "./errors.js";
export { key, maxKeyBytes, validateKey } from "./keys.js";
export { StoredResponse, type ResponseInit, type WireResponse } from "./response.js";
export { RetryBudget, backoffCeilingMs, backoffMs, defaultRetryPolicy, parseHttpDate, parseRetryAfter, realClock, retryAfterWaitMs, retryableStatus, shouldRetry, type Clock, type EffectivePolicy, type RetryPolicy, } from "./retry.js";
export { Claim, renewalPoint, run, type RunOptions, type RunResult } from "./run.js";
export type { ClaimRequest, ClaimResult, KeyPage, KeyRecord, Settings, State, Tenant } from "./types.js";
