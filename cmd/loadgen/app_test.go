package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/testkit/pgtest"
)

// TestMain lets the app mode start this test binary as its apps: it runs
// itself with -serve-app, as the loadgen binary does.
func TestMain(m *testing.M) {
	if len(os.Args) == 4 && os.Args[1] == "-serve-app" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
		stop()
		os.Exit(code)
	}
	os.Exit(m.Run())
}

func TestParseFlagsApp(t *testing.T) {
	t.Parallel()
	parse := func(args ...string) (config, error) {
		return parseFlags(append([]string{"-mode", "app", "-database-url", "postgres://u@127.0.0.1:5432/db"}, args...), io.Discard)
	}
	_, err := parse()
	require.ErrorContains(t, err, "-idem-bin")
	cfg, err := parse("-idem-bin", "/x/idem")
	require.NoError(t, err, "no token needed: the mode mints its own")
	require.Equal(t, []int{16, 64}, cfg.app.clients)
	require.Equal(t, []string{"fresh", "replay"}, cfg.app.scenarios)
	require.Equal(t, 3, cfg.rounds)
	require.Equal(t, 256, cfg.keys)
	_, err = parse("-idem-bin", "/x/idem", "-clients", "16,0")
	require.ErrorContains(t, err, "-clients")
	_, err = parse("-idem-bin", "/x/idem", "-scenarios", "fresh,nope")
	require.ErrorContains(t, err, "-scenarios")
	_, err = parseFlags([]string{"-mode", "app", "-idem-bin", "/x/idem", "-database-url", "postgres://u@10.0.0.1/db"}, io.Discard)
	require.ErrorContains(t, err, "not loopback")
}

// TestAppModeOneSecond runs the app mode for a second per phase against
// the real idem and floor binaries on the shared PostgreSQL: the report has
// every goal's line and its command, every request counted was answered
// as expected, and each protected app ran its handler once per fresh key
// and never for a replay (the mode checks the orders tables). No timing is
// asserted. Not parallel: it runs before the package's parallel tests,
// so its five processes do not load the machine under their timing-bound
// ones (the neighbour mode's 400 ms phases).
func TestAppModeOneSecond(t *testing.T) {
	db := pgtest.ServerURL(t)
	dir := t.TempDir()
	bins := map[string]string{
		"idem":       "github.com/idem-dev/idem/cmd/server",
		"benchfloor": "github.com/idem-dev/idem/postgres/internal/benchfloor",
	}
	for name, pkg := range bins {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		out, err := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(dir, name), pkg).CombinedOutput()
		cancel()
		require.NoError(t, err, "go build %s: %s", pkg, out)
	}
	cfg, err := parseFlags([]string{
		"-mode", "app", "-idem-bin", filepath.Join(dir, "idem"), "-floor-bin", filepath.Join(dir, "benchfloor"),
		"-database-url", db, "-duration", "1s", "-rounds", "1", "-clients", "2", "-keys", "8",
		"-idem-profile", filepath.Join(dir, "idem.pprof"), "-app-profile", filepath.Join(dir, "app.pprof"),
	}, io.Discard)
	require.NoError(t, err)
	rep, err := runApp(context.Background(), cfg, cfg.app)
	require.NoError(t, err)
	var out bytes.Buffer
	require.Equal(t, 0, rep.print(&out), out.String())
	text := out.String()

	require.Len(t, rep.cells, 2)
	for _, c := range rep.cells {
		require.Len(t, c.rounds, 1)
		rr := c.rounds[0]
		phases := []*phaseResult{rr.floor, rr.pair}
		if c.scenario == scenarioFresh {
			require.NotNil(t, rr.server, "the floor server's phase runs with -floor-bin")
			phases = append(phases, rr.server)
		}
		for _, ph := range phases {
			for _, g := range ph.gens {
				sent, answered := g.requests()
				require.Positive(t, sent, "%s %s", c.scenario, g.name)
				require.Equal(t, sent, answered, "%s %s: every request answered", c.scenario, g.name)
				require.Zero(t, g.rep.tally.unexpected, "%s %s: %v", c.scenario, g.name, g.rep.tally.outcomes)
			}
		}
		if c.scenario == scenarioReplay {
			require.Zero(t, rr.pair.orders[roleAppIdem], "a replay never runs the handler")
			require.Zero(t, rr.pair.orders[roleAppLibrary])
			require.Positive(t, rr.pair.gens[0].rep.tally.outcomes["post 201"])
		}
		for _, role := range []string{roleAppUnprotected, roleAppIdem, roleAppLibrary, roleIdem} {
			require.Contains(t, rr.floor.cpu, role, "every process is read")
		}
		require.Contains(t, rr.pair.cpu, "pg-"+roleIdem, "the idem server's backends are found")
		require.Contains(t, rr.pair.cpu, "pg-"+roleAppLibrary, "the library's backends are found")
	}
	for _, line := range []string{
		"1. fresh: CPU per request, all processes, idem ÷ unprotected",
		"fresh: requests/s, idem ÷ unprotected",
		"2. replays: CPU per request, all processes, idem ÷ unprotected",
		"3. SDK defaults",
		"4. fresh: PostgreSQL CPU per request, idem (app + ledger) ÷ the library",
		"5. the idem server's CPU per call ÷ the bare floor server",
		"command: scripts/bench-app 1 1 2 fresh,replay",
		"not attributed: PostgreSQL's background processes",
	} {
		require.Contains(t, text, line)
	}
	m := regexp.MustCompile(`RESULT mode=app rounds=1 seconds=1 requests=(\d+) answered=(\d+) violations=0 fresh_2_cpu_idem=`).FindStringSubmatch(text)
	require.NotNil(t, m, text)
	sent, _ := strconv.Atoi(m[1])
	require.Positive(t, sent)
	require.Equal(t, m[1], m[2], "every request counted was answered")
	require.NotEmpty(t, rep.schemas)
	conn, err := pgx.Connect(context.Background(), db)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var left int
	require.NoError(t, conn.QueryRow(context.Background(), `SELECT count(*) FROM pg_namespace WHERE nspname = ANY($1)`, rep.schemas).Scan(&left))
	require.Zero(t, left, "the run drops its schemas")
	for _, f := range []string{"idem.pprof", "app.pprof"} {
		st, err := os.Stat(filepath.Join(dir, f))
		require.NoError(t, err, "the profile is written")
		require.Positive(t, st.Size(), f)
	}
}
