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
// *idem.Error values pass through; an error whose result code is in
// unavailableCodes (the file cannot serve any write right now: locked, full,
// read-only, failing I/O, unopenable, corrupt), a connection gone, or a
// deadline that ran out become store_unavailable (a closed Store is
// Store.interpretError's case); anything else is wrapped with what was
// being done. Callers handle sql.ErrNoRows and the constraint violations
// that mean something for their operation (see sqliteCode) before calling
// it.
func interpretError(err error, doing string) error {
	if err == nil {
		return nil
	}
	var ie *idem.Error
	if errors.As(err, &ie) {
		return err
	}
	wrapped := fmt.Errorf("%s: %w", doing, err)
	if _, ok := unavailableCodes[sqliteCode(err)&0xff]; ok {
		return unavailable(wrapped)
	}
	if errors.Is(err, sql.ErrConnDone) || errors.Is(err, context.DeadlineExceeded) {
		return unavailable(wrapped)
	}
	return wrapped
}

// unavailableCodes is the one table of SQLite primary result codes that
// mean the database cannot serve right now, whatever the statement: the
// caller gets 503 store_unavailable (retryable) and /readyz fails while it
// lasts, instead of 500 internal. Extended codes (SQLITE_IOERR_WRITE,
// SQLITE_READONLY_DBMOVED, …) are classified by their primary code.
var unavailableCodes = map[int]string{
	sqlitelib.SQLITE_BUSY:     "another connection or process holds the lock",
	sqlitelib.SQLITE_LOCKED:   "a table is locked",
	sqlitelib.SQLITE_FULL:     "the disk is full",
	sqlitelib.SQLITE_READONLY: "the file or its folder became read-only, or the file was moved",
	sqlitelib.SQLITE_IOERR:    "the operating system reported an I/O error",
	sqlitelib.SQLITE_CANTOPEN: "the file, its journal or its folder cannot be opened",
	sqlitelib.SQLITE_PERM:     "access to the file was denied",
	sqlitelib.SQLITE_NOMEM:    "out of memory",
	sqlitelib.SQLITE_PROTOCOL: "the WAL locking protocol failed (another process changed the file)",
	sqlitelib.SQLITE_CORRUPT:  "the file is corrupt",
	sqlitelib.SQLITE_NOTADB:   "the file is not a database",
}

// unavailable returns the store_unavailable error for cause.
func unavailable(cause error) error {
	return idem.StoreUnavailable("the database cannot be used right now", cause)
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
