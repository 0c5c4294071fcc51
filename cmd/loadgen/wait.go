package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// modeWait measures the wake-up of claims held on a key in flight: per
// round, one claim holds a fresh key (lease 60 s), -waiters claims of the
// same key with wait_seconds are sent, split evenly over -url and -url2 (a
// second replica on the same database); once every replica reports them
// held (its idem_claim_waiters gauge), the holder completes the key and
// each waiter's latency is taken from the moment the complete was sent to
// its answer (a 200 replay expected). The baseline of the same round is
// the same number of plain claims of the now completed key, all sent at
// once: what answering that many replays costs without any waiting.
const modeWait = "wait"

// Bounds of the wait mode.
const (
	maxWaiters     = 4096
	maxWaitRounds  = 20
	waitHeldWithin = 30 * time.Second
)

// waitRound is one round's observations.
type waitRound struct {
	wake, baseline []time.Duration // sorted
	complete       time.Duration
	outcomes       map[string]int64
	unexpected     int64
}

// waitReport is a wait run.
type waitReport struct {
	cfg    config
	rounds []waitRound
}

// waitTarget is one replica: a loader on its URL and its metrics URL.
type waitTarget struct {
	l       *loader
	metrics string
}

// tally counts the outcomes of a round's claims under prefix (and the
// unexpected ones, not 200) and returns how long after since each answered.
func (wr *waitRound) tally(prefix string, results []result, answers []time.Time, since time.Time) []time.Duration {
	var waits []time.Duration
	for i, res := range results {
		waits = append(waits, answers[i].Sub(since))
		wr.outcomes[prefix+res.label()]++
		if !is(200)(res) {
			wr.unexpected++
		}
	}
	return waits
}

func runWait(ctx context.Context, cfg config) (*waitReport, error) {
	urls := []*url.URL{cfg.baseURL}
	if cfg.baseURL2 != nil {
		urls = append(urls, cfg.baseURL2)
	}
	var targets []waitTarget
	for _, u := range urls {
		c := cfg
		c.baseURL = u
		c.concurrency = cfg.waiters + 2
		c.timeout = time.Duration(cfg.waitSeconds)*time.Second + 15*time.Second
		l, err := newLoader(c)
		if err != nil {
			return nil, err
		}
		defer l.client.CloseIdleConnections()
		m := *u
		m.Path += "/metrics"
		targets = append(targets, waitTarget{l: l, metrics: m.String()})
	}
	holder := targets[0].l
	waitBody := fmt.Appendf(nil, `{"operation":"POST /v1/payments","request":{"amount":1000,"currency":"usd"},"wait_seconds":%d}`, cfg.waitSeconds)
	holdBody := []byte(`{"operation":"POST /v1/payments","request":{"amount":1000,"currency":"usd"},"lease_seconds":60}`)

	rep := &waitReport{cfg: cfg}
	for round := range cfg.rounds {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		key := fmt.Sprintf("%s-wait-%d", holder.prefix, round)
		r := holder.post(ctx, key, kindClaim, holdBody)
		if r.err != nil || r.status != http.StatusCreated {
			return nil, fmt.Errorf("round %d: the holder's claim got %s, want 201", round, r.label())
		}
		wr := waitRound{outcomes: map[string]int64{}}
		answers := make([]time.Time, cfg.waiters)
		results := make([]result, cfg.waiters)
		var wg sync.WaitGroup
		for i := range cfg.waiters {
			t := targets[i%len(targets)]
			wg.Go(func() {
				results[i] = t.l.post(ctx, key, kindClaim, waitBody)
				answers[i] = time.Now()
			})
		}
		if err := waitHeld(ctx, holder.client, targets, cfg.waiters); err != nil {
			wg.Wait()
			return nil, fmt.Errorf("round %d: %w", round, err)
		}
		t0 := time.Now()
		r = holder.post(ctx, key, kindComplete, completeBody(r.token))
		wr.complete = time.Since(t0)
		if r.err != nil || r.status != http.StatusOK {
			wg.Wait()
			return nil, fmt.Errorf("round %d: complete got %s, want 200", round, r.label())
		}
		wg.Wait()
		wr.wake = wr.tally("waiter ", results, answers, t0)

		// Baseline: as many plain claims of the completed key at once.
		start := make(chan struct{})
		var t1 time.Time
		for i := range cfg.waiters {
			t := targets[i%len(targets)]
			wg.Go(func() {
				<-start
				results[i] = t.l.post(ctx, key, kindClaim, claimBody)
				answers[i] = time.Now()
			})
		}
		t1 = time.Now()
		close(start)
		wg.Wait()
		wr.baseline = wr.tally("baseline ", results, answers, t1)
		slices.Sort(wr.wake)
		slices.Sort(wr.baseline)
		rep.rounds = append(rep.rounds, wr)
	}
	return rep, nil
}

