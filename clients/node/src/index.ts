// The idem SDK for Node.js 20+: see README.md.
export { Client, type AttemptInfo, type CallOptions, type ClaimOptions, type ClientOptions } from "./client.js";
export { Codes, IdemError, NoSideEffect, isIdemError, isNoSideEffect, type Code, type FieldError, type GiveUpReason } from "./errors.js";
export { key, maxKeyBytes, validateKey } from "./keys.js";
export { StoredResponse, type ResponseInit, type WireResponse } from "./response.js";
export {
  FleetBudgetError,
  RetryBudget,
  background,
  headerAttempt,
  interactive,
  backoffCeilingMs,
  backoffMs,
  defaultRetryPolicy,
  parseHttpDate,
  parseRetryAfter,
  realClock,
  retryAfterWaitMs,
  retryableStatus,
  withDefaults,
  type AttemptCause,
  type Clock,
  type EffectivePolicy,
  type RetryPolicy,
} from "./retry.js";
export { Claim, renewalPoint, run, type RunOptions, type RunResult } from "./run.js";
export type { ClaimRequest, ClaimResult, KeyPage, KeyRecord, Settings, State, Tenant, Usage } from "./types.js";
export { FrontDoor, type FrontDoorOptions, type FrontRequest, type HandlerAnswer, type Outcome, type FrontDoorPort } from "./frontdoor.js";
export {
  FrontDoorError,
  checkIJSON,
  defaultStoredHeaders,
  escapeLabel,
  escapeScope,
  fingerprintDocument,
  headerNotReplayable,
  notReplayableDetail,
  mismatchDetail,
  headerPreferenceApplied,
  isJSON,
  operation,
  parseKey,
  pathRoute,
  preferWait,
  problemResponse,
  problems,
  requirement,
  scopedKey,
  splitTarget,
  storableStatus,
  storageQuotaDetail,
  tenantUnknownDetail,
  held,
  outcomeReviewDetail,
  outcomeUnknownDetail,
  unstorableStatus,
  storeStatus,
  storedHeaders,
  validLabelText,
  validRequestId,
  type Answer,
  type FingerprintRules,
  type FrontDoorCode,
  type MethodRules,
  type RequestParts,
  type Requirement,
} from "./rules.js";
export { expressErrorHandler, expressMiddleware, type ExpressOptions, type ExpressRequest } from "./express.js";
export { withIdempotency, type FetchOptions } from "./fetch.js";
export {
  ResumeAnswer,
  ResumeHandler,
  decodeResumeCall,
  expressResumeHandler,
  fetchResumeHandler,
  resumeEventType,
  signatureToleranceSeconds,
  verifySignature,
  type ResumeCall,
  type ResumeFunction,
  type ResumeOptions,
  type ResumeRequest,
  type ResumeResult,
} from "./resume.js";
