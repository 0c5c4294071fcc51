// Command loadgen is an HTTP load generator for the claim hot path of an idem
// server running on this machine. It talks raw net/http with keep-alive
// (not the client SDK, whose retries and backoff would hide the server's
// behaviour), so the numbers it prints measure the server.
//
// Usage:
//
//	loadgen -url http://127.0.0.1:8080 -token "$IDEM_TOKEN" \
//	    [-mode claim|lifecycle|replay|contention] [-duration 10s] \
//	    [-concurrency 16] [-requests N] [-keys N] [-random-keys]
//	loadgen -url http://127.0.0.1:8080 -token "$QUIET" -mode neighbour \
//	    -flood-token "$FLOODER" [-flood-concurrency 32] [-concurrency 4]
//	loadgen -url http://127.0.0.1:8081 -mode frontdoor|frontdoor-replay [-path /orders]
//	loadgen -url http://127.0.0.1:8080 -token "$IDEM_TOKEN" -mode wait \
//	    [-url2 http://127.0.0.1:8090] [-waiters 1000] [-rounds 3] [-wait-seconds 20]
//	loadgen -mode app -idem-bin ./idem [-floor-bin ./benchfloor] \
//	    [-database-url "$TEST_DATABASE_URL"] [-duration 10s] [-rounds 3] \
//	    [-clients 16,64] [-scenarios fresh,replay] [-idem-profile FILE] [-app-profile FILE]
//	loadgen -serve-upstream 127.0.0.1:0
//	loadgen -serve-app unprotected|idem|library 127.0.0.1:0
//	loadgen storm -server-bin bin/idem -database-url "$TEST_DATABASE_URL" \
//	    [-callers 1000] [-workers go:2,python:1,node:1] [-python python3] [-node node] \
//	    [-period 10s] [-outage 10s] [-budget off,on] [-svg out.svg]
//	loadgen storm-worker   (a Go worker of loadgen storm; configured by STORM_WORKER)
//
// `loadgen storm` is the storm test of the fleet retry budget (storm.go):
// it starts the server binary itself behind a cut proxy to PostgreSQL and
// runs many callers in worker processes of the Go, Python and Node SDKs,
// each caller with its own client, through a store outage, with the
// tenant's budget off and then on.
//
// Modes:
//
//   - claim: every request claims a fresh key (201 expected).
//   - lifecycle: claim a fresh key (201), then complete it (200).
//   - replay: first claims and completes -keys keys (not measured), then
//     claims them again and again (200 replays expected).
//   - contention: every worker claims keys of a small set of -keys keys; the
//     one that gets 201 completes the key, the others get 409
//     request_in_flight or a 200 replay. Each key must see exactly one 201:
//     if not, loadgen prints an INVARIANT VIOLATION line and exits 1.
//   - neighbour: what a flooding, rate-limited tenant costs a quiet one. The
//     quiet tenant (-token, rate limit off) claims fresh keys with
//     -concurrency workers for -duration alone, then for -duration again
//     while the flooder (-flood-token, a tenant with a small
//     rate_limit_per_second) claims with -flood-concurrency workers as fast
//     as they can (201 within its rate, 429 rate_limited past it). The
//     report puts the quiet tenant's p50/p99 alone beside its p50/p99 with
//     the flood.
//   - frontdoor: POST -path of any HTTP API with a fresh Idempotency-Key and
//     a JSON body (2xx expected): the idem gateway, or the upstream behind
//     it for the baseline of the same run. No token needed.
//   - frontdoor-replay: first sends -keys keys once (not measured), then
//     sends them again and again (2xx replays expected through a gateway).
//   - wait: per round, -waiters claims with wait_seconds are held on one key
//     in flight (split over -url and -url2, a second replica), then one
//     complete wakes them all: the report gives the time from the complete
//     to each waiter's 200 replay (p50/p99/max), beside a baseline of as
//     many plain replay claims sent at once. It reads each replica's
//     idem_claim_waiters gauge at /metrics to know every waiter is held.
//   - app: the app-level bench of issue 23 (scripts/bench-app runs it). It
//     starts the idem server (-idem-bin, on PostgreSQL, a tenant and a
//     token of its own), the bare floor server (-floor-bin, optional) and
//     the app of testkit/benchapp three times (this binary with
//     -serve-app): unprotected, behind client/idemhttp with the SDK's
//     defaults, and behind benchapp.Lib, an in-process PostgreSQL
//     idempotency layer; each in its own schema of -database-url with its
//     own application_name. Per round, per scenario (fresh keys, replays
//     of -keys completed keys) and per client count, two load generators
//     run at the same moment: both on the unprotected app (the floor),
//     then one on the idem app and one on the library's; with -floor-bin
//     also `lifecycle` on the idem server and the floor server at once.
//     Around each phase it reads utime+stime from /proc/PID/stat of every
//     process and of every PostgreSQL backend found in pg_stat_activity
//     by datname and application_name, and counts each app's orders rows
//     (one per fresh key, none for a replay). It prints per request CPU by
//     process, requests/s, and issue 23's goals 1–5 as ratios against the
//     unprotected app of the same run (median of -rounds, min–max), with
//     the command; exits 1 when a request was not answered as expected or
//     a handler ran other than once per fresh key.
//
// With -serve-upstream ADDR (loopback only) loadgen does not generate load:
// it serves the conformance kit's reference upstream (POST /orders with a
// side-effect counter, GET /count) until SIGINT/SIGTERM, so the gateway
// benchmark has an upstream in its own process. It prints "upstream
// listening on ADDR". With -serve-app VARIANT ADDR it serves the bench app
// of testkit/benchapp (the app mode starts it so; BENCHAPP_DATABASE_URL,
// BENCHAPP_IDEM_URL and IDEM_TOKEN configure it) and prints "app listening
// on ADDR".
//
// The token needs the keys:write scope for a tenant whose rate limit is off.
// Keys carry a per-run prefix, so runs never see each other's keys. With
// -random-keys the fresh keys of claim and lifecycle are random UUIDs
// instead (122 random bits, no shared prefix), as integrations that key by a
// UUID send them: each insert lands at a random place in the ledger's
// primary-key index, which is what a large ledger pays for (scripts/bench-scale).
//
// It prints a report: requests, responses by status and problem code,
// throughput, latency p50/p90/p99/max (per request kind), and a final
// machine-readable RESULT line. It exits 1 when any response was not one the
// mode expects, or on an invariant violation; 2 on a usage error.
//
// Safety bounds: -url must name a loopback address (127.0.0.0/8, ::1 or
// localhost) and every connection is checked to be loopback when dialled;
// redirects are not followed; -duration is at most 120s; -concurrency at most
// 1024; -requests caps the number of iterations started.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/idem-dev/idem/conformance"
)

