package conformance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Scenarios returns every scenario, in the order Run runs them: core, then
// recommended, then idem.
func Scenarios() []Scenario {
	return []Scenario{
		{"sf_string_key", ClassCore, "§2.1", "an sf-string key (\"k\") is accepted and a retry with it is not run again", scenarioSFString},
		{"one_side_effect", ClassCore, "§1, §2.6", "retries of one key, in turn and N at once (each retried on 409), cause one side effect; every 2xx answer is that run's result", scenarioOneSideEffect},
		{"in_flight_conflict", ClassCore, "§2.6", "the key retried while the first request is in flight: 409 conflict, the retry is not run", scenarioInFlight},
		{"mismatch_refused", ClassCore, "§2.2, §2.7", "the key reused with another payload is failed with a 4xx and not run", scenarioMismatchRefused},
		{"client_disconnect", ClassCore, "§1, §2.6", "the caller hangs up mid-request and retries until settled: one side effect, the retry gets a 2xx", scenarioDisconnect},

		{"first_request", ClassRecommended, "§2.6", "a new key is processed normally: 2xx, not marked replayed, one side effect", scenarioFirst},
		{"retry_replay", ClassRecommended, "§2.6", "a retry after completion gets the previous answer byte-identical (status, body, Content-Type, Location; the replay header if documented)", scenarioReplay},
		{"stored_error", ClassRecommended, "§2.6", "a 500 answer is the previous result too: the retry gets it again and is not run", scenarioStoredError},
		{"missing_key_400", ClassRecommended, "§2.7", "no Idempotency-Key on the operation that requires it: 400, not run", scenarioMissingKey},
		{"malformed_key_400", ClassRecommended, "§2.1, RFC 8941 §4.2", "a key that is no sf-string Item (empty, a list, two fields, unterminated string): 400, not run", scenarioMalformedKey},
		{"mismatch_422", ClassRecommended, "§2.7", "the key reused with another payload: 422", scenarioMismatch422},
		{"in_flight_retry_after", ClassRecommended, "§2.7, RFC 9110 §10.2.3", "the 409 for a key in flight says when to retry (Retry-After), and the retry after completion gets the replay", scenarioRetryAfter},
		{"problem_details", ClassRecommended, "§2.7, RFC 9457 §3", "the 400, 409 and 422 refusals are application/problem+json with type, title and the status", scenarioProblems},
		{"expiry", ClassRecommended, "§2.3", "the key is replayed within its published expiry and is a new key after it", scenarioExpiry},

		{"key_length", ClassIdem, "docs/frontdoor.md rule 1", "a 255-byte key is accepted; 256 bytes or a byte outside printable ASCII: 400", scenarioKeyLength},
		{"bare_key", ClassIdem, "docs/frontdoor.md rule 1", "the bare k and the sf-string \"k\" are the same key", scenarioBareKey},
		{"json_equivalence", ClassIdem, "docs/frontdoor.md rule 4", "JSON re-spaced, re-ordered or with 1e3 for 1000 is the same request: one side effect", scenarioJSONEquivalence},
		{"fingerprint_scope", ClassIdem, "docs/frontdoor.md rule 4", "the key reused with another query, or on another path of the route: 422, not run", scenarioFingerprintScope},
		{"non_ijson_body", ClassIdem, "docs/frontdoor.md rule 4, RFC 7493", "a JSON body that is not I-JSON (duplicate names, lone surrogate, invalid UTF-8, number out of range): 400, not run", scenarioNonIJSON},
		{"prefer_wait", ClassIdem, "docs/frontdoor.md rule 5, RFC 7240", "a retry with Prefer: wait=N while the key is in flight is held and gets the replay, with Preference-Applied", scenarioPreferWait},
		{"replay_headers", ClassIdem, "docs/frontdoor.md rule 6", "a replay repeats the allowlisted headers (ETag) and never Set-Cookie", scenarioReplayHeaders},
		{"problem_members", ClassIdem, "docs/frontdoor.md rule 7", "every refusal has detail, code, retryable and its own instance; a retryable one has Retry-After", scenarioProblemMembers},
		{"store_unavailable", ClassIdem, "docs/frontdoor.md rule 5", "the idempotency store failing: 503 problem with Retry-After, the request is not run (fail closed); back up, the key runs", scenarioStoreDown},
	}
}

