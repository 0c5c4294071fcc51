package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// nodeConn connects to a data node's idem database as the cluster's
// superuser (trust on loopback, the throwaway cluster of the script).
func (h *harness) nodeConn(ctx context.Context, name string) (*pgx.Conn, error) {
	return pgx.Connect(ctx, "postgres://postgres@"+h.cfg.nodes[name]+"/idem?sslmode=disable&connect_timeout=2")
}

// stopWAL freezes the primary's walsenders (SIGSTOP): the standbys
// receive nothing more while the primary, asynchronous, keeps committing.
func (h *harness) stopWAL(ctx context.Context, primary string) (int, error) {
	c, err := h.nodeConn(ctx, primary)
	if err != nil {
		return 0, err
	}
	defer c.Close(ctx)
	rows, err := c.Query(ctx, `select pid from pg_stat_replication`)
	if err != nil {
		return 0, err
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return 0, err
	}
	if len(pids) == 0 {
		return 0, fmt.Errorf("no walsender on %s", primary)
	}
	for _, pid := range pids {
		if err := syscall.Kill(int(pid), syscall.SIGSTOP); err != nil {
			return 0, fmt.Errorf("SIGSTOP walsender %d: %w", pid, err)
		}
	}
	return len(pids), nil
}

// runAsync is the asynchronous case (issue 25, item 2's proof): the
// standbys made to lag, the primary lost, a standby promoted without the
// last acknowledged writes; idem's rollback check must stop writes.
func (h *harness) runAsync(ctx context.Context) bool {
	primary, err := h.waitNodes(ctx, 3*time.Minute, "primary", "secondary", "secondary")
	if err != nil {
		fmt.Println("failover:", err)
		return false
	}
	if _, err := h.waitMetric(ctx, `idem_store_durability{mode="asynchronous"}`, 90*time.Second, func(v float64) bool { return v == 1 }); err != nil {
		h.violate("idem does not report the asynchronous standbys: %v", err)
	}
	readyCtx, stopReady := context.WithCancel(ctx)
	defer stopReady()
	go h.pollReady(readyCtx)

	load, stopLoad := context.WithCancel(ctx)
	finish, stopFinish := context.WithCancel(ctx)
	defer stopFinish()
	wg := h.writers(load, finish)
	pause(ctx, h.cfg.settle)

	senders, err := h.stopWAL(ctx, primary)
	if err != nil {
		h.violate("stop the standbys' WAL: %v", err)
		stopLoad()
		stopFinish()
		wg.Wait()
		return false
	}
	lagFrom := h.maxAcked.Load()
	lagAt := time.Now()
	fmt.Printf("== %d walsenders of %s stopped at token %d; writes go on, acknowledged by the primary alone\n", senders, primary, lagFrom)
	pause(ctx, 3*time.Second)
	seen := h.maxAcked.Load()
	lag := time.Since(lagAt)
	fmt.Printf("== kill the primary %s's machine: the standbys are %.1fs (%d tokens) behind\n", primary, lag.Seconds(), seen-lagFrom)
	tKill := time.Now()
	if err := h.ctl(ctx, "kill", primary); err != nil {
		h.violate("kill %s: %v", primary, err)
	}
	np, err := h.waitPrimary(ctx, primary, 2*time.Minute)
	if err != nil {
		h.violate("%v", err)
		stopLoad()
		stopFinish()
		wg.Wait()
		return false
	}
	fmt.Printf("== %s promoted %.1fs after the kill\n", np.name, time.Since(tKill).Seconds())
	_, detectErr := h.waitMetric(ctx, "idem_ledger_rollback_detected", time.Minute, func(v float64) bool { return v == 1 })
	detectedAfter := time.Since(tKill)
	if detectErr != nil {
		h.violate("the ledger rollback check did not fire after a failover that lost writes: %v", detectErr)
	}
	// The writers retry the 503s; stop them.
	stopLoad()
	stopFinish()
	wg.Wait()

	// What the new primary lost: acknowledged completes it does not hold.
	c, err := h.nodeConn(ctx, np.name)
	if err != nil {
		h.violate("connect to %s: %v", np.name, err)
		return false
	}
	defer c.Close(ctx)
	h.mu.Lock()
	var completed []string
	byName := map[string]*key{}
	for _, k := range h.keys {
		if k.completed {
			completed = append(completed, k.name)
			byName[k.name] = k
		}
	}
	h.mu.Unlock()
	rows, err := c.Query(ctx, `select key from idempotency_keys where tenant_id = 'failover' and state = 'completed' and key = any($1)`, completed)
	held := map[string]bool{}
	if err == nil {
		var names []string
		names, err = pgx.CollectRows(rows, pgx.RowTo[string])
		for _, n := range names {
			held[n] = true
		}
	}
	var source int64
	if err == nil {
		err = c.QueryRow(ctx, `select last_value from fencing_tokens`).Scan(&source)
	}
	if err != nil {
		h.violate("read %s: %v", np.name, err)
		return false
	}
	var lost []*key
	for _, n := range completed {
		if !held[n] {
			lost = append(lost, byName[n])
		}
	}
	fmt.Printf("== %s holds %d of %d acknowledged completes: %d lost; its token source is at %d, %d below the highest token seen (%d)\n",
		np.name, len(completed)-len(lost), len(completed), len(lost), source, seen-source, seen)
	if len(lost) == 0 || source >= h.maxAcked.Load() {
		h.violate("the failover lost nothing (lost %d, source %d, seen %d): the standbys did not lag, no proof", len(lost), source, h.maxAcked.Load())
	}

	// While stopped: readiness 503; a fresh claim, a lost key's claim and a
	// complete answer 503 store_unavailable — never the 201 that would run
	// a lost key again.
	refusals := 0
	if a := h.getReady(ctx); a != http.StatusServiceUnavailable {
		h.violate("/readyz answers %d after the rollback, want 503", a)
	}
	check := func(what string, a answer) {
		if a.status == http.StatusServiceUnavailable && a.code == "store_unavailable" && strings.Contains(a.detail, "back in time") {
			refusals++
			return
		}
		h.violate("%s after the rollback answered %s (want 503 store_unavailable, the rollback's detail)", what, a)
	}
	check("a fresh claim", h.do(ctx, http.MethodPost, "/v1/keys/"+h.prefix+"-after/claim", claimBody("", 0), nil))
	nLost := min(len(lost), 50)
	for _, k := range lost[:nLost] {
		check("the claim of lost key "+k.name, h.do(ctx, http.MethodPost, "/v1/keys/"+k.name+"/claim", claimBody("", 0), nil))
	}
	if len(lost) > 0 {
		k := lost[0]
		check("a complete", h.do(ctx, http.MethodPost, "/v1/keys/"+k.name+"/complete", completeBody(k.token, k.body), nil))
	}
	detections, _ := h.metric(ctx, "idem_ledger_rollback_detections_total")

	// The operator checks and acknowledges; writes come back with tokens
	// above every token seen.
	ack := exec.CommandContext(ctx, h.cfg.idem, "ledger", "acknowledge-rollback", "--yes", "--by", "scripts/failover --async")
	ack.Stdout, ack.Stderr = os.Stdout, os.Stderr
	if err := ack.Run(); err != nil {
		h.violate("ledger acknowledge-rollback: %v", err)
	}
	var after answer
	actx, acancel := context.WithTimeout(ctx, time.Minute)
	for actx.Err() == nil {
		after = h.do(actx, http.MethodPost, "/v1/keys/"+h.prefix+"-after-ack/claim", claimBody("", 0), nil)
		if after.status == http.StatusCreated {
			break
		}
		pause(actx, 100*time.Millisecond)
	}
	acancel()
	if after.status != http.StatusCreated || after.token <= seen {
		h.violate("after the acknowledgement a fresh claim answered %s with token %d (want 201 above %d)", after, after.token, seen)
	}
	ready := h.getReady(ctx)
	if ready != http.StatusOK {
		h.violate("/readyz answers %d after the acknowledgement", ready)
	}

	fmt.Printf("\n== figures (asynchronous: number_sync_standbys 0, no standby in the replication quorum)\n")
	fmt.Printf("requests: %d by %d writers; standbys %.1fs behind at the kill\n", h.requests.Load(), h.cfg.writers, lag.Seconds())
	fmt.Printf("lost by the failover: %d acknowledged completes (each would run again); %d acknowledged claims whose complete found no key (404); %d tokens (%d..%d) would be handed out again\n",
		len(lost), h.claimsLost.Load(), seen-source, source+1, seen)
	fmt.Printf("rollback detected: %v (detections %v), %.1fs after the kill; refused while stopped: %d of %d writes (503 store_unavailable), /readyz 503\n",
		detectErr == nil, detections, detectedAfter.Seconds(), refusals, nLost+2)
	fmt.Printf("after acknowledge-rollback: a fresh claim 201 with token %d (> %d), /readyz %d\n", after.token, seen, ready)
	fmt.Printf("RESULT mode=async requests=%d lag_s=%.1f lost=%d tokens_lost=%d detected=%t refused=%d violations=%d\n",
		h.requests.Load(), lag.Seconds(), len(lost), seen-source, detectErr == nil, refusals, len(h.violations))
	return len(h.violations) == 0
}

// getReady is one GET /readyz.
func (h *harness) getReady(ctx context.Context) int {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, h.cfg.url+"/readyz", nil)
	if err != nil {
		return 0
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}
