// Command listenerserve is `idem serve` for the fault checker's
// listenerdown kind: the real server wiring (server.Start, its settings
// from the environment and flags as serve reads them), its store wrapped
// by testkit/listenerdown. SIGUSR1 holds the key-event subscriptions down
// — each blocks until SIGUSR2, then fails store_unavailable, as
// PostgreSQL's does while its LISTEN connection reconnects — and SIGUSR2
// lets them through again; the store itself keeps working. The runner
// starts it instead of the idem binary only when the kind is on. Test-only.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/server"
	"github.com/idem-dev/idem/testkit/listenerdown"
)

func main() {
	fs := flag.NewFlagSet("listenerserve", flag.ExitOnError)
	finish := server.Flags(fs, os.Getenv)
	_ = fs.Parse(os.Args[1:])
	cfg, err := finish()
	if err != nil {
		fmt.Fprintln(os.Stderr, "listenerserve: invalid configuration:", err)
		os.Exit(2)
	}
	logger := server.NewLogger(cfg, os.Stderr)
	sw := &listenerdown.Switch{}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGUSR1, syscall.SIGUSR2)
	go func() {
		for s := range sigs {
			if s == syscall.SIGUSR1 {
				sw.Down()
				logger.Info("listenerdown: key-event subscriptions held down")
			} else {
				sw.Up()
				logger.Info("listenerdown: key-event subscriptions let through")
			}
		}
	}()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	srv, err := server.Start(ctx, cfg, logger, server.WithDriver(func(d idem.Driver) idem.Driver { return listenerdown.Wrap(d, sw) }))
	if err != nil {
		logger.Error("start failed", "err", err)
		os.Exit(1)
	}
	if err := srv.Listen(); err != nil {
		_ = srv.Close()
		logger.Error("start failed", "err", err)
		os.Exit(1)
	}
	if err := srv.Run(ctx); err != nil {
		logger.Error("stopped with an error", "err", err)
		os.Exit(1)
	}
}
