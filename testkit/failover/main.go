// Command failover is the harness of scripts/failover (issue 25, item 1):
// it drives claim → complete → replay load against an idem server whose
// PostgreSQL is a pg_auto_failover formation, kills the primary's machine
// through the script's ctl, and checks afterwards what every acknowledged
// write became. It is a harness, not product code: it lives under testkit
// and talks raw HTTP (no SDK retries hiding the server's answers).
//
// -mode sync (one synchronous standby required) checks, over -kills kills:
//
//   - every acknowledged complete replays its exact body and token (lost 0);
//   - every acknowledged claim left in flight answers 409 request_in_flight
//     to another attempt, never a fresh 201 (doubled 0);
//   - fencing tokens never go backwards: per key, and globally as seen (a
//     claim sent after another's 201 was acknowledged gets a higher token);
//   - a waiting claim (Prefer: wait) wakes on a complete sent to the new
//     primary before its wait runs out;
//   - /readyz answers 503 during each outage and 200 after;
//   - the ledger rollback check did not fire.
//
// -mode async (asynchronous standbys) stops the standbys' WAL (SIGSTOP of
// the primary's walsenders) while writes continue, kills the primary, and
// checks that idem's rollback check stops writes on the promoted standby
// (readiness 503, writes 503 store_unavailable, a lost key's claim refused
// rather than a fresh 201, idem_ledger_rollback_detected 1), then that
// `idem ledger acknowledge-rollback --yes` lets writes in again with tokens
// above every token seen.
//
// It prints the figures and a RESULT line, and exits 1 on a violation.
// Every address must be loopback.
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/jackc/pgx/v5"
)

type config struct {
	mode    string
	url     string
	token   string
	monitor string
	nodes   map[string]string // name → host:port
	ctl     string
	kills   int
	writers int
	idem    string
	acks    string
	settle  time.Duration
}

func main() {
	var cfg config
	var nodes string
	flag.StringVar(&cfg.mode, "mode", "sync", "sync or async")
	flag.StringVar(&cfg.url, "url", "", "idem base URL (loopback)")
	flag.StringVar(&cfg.token, "token", "", "keys:write token")
	flag.StringVar(&cfg.monitor, "monitor", "", "pg_auto_failover monitor URL (loopback)")
	flag.StringVar(&nodes, "nodes", "", "name=host:port,… of the data nodes")
	flag.StringVar(&cfg.ctl, "ctl", "", "the script's ctl: ctl kill|start NAME")
	flag.IntVar(&cfg.kills, "kills", 3, "primaries killed (sync mode), 1 to 6")
	flag.IntVar(&cfg.writers, "writers", 8, "concurrent writers, 1 to 64")
	flag.StringVar(&cfg.idem, "idem", "", "the idem binary (ledger acknowledge-rollback in async mode)")
	flag.String("log", "", "idem's log (unused; the script prints it on failure)")
	flag.StringVar(&cfg.acks, "acks", "", "file every acknowledged claim and complete is logged to")
	flag.DurationVar(&cfg.settle, "settle", 5*time.Second, "load between two kills once three nodes are back")
	flag.Parse()
	cfg.nodes = map[string]string{}
	for _, n := range strings.Split(nodes, ",") {
		name, addr, ok := strings.Cut(n, "=")
		if !ok {
			fatalf("-nodes: %q is not name=host:port", n)
		}
		cfg.nodes[name] = addr
	}
	if cfg.kills < 1 || cfg.kills > 6 || cfg.writers < 1 || cfg.writers > 64 {
		fatalf("-kills 1..6, -writers 1..64")
	}
	for _, u := range []string{cfg.url, cfg.monitor} {
		mustLoopback(u)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The whole run is bounded; the CI step bounds the script too.
	ctx, cancel := context.WithTimeout(ctx, 12*time.Minute)
	defer cancel()
	h, err := newHarness(ctx, cfg)
	if err != nil {
		fatalf("%v", err)
	}
	defer h.close()
	var ok bool
	if cfg.mode == "async" {
		ok = h.runAsync(ctx)
	} else {
		ok = h.runSync(ctx)
	}
	if !ok {
		os.Exit(1)
	}
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "failover: "+format+"\n", args...)
	os.Exit(1)
}

