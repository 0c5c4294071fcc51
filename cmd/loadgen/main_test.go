package main

import (
	"bytes"
	"context"
	"io"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/conformance"
	"github.com/idem-dev/idem/testkit/pgtest"
	"github.com/idem-dev/idem/testkit/servertest"
)

func TestPercentileNearestRank(t *testing.T) {
	t.Parallel()
	require.Equal(t, time.Duration(0), percentile(nil, 50))

	d := make([]time.Duration, 100) // 1ms … 100ms, sorted
	for i := range d {
		d[i] = time.Duration(i+1) * time.Millisecond
	}
	require.Equal(t, 50*time.Millisecond, percentile(d, 50))
	require.Equal(t, 90*time.Millisecond, percentile(d, 90))
	require.Equal(t, 99*time.Millisecond, percentile(d, 99))
	require.Equal(t, 100*time.Millisecond, percentile(d, 100))
	require.Equal(t, 1*time.Millisecond, percentile(d, 0.1))

	one := []time.Duration{7 * time.Millisecond}
	require.Equal(t, 7*time.Millisecond, percentile(one, 50))
	require.Equal(t, 7*time.Millisecond, percentile(one, 99))

	three := []time.Duration{1, 2, 3}
	require.Equal(t, time.Duration(2), percentile(three, 50))
	require.Equal(t, time.Duration(3), percentile(three, 90))
}

func TestCheckLoopbackURL(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{
		"http://127.0.0.1:8080", "http://127.1.2.3:9", "http://[::1]:8080/", "http://localhost:8080", "https://LOCALHOST",
	} {
		u, err := checkLoopbackURL(ok)
		require.NoError(t, err, ok)
		require.False(t, strings.HasSuffix(u.Path, "/"), ok)
	}
	for _, bad := range []string{
		"http://10.0.0.1:8080", "http://example.com", "https://example.com:443", "http://192.168.1.10",
		"http://0.0.0.0:8080", "http://[::ffff:10.0.0.1]", "http://127.0.0.1.example.com", "ftp://127.0.0.1", "127.0.0.1:8080", "http://:8080",
	} {
		_, err := checkLoopbackURL(bad)
		require.Error(t, err, bad)
	}
}

func TestLoopbackDialControl(t *testing.T) {
	t.Parallel()
	require.NoError(t, loopbackOnly("tcp", "127.0.0.1:80", nil))
	require.NoError(t, loopbackOnly("tcp6", "[::1]:80", nil))
	require.Error(t, loopbackOnly("tcp", "10.0.0.1:80", nil))
	require.Error(t, loopbackOnly("tcp", "93.184.216.34:443", nil))
}

func TestParseFlagsBounds(t *testing.T) {
	t.Parallel()
	var errOut bytes.Buffer
	parse := func(args ...string) error {
		_, err := parseFlags(append([]string{"-token", "t"}, args...), &errOut)
		return err
	}
	require.NoError(t, parse())
	require.NoError(t, parse("-duration", "120s", "-mode", "contention"))
	require.ErrorContains(t, parse("-duration", "121s"), "-duration")
	require.ErrorContains(t, parse("-duration", "0s"), "-duration")
	require.ErrorContains(t, parse("-concurrency", "0"), "-concurrency")
	require.ErrorContains(t, parse("-concurrency", "5000"), "-concurrency")
	require.ErrorContains(t, parse("-mode", "nope"), "-mode")
	require.ErrorContains(t, parse("-url", "http://example.com"), "loopback")
	cfg, err := parseFlags([]string{"-token", "t", "-mode", "contention"}, &errOut)
	require.NoError(t, err)
	require.Equal(t, 8, cfg.keys)
	cfg, err = parseFlags([]string{"-token", "t", "-mode", "replay"}, &errOut)
	require.NoError(t, err)
	require.Equal(t, 256, cfg.keys)
}