// problemShape checks that a is an RFC 9457 problem of status: the media
// type, a JSON object with type and title, and status when given.
func (k *kit) problemShape(a answer, status int) error {
	if err := k.check(a.status == status, "status %d, want %d: %s", a.status, status, a); err != nil {
		return err
	}
	mt, _, _ := mime.ParseMediaType(a.header.Get("Content-Type"))
	if err := k.check(mt == "application/problem+json", "%d with Content-Type %q, want application/problem+json", status, a.header.Get("Content-Type")); err != nil {
		return err
	}
	var p map[string]any
	if err := k.check(json.Unmarshal(a.body, &p) == nil, "%d problem body is not a JSON object: %s", status, a); err != nil {
		return err
	}
	for _, member := range []string{"type", "title"} {
		s, ok := p[member].(string)
		if err := k.check(ok && s != "", "%d problem member %q missing or not a non-empty string: %s", status, member, a); err != nil {
			return err
		}
	}
	if s, ok := p["status"]; ok {
		return k.check(s == float64(status), "%d problem status member %v", status, s)
	}
	return nil
}

// problem checks that a is an idem problem (docs/frontdoor.md rule 7):
// the RFC 9457 shape with status, detail, code, retryable and instance,
// and Retry-After when it is retryable.
func (k *kit) problem(a answer, status int, code string) error {
	if err := k.problemShape(a, status); err != nil {
		return err
	}
	var p map[string]any
	_ = json.Unmarshal(a.body, &p)
	for _, member := range []string{"detail", "code", "instance"} {
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
		if err := k.retryAfter(a); err != nil {
			return err
		}
	}
	return nil
}

// retryAfter checks a Retry-After of delay-seconds >= 1 or an HTTP-date.
func (k *kit) retryAfter(a answer) error {
	v := a.header.Get("Retry-After")
	n, err := strconv.Atoi(v)
	ok := err == nil && n >= 1
	if !ok {
		_, err := http.ParseTime(v)
		ok = err == nil
	}
	return k.check(ok, "Retry-After %q, want delay-seconds >= 1 or an HTTP-date (%d answer)", v, a.status)
}

// inFlight sends the request twice on one key, the second 300 ms after the
// first, while the target holds the first 2 s (delay_ms), and returns the
// answer of the request that ran and of the one that met it in flight,
// and the side effects of both. The retry carries header when given.
func (k *kit) inFlight(key, body string, header map[string]string) (ran, dup answer, n int64, err error) {
	query := "delay_ms=2000"
	var a, b answer
	n, err = k.effects(func() error {
		done := make(chan error, 1)
		go func() {
			var err error
			a, err = k.send([]string{key}, body, query)
			done <- err
		}()
		time.Sleep(300 * time.Millisecond)
		var err error
		if b, err = k.do(k.ctx, request{keys: []string{key}, body: body, query: query, header: header}); err != nil {
			return err
		}
		return <-done
	})
	// Whichever the target claimed first ran; on a slow machine the second
	// may be claimed first, and that is no fault of the target.
	ran, dup = a, b
	if a.status == http.StatusConflict {
		ran, dup = b, a
	}
	return ran, dup, n, err
}

func scenarioSFString(k *kit) error {
	key := `"` + k.key("1") + `"`
	r := request{keys: []string{key}, body: `{"scenario":"sf_string_key"}`}
	as, n, err := k.sendCounted(r, r)
	if err != nil {
		return err
	}
	first, again := as[0], as[1]
	if err := k.check(first.status/100 == 2, "sf-string key refused: %s", first); err != nil {
		return err
	}
	if n >= 0 {
		return k.wantEffects(n, 1)
	}
	return k.check(sameResult(again, first), "the retry with the sf-string key ran again or answered otherwise:\nfirst %s\nretry %s", first, again)
}

