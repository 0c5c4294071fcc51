package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idem-dev/idem"
)

// PostgreSQL error codes the store translates.
const (
	pgUniqueViolation     = "23505"
	pgForeignKeyViolation = "23503"
)

// interpretError translates a database error into the domain's errors:
// *idem.Error values pass through, an unreachable or unresponsive database
// becomes store_unavailable, and anything else is wrapped with what was
// being done. Callers handle pgx.ErrNoRows and constraint violations that
// mean something for their operation before calling it.
func interpretError(err error, doing string) error {
	if err == nil {
		return nil
	}
	var ie *idem.Error
	if errors.As(err, &ie) {
		return err
	}
	wrapped := fmt.Errorf("%s: %w", doing, err)
	if isUnavailable(err) {
		return unavailable(wrapped)
	}
	return wrapped
}

// unavailable returns the store_unavailable error for cause.
func unavailable(cause error) error {
	return idem.StoreUnavailable("the database cannot be reached", cause)
}

// unavailableStates is the one table of SQLSTATEs that mean the database
// cannot serve right now, whatever the statement — a whole class by its two
// characters, or one code: the caller gets 503 store_unavailable
// (retryable) and /readyz fails while it lasts, instead of 500 internal.
// Most arrive as FATAL when a new connection is made, so they show once the
// pool has to reconnect.
var unavailableStates = map[string]string{
	"08":    "connection exception",
	"28":    "invalid authorization: login refused (password changed, role without LOGIN)",
	"3D":    "invalid catalog name: the database was dropped or renamed",
	"53":    "insufficient resources: disk full, out of memory, too many connections",
	"57":    "operator intervention: shutdown, crash, database dropped, statement canceled or timed out",
	"58":    "system error: I/O error",
	"25006": "read-only SQL transaction: a standby or a read-only database",
}

// isUnavailable reports whether err means the database cannot be reached,
// cannot serve, or did not answer in time, as opposed to refusing the
// statement.
func isUnavailable(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		code := pgErr.Code
		_, ok := unavailableStates[code]
		if !ok && len(code) == 5 {
			_, ok = unavailableStates[code[:2]]
		}
		return ok
	}
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	return errors.As(err, &connectErr) ||
		pgconn.Timeout(err) ||
		errors.Is(err, context.DeadlineExceeded) ||
		errors.As(err, &netErr) ||
		errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed) ||
		errors.Is(err, sql.ErrConnDone)
}

// pgErrorCode returns the SQLSTATE of err, or "".
func pgErrorCode(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}
