package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"sync"
	"time"
)

// modeNeighbour measures what a flooding, rate-limited tenant costs a quiet
// one: the quiet tenant (-token) claims fresh keys with -concurrency workers
// for -duration alone, then again for -duration while the flooder
// (-flood-token, a tenant with a rate limit) claims fresh keys as fast as
// -flood-concurrency workers can, getting mostly 429 rate_limited.
const modeNeighbour = "neighbour"

// neighbourReport holds the two phases of a neighbour run.
type neighbourReport struct {
	cfg                 config
	alone, beside       *tally // the quiet tenant's observations
	flood               *tally // the flooder's, during the second phase
	aloneTime, withTime time.Duration
}

// floodOK is what a flooding claim may get: 201 within its rate, 429
// rate_limited past it.
func floodOK(r result) bool {
	return r.err == nil && (r.status == http.StatusCreated ||
		(r.status == http.StatusTooManyRequests && r.code == "rate_limited"))
}

// phase runs workers of loader l for d, each claiming fresh keys under
// prefix, and returns the merged tally.
func phase(ctx context.Context, l *loader, workers int, d time.Duration, prefix string, expect func(result) bool) *tally {
	var wg sync.WaitGroup
	tallies := make([]*tally, workers)
	deadline := time.Now().Add(d)
	for w := range workers {
		t := newTally()
		tallies[w] = t
		wg.Go(func() {
			for n := 0; ctx.Err() == nil && time.Now().Before(deadline); n++ {
				l.timed(ctx, t, kindClaim, fmt.Sprintf("%s-%s-w%d-%d", l.prefix, prefix, w, n), claimBody, expect)
				t.iterations++
			}
		})
	}
	wg.Wait()
	total := newTally()
	for _, t := range tallies {
		total.merge(t)
	}
	return total
}

// runNeighbour runs the quiet tenant alone, then beside the flooder.
func runNeighbour(ctx context.Context, cfg config) (*neighbourReport, error) {
	quiet, err := newLoader(cfg)
	if err != nil {
		return nil, err
	}
	defer quiet.client.CloseIdleConnections()
	floodCfg := cfg
	floodCfg.token, floodCfg.concurrency = cfg.floodToken, cfg.floodConcurrency
	flooder, err := newLoader(floodCfg)
	if err != nil {
		return nil, err
	}
	defer flooder.client.CloseIdleConnections()

	rep := &neighbourReport{cfg: cfg}
	start := time.Now()
	rep.alone = phase(ctx, quiet, cfg.concurrency, cfg.duration, "alone", is(201))
	rep.aloneTime = time.Since(start)

	var wg sync.WaitGroup
	wg.Go(func() { rep.flood = phase(ctx, flooder, cfg.floodConcurrency, cfg.duration, "flood", floodOK) })
	start = time.Now()
	rep.beside = phase(ctx, quiet, cfg.concurrency, cfg.duration, "beside", is(201))
	rep.withTime = time.Since(start)
	wg.Wait()
	return rep, nil
}

// latencies returns the sorted claim latencies of t.
func (t *tally) sortedClaims() []time.Duration {
	d := t.latencies[kindClaim]
	slices.Sort(d)
	return d
}

// print writes the neighbour report and returns the exit code: 1 when a
// response was not one the phase expects.
func (r *neighbourReport) print(w io.Writer) int {
	alone, beside, flood := r.alone.sortedClaims(), r.beside.sortedClaims(), r.flood.sortedClaims()
	rps := func(n int, d time.Duration) float64 { return float64(n) / d.Seconds() }
	fmt.Fprintf(w, "loadgen: mode=%s quiet concurrency=%d, flood concurrency=%d, %s per phase, url=%s\n",
		modeNeighbour, r.cfg.concurrency, r.cfg.floodConcurrency, r.cfg.duration, r.cfg.baseURL.Redacted())
	fmt.Fprintf(w, "%-26s %8s %9s %8s %8s %8s %8s %6s\n", "phase", "requests", "req/s", "p50 ms", "p90 ms", "p99 ms", "max ms", "errors")
	row := func(name string, d []time.Duration, secs time.Duration, errs int64) {
		fmt.Fprintf(w, "%-26s %8d %9.1f %8s %8s %8s %8s %6d\n", name, len(d), rps(len(d), secs),
			ms(percentile(d, 50)), ms(percentile(d, 90)), ms(percentile(d, 99)), ms(percentile(d, 100)), errs)
	}
	row("quiet tenant alone", alone, r.aloneTime, r.alone.unexpected)
	row("quiet tenant beside flood", beside, r.withTime, r.beside.unexpected)
	row("flooding tenant", flood, r.withTime, r.flood.unexpected)
	fmt.Fprintln(w, "flooding tenant responses:")
	for _, k := range slices.Sorted(maps.Keys(r.flood.outcomes)) {
		fmt.Fprintf(w, "  %-34s %d\n", k, r.flood.outcomes[k])
	}
	errs := r.alone.unexpected + r.beside.unexpected + r.flood.unexpected
	ratio := 0.0
	if p := percentile(alone, 99); p > 0 {
		ratio = float64(percentile(beside, 99)) / float64(p)
	}
	fmt.Fprintf(w, "quiet p99 beside the flood / alone: %.2f×\n", ratio)
	fmt.Fprintf(w, "RESULT mode=%s quiet_alone_p50_ms=%s quiet_alone_p99_ms=%s quiet_alone_rps=%.1f quiet_flood_p50_ms=%s quiet_flood_p99_ms=%s quiet_flood_rps=%.1f flood_rps=%.1f p99_ratio=%.2f errors=%d\n",
		modeNeighbour, ms(percentile(alone, 50)), ms(percentile(alone, 99)), rps(len(alone), r.aloneTime),
		ms(percentile(beside, 50)), ms(percentile(beside, 99)), rps(len(beside), r.withTime),
		rps(len(flood), r.withTime), ratio, errs)
	if errs > 0 {
		fmt.Fprintf(w, "ERROR: %d responses were not what mode %s expects (see responses above)\n", errs, modeNeighbour)
		return 1
	}
	return 0
}