func mustLoopback(raw string) {
	u, err := url.Parse(raw)
	if err != nil {
		fatalf("%s: %v", raw, err)
	}
	for _, h := range strings.Split(u.Host, ",") {
		host, _, err := net.SplitHostPort(h)
		if err != nil {
			host = h
		}
		if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
			fatalf("%s: not a loopback address", raw)
		}
	}
}

// loopbackOnly refuses, at dial time, any connection to a non-loopback
// address.
func loopbackOnly(_, address string, _ syscall.RawConn) error {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return err
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("dial %s: not a loopback address, refused", address)
	}
	return nil
}

// key is what the harness knows of one key: acknowledged claim and
// complete, the body it completed with, and every token seen for it.
type key struct {
	name      string
	token     int64 // of the acknowledged claim (0: none)
	completed bool  // the complete was acknowledged
	body      string
	tokens    []int64 // every fencing token an answer gave for it, in order
	hold      bool    // left in flight on purpose
}

// harness holds the run's state.
type harness struct {
	cfg    config
	client *http.Client
	mon    *pgx.Conn
	prefix string

	mu         sync.Mutex
	keys       map[string]*key
	violations []string
	acks       *bufio.Writer
	acksFile   *os.File

	maxAcked atomic.Int64 // highest fencing token of an acknowledged claim
	requests atomic.Int64
	// claimsLost counts completes answered 404 key_not_found (async mode:
	// the claim was lost with the failover).
	claimsLost atomic.Int64
	refused    atomic.Int64 // 503 and transport errors, retried
	lastOK     atomic.Int64 // unix nanos of the last acknowledged write
	failStart  atomic.Int64 // unix nanos of the last OK before the current run of failures (0: none)
	okAfter    atomic.Int64 // unix nanos of the first OK after failStart

	ready *readyLog
}

func newHarness(ctx context.Context, cfg config) (*harness, error) {
	var b [4]byte
	_, _ = rand.Read(b[:])
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 2 * time.Second, Control: loopbackOnly}).DialContext,
		MaxIdleConnsPerHost: 2*cfg.writers + 8,
		DisableCompression:  true,
	}
	mon, err := pgx.Connect(ctx, cfg.monitor)
	if err != nil {
		return nil, fmt.Errorf("monitor: %w", err)
	}
	h := &harness{
		cfg:    cfg,
		client: &http.Client{Transport: tr, Timeout: 40 * time.Second},
		mon:    mon,
		prefix: "fo-" + hex.EncodeToString(b[:]),
		keys:   map[string]*key{},
		ready:  &readyLog{},
	}
	if cfg.acks != "" {
		f, err := os.Create(cfg.acks)
		if err != nil {
			return nil, err
		}
		h.acksFile, h.acks = f, bufio.NewWriter(f)
	}
	return h, nil
}

func (h *harness) close() {
	if h.acks != nil {
		_ = h.acks.Flush()
		_ = h.acksFile.Close()
	}
	_ = h.mon.Close(context.Background())
}

func (h *harness) violate(format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	msg := fmt.Sprintf(format, args...)
	if len(h.violations) < 1000 {
		h.violations = append(h.violations, msg)
	}
	if len(h.violations) <= 20 {
		fmt.Printf("VIOLATION: %s\n", msg)
	}
}

func (h *harness) ack(kind, k string, token int64) {
	if h.acks == nil {
		return
	}
	h.mu.Lock()
	fmt.Fprintf(h.acks, "%s %s %s %d\n", time.Now().UTC().Format(time.RFC3339Nano), kind, k, token)
	h.mu.Unlock()
}

