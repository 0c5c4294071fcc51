package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// The load modes.
const (
	modeClaim      = "claim"
	modeLifecycle  = "lifecycle"
	modeReplay     = "replay"
	modeContention = "contention"
	// modeFrontdoor and modeFrontdoorReplay load any HTTP API through its
	// front door (Idempotency-Key), e.g. the gateway or its upstream.
	modeFrontdoor       = "frontdoor"
	modeFrontdoorReplay = "frontdoor-replay"
)

func frontdoorMode(m string) bool { return m == modeFrontdoor || m == modeFrontdoorReplay }

// kindPost is the request kind of the frontdoor modes.
const kindPost = "post"

// frontdoorBody is the JSON body the frontdoor modes send.
var frontdoorBody = []byte(`{"amount":1000,"currency":"usd"}`)

// The request kinds latencies are kept for.
const (
	kindClaim    = "claim"
	kindComplete = "complete"
)

// claimBody is the claim request every mode sends: the server computes the
// JCS fingerprint of "request", as for a typical integration.
var claimBody = []byte(`{"operation":"POST /v1/payments","request":{"amount":1000,"currency":"usd"}}`)

// maxResponseBytes bounds how much of a response body is read.
const maxResponseBytes = 1 << 20

// result is the outcome of one HTTP request.
type result struct {
	status int
	code   string // problem code of an error response
	token  int64  // fencing_token of a 201 claim
	err    error  // transport error
}

// label names the outcome in the report: "201", "409 request_in_flight",
// "transport error".
func (r result) label() string {
	if r.err != nil {
		return "transport error"
	}
	if r.code != "" {
		return strconv.Itoa(r.status) + " " + r.code
	}
	return strconv.Itoa(r.status)
}

// tally is what one worker (and, merged, the whole run) observed.
type tally struct {
	latencies  map[string][]time.Duration // by request kind
	outcomes   map[string]int64           // "claim 201" → count
	unexpected int64                      // responses the mode does not expect
	wins       map[string]int             // contention: 201s per key
	decided    map[string]bool            // contention: keys that got a 200, 201 or 409 request_in_flight
	iterations int64
}

func newTally() *tally {
	return &tally{
		latencies: map[string][]time.Duration{},
		outcomes:  map[string]int64{},
		wins:      map[string]int{},
		decided:   map[string]bool{},
	}
}

func (t *tally) record(kind string, d time.Duration, r result, expected bool) {
	t.latencies[kind] = append(t.latencies[kind], d)
	t.outcomes[kind+" "+r.label()]++
	if !expected {
		t.unexpected++
	}
}

func (t *tally) merge(o *tally) {
	for k, v := range o.latencies {
		t.latencies[k] = append(t.latencies[k], v...)
	}
	for k, v := range o.outcomes {
		t.outcomes[k] += v
	}
	for k, v := range o.wins {
		t.wins[k] += v
	}
	for k := range o.decided {
		t.decided[k] = true
	}
	t.unexpected += o.unexpected
	t.iterations += o.iterations
}

// loader sends the requests of one run.
type loader struct {
	cfg    config
	client *http.Client
	prefix string // per-run key prefix
}

// loopbackOnly refuses, at dial time, any connection to a non-loopback
// address (for example a "localhost" that does not resolve to loopback).
func loopbackOnly(_, address string, _ syscall.RawConn) error {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return fmt.Errorf("dial %s: %w", address, err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("dial %s: not a loopback address, refused", address)
	}
	return nil
}

func newLoader(cfg config) (*loader, error) {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, fmt.Errorf("key prefix: %w", err)
	}
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, Control: loopbackOnly}).DialContext,
		MaxIdleConns:        cfg.concurrency,
		MaxIdleConnsPerHost: cfg.concurrency,
		MaxConnsPerHost:     cfg.concurrency,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	return &loader{
		cfg: cfg,
		client: &http.Client{
			Transport:     tr,
			Timeout:       cfg.timeout,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		prefix: "lg-" + hex.EncodeToString(b[:]),
	}, nil
}