func scenarioOneSideEffect(k *kit) error {
	key := k.key("seq")
	body := `{"scenario":"one_side_effect","amount":1000}`
	r := request{keys: []string{key}, body: body}
	answers, n, err := k.sendCounted(r, r, r)
	if err != nil {
		return err
	}
	if err := k.check(answers[0].status/100 == 2, "first request: %s", answers[0]); err != nil {
		return err
	}
	if err := k.oneRun(answers, n); err != nil {
		return fmt.Errorf("3 requests in turn: %w", err)
	}

	// N simultaneous duplicates, each retried on 409 as the draft tells.
	burstKey := k.key("burst")
	callers := k.opts.Concurrency
	results := make([]answer, callers)
	n, err = k.effects(func() error {
		var wg sync.WaitGroup
		errs := make([]error, callers)
		start := make(chan struct{})
		for i := range callers {
			wg.Go(func() {
				<-start
				results[i], errs[i] = k.untilSettled(request{keys: []string{burstKey}, body: body, query: "delay_ms=200"}, 10*time.Second)
			})
		}
		close(start)
		wg.Wait()
		return errors.Join(errs...)
	})
	if err != nil {
		return err
	}
	if err := k.oneRun(results, n); err != nil {
		return fmt.Errorf("%d requests at once: %w", callers, err)
	}
	return nil
}

// oneRun checks that answers, of requests with one key, come from one run:
// n side effects is 1 and every 2xx answer is the same result; without a
// counter, every answer is the same 2xx result. (Whether a retry gets that
// result back is retry_replay's question, a SHOULD of the draft; that it
// runs once is the MUST.)
func (k *kit) oneRun(answers []answer, n int64) error {
	var first *answer
	for i := range answers {
		a := answers[i]
		if n < 0 && a.status/100 != 2 {
			return k.check(false, "answer %d: %s, want the 2xx of the one run", i, a)
		}
		if a.status/100 != 2 {
			continue
		}
		if first == nil {
			first = &answers[i]
			continue
		}
		if err := k.check(sameResult(a, *first), "answer %d is another run's: %s, first %s", i, a, *first); err != nil {
			return err
		}
	}
	return k.wantEffects(n, 1)
}

func scenarioInFlight(k *kit) error {
	ran, dup, n, err := k.inFlight(k.key("1"), `{"scenario":"in_flight_conflict"}`, nil)
	if err != nil {
		return err
	}
	if err := k.check(ran.status/100 == 2, "the request that ran: %s", ran); err != nil {
		return err
	}
	if err := k.check(dup.status == http.StatusConflict, "the retry while in flight: %s, want 409%s", dup, how(dup, ran)); err != nil {
		return err
	}
	return k.wantEffects(n, 1)
}

// how says what a request that met its key in flight got instead of 409:
// the first request's result (it waited for it) or a run of its own.
func how(dup, ran answer) string {
	switch {
	case dup.status/100 != 2:
		return ""
	case sameResult(dup, ran):
		return " (it waited for the first request and got its result: no second side effect)"
	}
	return " (it ran again)"
}

// mismatch sends a first request and the key again with another body and
// returns the second answer and its side effects.
func (k *kit) mismatch(name string) (answer, int64, error) {
	key := k.key("1")
	first, err := k.send([]string{key}, `{"scenario":"`+name+`","amount":1000}`, "")
	if err != nil {
		return answer{}, 0, err
	}
	if err := k.check(first.status/100 == 2, "first request: %s", first); err != nil {
		return answer{}, 0, err
	}
	as, n, err := k.sendCounted(request{keys: []string{key}, body: `{"scenario":"` + name + `","amount":2000}`})
	if err != nil {
		return answer{}, 0, err
	}
	return as[0], n, nil
}

func scenarioMismatchRefused(k *kit) error {
	other, n, err := k.mismatch("mismatch_refused")
	if err != nil {
		return err
	}
	if err := k.check(other.status/100 == 4, "the key with another payload: %s, want a 4xx", other); err != nil {
		return err
	}
	return k.wantEffects(n, 0)
}

func scenarioMismatch422(k *kit) error {
	other, _, err := k.mismatch("mismatch_422")
	if err != nil {
		return err
	}
	return k.check(other.status == http.StatusUnprocessableEntity, "the key with another payload: %s, want 422", other)
}

