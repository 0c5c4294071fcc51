package main

// A storm worker: one process of the storm test's fleet (storm.go). The
// coordinator (`loadgen storm`) starts several, of all three SDKs: `loadgen
// storm-worker` for Go, testkit/storm/worker.py for Python and
// testkit/storm/worker.mjs for Node. Every worker speaks the same small
// protocol, so the coordinator merges them second by second:
//
//   - its configuration is the JSON object in the environment variable
//     STORM_WORKER (workerConfig): the server's URL and the tenant's token,
//     its callers (index, index+stride, … below total: caller i starts its
//     first call at period·i/total, so the fleet's calls are evenly spread
//     and every SDK's callers spread over the whole period), the period
//     between two calls of one caller, how long to start calls for, and
//     the side-effect sink's URL;
//   - once its clients are made it writes "ready" on a line of stdout, and
//     reads one line of stdin: the run's start, Unix milliseconds, the
//     same for every worker (second 0 of the report);
//   - each caller makes one logical call (claim → work → complete, the
//     SDK's run/Do with the interactive preset, a client of its own) per
//     period on a fresh key; the work is one POST to the sink, the ledger
//     of side effects, whose counts per key find the duplicates;
//   - when every call it started has ended it writes one JSON line on
//     stdout (workerResult): per second since the start, the counts of
//     second (calls, attempts, fleet and per-process refusals, successes,
//     side effects), their totals, and the failed calls by what ended
//     them, and exits.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-dev/idem/client"
)

// workerConfig is STORM_WORKER.
type workerConfig struct {
	Base     string `json:"base"`
	Token    string `json:"token"`
	Index    int    `json:"index"`
	Stride   int    `json:"stride"`
	Total    int    `json:"total"`
	PeriodMS int64  `json:"period_ms"`
	RunMS    int64  `json:"run_ms"`
	Seconds  int    `json:"seconds"` // how many seconds to report
	Sink     string `json:"sink"`
}

// workerResult is a worker's last line.
type workerResult struct {
	SDK     string `json:"sdk"`
	Callers int    `json:"callers"`
	LateMS  int64  `json:"late_ms"` // how late after the start its first second began
	// Errors counts the logical calls that failed by what ended them
	// (the error's type, code or cause, and give-up).
	Errors  map[string]int64 `json:"errors"`
	Seconds []second         `json:"seconds"`
	// Totals is the sum of every second, those past the reported ones
	// included (the calls started last end after them).
	Totals second `json:"totals"`
}

func readWorkerConfig() (workerConfig, error) {
	var c workerConfig
	if err := json.Unmarshal([]byte(os.Getenv("STORM_WORKER")), &c); err != nil {
		return c, fmt.Errorf("STORM_WORKER: %w", err)
	}
	if c.Base == "" || c.Sink == "" || c.Index < 0 || c.Stride <= c.Index || c.Total <= c.Index || c.PeriodMS <= 0 || c.RunMS <= 0 || c.Seconds <= 0 {
		return c, errors.New("STORM_WORKER: incomplete")
	}
	return c, nil
}

// awaitStart writes "ready" and reads the start time.
func awaitStart(stdin io.Reader, stdout io.Writer) (time.Time, error) {
	fmt.Fprintln(stdout, "ready")
	line, err := bufio.NewReader(stdin).ReadString('\n')
	if err != nil {
		return time.Time{}, fmt.Errorf("reading the start: %w", err)
	}
	ms, err := strconv.ParseInt(strings.TrimSpace(line), 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("the start %q: %w", line, err)
	}
	return time.UnixMilli(ms), nil
}

// counters is one second of a worker, counted concurrently.
type counters struct {
	calls, ok, attempts, first, fleet, signal, proc, effects atomic.Int64
}

func (c *counters) second() second {
	return second{Calls: c.calls.Load(), Succeeded: c.ok.Load(), Attempts: c.attempts.Load(), First: c.first.Load(),
		FleetRefused: c.fleet.Load(), FleetSignal: c.signal.Load(), ProcRefused: c.proc.Load(), SideEffects: c.effects.Load()}
}