// send POSTs a JSON body to path with one extra header and reads the whole
// answer (so the connection is reused). A failed read keeps the status.
func (l *loader) send(ctx context.Context, path string, body []byte, header, value string) (int, []byte, error) {
	u := *l.cfg.baseURL
	u.Path += path
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), bytes.NewReader(body))
	if err != nil {
		return 0, nil, fmt.Errorf("new request: %w", err)
	}
	req.Header.Set(header, value)
	req.Header.Set("Content-Type", "application/json")
	resp, err := l.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes))
	if err != nil {
		return resp.StatusCode, nil, fmt.Errorf("read body: %w", err)
	}
	return resp.StatusCode, data, nil
}

// post sends one POST to /v1/keys/{key}/{op} and reads the whole answer.
func (l *loader) post(ctx context.Context, key, op string, body []byte) result {
	status, data, err := l.send(ctx, "/v1/keys/"+key+"/"+op, body, "Authorization", "Bearer "+l.cfg.token)
	if err != nil {
		return result{status: status, err: err}
	}
	r := result{status: status}
	var v struct {
		Code         string `json:"code"`
		FencingToken int64  `json:"fencing_token"`
	}
	if json.Unmarshal(data, &v) == nil {
		r.code = v.Code
		if status == http.StatusCreated {
			r.token = v.FencingToken
		}
	}
	return r
}

// postFrontdoor sends one POST to the configured path with key as
// Idempotency-Key and reads the whole answer.
func (l *loader) postFrontdoor(ctx context.Context, key string) result {
	status, data, err := l.send(ctx, l.cfg.path, frontdoorBody, "Idempotency-Key", key)
	if err != nil {
		return result{status: status, err: err}
	}
	r := result{status: status}
	if status >= 400 {
		var v struct {
			Code string `json:"code"`
		}
		if json.Unmarshal(data, &v) == nil {
			r.code = v.Code
		}
	}
	return r
}

func success(r result) bool { return r.err == nil && r.status >= 200 && r.status < 300 }

func (l *loader) timedFrontdoor(ctx context.Context, t *tally, key string) {
	start := time.Now()
	r := l.postFrontdoor(ctx, key)
	t.record(kindPost, time.Since(start), r, success(r))
}

func completeBody(token int64) []byte {
	return fmt.Appendf(nil, `{"fencing_token":%d,"response":{"status":201,"headers":{"Content-Type":"application/json"},"body":"{\"id\":\"ord_1\"}"}}`, token)
}

// timed runs one request and records it.
func (l *loader) timed(ctx context.Context, t *tally, kind, key string, body []byte, expect func(result) bool) result {
	start := time.Now()
	r := l.post(ctx, key, kind, body)
	t.record(kind, time.Since(start), r, expect(r))
	return r
}

func is(statuses ...int) func(result) bool {
	return func(r result) bool {
		if r.err != nil {
			return false
		}
		for _, s := range statuses {
			if r.status == s && (s < 400 || r.code != "") {
				return true
			}
		}
		return false
	}
}

func contentionOK(r result) bool {
	return r.err == nil && (r.status == http.StatusCreated || r.status == http.StatusOK ||
		(r.status == http.StatusConflict && r.code == "request_in_flight"))
}

// randomUUID returns a random (version 4 layout) UUID. math/rand/v2's
// generator is enough: the keys need to be spread and unique within a run,
// not unpredictable.
func randomUUID() string {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], mrand.Uint64())
	binary.LittleEndian.PutUint64(b[8:], mrand.Uint64())
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	var s [36]byte
	hex.Encode(s[0:8], b[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], b[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], b[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], b[8:10])
	s[23] = '-'
	hex.Encode(s[24:], b[10:])
	return string(s[:])
}

// freshKey is the key of iteration n of worker w in the claim and
// lifecycle modes.
func (l *loader) freshKey(w int, n int64) string {
	if l.cfg.randomKeys {
		return randomUUID()
	}
	return fmt.Sprintf("%s-w%d-%d", l.prefix, w, n)
}

