package postgres

import (
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
)

// TestInterpretErrorSQLStates checks the unavailableStates table, a FATAL
// at login wrapped in a connect error included (before, a server error
// during connect counted as the statement's own failure: 500). The login
// refused and database dropped cases run against a real server in
// server.TestPostgresLoginFailures.
func TestInterpretErrorSQLStates(t *testing.T) {
	t.Parallel()
	unavailable := []string{
		"08006", // connection_failure
		"28P01", // invalid_password
		"28000", // invalid_authorization_specification (role without LOGIN)
		"3D000", // invalid_catalog_name (database dropped)
		"53100", // disk_full
		"53300", // too_many_connections
		"57P01", // admin_shutdown
		"57P04", // database_dropped
		"57014", // query_canceled
		"58030", // io_error
		"25006", // read_only_sql_transaction
	}
	for _, code := range unavailable {
		err := &pgconn.PgError{Severity: "FATAL", Code: code}
		require.Equal(t, idem.CodeStoreUnavailable, idem.ErrorCode(interpretError(err, "claim")), code)
		wrapped := fmt.Errorf("failed to connect: %w", err)
		require.Equal(t, idem.CodeStoreUnavailable, idem.ErrorCode(interpretError(wrapped, "claim")), code)
	}
	for _, code := range []string{"23505", "22P02", "42P01", "40001", "25001"} {
		err := &pgconn.PgError{Severity: "ERROR", Code: code}
		require.Equal(t, idem.CodeInternal, idem.ErrorCode(interpretError(err, "claim")), code)
	}
}
