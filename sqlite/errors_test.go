package sqlite

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	sqlitelib "modernc.org/sqlite/lib"

	"github.com/idem-dev/idem"
)

// TestInterpretErrorUnavailable produces real SQLite errors of the codes in
// unavailableCodes that a test can provoke without root (a read-only
// connection, a file that cannot be opened, a held lock) and checks that
// each becomes store_unavailable, while a statement's own error (a
// constraint, a syntax error) does not. The disk-full case runs through
// real HTTP in server.TestSQLiteDiskFull.
func TestInterpretErrorUnavailable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "idem.db")
	s, err := Open(ctx, path, Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })

	open := func(dsn string) *sql.DB {
		db, err := sql.Open("sqlite", dsn)
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		return db
	}
	exec := func(db *sql.DB, q string) error {
		_, err := db.ExecContext(ctx, q)
		return err
	}

	readOnly := open("file:" + path + "?mode=ro")
	errReadOnly := exec(readOnly, "UPDATE fencing_counter SET value = value + 1")
	errCantOpen := exec(open("file:"+filepath.Join(dir, "missing", "x.db")+"?mode=ro"), "SELECT 1")
	holder := open("file:" + path)
	conn, err := holder.Conn(ctx)
	require.NoError(t, err)
	_, err = conn.ExecContext(ctx, "BEGIN IMMEDIATE")
	require.NoError(t, err)
	errBusy := exec(open("file:"+path+"?_pragma=busy_timeout(1)"), "BEGIN IMMEDIATE")
	_, _ = conn.ExecContext(ctx, "ROLLBACK")
	_ = conn.Close()

	for _, tt := range []struct {
		name string
		err  error
		code int
	}{
		{"read-only", errReadOnly, sqlitelib.SQLITE_READONLY},
		{"cannot open", errCantOpen, sqlitelib.SQLITE_CANTOPEN},
		{"busy", errBusy, sqlitelib.SQLITE_BUSY},
	} {
		require.Error(t, tt.err, tt.name)
		require.Equal(t, tt.code, sqliteCode(tt.err)&0xff, "%s: %v", tt.name, tt.err)
		require.Equal(t, idem.CodeStoreUnavailable, idem.ErrorCode(interpretError(tt.err, tt.name)), "%s: %v", tt.name, tt.err)
	}

	errSyntax := exec(holder, "SELEC 1")
	errConstraint := exec(holder, "INSERT INTO fencing_counter (id, value) VALUES (1, 0)")
	for _, err := range []error{errSyntax, errConstraint} {
		require.Error(t, err)
		require.Equal(t, idem.CodeInternal, idem.ErrorCode(interpretError(err, "statement")), "%v", err)
	}
}