// iterate runs one iteration of the mode for worker w.
func (l *loader) iterate(ctx context.Context, t *tally, w int, n int64) {
	switch l.cfg.mode {
	case modeClaim:
		l.timed(ctx, t, kindClaim, l.freshKey(w, n), claimBody, is(201))
	case modeLifecycle:
		key := l.freshKey(w, n)
		if r := l.timed(ctx, t, kindClaim, key, claimBody, is(201)); r.err == nil && r.status == http.StatusCreated {
			l.timed(ctx, t, kindComplete, key, completeBody(r.token), is(200))
		}
	case modeReplay:
		key := fmt.Sprintf("%s-r%d", l.prefix, mrand.IntN(l.cfg.keys))
		l.timed(ctx, t, kindClaim, key, claimBody, is(200))
	case modeFrontdoor:
		l.timedFrontdoor(ctx, t, fmt.Sprintf("%s-w%d-%d", l.prefix, w, n))
	case modeFrontdoorReplay:
		l.timedFrontdoor(ctx, t, fmt.Sprintf("%s-r%d", l.prefix, mrand.IntN(l.cfg.keys)))
	case modeContention:
		key := fmt.Sprintf("%s-c%d", l.prefix, mrand.IntN(l.cfg.keys))
		r := l.timed(ctx, t, kindClaim, key, claimBody, contentionOK)
		if contentionOK(r) {
			t.decided[key] = true
		}
		if r.err == nil && r.status == http.StatusCreated {
			t.wins[key]++
			l.timed(ctx, t, kindComplete, key, completeBody(r.token), is(200))
		}
	}
}

// prepareReplay claims and completes the replay key set (not measured).
func (l *loader) prepareReplay(ctx context.Context) error {
	var (
		wg   sync.WaitGroup
		next atomic.Int64
		mu   sync.Mutex
		errs []error
	)
	for range l.cfg.concurrency {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(l.cfg.keys) {
					return
				}
				key := fmt.Sprintf("%s-r%d", l.prefix, i)
				if l.cfg.mode == modeFrontdoorReplay {
					if r := l.postFrontdoor(ctx, key); !success(r) {
						mu.Lock()
						errs = append(errs, fmt.Errorf("prepare replay key %s: %s: %v", key, r.label(), r.err))
						mu.Unlock()
						return
					}
					continue
				}
				r := l.post(ctx, key, kindClaim, claimBody)
				if r.err == nil && r.status == http.StatusCreated {
					r = l.post(ctx, key, kindComplete, completeBody(r.token))
					if r.err == nil && r.status == http.StatusOK {
						continue
					}
				}
				mu.Lock()
				errs = append(errs, fmt.Errorf("prepare replay key %s: %s: %v", key, r.label(), r.err))
				mu.Unlock()
				return
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// runLoad runs the configured load and returns the merged observations.
func runLoad(ctx context.Context, cfg config) (*report, error) {
	l, err := newLoader(cfg)
	if err != nil {
		return nil, err
	}
	defer l.client.CloseIdleConnections()
	if cfg.mode == modeReplay || cfg.mode == modeFrontdoorReplay {
		if err := l.prepareReplay(ctx); err != nil {
			return nil, err
		}
	}
	return l.load(ctx), nil
}

// load runs the loader's mode for its duration (or its -requests) with its
// workers and returns the merged observations.
func (l *loader) load(ctx context.Context) *report {
	cfg := l.cfg
	var (
		wg      sync.WaitGroup
		started atomic.Int64
		tallies = make([]*tally, cfg.concurrency)
	)
	begin := time.Now()
	deadline := begin.Add(cfg.duration)
	for w := range cfg.concurrency {
		t := newTally()
		tallies[w] = t
		wg.Go(func() {
			for n := int64(0); ctx.Err() == nil && time.Now().Before(deadline); n++ {
				if cfg.requests > 0 && started.Add(1) > cfg.requests {
					return
				}
				l.iterate(ctx, t, w, n)
				t.iterations++
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(begin)
	total := newTally()
	for _, t := range tallies {
		total.merge(t)
	}
	return &report{cfg: cfg, elapsed: elapsed, tally: total}
}