// answer is one HTTP answer of idem.
type answer struct {
	status int
	code   string
	detail string
	token  int64
	body   string // response.body of a replay
	err    error
	header http.Header
}

func (a answer) String() string {
	if a.err != nil {
		return "transport error: " + a.err.Error()
	}
	if a.code != "" {
		return strconv.Itoa(a.status) + " " + a.code + " (" + a.detail + ")"
	}
	return strconv.Itoa(a.status)
}

// unavailable is an answer a writer retries: the store away or the
// connection cut.
func (a answer) unavailable() bool {
	return a.err != nil || (a.status == http.StatusServiceUnavailable && a.code == "store_unavailable")
}

func (h *harness) do(ctx context.Context, method, path string, body []byte, hdr map[string]string) answer {
	req, err := http.NewRequestWithContext(ctx, method, h.cfg.url+path, bytes.NewReader(body))
	if err != nil {
		return answer{err: err}
	}
	req.Header.Set("Authorization", "Bearer "+h.cfg.token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	h.requests.Add(1)
	resp, err := h.client.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return answer{status: resp.StatusCode, err: err}
	}
	a := answer{status: resp.StatusCode, header: resp.Header}
	var v struct {
		Code         string `json:"code"`
		Detail       string `json:"detail"`
		FencingToken int64  `json:"fencing_token"`
		Response     *struct {
			Body string `json:"body"`
		} `json:"response"`
	}
	if json.Unmarshal(data, &v) == nil {
		a.code, a.detail, a.token = v.Code, v.Detail, v.FencingToken
		if v.Response != nil {
			a.body = v.Response.Body
		}
	}
	return a
}

func claimBody(attempt string, wait int) []byte {
	s := `{"operation":"POST /v1/payments","request":{"amount":1000,"currency":"usd"},"lease_seconds":3600`
	if attempt != "" {
		s += `,"attempt_id":"` + attempt + `"`
	}
	if wait > 0 {
		s += `,"wait_seconds":` + strconv.Itoa(wait)
	}
	return []byte(s + "}")
}

func completeBody(token int64, body string) []byte {
	b, _ := json.Marshal(map[string]any{
		"fencing_token": token,
		"response":      map[string]any{"status": 201, "headers": map[string]string{"Content-Type": "application/json"}, "body": body},
	})
	return b
}

func uuid() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

func (h *harness) ok() {
	now := time.Now().UnixNano()
	h.lastOK.Store(now)
	if h.failStart.Load() != 0 {
		h.okAfter.CompareAndSwap(0, now)
	}
}

func (h *harness) failed() {
	h.refused.Add(1)
	if h.failStart.Load() == 0 {
		h.failStart.CompareAndSwap(0, h.lastOK.Load())
	}
}

// writerOutage returns and resets the span from the last acknowledged write
// before the failures to the first after them.
func (h *harness) writerOutage() time.Duration {
	from, to := h.failStart.Load(), h.okAfter.Load()
	h.failStart.Store(0)
	h.okAfter.Store(0)
	if from == 0 || to == 0 {
		return 0
	}
	return time.Duration(to - from)
}

// observe records a token an answer gave for k, checking it does not go
// backwards for the key.
func (h *harness) observe(k *key, token int64, what string) {
	if token == 0 {
		return
	}
	h.mu.Lock()
	prev := int64(0)
	if n := len(k.tokens); n > 0 {
		prev = k.tokens[n-1]
	}
	k.tokens = append(k.tokens, token)
	h.mu.Unlock()
	if token < prev {
		h.violate("token backwards on key %s: %d after %d (%s)", k.name, token, prev, what)
	}
}