func TestCheckContention(t *testing.T) {
	t.Parallel()
	decided := map[string]bool{"a": true, "b": true, "c": true}

	require.Empty(t, checkContention(map[string]int{"a": 1, "b": 1, "c": 1}, decided))

	bad := checkContention(map[string]int{"a": 1, "b": 2, "c": 1}, decided)
	require.Len(t, bad, 1)
	require.Contains(t, bad[0], "key b: 2 claims answered 201")

	bad = checkContention(map[string]int{"a": 1, "c": 1}, decided)
	require.Len(t, bad, 1)
	require.Contains(t, bad[0], "key b")

	// A key that never got a decided answer (only transport errors) and no
	// 201 is not a violation; a 201 without a decided mark still counts.
	require.Empty(t, checkContention(map[string]int{"a": 1}, map[string]bool{"a": true}))
	require.Len(t, checkContention(map[string]int{"x": 3}, nil), 1)
}

func TestReportPrintsViolationAndFails(t *testing.T) {
	t.Parallel()
	u, err := url.Parse("http://127.0.0.1:1")
	require.NoError(t, err)
	tl := newTally()
	tl.record(kindClaim, time.Millisecond, result{status: 201}, true)
	tl.record(kindClaim, 2*time.Millisecond, result{status: 201}, true)
	tl.wins["k"] = 2
	tl.decided["k"] = true
	tl.iterations = 2
	rep := &report{cfg: config{baseURL: u, mode: modeContention, concurrency: 2, keys: 1}, elapsed: time.Second, tally: tl}
	var out bytes.Buffer
	require.Equal(t, 1, rep.print(&out))
	require.Contains(t, out.String(), "INVARIANT VIOLATION: key k: 2 claims answered 201")
	require.Contains(t, out.String(), "RESULT mode=contention")
	require.Contains(t, out.String(), "violations=1")

	tl.wins["k"] = 1
	out.Reset()
	require.Equal(t, 0, rep.print(&out))
	require.NotContains(t, out.String(), "INVARIANT VIOLATION")
	require.Contains(t, out.String(), "requests     2")
}

func TestFrontdoorModeLoadsAnyAPI(t *testing.T) {
	t.Parallel()
	up := conformance.NewUpstream()
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	cfg, err := parseFlags([]string{"-url", srv.URL, "-mode", "frontdoor", "-requests", "40", "-concurrency", "4", "-duration", "20s"}, io.Discard)
	require.NoError(t, err, "no token needed")
	rep, err := runLoad(context.Background(), cfg)
	require.NoError(t, err)
	var out bytes.Buffer
	require.Equal(t, 0, rep.print(&out), out.String())
	require.Contains(t, out.String(), "post 201")
	require.Equal(t, int64(40), up.Count())

	cfg.mode, cfg.keys = "frontdoor-replay", 5
	rep, err = runLoad(context.Background(), cfg)
	require.NoError(t, err)
	require.Equal(t, 0, rep.print(&out))
	require.Equal(t, int64(85), up.Count(), "5 prepared keys, then 40 posts: the bare upstream does not replay")
}

// TestNeighbourModeAgainstTheServer runs the neighbour scenario briefly
// against the real server wiring: a quiet tenant, then the same beside a
// flooding tenant limited to 1 request/s (a burst of one), which is mostly
// refused 429 however few requests a busy machine lets its 4 workers send
// in 400 ms (at 5/s, six requests could all fit in the burst and its
// refill: it failed so 3 times in 6 here).
func TestNeighbourModeAgainstTheServer(t *testing.T) {
	t.Parallel()
	var errOut bytes.Buffer
	_, err := parseFlags([]string{"-token", "t", "-mode", "neighbour"}, &errOut)
	require.ErrorContains(t, err, "-flood-token")

	ts := servertest.Start(t, servertest.Options{Tenants: []string{"quiet"}})
	rate := 1
	ts.CreateTenant(t, "flood", idem.SettingsPatch{RateLimitPerSecond: &rate})
	cfg, err := parseFlags([]string{
		"-url", ts.URL(), "-mode", "neighbour", "-duration", "400ms", "-concurrency", "2",
		"-token", ts.Token(t, "quiet", "keys:write"),
		"-flood-token", ts.Token(t, "flood", "keys:write"), "-flood-concurrency", "4",
	}, &errOut)
	require.NoError(t, err)
	rep, err := runNeighbour(context.Background(), cfg)
	require.NoError(t, err)
	var out bytes.Buffer
	require.Equal(t, 0, rep.print(&out), out.String())
	require.Contains(t, out.String(), "RESULT mode=neighbour")
	require.Contains(t, out.String(), "errors=0")
	require.Positive(t, rep.flood.outcomes["claim 429 rate_limited"], out.String())
	require.Positive(t, len(rep.alone.latencies[kindClaim]))
	require.Positive(t, len(rep.beside.latencies[kindClaim]))
}

