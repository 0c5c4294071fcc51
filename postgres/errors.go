package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

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

// isUnavailable reports whether err means the database cannot be reached or
// did not answer in time, as opposed to refusing the statement.
func isUnavailable(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case strings.HasPrefix(pgErr.Code, "08"), // connection exception
			pgErr.Code == "57P01", // admin_shutdown
			pgErr.Code == "57P02", // crash_shutdown
			pgErr.Code == "57P03", // cannot_connect_now
			pgErr.Code == "53300": // too_many_connections
			return true
		}
		return false
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