// claim claims k for a new attempt, retrying the same attempt_id while the
// store is away (a lost 201 comes back as its recovery), and returns its
// token, or 0 when stopped. floor is the highest acknowledged token before
// the first send: the token must be above it.
func (h *harness) claim(ctx context.Context, k *key) int64 {
	attempt := uuid()
	floor := h.maxAcked.Load()
	for ctx.Err() == nil {
		a := h.do(ctx, http.MethodPost, "/v1/keys/"+k.name+"/claim", claimBody(attempt, 0), nil)
		if ctx.Err() != nil {
			return 0
		}
		switch {
		case a.status == http.StatusCreated:
			h.ok()
			if a.token <= floor {
				h.violate("token backwards globally: key %s got %d, but %d had been acknowledged before its claim was sent", k.name, a.token, floor)
			}
			h.observe(k, a.token, "claim 201")
			for {
				cur := h.maxAcked.Load()
				if a.token <= cur || h.maxAcked.CompareAndSwap(cur, a.token) {
					break
				}
			}
			h.mu.Lock()
			k.token = a.token
			h.mu.Unlock()
			h.ack("claim", k.name, a.token)
			return a.token
		case a.unavailable():
			h.failed()
			pause(ctx, 50*time.Millisecond)
		default:
			h.violate("claim of fresh key %s answered %s", k.name, a)
			return 0
		}
	}
	return 0
}

// complete completes k with its body, retrying while the store is away
// (the same complete again is a no-op 200).
func (h *harness) complete(ctx context.Context, k *key) bool {
	for ctx.Err() == nil {
		a := h.do(ctx, http.MethodPost, "/v1/keys/"+k.name+"/complete", completeBody(k.token, k.body), nil)
		if ctx.Err() != nil {
			return false
		}
		switch {
		case a.status == http.StatusOK:
			h.ok()
			h.mu.Lock()
			k.completed = true
			h.mu.Unlock()
			h.ack("complete", k.name, k.token)
			return true
		case a.unavailable():
			h.failed()
			pause(ctx, 50*time.Millisecond)
		case h.cfg.mode == "async" && a.status == http.StatusNotFound && a.code == "key_not_found":
			// The failover lost the claim: its holder learns it here.
			h.claimsLost.Add(1)
			return false
		default:
			h.violate("complete of key %s (token %d) answered %s", k.name, k.token, a)
			return false
		}
	}
	return false
}

// replay claims a completed key again: a 200 with its body and token.
func (h *harness) replay(ctx context.Context, k *key, final bool) {
	for ctx.Err() == nil {
		a := h.do(ctx, http.MethodPost, "/v1/keys/"+k.name+"/claim", claimBody("", 0), nil)
		if ctx.Err() != nil {
			return
		}
		if a.unavailable() {
			if !final {
				h.failed()
			}
			pause(ctx, 50*time.Millisecond)
			continue
		}
		h.observe(k, a.token, "replay")
		switch {
		case a.status == http.StatusOK && a.body == k.body && a.token == k.token:
			if !final {
				h.ok()
			}
		case a.status == http.StatusCreated:
			h.violate("LOST: acknowledged complete of key %s (token %d) answered a fresh 201 with token %d: it would run again", k.name, k.token, a.token)
		default:
			h.violate("LOST: acknowledged complete of key %s (token %d) answered %s, token %d, body %q (want 200 %q)", k.name, k.token, a, a.token, a.body, k.body)
		}
		return
	}
}

// inFlight claims a key left in flight with another attempt: 409.
func (h *harness) inFlight(ctx context.Context, k *key) {
	for ctx.Err() == nil {
		a := h.do(ctx, http.MethodPost, "/v1/keys/"+k.name+"/claim", claimBody(uuid(), 0), nil)
		if a.unavailable() {
			pause(ctx, 50*time.Millisecond)
			continue
		}
		h.observe(k, a.token, "claim of a key in flight")
		switch {
		case a.status == http.StatusConflict && a.code == "request_in_flight":
		case a.status == http.StatusCreated:
			h.violate("DOUBLED: acknowledged claim of key %s (token %d) answered a fresh 201 with token %d to another attempt", k.name, k.token, a.token)
		default:
			h.violate("acknowledged claim of key %s (token %d) answered %s to another attempt (want 409 request_in_flight)", k.name, k.token, a)
		}
		return
	}
}