// TestWaitModeAgainstTwoReplicas: the wait mode against two real servers on
// one PostgreSQL schema, small and bounded: every held claim is woken by
// the one complete with the replay.
func TestWaitModeAgainstTwoReplicas(t *testing.T) {
	t.Parallel()
	var errOut bytes.Buffer
	_, err := parseFlags([]string{"-token", "t", "-mode", "wait", "-waiters", "5000"}, &errOut)
	require.ErrorContains(t, err, "-waiters")
	_, err = parseFlags([]string{"-token", "t", "-mode", "wait", "-url2", "http://10.0.0.1"}, &errOut)
	require.ErrorContains(t, err, "loopback")

	dsn := pgtest.URL(t)
	a := servertest.Start(t, servertest.Options{DatabaseURL: dsn, Tenants: []string{"acme"}})
	b := servertest.Start(t, servertest.Options{DatabaseURL: dsn})
	cfg, err := parseFlags([]string{
		"-url", a.URL(), "-url2", b.URL(), "-mode", "wait", "-waiters", "20", "-rounds", "2", "-wait-seconds", "15",
		"-token", a.Token(t, "acme", "keys:write"),
	}, &errOut)
	require.NoError(t, err)
	rep, err := runWait(context.Background(), cfg)
	require.NoError(t, err)
	var out bytes.Buffer
	require.Equal(t, 0, rep.print(&out), out.String())
	require.Contains(t, out.String(), "RESULT mode=wait waiters=20 replicas=2 rounds=2")
	require.Contains(t, out.String(), "waiter 200                         40")
	require.Contains(t, out.String(), "errors=0")
}

// TestRandomKeys: -random-keys gives UUID-shaped keys that the server
// accepts, a new one per iteration, and only for the fresh-key modes.
func TestRandomKeys(t *testing.T) {
	t.Parallel()
	var errOut bytes.Buffer
	_, err := parseFlags([]string{"-token", "t", "-mode", "replay", "-random-keys"}, &errOut)
	require.ErrorContains(t, err, "-random-keys")

	seen := map[string]bool{}
	for range 1000 {
		k := randomUUID()
		require.Regexp(t, `^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`, k)
		require.False(t, seen[k], "repeated key %s", k)
		seen[k] = true
	}

	ts := servertest.Start(t, servertest.Options{Tenants: []string{"acme"}})
	cfg, err := parseFlags([]string{
		"-url", ts.URL(), "-mode", "lifecycle", "-random-keys", "-requests", "20", "-concurrency", "2",
		"-token", ts.Token(t, "acme", "keys:write"),
	}, &errOut)
	require.NoError(t, err)
	rep, err := runLoad(context.Background(), cfg)
	require.NoError(t, err)
	var out bytes.Buffer
	require.Equal(t, 0, rep.print(&out), out.String())
	require.Contains(t, out.String(), "claim 201                          20")
	require.Contains(t, out.String(), "complete 200                       20")
	require.Regexp(t, `errors=0 violations=0 p99_claim_ms=[0-9.]+ p99_complete_ms=[0-9.]+\n`, out.String())
}
