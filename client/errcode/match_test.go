package errcode

import (
	"errors"
	"fmt"
	"testing"
)

type testError struct{ c Code }

func (e *testError) Error() string { return string(e.c) }

func (e *testError) code() Code { return e.c }

func TestMatchAndCodeOf(t *testing.T) {
	lost := &testError{LeaseLost}
	wrapped := fmt.Errorf("checkpoint: %w", &testError{LeaseLost})
	if !Match(lost, &testError{LeaseLost}, (*testError).code) {
		t.Error("Match: same code does not match")
	}
	if Match(lost, &testError{KeyNotFound}, (*testError).code) || Match(lost, errors.New("lease_lost"), (*testError).code) {
		t.Error("Match: another code or type matches")
	}
	for _, tc := range []struct {
		err  error
		want Code
	}{{nil, ""}, {lost, LeaseLost}, {wrapped, LeaseLost}, {errors.New("x"), Internal}} {
		if got := CodeOf(tc.err, (*testError).code, Internal); got != tc.want {
			t.Errorf("CodeOf(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}