func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// writers runs the writers until ctx is done; each finishes the key it
// works on (within finish) before returning.
func (h *harness) writers(ctx context.Context, finish context.Context) *sync.WaitGroup {
	var wg sync.WaitGroup
	for w := range h.cfg.writers {
		wg.Go(func() {
			for n := 0; ctx.Err() == nil; n++ {
				k := &key{name: fmt.Sprintf("%s-w%d-%d", h.prefix, w, n)}
				k.body = fmt.Sprintf(`{"id":"ord_%s","writer":%d,"n":%d}`, k.name, w, n)
				k.hold = n%16 == 7 // left in flight: its claim must stay the only one
				h.mu.Lock()
				h.keys[k.name] = k
				h.mu.Unlock()
				if h.claim(finish, k) == 0 {
					return
				}
				if k.hold {
					continue
				}
				if !h.complete(finish, k) {
					if finish.Err() != nil {
						return
					}
					continue
				}
				if n%4 == 0 {
					h.replay(finish, k, false)
				}
			}
		})
	}
	return &wg
}

// readyLog polls /readyz and keeps its transitions.
type readyLog struct {
	mu    sync.Mutex
	trans []readyAt
}

type readyAt struct {
	at     time.Time
	status int // 0: no answer
}

func (h *harness) pollReady(ctx context.Context) {
	c := &http.Client{Transport: h.client.Transport, Timeout: time.Second}
	last := -1
	for ctx.Err() == nil {
		st := 0
		if req, err := http.NewRequestWithContext(ctx, http.MethodGet, h.cfg.url+"/readyz", nil); err == nil {
			if resp, err := c.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				st = resp.StatusCode
			}
		}
		if st != last && ctx.Err() == nil {
			h.ready.mu.Lock()
			h.ready.trans = append(h.ready.trans, readyAt{time.Now(), st})
			h.ready.mu.Unlock()
			last = st
		}
		pause(ctx, 50*time.Millisecond)
	}
}

// readyStatus is the last /readyz status polled.
func (h *harness) readyStatus() int {
	h.ready.mu.Lock()
	defer h.ready.mu.Unlock()
	if len(h.ready.trans) == 0 {
		return -1
	}
	return h.ready.trans[len(h.ready.trans)-1].status
}

// readyOutage returns the first non-200 after since and the next 200.
func (h *harness) readyOutage(since time.Time) (down, up time.Time) {
	h.ready.mu.Lock()
	defer h.ready.mu.Unlock()
	for _, t := range h.ready.trans {
		if t.at.Before(since) {
			continue
		}
		if down.IsZero() && t.status != http.StatusOK {
			down = t.at
		}
		if !down.IsZero() && t.status == http.StatusOK {
			return down, t.at
		}
	}
	return down, time.Time{}
}

// node is one row of the monitor's node table.
type node struct {
	name, reported, goal string
	port                 int
}

func (h *harness) nodes(ctx context.Context) ([]node, error) {
	rows, err := h.mon.Query(ctx, `select nodename, nodeport, reportedstate::text, goalstate::text from pgautofailover.node where formationid = 'default' order by nodeid`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (node, error) {
		var n node
		err := r.Scan(&n.name, &n.port, &n.reported, &n.goal)
		return n, err
	})
}

