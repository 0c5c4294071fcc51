// Package conformance is a black-box conformance kit for HTTP APIs that
// claim Idempotency-Key support. It talks to the target over HTTP only, so
// it can test any implementation: the idem gateway, an SDK middleware, or
// someone else's API.
//
// Every scenario has a class and cites what it checks:
//
//   - core: a MUST of draft-ietf-httpapi-idempotency-key-header-07 (the
//     "draft"): the key is an sf-string (§2.1), a key is not reused with
//     another payload (§2.2, and §2.7: the server MUST fail such a request),
//     a request retried while the first is in flight gets a conflict error
//     (§2.6), and duplicates of a money transfer MUST NOT happen (§1);
//   - recommended: a SHOULD of the draft (400 for a missing key, 422 for a
//     mismatch, 409 and the previous result for a retry, §2.6–2.7; the
//     published expiry, §2.3) or of the RFCs it leans on (RFC 9457 problem
//     bodies, Retry-After of RFC 9110 §10.2.3);
//   - idem: behaviour idem documents beyond the draft (docs/frontdoor.md):
//     key length, the bare key, JSON equivalence, the path in the
//     fingerprint, I-JSON bodies, Prefer: wait, problem members, failing
//     closed when the store is down.
//
// The target must expose an unsafe endpoint (Options.Path, default POST
// /orders) that performs one side effect per execution and answers 2xx
// with a body that differs from one execution to the next (an order
// number), and honours two query parameters: delay_ms=N (hold the answer N
// milliseconds, for the in-flight scenarios) and status=N (answer status N,
// for the stored-error scenario). It may expose a counter (Options.Counter,
// default GET /count answering {"count": N}) so the kit can check that a key
// causes one side effect; or the kit serves the endpoint itself (Upstream,
// `--serve-upstream`) behind the target and counts what reaches it. Upstream
// is the reference implementation of that contract.
//
// Run returns a Report; `server conformance --target URL` prints it.
package conformance

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
)

// Classes of scenarios, reported apart.
const (
	ClassCore        = "core"
	ClassRecommended = "recommended"
	ClassIdem        = "idem"
)

// Classes lists the classes in report order.
var Classes = []string{ClassCore, ClassRecommended, ClassIdem}

// Options configure Run.
type Options struct {
	// Target is the base URL of the API under test.
	Target string
	// Path is the unsafe endpoint (default /orders).
	Path string
	// OtherPath is another path the same unsafe method is served on,
	// ideally of the same route (Path /orders/1, OtherPath /orders/2);
	// default Path + "/other". The other_path scenario reuses a key there.
	OtherPath string
	// Method is its method (default POST).
	Method string
	// Counter is the path of the side-effect counter (default /count).
	// NoCounter skips the side-effect checks; Count, when set, is asked
	// instead of the target (the kit's own Upstream behind the target).
	Counter   string
	NoCounter bool
	Count     func(ctx context.Context) (int64, error)
	// ReplayHeader is the response header the target documents on a
	// replay, checked to be "true" on replays and absent on first answers;
	// "" is idem's Idempotent-Replayed, "-" none (a replay is then told by
	// its body alone).
	ReplayHeader string
	// Expiry is the key expiry the target publishes (draft §2.3): after it
	// the key is a new key. Zero skips the expiry scenario.
	Expiry time.Duration
	// Concurrency is how many simultaneous requests one_side_effect sends
	// on one key (default 8).
	Concurrency int
	// Scenarios limits the run to these names; nil runs them all.
	Scenarios []string
	// Client sends the requests; nil uses a client with a 30 s timeout.
	Client *http.Client
	// StoreDown, when set, makes the target's idempotency store fail and
	// returns the function that restores it; the store_unavailable scenario
	// is skipped without it.
	StoreDown func(ctx context.Context) (restore func(), err error)
}

// Result is the outcome of one scenario.
type Result struct {
	Name        string `json:"name"`
	Class       string `json:"class"`
	Ref         string `json:"ref"`
	Description string `json:"description"`
	Passed      bool   `json:"passed"`
	Skipped     bool   `json:"skipped"`
	// Detail says what failed, or why the scenario was skipped.
	Detail string `json:"detail,omitempty"`
	// Checks counts the assertions made.
	Checks int `json:"checks"`
	// Seconds is how long the scenario took.
	Seconds float64 `json:"seconds"`
}

