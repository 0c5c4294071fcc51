package errcode

import "errors"

// The error types of a code — the domain's idem.Error, the front doors'
// frontdoor.Error and the SDK's client.Error — are three types, as each
// side's error carries its own members, but they match and name codes by
// one rule, written here once. code reads the code of an E (the type's
// Code field).

// Match reports whether target is an E with the code of e: the Is method
// of each error type, so that its sentinels (ErrLeaseLost, ...) match any
// error of their code under errors.Is.
func Match[E error, C comparable](e E, target error, code func(E) C) bool {
	t, ok := target.(E)
	return ok && code(t) == code(e)
}

// CodeOf returns the code of the first E in err's chain, "" for a nil
// err, and other when the chain has no E: the ErrorCode of the domain
// (other is internal, an error without a code of its own) and of the SDK
// (other is unknown, a network error, say).
func CodeOf[E error, C ~string](err error, code func(E) C, other C) C {
	if err == nil {
		return ""
	}
	if e, ok := errors.AsType[E](err); ok {
		return code(e)
	}
	return other
}
