package frontdoor

import (
	"time"

	"github.com/idem-dev/idem/client/errcode"
)

// CodeOutcomeReview: idem refused the claim because its completer gave up
// on the key (or a person flagged it): the first request stopped without
// an answer and whether it took effect is unknown. Only a person can
// resolve the key (complete or release it), so it is not retryable: a
// retry with the same key gets the same answer until then (rule 8).
const CodeOutcomeReview = errcode.OutcomeReview

// OutcomeUnknownDetail is the detail of the 409 request_in_flight a front
// door answers for a key idem's completer holds (outcome_unknown), the
// same in every front door: the caller's retry with the same key is right,
// the key is being finished.
const OutcomeUnknownDetail = "the first request with this idempotency key stopped before it answered, and the idempotency service is finding out whether it took effect; retry after Retry-After with the same key"

// OutcomeReviewDetail is the detail of CodeOutcomeReview, the same in
// every front door: nothing ran, and a retry waits on a person, not on
// time.
const OutcomeReviewDetail = "the first request with this idempotency key stopped before it answered, and whether it took effect is unknown: a person must resolve the key (complete or release it) before a retry with it can succeed; this request was not processed"

// Held is the front door's answer to a claim idem refused because its
// completer holds the key (docs/frontdoor.md rule 8), nil for any other
// code. outcome_unknown is 409 request_in_flight with idem's Retry-After
// (the next completer attempt): to the caller the key is in flight, being
// finished, and a retry after it gets the completer's answer replayed,
// runs the request (released) or learns of the review. outcome_review is
// 409 outcome_review, not retryable. Neither is a store failure: a
// fail_open route never passes such a request through.
func Held(code Code, retryAfter time.Duration) *Error {
	switch code {
	case errcode.OutcomeUnknown:
		return &Error{Code: CodeRequestInFlight, Detail: OutcomeUnknownDetail, RetryAfter: retryAfter}
	case errcode.OutcomeReview:
		return &Error{Code: CodeOutcomeReview, Detail: OutcomeReviewDetail}
	}
	return nil
}