// Outcome is "pass", "fail" or "skip".
func (x Result) Outcome() string {
	switch {
	case x.Skipped:
		return "skip"
	case !x.Passed:
		return "fail"
	}
	return "pass"
}

// Report is the outcome of a run.
type Report struct {
	Target  string   `json:"target"`
	Results []Result `json:"results"`
}

// Passed, Failed and Skipped count the scenarios by outcome.
func (r Report) Passed() int  { return r.count("", "pass") }
func (r Report) Failed() int  { return r.count("", "fail") }
func (r Report) Skipped() int { return r.count("", "skip") }

// Count counts the scenarios of class ("" for all) with outcome.
func (r Report) count(class, outcome string) int {
	n := 0
	for _, x := range r.Results {
		if (class == "" || x.Class == class) && x.Outcome() == outcome {
			n++
		}
	}
	return n
}

// ClassCounts returns passed, failed and skipped of one class.
func (r Report) ClassCounts(class string) (passed, failed, skipped int) {
	return r.count(class, "pass"), r.count(class, "fail"), r.count(class, "skip")
}

// Failures returns the names of the failed scenarios, in run order.
func (r Report) Failures() []string {
	var out []string
	for _, x := range r.Results {
		if x.Outcome() == "fail" {
			out = append(out, x.Name)
		}
	}
	return out
}

// Write prints the report, the scenarios grouped by class with the counts
// of each class, ending with the line "N passed, M failed".
func (r Report) Write(w io.Writer) {
	fmt.Fprintf(w, "Idempotency-Key conformance of %s\n", r.Target)
	for _, class := range Classes {
		p, f, s := r.ClassCounts(class)
		if p+f+s == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s: %d passed, %d failed, %d skipped\n", class, p, f, s)
		for _, x := range r.Results {
			if x.Class != class {
				continue
			}
			fmt.Fprintf(w, "%s  %-22s %s [%s]\n", strings.ToUpper(x.Outcome()), x.Name, x.Description, x.Ref)
			if x.Detail != "" {
				fmt.Fprintf(w, "      %s\n", x.Detail)
			}
		}
	}
	if n := r.Skipped(); n > 0 {
		fmt.Fprintf(w, "\n%d skipped\n", n)
	} else {
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "%d passed, %d failed\n", r.Passed(), r.Failed())
}

// WriteJSON prints the report as one JSON document: the target, the
// results and the counts of each class.
func (r Report) WriteJSON(w io.Writer) error {
	type counts struct {
		Passed  int `json:"passed"`
		Failed  int `json:"failed"`
		Skipped int `json:"skipped"`
	}
	doc := struct {
		Report
		Classes map[string]counts `json:"classes"`
	}{Report: r, Classes: map[string]counts{}}
	for _, c := range Classes {
		p, f, s := r.ClassCounts(c)
		doc.Classes[c] = counts{p, f, s}
	}
	if doc.Results == nil {
		doc.Results = []Result{}
	}
	if err := jsonv2.MarshalWrite(w, doc, jsontext.WithIndent("  "), jsonv2.Deterministic(true)); err != nil {
		return err
	}
	_, err := io.WriteString(w, "\n")
	return err
}

// ReadJSON reads a report WriteJSON wrote.
func ReadJSON(r io.Reader) (Report, error) {
	var rep Report
	err := jsonv2.UnmarshalRead(r, &rep, jsonv2.RejectUnknownMembers(false))
	return rep, err
}

// Scenario is one check of the kit.
type Scenario struct {
	// Name is the scenario's id.
	Name string
	// Class is ClassCore, ClassRecommended or ClassIdem.
	Class string
	// Ref is the draft section, RFC or documented behaviour it checks.
	Ref         string
	Description string
	run         func(k *kit) error
}

// errSkip skips a scenario.
type errSkip struct{ why string }