// waitNodes waits until the monitor reports want (each node's reported
// state equals its goal), and returns the primary's name.
func (h *harness) waitNodes(ctx context.Context, limit time.Duration, want ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	slices.Sort(want)
	var last []node
	for {
		ns, err := h.nodes(ctx)
		if err == nil {
			last = ns
			var got []string
			primary := ""
			for _, n := range ns {
				if n.reported == n.goal {
					got = append(got, n.reported)
				}
				if n.reported == "primary" && n.goal == "primary" {
					primary = n.name
				}
			}
			slices.Sort(got)
			if slices.Equal(got, want) && len(ns) == len(want) {
				return primary, nil
			}
		}
		if ctx.Err() != nil {
			return "", fmt.Errorf("the nodes did not reach %v within %s: %v", want, limit, last)
		}
		pause(ctx, 100*time.Millisecond)
	}
}

// waitPrimary waits for a primary other than old that takes writes
// (primary or wait_primary), and returns it.
func (h *harness) waitPrimary(ctx context.Context, old string, limit time.Duration) (node, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for {
		ns, err := h.nodes(ctx)
		if err == nil {
			for _, n := range ns {
				if n.name != old && n.reported == n.goal && (n.reported == "primary" || n.reported == "wait_primary") {
					return n, nil
				}
			}
		}
		if ctx.Err() != nil {
			return node{}, fmt.Errorf("no new primary within %s: %v", limit, ns)
		}
		pause(ctx, 100*time.Millisecond)
	}
}

func (h *harness) ctl(ctx context.Context, args ...string) error {
	cmd := exec.CommandContext(ctx, h.cfg.ctl, args...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	return cmd.Run()
}

// metric reads one sample of idem's /metrics (0 when absent).
func (h *harness) metric(ctx context.Context, series string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, h.cfg.url+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(rest), 64)
		}
	}
	return 0, sc.Err()
}

// waitMetric waits until series satisfies ok.
func (h *harness) waitMetric(ctx context.Context, series string, limit time.Duration, ok func(float64) bool) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for {
		v, err := h.metric(ctx, series)
		if err == nil && ok(v) {
			return v, nil
		}
		if ctx.Err() != nil {
			return v, fmt.Errorf("%s: %v within %s (last %v, %v)", series, "not as wanted", limit, v, err)
		}
		pause(ctx, 100*time.Millisecond)
	}
}

// probeWaiter holds a claim waiting (Prefer: wait=30) on a key in flight,
// completes the key and returns how long after the complete's 200 the
// waiter answered its 200 replay.
func (h *harness) probeWaiter(ctx context.Context, n int) (time.Duration, error) {
	k := &key{name: fmt.Sprintf("%s-waiter-%d", h.prefix, n)}
	k.body = fmt.Sprintf(`{"waiter":%d}`, n)
	h.mu.Lock()
	h.keys[k.name] = k
	h.mu.Unlock()
	if h.claim(ctx, k) == 0 {
		return 0, errors.New("the waiter probe's claim failed")
	}
	base, err := h.metric(ctx, "idem_claim_waiters")
	if err != nil {
		return 0, err
	}
	got := make(chan answer, 1)
	go func() {
		got <- h.do(ctx, http.MethodPost, "/v1/keys/"+k.name+"/claim", claimBody(uuid(), 0), map[string]string{"Prefer": "wait=30"})
	}()
	if _, err := h.waitMetric(ctx, "idem_claim_waiters", 20*time.Second, func(v float64) bool { return v > base }); err != nil {
		return 0, fmt.Errorf("the waiter was never held: %w", err)
	}
	if !h.complete(ctx, k) {
		return 0, errors.New("the waiter probe's complete failed")
	}
	done := time.Now()
	a := <-got
	woke := time.Since(done)
	if a.status != http.StatusOK || a.body != k.body {
		return woke, fmt.Errorf("the waiter answered %s %q, want 200 %q", a, a.body, k.body)
	}
	if woke > 15*time.Second {
		return woke, fmt.Errorf("the waiter answered %s after the complete: at the end of its wait, no event woke it", woke)
	}
	return woke, nil
}

type killFigures struct {
	from, to      string
	ready, writer time.Duration
	waiter        time.Duration
	listen        time.Duration // from /readyz 200 to the listening connection back
}

