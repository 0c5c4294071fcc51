package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/idem-dev/idem/conformance"
)

func runConformance(ctx context.Context, e env, args []string) int {
	fs := flag.NewFlagSet("conformance", flag.ContinueOnError)
	target := fs.String("target", "", "base URL of the API under test, e.g. http://localhost:8081")
	path := fs.String("path", "/orders", "unsafe endpoint: performs one side effect per execution, answers 2xx, honours ?delay_ms=N")
	otherPath := fs.String("other-path", "", "another path the unsafe method is served on, ideally of the same route as --path (default: --path + \"/other\")")
	method := fs.String("method", "POST", "method of the unsafe endpoint")
	counter := fs.String("counter", "/count", "side-effect counter: GET answers {\"count\": N}")
	noCounter := fs.Bool("no-counter", false, "the target has no counter: skip the side-effect checks")
	scenarios := fs.String("scenarios", "", "comma-separated scenarios to run (default: all)")
	timeout := fs.Duration("timeout", 2*time.Minute, "bound of the whole run")
	usage := func(w io.Writer) {
		fmt.Fprint(w, e.expand(`Usage: PROG conformance --target URL [flags]

Runs black-box Idempotency-Key conformance scenarios over HTTP against any
API that claims support (draft-ietf-httpapi-idempotency-key-header, Stripe's
behaviour) and prints a report ending in "N passed, M failed". Exits 1 when
a scenario fails. Scenarios:
`))
		for _, s := range conformance.Scenarios() {
			fmt.Fprintf(w, "  %-22s %s\n", s.Name, s.Description)
		}
		fmt.Fprint(w, "\nstore_unavailable needs a target that can simulate a store failure; from\nthe command line it is skipped.\n\nFlags:\n")
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
	rep := conformance.Run(ctx, conformance.Options{
		Target: *target, Path: *path, OtherPath: *otherPath, Method: strings.ToUpper(*method), Counter: *counter, NoCounter: *noCounter, Scenarios: names,
	})
	rep.Write(e.stdout)
	if rep.Failed() > 0 {
		return 1
	}
	return 0
}
