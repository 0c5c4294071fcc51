package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/idem-dev/idem/server"
)

const ledgerUsage = `Usage:
  PROG ledger status
  PROG ledger acknowledge-rollback --yes [--by NAME]

status prints the fencing token source of the store named by
IDEM_DATABASE_URL and the ledger rollbacks recorded and not yet
acknowledged.

A replica that finds the token source below a token it saw issued — the
database went back in time (a failover to a standby that was behind, an
older copy restored) and lost acknowledged writes — refuses every key write
and GET /readyz with 503 store_unavailable, and records the rollback in the
database so every replica refuses too. Check what was lost first (the
replicas' "LEDGER ROLLBACK DETECTED" log lines name the tokens; keys
completed in the lost stretch will run again when claimed), then run
acknowledge-rollback --yes: it marks the rollbacks acknowledged (by --by,
default $USER) and moves the token source past every token they name, so no
token given out before is given out again. The replicas take writes again
at their next check (IDEM_LEDGER_CHECK_INTERVAL). See the operating docs
(/docs/operating/#high-availability).`

func runLedger(ctx context.Context, e env, args []string) int {
	if _, code, ok := e.groupHelp(args, ledgerUsage); ok {
		return code
	}
	sub := args[0]
	if sub != "status" && sub != "acknowledge-rollback" {
		fmt.Fprintf(e.stderr, "%s: unknown ledger command %q (want status or acknowledge-rollback)\n", e.prog, sub)
		return 2
	}
	fs := flag.NewFlagSet("ledger "+sub, flag.ContinueOnError)
	var yes *bool
	var by *string
	if sub == "acknowledge-rollback" {
		yes = fs.Bool("yes", false, "acknowledge: the lost writes were checked")
		who := e.getenv("USER")
		if who == "" {
			who = "cli"
		}
		by = fs.String("by", who, "who acknowledges, for the record")
	}
	cfg, done, code := loadConfigNoArgs(e, fs, settingsUsage(e, fs, ledgerUsage), args[1:], storeSettings...)
	if done {
		return code
	}
	if yes != nil && !*yes {
		fmt.Fprintf(e.stderr, "%s: ledger acknowledge-rollback needs --yes: acknowledged writes were lost, check them first (see --help)\n", e.prog)
		return 2
	}
	ctx, store, closeStore, err := openCommandStore(ctx, cfg)
	if err != nil {
		return fail(e, "%v", err)
	}
	defer closeStore()
	src := store.Ledger()
	if src == nil {
		return fail(e, "this store keeps no ledger rollback records")
	}
	if sub == "status" {
		st, err := src.LedgerState(ctx)
		if err != nil {
			return fail(e, "ledger status: %s", describe(err))
		}
		return printJSON(e, map[string]any{
			"source_token":    st.SourceToken,
			"open_rollbacks":  st.OpenRollbacks,
			"open_seen_token": st.OpenSeenToken,
		})
	}
	acked, source, err := server.AcknowledgeLedgerRollback(ctx, store, *by)
	if err != nil {
		return fail(e, "ledger acknowledge-rollback: %s", describe(err))
	}
	// The audit line: who acknowledged which rollbacks, on stderr beside
	// the JSON answer; the rows keep it too (acknowledged_at, _by).
	audit := slog.New(slog.NewJSONHandler(e.stderr, nil))
	list := make([]map[string]any, 0, len(acked))
	for _, r := range acked {
		audit.Warn("ledger rollback acknowledged", "rollback_id", r.ID, "replica", r.Replica,
			"seen_token", r.SeenToken, "source_token", r.SourceToken, "detected_at", r.DetectedAt, "by", r.AcknowledgedBy,
			"host", hostname())
		list = append(list, map[string]any{
			"id": r.ID, "replica": r.Replica, "seen_token": r.SeenToken, "source_token": r.SourceToken,
			"detected_at":     r.DetectedAt.UTC().Format(time.RFC3339Nano),
			"acknowledged_at": r.AcknowledgedAt.UTC().Format(time.RFC3339Nano),
			"acknowledged_by": r.AcknowledgedBy,
		})
	}
	if len(acked) == 0 {
		fmt.Fprintln(e.stderr, "no ledger rollback to acknowledge")
	}
	return printJSON(e, map[string]any{"acknowledged": list, "source_token": source})
}

func hostname() string {
	h, _ := os.Hostname()
	return h
}
