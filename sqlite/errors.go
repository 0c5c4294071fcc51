package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	sqlite3 "modernc.org/sqlite"
	sqlitelib "modernc.org/sqlite/lib"

	"github.com/idem-dev/idem"
)

// interpretError translates a database error into the domain's errors:
// *idem.Error values pass through; a lock wait that ran out (SQLITE_BUSY,
// SQLITE_LOCKED), a connection gone, or a deadline that ran out become
// store_unavailable (a closed Store is Store.interpretError's case);
// anything else is wrapped with what was being done.
// Callers handle sql.ErrNoRows and the constraint violations that mean
// something for their operation (see sqliteCode) before calling it.
func interpretError(err error, doing string) error {
	if err == nil {
		return nil
	}
	var ie *idem.Error
	if errors.As(err, &ie) {
		return err
	}
	wrapped := fmt.Errorf("%s: %w", doing, err)
	if code := sqliteCode(err); code == sqlitelib.SQLITE_BUSY || code == sqlitelib.SQLITE_LOCKED {
		return unavailable(wrapped)
	}
	if errors.Is(err, sql.ErrConnDone) || errors.Is(err, context.DeadlineExceeded) {
		return unavailable(wrapped)
	}
	return wrapped
}

// unavailable returns the store_unavailable error for cause.
func unavailable(cause error) error {
	return idem.StoreUnavailable("the database is busy or closed", cause)
}

// sqliteCode returns the extended result code of a SQLite error, its primary
// code when the extended one is a plain busy or locked variant, or 0.
func sqliteCode(err error) int {
	var se *sqlite3.Error
	if !errors.As(err, &se) {
		return 0
	}
	code := se.Code()
	switch primary := code & 0xff; primary {
	case sqlitelib.SQLITE_BUSY, sqlitelib.SQLITE_LOCKED:
		return primary
	}
	return code
}