func scenarioDisconnect(k *kit) error {
	key := k.key("1")
	body := `{"scenario":"client_disconnect"}`
	const hold = 1500 * time.Millisecond
	r := request{keys: []string{key}, body: body, query: "delay_ms=" + strconv.Itoa(int(hold/time.Millisecond))}
	var settled, again answer
	n, err := k.effects(func() error {
		// The caller gives up 300 ms in, while the target holds the answer.
		ctx, cancel := context.WithTimeout(k.ctx, 300*time.Millisecond)
		_, err := k.do(ctx, r)
		cancel()
		if err == nil {
			return errors.New("the request was answered before the caller hung up: the target does not honour delay_ms")
		}
		if settled, err = k.untilSettled(r, 20*time.Second); err != nil {
			return err
		}
		if again, err = k.do(k.ctx, r); err != nil {
			return err
		}
		// A run the hang-up did not stop ends within the hold: wait it out
		// before counting, so that a second run is counted too.
		time.Sleep(hold + 500*time.Millisecond)
		return nil
	})
	if err != nil {
		return err
	}
	if err := k.check(settled.status/100 == 2, "the retry after the hang-up: %s", settled); err != nil {
		return err
	}
	return k.oneRun([]answer{settled, again}, n)
}

func scenarioFirst(k *kit) error {
	as, n, err := k.sendCounted(request{keys: []string{k.key("1")}, body: `{"scenario":"first_request"}`})
	if err != nil {
		return err
	}
	a := as[0]
	if err := k.fresh(a, "first request"); err != nil {
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
	if err := k.fresh(first, "first request"); err != nil {
		return err
	}
	as, n, err := k.sendCounted(request{keys: []string{key}, body: `{"scenario":"retry_replay","amount":1000}`})
	if err != nil {
		return err
	}
	again := as[0]
	if err := k.isReplayOf(again, first, "the retry"); err != nil {
		return err
	}
	for _, h := range []string{"Content-Type", "Location"} {
		if err := k.check(again.header.Get(h) == first.header.Get(h), "replayed %s %q, first %q", h, again.header.Get(h), first.header.Get(h)); err != nil {
			return err
		}
	}
	return k.wantEffects(n, 0)
}

func scenarioStoredError(k *kit) error {
	key := k.key("1")
	body := `{"scenario":"stored_error"}`
	r := request{keys: []string{key}, body: body, query: "status=500"}
	as, n, err := k.sendCounted(r, r)
	if err != nil {
		return err
	}
	first, again := as[0], as[1]
	if err := k.check(first.status == http.StatusInternalServerError, "first request with status=500: %s (the target does not honour status=N)", first); err != nil {
		return err
	}
	if err := k.isReplayOf(again, first, "the retry of the 500"); err != nil {
		return err
	}
	return k.wantEffects(n, 1)
}

// refused sends each key set and checks status 400 and no side effect.
func (k *kit) refused(name string, cases []struct {
	name string
	keys []string
}) error {
	n, err := k.effects(func() error {
		for _, c := range cases {
			a, err := k.send(c.keys, `{"scenario":"`+name+`"}`, "")
			if err != nil {
				return err
			}
			if err := k.check(a.status == http.StatusBadRequest, "%s key: %s, want 400", c.name, a); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return k.wantEffects(n, 0)
}

type keyCase = struct {
	name string
	keys []string
}

func scenarioMissingKey(k *kit) error {
	return k.refused("missing_key_400", []keyCase{{"missing", nil}})
}

func scenarioMalformedKey(k *kit) error {
	return k.refused("malformed_key_400", []keyCase{
		{"empty", []string{""}},
		{"a list", []string{k.key("a") + ", " + k.key("b")}},
		{"two fields", []string{k.key("a"), k.key("a")}},
		{"unterminated sf-string", []string{`"` + k.key("u")}},
	})
}

func scenarioRetryAfter(k *kit) error {
	key, body := k.key("1"), `{"scenario":"in_flight_retry_after"}`
	ran, dup, _, err := k.inFlight(key, body, nil)
	if err != nil {
		return err
	}
	if err := k.check(dup.status == http.StatusConflict, "the retry while in flight: %s, want 409%s", dup, how(dup, ran)); err != nil {
		return err
	}
	if err := k.retryAfter(dup); err != nil {
		return err
	}
	after, err := k.send([]string{key}, body, "delay_ms=2000")
	if err != nil {
		return err
	}
	return k.isReplayOf(after, ran, "the retry after completion")
}

func scenarioProblems(k *kit) error {
	missing, err := k.send(nil, `{"scenario":"problem_details"}`, "")
	if err != nil {
		return err
	}
	if err := k.problemShape(missing, http.StatusBadRequest); err != nil {
		return fmt.Errorf("missing key: %w", err)
	}
	other, _, err := k.mismatch("problem_details")
	if err != nil {
		return err
	}
	if err := k.problemShape(other, http.StatusUnprocessableEntity); err != nil {
		return fmt.Errorf("mismatch: %w", err)
	}
	_, dup, _, err := k.inFlight(k.key("2"), `{"scenario":"problem_details"}`, nil)
	if err != nil {
		return err
	}
	if err := k.problemShape(dup, http.StatusConflict); err != nil {
		return fmt.Errorf("in flight: %w", err)
	}
	return nil
}

func scenarioExpiry(k *kit) error {
	if k.opts.Expiry <= 0 {
		return errSkip{"no published expiry given (--expiry)"}
	}
	key, body := k.key("1"), `{"scenario":"expiry"}`
	began := time.Now()
	first, err := k.send([]string{key}, body, "")
	if err != nil {
		return err
	}
	if err := k.fresh(first, "first request"); err != nil {
		return err
	}
	// Halfway through the expiry the key still replays.
	time.Sleep(k.opts.Expiry / 2)
	mid, err := k.send([]string{key}, body, "")
	if err != nil {
		return err
	}
	if err := k.check(k.replayed(mid, first) && sameResult(mid, first), "the retry %s in is not the first result: %s, first %s",
		time.Since(began).Round(time.Millisecond), mid, first); err != nil {
		return err
	}
	// Past it, the key is a new key: the request runs again. The target may
	// purge late; it gets half the expiry, at least 5 s, of grace.
	grace := max(5*time.Second, k.opts.Expiry/2)
	deadline := began.Add(k.opts.Expiry + grace)
	for {
		as, n, err := k.sendCounted(request{keys: []string{key}, body: body})
		if err != nil {
			return err
		}
		a := as[0]
		if !k.replayed(a, first) && a.status/100 == 2 && !sameResult(a, first) {
			// Measured from before the first request was sent: the target's
			// clock starts at its completion, later; a second of grace.
			if err := k.check(time.Since(began) >= k.opts.Expiry-time.Second, "the key ran anew after %s, before its expiry %s", time.Since(began), k.opts.Expiry); err != nil {
				return err
			}
			return k.wantEffects(n, 1)
		}
		if time.Now().After(deadline) {
			return k.check(false, "the key was still not new %s after its published expiry %s: %s", time.Since(began)-k.opts.Expiry, k.opts.Expiry, a)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func scenarioKeyLength(k *kit) error {
	if err := k.refused("key_length", []keyCase{
		{"256 bytes", []string{strings.Repeat("k", 256)}},
		{"non-ASCII", []string{k.key("caf\xc3\xa9")}},
	}); err != nil {
		return err
	}
	longest := k.key("max-")
	longest += strings.Repeat("k", 255-len(longest))
	ok, err := k.send([]string{longest}, `{"scenario":"key_length"}`, "")
	if err != nil {
		return err
	}
	return k.check(ok.status/100 == 2, "a 255-byte key was refused: %s", ok)
}

func scenarioBareKey(k *kit) error {
	key := k.key("1")
	as, n, err := k.sendCounted(
		request{keys: []string{`"` + key + `"`}, body: `{"scenario":"bare_key"}`},
		request{keys: []string{key}, body: `{"scenario":"bare_key"}`},
	)
	if err != nil {
		return err
	}
	first, bare := as[0], as[1]
	if err := k.check(first.status/100 == 2, "sf-string key: %s", first); err != nil {
		return err
	}
	if err := k.isReplayOf(bare, first, "the bare key after the sf-string key"); err != nil {
		return err
	}
	return k.wantEffects(n, 1)
}

func scenarioJSONEquivalence(k *kit) error {
	key := k.key("1")
	bodies := []string{
		`{"scenario":"json_equivalence","amount":1000,"currency":"usd"}`,
		`{"currency":"usd","amount":1000,"scenario":"json_equivalence"}`,
		"{ \"scenario\" : \"json_equivalence\",\n  \"amount\": 1000.0, \"currency\": \"usd\" }",
		`{"scenario":"json_equivalence","amount":1e3,"currency":"usd"}`,
	}
	reqs := make([]request, len(bodies))
	for i, b := range bodies {
		reqs[i] = request{keys: []string{key}, body: b}
	}
	answers, n, err := k.sendCounted(reqs...)
	if err != nil {
		return err
	}
	for i, a := range answers {
		if err := k.check(a.status/100 == 2 && string(a.body) == string(answers[0].body), "body %d: %s, first %s", i, a, answers[0]); err != nil {
			return err
		}
	}
	return k.wantEffects(n, 1)
}

func scenarioFingerprintScope(k *kit) error {
	key := k.key("1")
	body := `{"scenario":"fingerprint_scope","status":"cancelled"}`
	first, err := k.send([]string{key}, body, "")
	if err != nil {
		return err
	}
	if err := k.check(first.status/100 == 2, "first request: %s", first); err != nil {
		return err
	}
	var query, other answer
	n, err := k.effects(func() error {
		var err error
		if query, err = k.send([]string{key}, body, "dry_run=1"); err != nil {
			return err
		}
		other, err = k.sendTo(k.opts.OtherPath, []string{key}, body, "")
		return err
	})
	if err != nil {
		return err
	}
	if err := k.problem(query, http.StatusUnprocessableEntity, "fingerprint_mismatch"); err != nil {
		return fmt.Errorf("the key with another query: %w", err)
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

func scenarioPreferWait(k *kit) error {
	ran, held, n, err := k.inFlight(k.key("1"), `{"scenario":"prefer_wait"}`, map[string]string{"Prefer": "wait=10"})
	if err != nil {
		return err
	}
	if err := k.check(ran.status/100 == 2, "the request that ran: %s", ran); err != nil {
		return err
	}
	if err := k.isReplayOf(held, ran, "the retry with Prefer: wait=10"); err != nil {
		return err
	}
	if err := k.check(strings.HasPrefix(held.header.Get("Preference-Applied"), "wait="), "Preference-Applied %q, want wait=N", held.header.Get("Preference-Applied")); err != nil {
		return err
	}
	return k.wantEffects(n, 1)
}

func scenarioReplayHeaders(k *kit) error {
	key := k.key("1")
	first, err := k.send([]string{key}, `{"scenario":"replay_headers"}`, "")
	if err != nil {
		return err
	}
	again, err := k.send([]string{key}, `{"scenario":"replay_headers"}`, "")
	if err != nil {
		return err
	}
	if err := k.isReplayOf(again, first, "the retry"); err != nil {
		return err
	}
	if err := k.check(again.header.Get("ETag") == first.header.Get("ETag"), "replayed ETag %q, first %q", again.header.Get("ETag"), first.header.Get("ETag")); err != nil {
		return err
	}
	if first.header.Get("Set-Cookie") != "" {
		return k.check(again.header.Get("Set-Cookie") == "", "the replay repeats Set-Cookie")
	}
	return nil
}

func scenarioProblemMembers(k *kit) error {
	missing, err := k.send(nil, `{"scenario":"problem_members"}`, "")
	if err != nil {
		return err
	}
	if err := k.problem(missing, http.StatusBadRequest, "idempotency_key_missing"); err != nil {
		return fmt.Errorf("missing key: %w", err)
	}
	bad, err := k.send([]string{"a, b"}, `{"scenario":"problem_members"}`, "")
	if err != nil {
		return err
	}
	if err := k.problem(bad, http.StatusBadRequest, "invalid_key"); err != nil {
		return fmt.Errorf("invalid key: %w", err)
	}
	other, _, err := k.mismatch("problem_members")
	if err != nil {
		return err
	}
	if err := k.problem(other, http.StatusUnprocessableEntity, "fingerprint_mismatch"); err != nil {
		return fmt.Errorf("mismatch: %w", err)
	}
	_, dup, _, err := k.inFlight(k.key("2"), `{"scenario":"problem_members"}`, nil)
	if err != nil {
		return err
	}
	if err := k.problem(dup, http.StatusConflict, "request_in_flight"); err != nil {
		return fmt.Errorf("in flight: %w", err)
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