func (e errSkip) Error() string { return e.why }

// Run runs the scenarios against the target and returns the report.
func Run(ctx context.Context, opts Options) Report {
	if opts.Path == "" {
		opts.Path = "/orders"
	}
	if opts.Method == "" {
		opts.Method = http.MethodPost
	}
	if opts.OtherPath == "" {
		opts.OtherPath = strings.TrimSuffix(opts.Path, "/") + "/other"
	}
	if opts.Counter == "" && !opts.NoCounter {
		opts.Counter = "/count"
	}
	switch opts.ReplayHeader {
	case "":
		opts.ReplayHeader = "Idempotent-Replayed"
	case "-":
		opts.ReplayHeader = ""
	}
	if opts.Concurrency <= 0 {
		opts.Concurrency = 8
	}
	if opts.Client == nil {
		opts.Client = &http.Client{Timeout: 30 * time.Second}
	}
	opts.Target = strings.TrimSuffix(opts.Target, "/")
	var b [6]byte
	_, _ = rand.Read(b[:])
	rep := Report{Target: opts.Target}
	for _, s := range Scenarios() {
		if opts.Scenarios != nil && !slices.Contains(opts.Scenarios, s.Name) {
			continue
		}
		k := &kit{ctx: ctx, opts: opts, prefix: "conf-" + hex.EncodeToString(b[:]) + "-" + s.Name}
		began := time.Now()
		err := s.run(k)
		res := Result{Name: s.Name, Class: s.Class, Ref: s.Ref, Description: s.Description, Passed: err == nil, Checks: k.checks,
			Seconds: float64(time.Since(began).Milliseconds()) / 1000}
		var skip errSkip
		switch {
		case errors.As(err, &skip):
			res.Skipped, res.Detail = true, skip.why
		case err != nil:
			res.Detail = err.Error()
		}
		rep.Results = append(rep.Results, res)
	}
	return rep
}

// kit is the state of one scenario.
type kit struct {
	ctx    context.Context
	opts   Options
	prefix string
	checks int
}

func (k *kit) key(name string) string { return k.prefix + "-" + name }

type answer struct {
	status int
	header http.Header
	body   []byte
}

func (a answer) String() string {
	b := a.body
	if len(b) > 300 {
		b = append(b[:300:300], "…"...)
	}
	return fmt.Sprintf("%d %s", a.status, b)
}

// request is one unsafe request of a scenario.
type request struct {
	path   string // default Options.Path
	keys   []string
	body   string
	query  string
	header map[string]string
}

// send sends the unsafe request with the key field values given (nil: no
// field), the body and the query.
func (k *kit) send(keys []string, body, query string) (answer, error) {
	return k.do(k.ctx, request{keys: keys, body: body, query: query})
}

// sendCounted sends the requests one after the other and returns their
// answers, in order, with the side effects they caused (effects: -1 when
// the target has no counter). The first failure to send stops it.
func (k *kit) sendCounted(reqs ...request) ([]answer, int64, error) {
	answers := make([]answer, 0, len(reqs))
	n, err := k.effects(func() error {
		for _, r := range reqs {
			a, err := k.do(k.ctx, r)
			if err != nil {
				return err
			}
			answers = append(answers, a)
		}
		return nil
	})
	return answers, n, err
}

// sendTo is send to another path than Options.Path.
func (k *kit) sendTo(path string, keys []string, body, query string) (answer, error) {
	return k.do(k.ctx, request{path: path, keys: keys, body: body, query: query})
}

