package server_test

import (
	"context"
	"log/slog"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/testkit/pgtest"
	"github.com/idem-dev/idem/testkit/servertest"
)

// TestStoreDurabilityReported (issue 25, item 3): the store's durability
// is logged at start and on idem_store_durability. SQLite and the test
// PostgreSQL alone: single_node. With a standby streaming from the
// PostgreSQL server (pg_receivewal, asynchronous) a server started then
// warns that none is synchronous and reports asynchronous.
func TestStoreDurabilityReported(t *testing.T) {
	t.Parallel()
	series := func(mode string) string { return `idem_store_durability{mode="` + mode + `"}` }
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		ts := servertest.Start(t, servertest.Options{})
		c := newAPIClient(t, ts)
		require.Equal(t, 1.0, c.metric(t, series("single_node")))
		require.Equal(t, 0.0, c.metric(t, series("asynchronous")))
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		base := pgtest.ServerURL(t)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, base)
		require.NoError(t, err)
		defer conn.Close(ctx)
		standbys := func() int {
			var n int
			require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_replication").Scan(&n))
			return n
		}
		if standbys() > 0 {
			t.Skip("the test PostgreSQL server has standbys already")
		}
		logs := &syncBuffer{}
		ts := servertest.Start(t, servertest.Options{Backend: servertest.BackendPostgres,
			Logger: slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))})
		c := newAPIClient(t, ts)
		require.Equal(t, 1.0, c.metric(t, series("single_node")))
		require.Contains(t, logs.String(), `"msg":"store durability","mode":"single_node"`)

		bin, err := exec.LookPath("pg_receivewal")
		if err != nil {
			matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_receivewal")
			require.NotEmpty(t, matches, "pg_receivewal not found")
			bin = matches[0]
		}
		recv := exec.Command(bin, "-d", base, "-D", t.TempDir(), "-n", "--no-sync")
		require.NoError(t, recv.Start())
		t.Cleanup(func() { _ = recv.Process.Kill(); _ = recv.Wait() })
		require.Eventually(t, func() bool { return standbys() > 0 }, 30*time.Second, 20*time.Millisecond, "pg_receivewal did not connect")

		logs2 := &syncBuffer{}
		ts2 := servertest.Start(t, servertest.Options{DatabaseURL: ts.Config().DatabaseURL,
			Logger: slog.New(slog.NewJSONHandler(logs2, &slog.HandlerOptions{Level: slog.LevelWarn}))})
		c2 := newAPIClient(t, ts2)
		require.Equal(t, 1.0, c2.metric(t, series("asynchronous")))
		require.Equal(t, 0.0, c2.metric(t, series("single_node")))
		require.True(t, strings.Contains(logs2.String(), "none is synchronous"), logs2.String())
	})
}
