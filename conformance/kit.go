// Package conformance is a black-box conformance kit for HTTP APIs that
// claim Idempotency-Key support (draft-ietf-httpapi-idempotency-key-header
// §2.6–2.7, Stripe's behaviour and idem's front-door rules). It talks to
// the target over HTTP only, so it can test any implementation: the idem
// gateway, an SDK middleware, or someone else's API.
//
// The target must expose an unsafe endpoint (Options.Path, default POST
// /orders) that performs one side effect per execution and answers 2xx,
// and may expose a counter (Options.Counter, default GET /count answering
// {"count": N}) so the kit can check that a key causes one side effect.
// The in-flight scenario needs the endpoint to honour ?delay_ms=N (hold
// the answer N milliseconds). Upstream is a reference implementation of
// that contract.
//
// Run returns a Report; `server conformance --target URL` prints it.
package conformance

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

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
	// Counter is the path of the side-effect counter (default /count); ""
	// after setting NoCounter skips the side-effect checks.
	Counter   string
	NoCounter bool
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
	Name        string
	Description string
	Passed      bool
	Skipped     bool
	// Detail says what failed, or why the scenario was skipped.
	Detail string
	// Checks counts the assertions made.
	Checks int
}

// Report is the outcome of a run.
type Report struct {
	Target  string
	Results []Result
}

// Passed, Failed and Skipped count the scenarios by outcome.
func (r Report) Passed() int  { return r.count(func(x Result) bool { return x.Passed && !x.Skipped }) }
func (r Report) Failed() int  { return r.count(func(x Result) bool { return !x.Passed && !x.Skipped }) }
func (r Report) Skipped() int { return r.count(func(x Result) bool { return x.Skipped }) }

func (r Report) count(f func(Result) bool) int {
	n := 0
	for _, x := range r.Results {
		if f(x) {
			n++
		}
	}
	return n
}

// Write prints the report, one line per scenario, ending with the line
// "N passed, M failed".
func (r Report) Write(w io.Writer) {
	fmt.Fprintf(w, "Idempotency-Key conformance of %s\n\n", r.Target)
	for _, x := range r.Results {
		mark := "PASS"
		switch {
		case x.Skipped:
			mark = "SKIP"
		case !x.Passed:
			mark = "FAIL"
		}
		fmt.Fprintf(w, "%s  %-22s %s\n", mark, x.Name, x.Description)
		if x.Detail != "" {
			fmt.Fprintf(w, "      %s\n", x.Detail)
		}
	}
	if n := r.Skipped(); n > 0 {
		fmt.Fprintf(w, "\n%d skipped\n", n)
	} else {
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "%d passed, %d failed\n", r.Passed(), r.Failed())
}

// Scenario is one check of the kit.
type Scenario struct {
	Name        string
	Description string
	run         func(k *kit) error
}

// errSkip skips a scenario.
type errSkip struct{ why string }

func (e errSkip) Error() string { return e.why }

// Scenarios returns every scenario, in the order Run runs them.
func Scenarios() []Scenario {
	return []Scenario{
		{"key_syntax", "malformed keys (missing on POST, empty, 256 bytes, a list, two fields, non-ASCII, bad sf-string) get 400 problem+json", scenarioKeySyntax},
		{"first_request", "a new key runs the request once: 2xx, no Idempotent-Replayed, one side effect", scenarioFirst},
		{"retry_replay", "a retry gets the stored response verbatim (status, body, Location) with Idempotent-Replayed: true", scenarioReplay},
		{"one_side_effect", "several retries, JSON re-spaced and re-ordered, cause one side effect in total", scenarioOneSideEffect},
		{"sf_string_key", "the RFC 8941 sf-string \"k\" and the bare k are the same key", scenarioSFString},
		{"concurrent_request", "the key in flight: 409 problem with Retry-After, then the replay; concurrent duplicates cause one side effect", scenarioConcurrent},
		{"fingerprint_mismatch", "the key reused with another body or query: 422 problem, no side effect", scenarioMismatch},
		{"other_path", "the key reused with the same body on another path (/orders/7 vs /orders/8): 422 problem, no side effect, not the other resource's replay", scenarioOtherPath},
		{"non_ijson_body", "a JSON body that is not I-JSON (duplicate member names, lone surrogate, invalid UTF-8, number out of range): 400 problem, no side effect", scenarioNonIJSON},
		{"problem_details", "every refusal is RFC 9457 problem+json with type, title, status, detail, code, retryable, instance", scenarioProblems},
		{"store_unavailable", "the idempotency store failing: 503 problem with Retry-After, the request is not run (fail closed)", scenarioStoreDown},
	}
}

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
		err := s.run(k)
		res := Result{Name: s.Name, Description: s.Description, Passed: err == nil, Checks: k.checks}
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