func (k *kit) do(ctx context.Context, r request) (answer, error) {
	path := r.path
	if path == "" {
		path = k.opts.Path
	}
	u := k.opts.Target + path
	if r.query != "" {
		u += "?" + r.query
	}
	req, err := http.NewRequestWithContext(ctx, k.opts.Method, u, strings.NewReader(r.body))
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	for _, v := range r.keys {
		req.Header.Add("Idempotency-Key", v)
	}
	for h, v := range r.header {
		req.Header.Set(h, v)
	}
	resp, err := k.opts.Client.Do(req)
	if err != nil {
		return answer{}, fmt.Errorf("%s %s: %w", k.opts.Method, u, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{}, fmt.Errorf("read answer: %w", err)
	}
	return answer{resp.StatusCode, resp.Header, b}, nil
}

// count returns the target's side-effect counter.
func (k *kit) count() (int64, error) {
	if k.opts.Count != nil {
		return k.opts.Count(k.ctx)
	}
	req, err := http.NewRequestWithContext(k.ctx, http.MethodGet, k.opts.Target+k.opts.Counter, nil)
	if err != nil {
		return 0, err
	}
	resp, err := k.opts.Client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("side-effect counter: %w", err)
	}
	defer resp.Body.Close()
	var c struct {
		Count *int64 `json:"count"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&c); err != nil || c.Count == nil || resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("side-effect counter GET %s did not answer 200 {\"count\": N}", k.opts.Counter)
	}
	return *c.Count, nil
}

// counting reports whether side effects can be counted.
func (k *kit) counting() bool { return !k.opts.NoCounter || k.opts.Count != nil }

// effects runs f and returns how many side effects it caused, or -1 when
// the target has no counter.
func (k *kit) effects(f func() error) (int64, error) {
	if !k.counting() {
		return -1, f()
	}
	before, err := k.count()
	if err != nil {
		return 0, err
	}
	if err := f(); err != nil {
		return 0, err
	}
	after, err := k.count()
	if err != nil {
		return 0, err
	}
	return after - before, nil
}

func (k *kit) check(ok bool, format string, args ...any) error {
	k.checks++
	if !ok {
		return fmt.Errorf(format, args...)
	}
	return nil
}

// wantEffects checks n side effects (skipped without a counter).
func (k *kit) wantEffects(got, want int64) error {
	if got < 0 {
		return nil
	}
	return k.check(got == want, "%d side effects, want %d", got, want)
}

// replayed reports whether a is marked as a replay by the documented
// header; without one it is told by its result being first's.
func (k *kit) replayed(a, first answer) bool {
	if k.opts.ReplayHeader == "" {
		return sameResult(a, first)
	}
	return a.header.Get(k.opts.ReplayHeader) == "true"
}

// sameResult reports whether a and b are the same result: the same status
// and the same body, byte for byte or as the same JSON value (an
// implementation that stores the parsed body re-encodes it). The core
// scenarios ask no more than this; retry_replay asks for the bytes.
func sameResult(a, b answer) bool {
	if a.status != b.status {
		return false
	}
	if string(a.body) == string(b.body) {
		return true
	}
	var x, y any
	if json.Unmarshal(a.body, &x) != nil || json.Unmarshal(b.body, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

// fresh checks that a is a first answer: 2xx and not marked replayed.
func (k *kit) fresh(a answer, what string) error {
	if err := k.check(a.status/100 == 2, "%s: %s", what, a); err != nil {
		return err
	}
	if k.opts.ReplayHeader != "" {
		return k.check(a.header.Get(k.opts.ReplayHeader) == "", "%s is marked %s: %s", what, k.opts.ReplayHeader, a)
	}
	return nil
}

// isReplayOf checks that a replays first: the same status and body, marked
// by the replay header when the target documents one.
func (k *kit) isReplayOf(a, first answer, what string) error {
	if err := k.check(a.status == first.status && string(a.body) == string(first.body),
		"%s is not the first answer:\nfirst  %s\nreplay %s", what, first, a); err != nil {
		return err
	}
	if k.opts.ReplayHeader != "" {
		return k.check(a.header.Get(k.opts.ReplayHeader) == "true", "%s lacks %s: true", what, k.opts.ReplayHeader)
	}
	return nil
}

// untilSettled sends r until it gets an answer other than 409 (what a
// client does with a conflict), at most for d.
func (k *kit) untilSettled(r request, d time.Duration) (answer, error) {
	deadline := time.Now().Add(d)
	for {
		a, err := k.do(k.ctx, r)
		if err != nil || a.status != http.StatusConflict || time.Now().After(deadline) {
			return a, err
		}
		select {
		case <-k.ctx.Done():
			return a, k.ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
