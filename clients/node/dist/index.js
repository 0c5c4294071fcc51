// The idem SDK for Node.js 20+: see README.md.
export { Client } from "./client.js";
export { Codes, IdemError, NoSideEffect, isIdemError, isNoSideEffect } from "./errors.js";
export { key, maxKeyBytes, validateKey } from "./keys.js";
export { StoredResponse } from "./response.js";
export { FleetBudgetError, headerRetryBudget, RetryBudget, background, headerAttempt, interactive, backoffCeilingMs, backoffMs, defaultRetryPolicy, parseHttpDate, parseRetryAfter, realClock, retryAfterWaitMs, retryableStatus, withDefaults, } from "./retry.js";
export { Claim, renewalPoint, run } from "./run.js";
export { FrontDoor } from "./frontdoor.js";
export { ReplayCache, defaultReplayCacheBytes, defaultReplayCacheEntries, defaultReplayCacheMaxAgeSeconds, maxReplayCacheMaxAgeSeconds } from "./replaycache.js";
export { FrontDoorError, checkIJSON, defaultStoredHeaders, escapeLabel, escapeScope, fingerprintDocument, headerNotReplayable, notReplayableDetail, mismatchDetail, headerPreferenceApplied, isJSON, operation, parseKey, pathRoute, preferWait, problemResponse, problems, requirement, scopedKey, splitTarget, storableStatus, storageQuotaDetail, tenantUnknownDetail, held, outcomeReviewDetail, outcomeUnknownDetail, unstorableStatus, storeStatus, storedHeaders, validLabelText, validRequestId, budgetRefusal, callerAttempt, retryBudgetDetail, spentBudget, } from "./rules.js";
export { expressErrorHandler, expressMiddleware } from "./express.js";
export { withIdempotency } from "./fetch.js";
export { ResumeAnswer, ResumeHandler, decodeResumeCall, expressResumeHandler, fetchResumeHandler, resumeEventType, signatureToleranceSeconds, maxSeenResumeIds, verifySignature, } from "./resume.js";