// Bounds of the flags.
const (
	maxDuration    = 120 * time.Second
	maxConcurrency = 1024
	maxKeys        = 100000
)

// config is the parsed command line.
type config struct {
	baseURL     *url.URL
	token       string
	duration    time.Duration
	concurrency int
	mode        string
	requests    int64
	keys        int
	timeout     time.Duration
	path        string // frontdoor modes: the endpoint
	randomKeys  bool   // claim and lifecycle: random UUID keys instead of prefix-wN-n
	// neighbour mode: the flooding tenant's token and workers.
	floodToken       string
	floodConcurrency int
	// wait mode: a second replica, the waiters per round, the rounds and
	// the wait_seconds each waiter sends.
	baseURL2    *url.URL
	waiters     int
	rounds      int
	waitSeconds int
	// app mode: its own flags.
	app appOptions
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "storm" {
		return runStorm(ctx, args[1:], stdout, stderr)
	}
	if len(args) == 1 && args[0] == "storm-worker" {
		return runStormWorker(ctx, os.Stdin, stdout, stderr)
	}
	if len(args) == 2 && (args[0] == "-serve-upstream" || args[0] == "--serve-upstream") {
		return serveUpstream(ctx, args[1], stdout, stderr)
	}
	if len(args) == 3 && (args[0] == "-serve-app" || args[0] == "--serve-app") {
		return serveApp(ctx, args[1], args[2], stdout, stderr)
	}
	cfg, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "loadgen: %v\n", err)
		return 2
	}
	// Each mode's report prints itself and says the exit code.
	var rep interface{ print(io.Writer) int }
	switch cfg.mode {
	case modeNeighbour:
		rep, err = runNeighbour(ctx, cfg)
	case modeApp:
		rep, err = runApp(ctx, cfg, cfg.app)
	case modeWait:
		rep, err = runWait(ctx, cfg)
	default:
		rep, err = runLoad(ctx, cfg)
	}
	if err != nil {
		fmt.Fprintf(stderr, "loadgen: %v\n", err)
		return 1
	}
	return rep.print(stdout)
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	rawURL := fs.String("url", "http://127.0.0.1:8080", "base URL of the idem server (loopback only)")
	token := fs.String("token", "", "bearer token with keys:write (default: $IDEM_TOKEN)")
	duration := fs.Duration("duration", 10*time.Second, "how long to run (at most 120s)")
	concurrency := fs.Int("concurrency", 16, "number of concurrent workers (connections)")
	mode := fs.String("mode", "claim", "claim | lifecycle | replay | contention | frontdoor | frontdoor-replay | neighbour | wait | app")
	rawURL2 := fs.String("url2", "", "wait mode: a second replica on the same database (loopback only); waiters are split over both")
	waiters := fs.Int("waiters", 1000, "wait mode: claims held on one key per round (at most 4096)")
	rounds := fs.Int("rounds", 3, "wait and app modes: rounds (at most 20); the app mode prints the median")
	idemBin := fs.String("idem-bin", "", "app mode: the idem server binary (go build ./cmd/server)")
	floorBin := fs.String("floor-bin", "", "app mode: the bare floor server (go build ./postgres/internal/benchfloor); measures goal 5 when set")
	databaseURL := fs.String("database-url", "", "app mode: a PostgreSQL server on this machine (default: $TEST_DATABASE_URL); its schemas are created and dropped")
	clients := fs.String("clients", "16,64", "app mode: the client counts, each generator's")
	scenarios := fs.String("scenarios", "fresh,replay", "app mode: fresh keys, replays of completed keys, or both")
	idemProfile := fs.String("idem-profile", "", "app mode: write a CPU profile of the idem server during the first fresh pair phase to this file")
	appProfile := fs.String("app-profile", "", "app mode: write a CPU profile of the idem app (idemhttp and the SDK) during the same phase to this file")
	appPool := fs.Int("app-pool", 10, "app mode: each app's PostgreSQL pool (the idem server's default is 10)")
	waitSeconds := fs.Int("wait-seconds", 20, "wait mode: wait_seconds of each held claim (1..300; the server caps it)")
	path := fs.String("path", "/orders", "frontdoor modes: the endpoint POSTed to")
	requests := fs.Int64("requests", 0, "stop after this many iterations (0 = only -duration bounds the run)")
	keys := fs.Int("keys", 0, "size of the key set for replay (default 256) and contention (default 8)")
	randomKeys := fs.Bool("random-keys", false, "claim and lifecycle: fresh keys are random UUIDs (random places in the ledger's index), not a per-run prefix and a counter")
	timeout := fs.Duration("timeout", 10*time.Second, "timeout of one HTTP request")
	floodToken := fs.String("flood-token", "", "neighbour mode: token of the flooding, rate-limited tenant")
	floodConcurrency := fs.Int("flood-concurrency", 32, "neighbour mode: workers of the flooding tenant")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	cfg := config{
		token: *token, duration: *duration, concurrency: *concurrency,
		mode: *mode, requests: *requests, keys: *keys, timeout: *timeout, path: *path, randomKeys: *randomKeys,
		floodToken: *floodToken, floodConcurrency: *floodConcurrency,
		waiters: *waiters, rounds: *rounds, waitSeconds: *waitSeconds,
		app: appOptions{idemBin: *idemBin, floorBin: *floorBin, databaseURL: *databaseURL, profile: *idemProfile, appProfile: *appProfile, pool: *appPool},
	}
	if cfg.token == "" {
		cfg.token = os.Getenv("IDEM_TOKEN")
	}
	if cfg.token == "" && !frontdoorMode(cfg.mode) && cfg.mode != modeApp {
		return config{}, errors.New("-token (or IDEM_TOKEN) is required")
	}
	u, err := checkLoopbackURL(*rawURL)
	if err != nil {
		return config{}, err
	}
	cfg.baseURL = u
	if cfg.duration <= 0 || cfg.duration > maxDuration {
		return config{}, fmt.Errorf("-duration must be in (0, %s], got %s", maxDuration, cfg.duration)
	}
	if cfg.concurrency < 1 || cfg.concurrency > maxConcurrency {
		return config{}, fmt.Errorf("-concurrency must be 1..%d, got %d", maxConcurrency, cfg.concurrency)
	}
	if cfg.requests < 0 {
		return config{}, fmt.Errorf("-requests must be ≥ 0, got %d", cfg.requests)
	}
	if cfg.timeout <= 0 || cfg.timeout > time.Minute {
		return config{}, fmt.Errorf("-timeout must be in (0, 1m], got %s", cfg.timeout)
	}
	if cfg.randomKeys && cfg.mode != modeClaim && cfg.mode != modeLifecycle {
		return config{}, fmt.Errorf("-random-keys applies to -mode claim and lifecycle only, not %q", cfg.mode)
	}
	switch cfg.mode {
	case modeClaim, modeLifecycle:
	case modeFrontdoor:
	case modeNeighbour:
		if cfg.floodToken == "" {
			return config{}, errors.New("-mode neighbour needs -flood-token (a tenant with a rate limit)")
		}
		if cfg.floodConcurrency < 1 || cfg.floodConcurrency > maxConcurrency {
			return config{}, fmt.Errorf("-flood-concurrency must be 1..%d, got %d", maxConcurrency, cfg.floodConcurrency)
		}
	case modeApp:
		if cfg.app.idemBin == "" {
			return config{}, errors.New("-mode app needs -idem-bin (go build -o idem ./cmd/server)")
		}
		if cfg.app.databaseURL == "" {
			cfg.app.databaseURL = os.Getenv("TEST_DATABASE_URL")
		}
		if cfg.app.databaseURL == "" {
			return config{}, errors.New("-mode app needs -database-url (or TEST_DATABASE_URL): a PostgreSQL server on this machine")
		}
		if err := checkLoopbackDatabase(cfg.app.databaseURL); err != nil {
			return config{}, err
		}
		if cfg.rounds < 1 || cfg.rounds > maxWaitRounds {
			return config{}, fmt.Errorf("-rounds must be 1..%d, got %d", maxWaitRounds, cfg.rounds)
		}
		if cfg.app.clients, err = parseClients(*clients); err != nil {
			return config{}, err
		}
		if cfg.app.scenarios, err = parseScenarios(*scenarios); err != nil {
			return config{}, err
		}
		if cfg.app.pool < 1 || cfg.app.pool > 256 {
			return config{}, fmt.Errorf("-app-pool must be 1..256, got %d", cfg.app.pool)
		}
		if cfg.keys == 0 {
			cfg.keys = 256
		}
		if cfg.keys < 1 || cfg.keys > maxKeys {
			return config{}, fmt.Errorf("-keys must be 1..%d, got %d", maxKeys, cfg.keys)
		}
	case modeWait:
		if cfg.waiters < 1 || cfg.waiters > maxWaiters {
			return config{}, fmt.Errorf("-waiters must be 1..%d, got %d", maxWaiters, cfg.waiters)
		}
		if cfg.rounds < 1 || cfg.rounds > maxWaitRounds {
			return config{}, fmt.Errorf("-rounds must be 1..%d, got %d", maxWaitRounds, cfg.rounds)
		}
		if cfg.waitSeconds < 1 || cfg.waitSeconds > 300 {
			return config{}, fmt.Errorf("-wait-seconds must be 1..300, got %d", cfg.waitSeconds)
		}
		if *rawURL2 != "" {
			u2, err := checkLoopbackURL(*rawURL2)
			if err != nil {
				return config{}, err
			}
			cfg.baseURL2 = u2
		}
	case modeReplay, modeContention, modeFrontdoorReplay:
		if cfg.keys == 0 {
			cfg.keys = 256
			if cfg.mode == modeContention {
				cfg.keys = 8
			}
		}
		if cfg.keys < 1 || cfg.keys > maxKeys {
			return config{}, fmt.Errorf("-keys must be 1..%d, got %d", maxKeys, cfg.keys)
		}
	default:
		return config{}, fmt.Errorf("-mode must be claim, lifecycle, replay, contention, frontdoor, frontdoor-replay, neighbour, wait or app, got %q", cfg.mode)
	}
	return cfg, nil
}

