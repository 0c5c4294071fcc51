package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/idem-dev/idem/conformance"
)

func runConformance(ctx context.Context, e env, args []string) int {
	fs := flag.NewFlagSet("conformance", flag.ContinueOnError)
	target := fs.String("target", "", "base URL of the API under test, e.g. http://localhost:8081")
	path := fs.String("path", "/orders", "unsafe endpoint: performs one side effect per execution, answers 2xx, honours ?delay_ms=N and ?status=N")
	otherPath := fs.String("other-path", "", "another path the unsafe method is served on, ideally of the same route as --path (default: --path + \"/other\")")
	method := fs.String("method", "POST", "method of the unsafe endpoint")
	counter := fs.String("counter", "/count", "side-effect counter on the target: GET answers {\"count\": N}")
	noCounter := fs.Bool("no-counter", false, "the target has no counter: skip the side-effect checks")
	serveUpstream := fs.String("serve-upstream", "", "serve the reference upstream on this loopback host:port (put it behind the target, e.g. a gateway) and count the side effects that reach it instead of asking --counter")
	replayHeader := fs.String("replay-header", "Idempotent-Replayed", "response header the target documents on a replay (\"true\"); \"-\": none, a replay is told by its body")
	expiry := fs.Duration("expiry", 0, "key expiry the target publishes (e.g. 2s): the expiry scenario waits it out; 0 skips it")
	concurrency := fs.Int("concurrency", 8, "simultaneous requests on one key in one_side_effect")
	storeDown := fs.String("store-down", "", "URL the kit POSTs to make the target's idempotency store fail (with --store-up); without it store_unavailable is skipped")
	storeUp := fs.String("store-up", "", "URL the kit POSTs to restore the store after --store-down")
	asJSON := fs.Bool("json", false, "print the report as JSON instead of text")
	scenarios := fs.String("scenarios", "", "comma-separated scenarios to run (default: all)")
	timeout := fs.Duration("timeout", 5*time.Minute, "bound of the whole run")
	usage := func(w io.Writer) {
		fmt.Fprint(w, e.expand(`Usage: PROG conformance --target URL [flags]

Runs black-box Idempotency-Key conformance scenarios over HTTP against any
API that claims support and prints a report, grouped by class, ending in
"N passed, M failed". Exits 1 when a scenario fails. The classes: core (a
MUST of draft-ietf-httpapi-idempotency-key-header-07), recommended (a
SHOULD of the draft or of the RFCs it leans on), idem (behaviour idem
documents beyond the draft). Scenarios:
`))
		for _, s := range conformance.Scenarios() {
			fmt.Fprintf(w, "  %-22s %-11s %s [%s]\n", s.Name, s.Class, s.Description, s.Ref)
		}
		fmt.Fprint(w, "\nstore_unavailable needs --store-down and --store-up; expiry needs --expiry.\n\nFlags:\n")
		printFlags(w, fs)
	}
	pos, done, code := parseFlags(fs, e, usage, args)
	if done {
		return code
	}
	if len(pos) > 0 || *target == "" {
		fmt.Fprintf(e.stderr, "%s: conformance needs --target URL and no other argument\n", e.prog)
		return 2
	}
	if (*storeDown == "") != (*storeUp == "") {
		fmt.Fprintf(e.stderr, "%s: --store-down and --store-up go together\n", e.prog)
		return 2
	}
	var names []string
	if *scenarios != "" {
		known := map[string]bool{}
		for _, s := range conformance.Scenarios() {
			known[s.Name] = true
		}
		for _, n := range strings.Split(*scenarios, ",") {
			n = strings.TrimSpace(n)
			if !known[n] {
				fmt.Fprintf(e.stderr, "%s: unknown scenario %q (see --help)\n", e.prog, n)
				return 2
			}
			names = append(names, n)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	opts := conformance.Options{
		Target: *target, Path: *path, OtherPath: *otherPath, Method: strings.ToUpper(*method), Counter: *counter, NoCounter: *noCounter,
		ReplayHeader: *replayHeader, Expiry: *expiry, Concurrency: *concurrency, Scenarios: names,
	}
	if *replayHeader == "" {
		opts.ReplayHeader = "-"
	}
	if *serveUpstream != "" {
		up, stop, err := serveConformanceUpstream(*serveUpstream)
		if err != nil {
			fmt.Fprintf(e.stderr, "%s: --serve-upstream: %v\n", e.prog, err)
			return 2
		}
		defer stop()
		opts.Count = func(context.Context) (int64, error) { return up.Count(), nil }
	}
	if *storeDown != "" {
		opts.StoreDown = func(ctx context.Context) (func(), error) {
			if err := postHook(ctx, *storeDown); err != nil {
				return nil, err
			}
			return func() {
				if err := postHook(context.Background(), *storeUp); err != nil {
					fmt.Fprintf(e.stderr, "%s: --store-up: %v\n", e.prog, err)
				}
			}, nil
		}
	}
	rep := conformance.Run(ctx, opts)
	if *asJSON {
		if err := rep.WriteJSON(e.stdout); err != nil {
			fmt.Fprintf(e.stderr, "%s: %v\n", e.prog, err)
			return 1
		}
	} else {
		rep.Write(e.stdout)
	}
	if rep.Failed() > 0 {
		return 1
	}
	return 0
}

// serveConformanceUpstream serves the reference upstream on a loopback
// address until stop is called.
func serveConformanceUpstream(addr string) (*conformance.Upstream, func(), error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, nil, err
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return nil, nil, fmt.Errorf("%s is not a loopback address", addr)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	up := conformance.NewUpstream()
	srv := &http.Server{Handler: up, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }()
	return up, func() { _ = srv.Close() }, nil
}

// postHook POSTs to a store-down or store-up URL and wants a 2xx.
func postHook(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	_ = resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return errors.New("POST " + url + ": " + resp.Status)
	}
	return nil
}