func (h *harness) runSync(ctx context.Context) bool {
	primary, err := h.waitNodes(ctx, 3*time.Minute, "primary", "secondary", "secondary")
	if err != nil {
		fmt.Println("failover:", err)
		return false
	}
	readyCtx, stopReady := context.WithCancel(ctx)
	defer stopReady()
	go h.pollReady(readyCtx)

	load, stopLoad := context.WithCancel(ctx)
	finish, stopFinish := context.WithCancel(ctx)
	defer stopFinish()
	begin := time.Now()
	wg := h.writers(load, finish)
	// A first waiter brings up idem's listening connection (LISTEN/NOTIFY),
	// so every kill cuts it.
	if _, err := h.probeWaiter(ctx, -1); err != nil {
		h.violate("waiter before the first kill: %v", err)
	}
	pause(ctx, h.cfg.settle)

	var figs []killFigures
	for i := range h.cfg.kills {
		if ctx.Err() != nil {
			break
		}
		fmt.Printf("== kill %d: the primary %s's machine\n", i+1, primary)
		h.writerOutage()
		reconnects, _ := h.metric(ctx, "idem_key_events_reconnects_total")
		tKill := time.Now()
		if err := h.ctl(ctx, "kill", primary); err != nil {
			h.violate("kill %s: %v", primary, err)
			break
		}
		np, err := h.waitPrimary(ctx, primary, 2*time.Minute)
		if err != nil {
			h.violate("kill %d: %v", i+1, err)
			break
		}
		promoted := time.Since(tKill)
		// The writers' outage ends with their first acknowledged write.
		wctx, wcancel := context.WithTimeout(ctx, 2*time.Minute)
		for wctx.Err() == nil && (h.failStart.Load() == 0 || h.okAfter.Load() == 0) {
			pause(wctx, 50*time.Millisecond)
		}
		wcancel()
		rctx, rcancel := context.WithTimeout(ctx, time.Minute)
		var down, up time.Time
		for rctx.Err() == nil {
			if down, up = h.readyOutage(tKill); !up.IsZero() {
				break
			}
			pause(rctx, 50*time.Millisecond)
		}
		rcancel()
		f := killFigures{from: primary, to: np.name, writer: h.writerOutage()}
		switch {
		case down.IsZero():
			h.violate("kill %d: /readyz never answered 503 during the outage", i+1)
		case up.IsZero():
			h.violate("kill %d: /readyz did not answer 200 again within a minute", i+1)
		default:
			f.ready = up.Sub(down)
		}
		// The listening connection reconnects with its own backoff: a
		// claim that waits before it is back is answered at once (see
		// the report: the stale 409 of a waiter whose subscription
		// failed), so the probe waits for it, and the lag is a figure.
		if _, err := h.waitMetric(ctx, "idem_key_events_reconnects_total", time.Minute, func(v float64) bool { return v > reconnects }); err != nil {
			h.violate("kill %d: the listening connection did not come back: %v", i+1, err)
		}
		if !up.IsZero() {
			f.listen = time.Since(up)
		}
		woke, err := h.probeWaiter(ctx, i)
		if err != nil {
			h.violate("kill %d: waiter: %v", i+1, err)
		}
		f.waiter = woke
		figs = append(figs, f)
		fmt.Printf("   %s promoted %.1fs after the kill; /readyz 503 for %.1fs, writers' outage %.1fs; listening again %.1fs after /readyz 200; a waiter woke %.2fs after a complete on the new primary\n",
			np.name, promoted.Seconds(), f.ready.Seconds(), f.writer.Seconds(), f.listen.Seconds(), woke.Seconds())
		// The dead machine comes back: three nodes again before the next kill.
		if err := h.ctl(ctx, "start", primary); err != nil {
			h.violate("restart %s: %v", primary, err)
			break
		}
		primary, err = h.waitNodes(ctx, 3*time.Minute, "primary", "secondary", "secondary")
		if err != nil {
			h.violate("after kill %d: %v", i+1, err)
			break
		}
		fmt.Printf("   %s back as a standby: three nodes\n", f.from)
		pause(ctx, h.cfg.settle)
	}
	stopLoad()
	// Each writer finishes its key (the store is back: bounded).
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		stopFinish()
		<-done
	}
	loadTime := time.Since(begin)
	loadRequests := h.requests.Load()

	// The checks afterwards, on the last primary.
	fmt.Println("== checking every acknowledged write")
	h.mu.Lock()
	keys := make([]*key, 0, len(h.keys))
	for _, k := range h.keys {
		keys = append(keys, k)
	}
	h.mu.Unlock()
	var completes, claims int
	var cwg sync.WaitGroup
	next := atomic.Int64{}
	for range 8 {
		cwg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(len(keys)) {
					return
				}
				k := keys[i]
				switch {
				case k.completed:
					h.replay(ctx, k, true)
				case k.token != 0:
					h.inFlight(ctx, k)
				}
			}
		})
	}
	cwg.Wait()
	for _, k := range keys {
		if k.completed {
			completes++
		} else if k.token != 0 {
			claims++
		}
	}
	detections, err1 := h.metric(ctx, "idem_ledger_rollback_detections_total")
	detected, err2 := h.metric(ctx, "idem_ledger_rollback_detected")
	if err := errors.Join(err1, err2); err != nil {
		h.violate("metrics: %v", err)
	}
	if detections != 0 || detected != 0 {
		h.violate("the ledger rollback check fired (detections %v, detected %v) with synchronous replication", detections, detected)
	}
	if st := h.readyStatus(); st != http.StatusOK {
		h.violate("/readyz answers %d at the end", st)
	}

	lost, doubled, backwards := 0, 0, 0
	for _, v := range h.violations {
		switch {
		case strings.HasPrefix(v, "LOST"):
			lost++
		case strings.HasPrefix(v, "DOUBLED"):
			doubled++
		case strings.HasPrefix(v, "token backwards"):
			backwards++
		}
	}
	fmt.Printf("\n== figures (synchronous: number_sync_standbys 1, three data nodes)\n")
	fmt.Printf("requests: %d in %.0fs of load by %d writers (%d answered 503 or cut, retried), then %d to check\n",
		loadRequests, loadTime.Seconds(), h.cfg.writers, h.refused.Load(), h.requests.Load()-loadRequests)
	fmt.Printf("acknowledged: %d completes, %d claims left in flight; highest token %d\n", completes, claims, h.maxAcked.Load())
	fmt.Printf("failovers: %d of %d\n", len(figs), h.cfg.kills)
	for i, f := range figs {
		fmt.Printf("  kill %d: %s → %s: /readyz 503 for %.1fs, writers' outage %.1fs, listening again +%.1fs, waiter woke %.2fs after the complete\n",
			i+1, f.from, f.to, f.ready.Seconds(), f.writer.Seconds(), f.listen.Seconds(), f.waiter.Seconds())
	}
	fmt.Printf("lost: %d, doubled: %d, tokens backwards: %d, ledger rollback detections: %v, violations: %d\n",
		lost, doubled, backwards, detections, len(h.violations))
	var maxReady, maxWriter time.Duration
	for _, f := range figs {
		maxReady, maxWriter = max(maxReady, f.ready), max(maxWriter, f.writer)
	}
	fmt.Printf("RESULT mode=sync requests=%d failovers=%d completes=%d claims=%d lost=%d doubled=%d backwards=%d max_ready_outage_s=%.1f max_writer_outage_s=%.1f violations=%d\n",
		h.requests.Load(), len(figs), completes, claims, lost, doubled, backwards, maxReady.Seconds(), maxWriter.Seconds(), len(h.violations))
	return len(h.violations) == 0 && len(figs) == h.cfg.kills
}