// serveUpstream serves conformance.Upstream on a loopback addr until ctx
// is done.
func serveUpstream(ctx context.Context, addr string, stdout, stderr io.Writer) int {
	host, _, err := net.SplitHostPort(addr)
	if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
		fmt.Fprintf(stderr, "loadgen: -serve-upstream %q: must be a loopback host:port\n", addr)
		return 2
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintf(stderr, "loadgen: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "upstream listening on %s\n", ln.Addr())
	return serveUntilDone(ctx, ln, conformance.NewUpstream(), stderr)
}

// serveUntilDone serves h on ln until ctx is done: 0 then, 1 (said on
// stderr) when serving failed.
func serveUntilDone(ctx context.Context, ln net.Listener, h http.Handler, stderr io.Writer) int {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintf(stderr, "loadgen: %v\n", err)
		return 1
	}
	return 0
}

// checkLoopbackURL parses raw and accepts it only when it is an http(s) URL
// whose host is a loopback IP literal (127.0.0.0/8, ::1) or "localhost". Other
// host names are refused without being resolved.
func checkLoopbackURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("-url: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("-url %q: scheme must be http or https", raw)
	}
	host := u.Hostname()
	if host == "" {
		return nil, fmt.Errorf("-url %q: no host", raw)
	}
	if !strings.EqualFold(host, "localhost") {
		ip := net.ParseIP(host)
		if ip == nil || !ip.IsLoopback() {
			return nil, fmt.Errorf("-url %q: host must be a loopback address (127.0.0.0/8, ::1 or localhost); loadgen only loads this machine", raw)
		}
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	return u, nil
}