// waitHeld waits until the replicas together report n held claims.
func waitHeld(ctx context.Context, hc *http.Client, targets []waitTarget, n int) error {
	deadline := time.Now().Add(waitHeldWithin)
	held := 0
	for time.Now().Before(deadline) {
		held = 0
		for _, t := range targets {
			v, err := gauge(ctx, hc, t.metrics, "idem_claim_waiters")
			if err != nil {
				return err
			}
			held += int(v)
		}
		if held == n {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return fmt.Errorf("only %d of %d waiters were held after %s (is IDEM_MAX_WAITERS at least %d per replica?)", held, n, waitHeldWithin, n)
}

// gauge reads one unlabelled sample from a Prometheus text endpoint.
func gauge(ctx context.Context, hc *http.Client, u, name string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", u, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("read %s: status %d", u, resp.StatusCode)
	}
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 4<<20))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, fmt.Errorf("read %s: no %s sample (a server without waiting?)", u, name)
}

// print writes the wait report and returns the exit code: 1 when an answer
// was not the expected 200.
func (r *waitReport) print(w io.Writer) int {
	replicas := 1
	if r.cfg.baseURL2 != nil {
		replicas = 2
	}
	fmt.Fprintf(w, "loadgen: mode=%s waiters=%d replicas=%d wait_seconds=%d rounds=%d url=%s\n",
		modeWait, r.cfg.waiters, replicas, r.cfg.waitSeconds, len(r.rounds), r.cfg.baseURL.Redacted())
	fmt.Fprintf(w, "%-6s %-30s %8s %8s %8s %8s\n", "round", "", "n", "p50 ms", "p99 ms", "max ms")
	var wake, base []time.Duration
	var unexpected int64
	outcomes := map[string]int64{}
	for i, rd := range r.rounds {
		fmt.Fprintf(w, "%-6d %-30s %8d %8s %8s %8s\n", i, "woken by one complete", len(rd.wake), ms(percentile(rd.wake, 50)), ms(percentile(rd.wake, 99)), ms(percentile(rd.wake, 100)))
		fmt.Fprintf(w, "%-6s %-30s %8d %8s %8s %8s\n", "", "baseline: replays at once", len(rd.baseline), ms(percentile(rd.baseline, 50)), ms(percentile(rd.baseline, 99)), ms(percentile(rd.baseline, 100)))
		fmt.Fprintf(w, "%-6s %-30s %8s %8s\n", "", "the complete itself", "", ms(rd.complete))
		wake = append(wake, rd.wake...)
		base = append(base, rd.baseline...)
		unexpected += rd.unexpected
		for k, v := range rd.outcomes {
			outcomes[k] += v
		}
	}
	slices.Sort(wake)
	slices.Sort(base)
	fmt.Fprintln(w, "responses:")
	keys := make([]string, 0, len(outcomes))
	for k := range outcomes {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(w, "  %-34s %d\n", k, outcomes[k])
	}
	fmt.Fprintf(w, "RESULT mode=%s waiters=%d replicas=%d rounds=%d wake_p50_ms=%s wake_p99_ms=%s wake_max_ms=%s baseline_p50_ms=%s baseline_p99_ms=%s baseline_max_ms=%s errors=%d\n",
		modeWait, r.cfg.waiters, replicas, len(r.rounds),
		ms(percentile(wake, 50)), ms(percentile(wake, 99)), ms(percentile(wake, 100)),
		ms(percentile(base, 50)), ms(percentile(base, 99)), ms(percentile(base, 100)), unexpected)
	if unexpected > 0 {
		fmt.Fprintf(w, "ERROR: %d answers were not the 200 replay (see responses above)\n", unexpected)
		return 1
	}
	return 0
}