// send sends the unsafe request with the key field values given (nil: no
// field), the body and the query.
func (k *kit) send(keys []string, body, query string) (answer, error) {
	return k.sendTo(k.opts.Path, keys, body, query)
}

// sendTo is send to another path than Options.Path.
func (k *kit) sendTo(path string, keys []string, body, query string) (answer, error) {
	u := k.opts.Target + path
	if query != "" {
		u += "?" + query
	}
	req, err := http.NewRequestWithContext(k.ctx, k.opts.Method, u, strings.NewReader(body))
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	for _, v := range keys {
		req.Header.Add("Idempotency-Key", v)
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

// effects runs f and returns how many side effects it caused, or -1 when
// the target has no counter.
func (k *kit) effects(f func() error) (int64, error) {
	if k.opts.NoCounter {
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

// problem checks that a is an RFC 9457 problem with status and code.
func (k *kit) problem(a answer, status int, code string) error {
	if err := k.check(a.status == status, "status %d, want %d (%s): %s", a.status, status, code, a); err != nil {
		return err
	}
	mt, _, _ := mime.ParseMediaType(a.header.Get("Content-Type"))
	if err := k.check(mt == "application/problem+json", "Content-Type %q, want application/problem+json", a.header.Get("Content-Type")); err != nil {
		return err
	}
	var p map[string]any
	if err := json.Unmarshal(a.body, &p); err != nil {
		return k.check(false, "problem body is not JSON: %s", a)
	}
	for _, member := range []string{"type", "title", "detail", "code", "instance"} {
		s, ok := p[member].(string)
		if err := k.check(ok && s != "", "problem member %q missing or not a non-empty string: %s", member, a); err != nil {
			return err
		}
	}
	if err := k.check(p["status"] == float64(status), "problem status %v, want %d", p["status"], status); err != nil {
		return err
	}
	retryable, ok := p["retryable"].(bool)
	if err := k.check(ok, "problem member \"retryable\" missing or not a boolean"); err != nil {
		return err
	}
	if code != "" {
		if err := k.check(p["code"] == code, "problem code %v, want %s", p["code"], code); err != nil {
			return err
		}
	}
	if retryable || status == http.StatusServiceUnavailable || code == "request_in_flight" {
		ra, err := strconv.Atoi(a.header.Get("Retry-After"))
		if err := k.check(err == nil && ra >= 1, "Retry-After %q, want whole seconds >= 1", a.header.Get("Retry-After")); err != nil {
			return err
		}
	}
	return nil
}

func scenarioKeySyntax(k *kit) error {
	cases := []struct {
		name string
		keys []string
		code string
	}{
		{"missing", nil, "idempotency_key_missing"},
		{"empty", []string{""}, "invalid_key"},
		{"256 bytes", []string{strings.Repeat("k", 256)}, "invalid_key"},
		{"a list", []string{k.key("a") + ", " + k.key("b")}, "invalid_key"},
		{"two fields", []string{k.key("a"), k.key("a")}, "invalid_key"},
		{"non-ASCII", []string{k.key("caf\xc3\xa9")}, "invalid_key"},
		{"unterminated sf-string", []string{`"` + k.key("u")}, "invalid_key"},
	}
	var n int64
	n, err := k.effects(func() error {
		for _, c := range cases {
			a, err := k.send(c.keys, `{"scenario":"key_syntax"}`, "")
			if err != nil {
				return err
			}
			if err := k.problem(a, http.StatusBadRequest, ""); err != nil {
				return fmt.Errorf("%s key: %w", c.name, err)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	longest := k.key("max-")
	longest += strings.Repeat("k", 255-len(longest))
	ok, err := k.send([]string{longest}, `{"scenario":"key_syntax"}`, "")
	if err != nil {
		return err
	}
	if err := k.check(ok.status/100 == 2, "a 255-byte key was refused: %s", ok); err != nil {
		return err
	}
	return k.wantEffects(n, 0)
}

func scenarioFirst(k *kit) error {
	var a answer
	n, err := k.effects(func() error {
		var err error
		a, err = k.send([]string{k.key("1")}, `{"scenario":"first_request"}`, "")
		return err
	})
	if err != nil {
		return err
	}
	if err := k.check(a.status/100 == 2, "first request: %s", a); err != nil {
		return err
	}
	if err := k.check(a.header.Get("Idempotent-Replayed") != "true", "the first answer is marked Idempotent-Replayed"); err != nil {
		return err
	}
	return k.wantEffects(n, 1)
}

func scenarioReplay(k *kit) error {
	key := k.key("1")
	first, err := k.send([]string{key}, `{"scenario":"retry_replay","amount":1000}`, "")
	if err != nil {
		return err
	}
	if err := k.check(first.status/100 == 2, "first request: %s", first); err != nil {
		return err
	}
	var again answer
	n, err := k.effects(func() error {
		var err error
		again, err = k.send([]string{key}, `{"scenario":"retry_replay","amount":1000}`, "")
		return err
	})
	if err != nil {
		return err
	}
	if err := k.check(again.status == first.status, "replay status %d, first %d", again.status, first.status); err != nil {
		return err
	}
	if err := k.check(bytes.Equal(again.body, first.body), "replay body differs:\nfirst  %s\nreplay %s", first, again); err != nil {
		return err
	}
	if err := k.check(again.header.Get("Idempotent-Replayed") == "true", "replay lacks Idempotent-Replayed: true"); err != nil {
		return err
	}
	for _, h := range []string{"Content-Type", "Location", "ETag"} {
		if err := k.check(again.header.Get(h) == first.header.Get(h), "replayed %s %q, first %q", h, again.header.Get(h), first.header.Get(h)); err != nil {
			return err
		}
	}
	if first.header.Get("Set-Cookie") != "" {
		if err := k.check(again.header.Get("Set-Cookie") == "", "the replay repeats Set-Cookie"); err != nil {
			return err
		}
	}
	return k.wantEffects(n, 0)
}

func scenarioOneSideEffect(k *kit) error {
	key := k.key("1")
	bodies := []string{
		`{"scenario":"one_side_effect","amount":1000,"currency":"usd"}`,
		`{"currency":"usd","amount":1000,"scenario":"one_side_effect"}`,
		"{ \"scenario\" : \"one_side_effect\",\n  \"amount\": 1000.0, \"currency\": \"usd\" }",
		`{"scenario":"one_side_effect","amount":1e3,"currency":"usd"}`,
	}
	var answers []answer
	n, err := k.effects(func() error {
		for _, b := range bodies {
			a, err := k.send([]string{key}, b, "")
			if err != nil {
				return err
			}
			answers = append(answers, a)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for i, a := range answers {
		if err := k.check(a.status/100 == 2 && bytes.Equal(a.body, answers[0].body), "request %d: %s, first %s", i, a, answers[0]); err != nil {
			return err
		}
	}
	return k.wantEffects(n, 1)
}

func scenarioSFString(k *kit) error {
	key := k.key("1")
	var first, bare answer
	n, err := k.effects(func() error {
		var err error
		if first, err = k.send([]string{`"` + key + `"`}, `{"scenario":"sf_string_key"}`, ""); err != nil {
			return err
		}
		bare, err = k.send([]string{key}, `{"scenario":"sf_string_key"}`, "")
		return err
	})
	if err != nil {
		return err
	}
	if err := k.check(first.status/100 == 2, "sf-string key: %s", first); err != nil {
		return err
	}
	if err := k.check(bare.header.Get("Idempotent-Replayed") == "true" && bytes.Equal(bare.body, first.body),
		"the bare key was not treated as the sf-string key: %s", bare); err != nil {
		return err
	}
	return k.wantEffects(n, 1)
}

func scenarioConcurrent(k *kit) error {
	key := k.key("1")
	body := `{"scenario":"concurrent_request"}`
	// The target holds each execution 3 s; the second request goes out
	// 300 ms after the first. Whichever the target claimed first runs, the
	// other must get 409 (on a slow machine the second may be claimed
	// first: that is no fault of the target).
	query := "delay_ms=3000"
	var a, b answer
	n, err := k.effects(func() error {
		done := make(chan error, 1)
		go func() {
			var err error
			a, err = k.send([]string{key}, body, query)
			done <- err
		}()
		time.Sleep(300 * time.Millisecond)
		var err error
		if b, err = k.send([]string{key}, body, query); err != nil {
			return err
		}
		return <-done
	})
	if err != nil {
		return err
	}
	first, dup := a, b
	if a.status == http.StatusConflict {
		first, dup = b, a
	}
	if err := k.check(first.status/100 == 2 && first.header.Get("Idempotent-Replayed") != "true", "the request that ran: %s", first); err != nil {
		return err
	}
	if err := k.problem(dup, http.StatusConflict, "request_in_flight"); err != nil {
		return fmt.Errorf("duplicate while in flight: %w", err)
	}
	after, err := k.send([]string{key}, body, query)
	if err != nil {
		return err
	}
	if err := k.check(after.header.Get("Idempotent-Replayed") == "true" && bytes.Equal(after.body, first.body), "retry after completion: %s", after); err != nil {
		return err
	}
	if err := k.wantEffects(n, 1); err != nil {
		return err
	}

	// A burst of simultaneous duplicates, each retried on 409 as told.
	burstKey := k.key("burst")
	const callers = 8
	results := make([]answer, callers)
	n, err = k.effects(func() error {
		var wg sync.WaitGroup
		errs := make([]error, callers)
		for i := range callers {
			wg.Go(func() {
				for range 100 {
					a, err := k.send([]string{burstKey}, body, "delay_ms=200")
					if err != nil {
						errs[i] = err
						return
					}
					if a.status == http.StatusConflict {
						time.Sleep(100 * time.Millisecond)
						continue
					}
					results[i] = a
					return
				}
			})
		}
		wg.Wait()
		return errors.Join(errs...)
	})
	if err != nil {
		return err
	}
	for i, a := range results {
		if err := k.check(a.status/100 == 2 && bytes.Equal(a.body, results[0].body), "burst caller %d got %s, caller 0 %s", i, a, results[0]); err != nil {
			return err
		}
	}
	return k.wantEffects(n, 1)
}

func scenarioMismatch(k *kit) error {
	key := k.key("1")
	first, err := k.send([]string{key}, `{"scenario":"fingerprint_mismatch","amount":1000}`, "")
	if err != nil {
		return err
	}
	if err := k.check(first.status/100 == 2, "first request: %s", first); err != nil {
		return err
	}
	var body, query answer
	n, err := k.effects(func() error {
		var err error
		if body, err = k.send([]string{key}, `{"scenario":"fingerprint_mismatch","amount":2000}`, ""); err != nil {
			return err
		}
		query, err = k.send([]string{key}, `{"scenario":"fingerprint_mismatch","amount":1000}`, "dry_run=1")
		return err
	})
	if err != nil {
		return err
	}
	if err := k.problem(body, http.StatusUnprocessableEntity, "fingerprint_mismatch"); err != nil {
		return fmt.Errorf("another body: %w", err)
	}
	if err := k.problem(query, http.StatusUnprocessableEntity, "fingerprint_mismatch"); err != nil {
		return fmt.Errorf("another query: %w", err)
	}
	return k.wantEffects(n, 0)
}

func scenarioOtherPath(k *kit) error {
	key := k.key("1")
	body := `{"scenario":"other_path","status":"cancelled"}`
	first, err := k.send([]string{key}, body, "")
	if err != nil {
		return err
	}
	if err := k.check(first.status/100 == 2, "first request: %s", first); err != nil {
		return err
	}
	var other answer
	n, err := k.effects(func() error {
		other, err = k.sendTo(k.opts.OtherPath, []string{key}, body, "")
		return err
	})
	if err != nil {
		return err
	}
	if err := k.problem(other, http.StatusUnprocessableEntity, "fingerprint_mismatch"); err != nil {
		return fmt.Errorf("same key and body on %s: %w", k.opts.OtherPath, err)
	}
	return k.wantEffects(n, 0)
}

func scenarioNonIJSON(k *kit) error {
	bodies := []string{`{"amount":1000,"amount":1}`, `{"a":{"x":1,"x":2}}`, `{"note":"\ud800"}`, "{\"note\":\"\xff\"}", `{"amount":1e400}`}
	answers := make([]answer, len(bodies))
	n, err := k.effects(func() error {
		for i, b := range bodies {
			var err error
			if answers[i], err = k.send([]string{k.key(strconv.Itoa(i))}, b, ""); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	for i, a := range answers {
		if err := k.problem(a, http.StatusBadRequest, "invalid_request"); err != nil {
			return fmt.Errorf("body %q: %w", bodies[i], err)
		}
	}
	return k.wantEffects(n, 0)
}

func scenarioProblems(k *kit) error {
	missing, err := k.send(nil, `{"scenario":"problem_details"}`, "")
	if err != nil {
		return err
	}
	if err := k.problem(missing, http.StatusBadRequest, "idempotency_key_missing"); err != nil {
		return fmt.Errorf("missing key: %w", err)
	}
	bad, err := k.send([]string{"a, b"}, `{"scenario":"problem_details"}`, "")
	if err != nil {
		return err
	}
	if err := k.problem(bad, http.StatusBadRequest, "invalid_key"); err != nil {
		return fmt.Errorf("invalid key: %w", err)
	}
	var p1, p2 map[string]any
	_ = json.Unmarshal(missing.body, &p1)
	_ = json.Unmarshal(bad.body, &p2)
	return k.check(p1["instance"] != p2["instance"], "two occurrences share the instance %v", p1["instance"])
}

func scenarioStoreDown(k *kit) error {
	if k.opts.StoreDown == nil {
		return errSkip{"the target cannot simulate a store failure (no StoreDown hook)"}
	}
	restore, err := k.opts.StoreDown(k.ctx)
	if err != nil {
		return fmt.Errorf("make the store fail: %w", err)
	}
	var a answer
	n, err := k.effects(func() error {
		var err error
		a, err = k.send([]string{k.key("1")}, `{"scenario":"store_unavailable"}`, "")
		return err
	})
	restore()
	if err != nil {
		return err
	}
	if err := k.problem(a, http.StatusServiceUnavailable, ""); err != nil {
		return err
	}
	if err := k.wantEffects(n, 0); err != nil {
		return err
	}
	// Back up, the same key runs; a client retries a 503 as told, and the
	// first requests after an outage may still meet broken connections.
	var after answer
	for range 10 {
		if after, err = k.send([]string{k.key("1")}, `{"scenario":"store_unavailable"}`, ""); err != nil {
			return err
		}
		if after.status != http.StatusServiceUnavailable {
			break
		}
		time.Sleep(300 * time.Millisecond)
	}
	return k.check(after.status/100 == 2, "the same key after the store came back: %s", after)
}