func runStormWorker(ctx context.Context, stdin io.Reader, stdout, stderr io.Writer) int {
	cfg, err := readWorkerConfig()
	if err != nil {
		fmt.Fprintf(stderr, "loadgen storm-worker: %v\n", err)
		return 2
	}
	res, err := stormWorker(ctx, cfg, stdin, stdout)
	if err != nil {
		fmt.Fprintf(stderr, "loadgen storm-worker: %v\n", err)
		return 1
	}
	b, _ := json.Marshal(res)
	fmt.Fprintf(stdout, "%s\n", b)
	return 0
}

func stormWorker(ctx context.Context, cfg workerConfig, stdin io.Reader, stdout io.Writer) (workerResult, error) {
	period := time.Duration(cfg.PeriodMS) * time.Millisecond
	secs := make([]counters, cfg.Seconds+60)
	var start time.Time
	at := func() int { return max(0, min(int(time.Since(start)/time.Second), len(secs)-1)) }

	// One transport for all (a process's sockets are not the point); one
	// client each, so each caller has its own per-process retry budget.
	hc := &http.Client{Transport: client.NewTransport()}
	sink := &http.Client{Transport: client.NewTransport(), Timeout: 10 * time.Second}
	hook := func(info client.AttemptInfo) {
		s := &secs[at()]
		s.attempts.Add(1)
		if info.Attempt == 1 {
			s.first.Add(1)
		}
		switch info.GiveUp {
		case "fleet-budget":
			s.fleet.Add(1)
		case "fleet-signal":
			s.signal.Add(1)
		case "budget":
			s.proc.Add(1)
		}
	}
	var callers []int
	for i := cfg.Index; i < cfg.Total; i += cfg.Stride {
		callers = append(callers, i)
	}
	clients := make([]*client.Client, 0, len(callers))
	for range callers {
		c, err := client.New(cfg.Base, client.WithToken(cfg.Token), client.WithHTTPClient(hc), client.Interactive(), client.WithAttemptHook(hook))
		if err != nil {
			return workerResult{}, err
		}
		clients = append(clients, c)
	}
	start, err := awaitStart(stdin, stdout)
	if err != nil {
		return workerResult{}, err
	}
	time.Sleep(time.Until(start))
	late := time.Since(start).Milliseconds()
	runCtx, cancel := context.WithDeadline(ctx, start.Add(time.Duration(cfg.RunMS)*time.Millisecond))
	defer cancel()
	var wg sync.WaitGroup
	var errMu sync.Mutex
	failures := map[string]int64{}
	for j, c := range clients {
		i := callers[j]
		offset := time.Duration(int64(period) * int64(i) / int64(cfg.Total))
		wg.Go(func() {
			t := time.NewTimer(time.Until(start.Add(offset)))
			defer t.Stop()
			for seq := 0; ; seq++ {
				select {
				case <-runCtx.Done():
					return
				case <-t.C:
				}
				t.Reset(period)
				sec := at()
				secs[sec].calls.Add(1)
				key := fmt.Sprintf("storm-go-%d-%d", i, seq)
				wg.Go(func() {
					_, err := c.Do(context.WithoutCancel(ctx), key, client.Request{Operation: "POST /orders", Payload: map[string]any{"caller": i, "seq": seq}},
						func(ctx context.Context, _ *client.Claim) (client.Response, error) {
							if err := sideEffect(ctx, sink, cfg.Sink, key); err != nil {
								return client.Response{}, err
							}
							secs[at()].effects.Add(1)
							return client.Response{Status: 201, Body: []byte(`{"ok":true}`)}, nil
						})
					if err == nil {
						secs[sec].ok.Add(1)
						return
					}
					why := fmt.Sprintf("%T:%s", err, client.ErrorCode(err))
					var fe *client.FleetBudgetError
					if errors.As(err, &fe) {
						why += ":" + fe.Call + ":" + fe.Cause
					}
					errMu.Lock()
					failures[why]++
					errMu.Unlock()
				})
			}
		})
	}
	wg.Wait()
	res := workerResult{SDK: "go", Callers: len(clients), LateMS: late, Errors: failures}
	for i := range secs {
		x := secs[i].second()
		if i < cfg.Seconds {
			res.Seconds = append(res.Seconds, x)
		}
		res.Totals.add(x)
	}
	return res, nil
}

// sideEffect records the work of key in the sink: the ledger the
// coordinator reads the duplicates from.
func sideEffect(ctx context.Context, hc *http.Client, sink, key string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, sink+"/effect/"+key, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("sink: status %d", resp.StatusCode)
	}
	return nil
}
