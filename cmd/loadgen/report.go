package main

import (
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"time"
)

// report is the outcome of a run.
type report struct {
	cfg     config
	elapsed time.Duration
	tally   *tally
}

// percentile returns the nearest-rank p-th percentile (0 < p ≤ 100) of
// sorted, or 0 for an empty slice.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}

// checkContention returns one line per key that broke the contention
// invariant: every key that got a decided answer (200, 201 or 409
// request_in_flight) was won by exactly one claim (201).
func checkContention(wins map[string]int, decided map[string]bool) []string {
	keys := map[string]bool{}
	for k := range wins {
		keys[k] = true
	}
	for k := range decided {
		keys[k] = true
	}
	var bad []string
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		switch n := wins[k]; {
		case n > 1:
			bad = append(bad, fmt.Sprintf("key %s: %d claims answered 201 (want exactly 1)", k, n))
		case n == 0 && decided[k]:
			bad = append(bad, fmt.Sprintf("key %s: answered but never won by a claim (0 × 201, want exactly 1)", k))
		}
	}
	return bad
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d)/float64(time.Millisecond)) }

// print writes the report and returns the exit code: 0, or 1 when a response
// was unexpected or the contention invariant broke.
func (r *report) print(w io.Writer) int {
	t := r.tally
	var requests int64
	all := []time.Duration{}
	kinds := slices.Sorted(maps.Keys(t.latencies))
	for _, k := range kinds {
		slices.Sort(t.latencies[k])
		requests += int64(len(t.latencies[k]))
		all = append(all, t.latencies[k]...)
	}
	slices.Sort(all)
	secs := r.elapsed.Seconds()
	rps := float64(requests) / secs

	fmt.Fprintf(w, "loadgen: mode=%s concurrency=%d url=%s elapsed=%s\n", r.cfg.mode, r.cfg.concurrency, r.cfg.baseURL.Redacted(), r.elapsed.Round(time.Millisecond))
	fmt.Fprintf(w, "iterations   %d (%.1f/s)\n", t.iterations, float64(t.iterations)/secs)
	fmt.Fprintf(w, "requests     %d\n", requests)
	fmt.Fprintf(w, "throughput   %.1f req/s\n", rps)
	fmt.Fprintln(w, "responses:")
	for _, k := range slices.Sorted(maps.Keys(t.outcomes)) {
		fmt.Fprintf(w, "  %-34s %d\n", k, t.outcomes[k])
	}
	fmt.Fprintf(w, "errors (unexpected responses): %d\n", t.unexpected)
	fmt.Fprintf(w, "latency ms   %-10s %8s %8s %8s %8s %8s\n", "kind", "n", "p50", "p90", "p99", "max")
	row := func(name string, d []time.Duration) {
		fmt.Fprintf(w, "             %-10s %8d %8s %8s %8s %8s\n", name, len(d),
			ms(percentile(d, 50)), ms(percentile(d, 90)), ms(percentile(d, 99)), ms(percentile(d, 100)))
	}
	for _, k := range kinds {
		row(k, t.latencies[k])
	}
	if len(kinds) > 1 {
		row("all", all)
	}

	code := 0
	if t.unexpected > 0 {
		fmt.Fprintf(w, "ERROR: %d responses were not what mode %s expects (see responses above)\n", t.unexpected, r.cfg.mode)
		code = 1
	}
	violations := 0
	if r.cfg.mode == modeContention {
		winners := 0
		for _, n := range t.wins {
			winners += n
		}
		fmt.Fprintf(w, "contention: %d keys, %d decided, %d 201s in total\n", r.cfg.keys, len(t.decided), winners)
		if r.cfg.keys <= 32 {
			for _, k := range slices.Sorted(maps.Keys(t.decided)) {
				fmt.Fprintf(w, "  %-30s 201s=%d\n", k, t.wins[k])
			}
		}
		bad := checkContention(t.wins, t.decided)
		violations = len(bad)
		for _, b := range bad {
			fmt.Fprintf(w, "INVARIANT VIOLATION: %s\n", b)
		}
		if violations == 0 {
			fmt.Fprintln(w, "contention invariant holds: exactly one 201 per key")
		} else {
			code = 1
		}
	}
	fmt.Fprintf(w, "RESULT mode=%s concurrency=%d requests=%d rps=%.1f iterations_per_s=%.1f p50_ms=%s p90_ms=%s p99_ms=%s max_ms=%s errors=%d violations=%d",
		r.cfg.mode, r.cfg.concurrency, requests, rps, float64(t.iterations)/secs,
		ms(percentile(all, 50)), ms(percentile(all, 90)), ms(percentile(all, 99)), ms(percentile(all, 100)),
		t.unexpected, violations)
	// Each kind's p99 too (p99_claim_ms=…), so a script can compare the
	// claim tail alone.
	for _, k := range kinds {
		fmt.Fprintf(w, " p99_%s_ms=%s", k, ms(percentile(t.latencies[k], 99)))
	}
	fmt.Fprintln(w)
	return code
}
