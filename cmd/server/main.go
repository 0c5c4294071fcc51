// Command server is the idem binary: the idempotency service and its
// operator tools.
//
//	server [serve] [flags]     run the HTTP service (the default)
//	server gateway             run the Idempotency-Key gateway in front of an HTTP API
//	server conformance         check any API's Idempotency-Key behaviour over HTTP
//	server migrate             run the database migrations and exit
//	server token               mint an HS256 token
//	server tenant create|list|set|delete
//	server ledger status|acknowledge-rollback
//	server config              print the effective configuration, secrets redacted
//	server healthcheck         exit 0 when the local service answers /healthz
//
// Every setting is an environment variable (IDEM_…) and a flag; a flag
// overrides its variable. Run `server --help` or `server COMMAND --help`.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// env bundles what a command needs from the process.
type env struct {
	prog   string
	getenv func(string) string
	stdout io.Writer
	stderr io.Writer
}

// expand puts the program name in place of PROG in a usage text.
func (e env) expand(text string) string {
	return strings.ReplaceAll(text, "PROG", e.prog)
}

// groupHelp answers a command group (keys, ledger, tenant, webhooks)
// called for help or without a subcommand: its usage on stdout (exit 0)
// for help, on stderr (exit 2) without a subcommand; ok is false when args
// name a subcommand. w is where the usage went, for a line more.
func (e env) groupHelp(args []string, usage string) (w io.Writer, code int, ok bool) {
	if len(args) > 0 && args[0] != "-h" && args[0] != "--help" && args[0] != "help" {
		return nil, 0, false
	}
	w = e.stdout
	if len(args) == 0 {
		w, code = e.stderr, 2
	}
	fmt.Fprintln(w, e.expand(usage))
	return w, code, true
}

// command is one subcommand.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, e env, args []string) int
}

func commands() []command {
	return []command{
		{"serve", "run the HTTP service (the default command)", runServe},
		{"gateway", "run the Idempotency-Key gateway in front of an HTTP API: gateway --upstream URL --tenant ID", runGateway},
		{"conformance", "check any API's Idempotency-Key behaviour over HTTP: conformance --target URL", runConformance},
		{"migrate", "run the database migrations and exit", runMigrate},
		{"token", "mint an HS256 token: token --tenant ID --scope \"keys:write\" --ttl 24h", runToken},
		{"tenant", "manage tenants in the store: tenant create|list|set|delete", runTenant},
		{"webhooks", "manage a tenant's signed webhook endpoints: webhooks create|list|set|delete|test|deliveries --tenant ID", runWebhooks},
		{"keys", "resolve an orphaned key by hand: keys release|complete|review --tenant ID --key KEY --token N", runKeys},
		{"ledger", "after the database went back in time: ledger status | acknowledge-rollback --yes", runLedger},
		{"config", "print the effective configuration with secrets redacted", runConfig},
		{"healthcheck", "exit 0 when the local service answers GET /healthz (for container HEALTHCHECKs)", runHealthcheck},
	}
}

// run executes the command line and returns the exit code: 0 on success,
// 1 on a runtime failure, 2 on a usage error.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	e := env{prog: progName(), getenv: getenv, stdout: stdout, stderr: stderr}
	if len(args) > 0 {
		switch args[0] {
		case "help", "-h", "-help", "--help":
			printUsage(e)
			return 0
		}
		for _, c := range commands() {
			if args[0] == c.name {
				return c.run(ctx, e, args[1:])
			}
		}
		if args[0] != "" && args[0][0] != '-' {
			fmt.Fprintf(stderr, "%s: unknown command %q\n\n", e.prog, args[0])
			printUsage(env{prog: e.prog, stdout: stderr})
			return 2
		}
	}
	return runServe(ctx, e, args)
}

func progName() string {
	if len(os.Args) == 0 {
		return "server"
	}
	return filepath.Base(os.Args[0])
}

func printUsage(e env) {
	fmt.Fprintf(e.stdout, `%[1]s is idem, an idempotency ledger for backends that must not repeat unsafe writes.

Usage:
  %[1]s [serve] [flags]    run the HTTP service (the default command)
  %[1]s COMMAND [flags]

Commands:
`, e.prog)
	for _, c := range commands() {
		fmt.Fprintf(e.stdout, "  %-12s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(e.stdout, `
Every setting is an environment variable and a flag; a flag overrides its
variable. With no signing key and the default sqlite: store the service runs
in development mode: it creates a secret and a "demo" tenant and prints
working tokens.

Run '%[1]s COMMAND --help' for the flags of a command, e.g. '%[1]s serve --help'.
`, e.prog)
}

// parseFlags parses args, allowing positional arguments between flags. It
// prints help to stdout for -h/--help (returning done=true, code 0) and a
// usage error to stderr (done=true, code 2).
func parseFlags(fs *flag.FlagSet, e env, usage func(io.Writer), args []string) (positional []string, done bool, code int) {
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	for {
		err := fs.Parse(args)
		if errors.Is(err, flag.ErrHelp) {
			usage(e.stdout)
			return nil, true, 0
		}
		if err != nil {
			fmt.Fprintf(e.stderr, "%s: %v\nRun '%s %s --help' for usage.\n", e.prog, err, e.prog, fs.Name())
			return nil, true, 2
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return positional, false, 0
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}

// printFlags writes one entry per flag of fs: name, default and help.
func printFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		def := ""
		if f.DefValue != "" {
			def = fmt.Sprintf(" (default %q)", f.DefValue)
		}
		fmt.Fprintf(w, "  --%s%s\n        %s\n", f.Name, def, f.Usage)
	})
}

func fail(e env, format string, args ...any) int {
	fmt.Fprintf(e.stderr, "%s: "+format+"\n", append([]any{e.prog}, args...)...)
	return 1
}
