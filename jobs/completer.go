package jobs

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/go-json-experiment/json"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/client/backoff"
	"github.com/idem-dev/idem/client/resumecall"
	"github.com/idem-dev/idem/internal/batch"
	"github.com/idem-dev/idem/internal/defaults"
	"github.com/idem-dev/idem/metrics"
	"github.com/idem-dev/idem/webhooks"
)

// The completer job (issue 24; the rules are in the root package's
// completer.go, the wire protocol on the page "When a worker dies",
// web/docs/worker-dies, and in openapi.yaml's createCompleter callback). Every Interval, at once while there is more,
// and as soon as an attempt ends, it takes over up to Concurrency orphans
// (at most half of them one tenant's) of tenants with a matching
// completer (CompleterStore.PickCompletions: FOR UPDATE SKIP LOCKED on
// PostgreSQL, the single writer on SQLite), calls each one's resume
// endpoint, signed like a webhook, with a bounded timeout, and records the
// outcome with its audit entry (FinishCompletion). A replica killed
// mid-attempt records nothing: the record goes back to the completer once
// the attempt's lease ran out and is taken again with a new fencing token,
// so the dead attempt's answer can never be applied, and nothing is lost.

// Defaults used for zero CompleterConfig fields.
const (
	DefaultCompleterInterval    = 5 * time.Second
	DefaultCompleterConcurrency = 8
	DefaultCompleterTimeout     = 30 * time.Second
	DefaultCompleterMaxAttempts = 8
	DefaultCompleterDeadline    = 2 * time.Hour
	DefaultCompleterBackoffBase = 10 * time.Second
	DefaultCompleterBackoffCap  = 10 * time.Minute
	// maxAnswerBytes bounds the answer read from an endpoint beyond the
	// response it may carry (the tenant's max_response_bytes, base64).
	maxAnswerBytes = 64 << 10
)

// CompleterConfig tunes the completer job. Zero fields take the defaults.
// It is server.Config.Completer as it is: the settings IDEM_COMPLETER_*.
type CompleterConfig struct {
	// Interval is the pause between picks when nothing was due.
	Interval time.Duration
	// Concurrency bounds the attempts in flight on this replica; one
	// tenant gets at most half of them (Share).
	Concurrency int
	// Timeout bounds one call of a resume endpoint: connect, TLS, request
	// and answer.
	Timeout time.Duration
	// Lease is the completer's lease on a record it took: zero means
	// Timeout + 2×StoreTimeout + 5 s, so an attempt and its record end
	// well inside it.
	Lease time.Duration
	// MaxAttempts and Deadline bound the attempts on one record; then it
	// goes to review (NextAttempt).
	MaxAttempts int
	Deadline    time.Duration
	// BackoffBase and BackoffCap shape the full-jitter pause after an
	// unknown attempt.
	BackoffBase time.Duration
	BackoffCap  time.Duration
	// StoreTimeout bounds every store call of the job.
	StoreTimeout time.Duration
	// AllowPrivate lets calls go to loopback and private addresses, as
	// webhooks (IDEM_WEBHOOK_ALLOW_PRIVATE).
	AllowPrivate bool
}

func (c CompleterConfig) withDefaults() CompleterConfig {
	defaults.Set(&c.Interval, DefaultCompleterInterval)
	defaults.Set(&c.Timeout, DefaultCompleterTimeout)
	defaults.Set(&c.StoreTimeout, 5*time.Second)
	defaults.Set(&c.Lease, c.Timeout+2*c.StoreTimeout+5*time.Second)
	defaults.Set(&c.Deadline, DefaultCompleterDeadline)
	defaults.Set(&c.BackoffBase, DefaultCompleterBackoffBase)
	defaults.Set(&c.BackoffCap, DefaultCompleterBackoffCap)
	defaults.Set(&c.Concurrency, DefaultCompleterConcurrency)
	defaults.Set(&c.MaxAttempts, DefaultCompleterMaxAttempts)
	return c
}

// NextAttempt decides what follows an unknown attempt (attempt, 1-based)
// at now on a record whose completer deadline is deadline: review true when
// the attempts are used up (MaxAttempts) or the next attempt would fall
// past the deadline, else the pause before the next attempt, a full jitter
// uniform in [0, min(BackoffCap, BackoffBase×2^(attempt-1))) plus a
// millisecond. The endpoint's retry_after (zero: none) lengthens the
// pause, never shortens it.
func (c CompleterConfig) NextAttempt(attempt int, now, deadline time.Time, retryAfter time.Duration) (wait time.Duration, review bool) {
	if attempt >= c.MaxAttempts {
		return 0, true
	}
	ceiling := backoff.Ceiling(c.BackoffBase, c.BackoffCap, attempt-1)
	wait = time.Millisecond
	if ceiling > 0 {
		wait += time.Duration(rand.Int64N(int64(ceiling)))
	}
	wait = max(wait, retryAfter)
	if now.Add(wait).After(deadline) {
		return 0, true
	}
	return wait, false
}

// Completer runs the completer job.
type Completer struct {
	store   idem.CompleterStore
	tenants idem.Store
	cfg     CompleterConfig
	client  *http.Client
	logger  *slog.Logger
	m       *metrics.Metrics
}

// NewCompleter returns the job over cs; tenants reads the tenants' settings
// (quota, response size). logger nil discards logs; m nil records nothing.
func NewCompleter(cs idem.CompleterStore, tenants idem.Store, cfg CompleterConfig, logger *slog.Logger, m *metrics.Metrics) *Completer {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	cfg = cfg.withDefaults()
	return &Completer{
		store: cs, tenants: tenants, cfg: cfg, logger: logger.With("component", "completer"), m: m,
		client: webhooks.NewClient(webhooks.Config{Timeout: cfg.Timeout, AllowPrivate: cfg.AllowPrivate}),
	}
}

// Share is the most attempts one tenant may have in flight on this
// replica: half the slots (at least one), so a tenant whose endpoint hangs
// leaves the other half to the other tenants.
func (c CompleterConfig) Share() int {
	return max(1, c.Concurrency/2)
}

// Run picks and attempts until ctx is done, then waits for the attempts
// in flight (shutting down cuts them short and records nothing). It
// refills a slot as soon as an attempt ends rather than waiting for a
// whole batch, and never gives one tenant more than Share of the slots:
// a tenant with a thousand orphans behind a hanging endpoint holds at
// most Share slots, and another tenant's orphan is picked into the rest
// at once.
func (c *Completer) Run(ctx context.Context) error {
	var (
		mu       sync.Mutex
		running  int
		inflight = map[string]int{}
		wg       sync.WaitGroup
	)
	freed := make(chan struct{}, 1)
	defer wg.Wait()
	share := c.cfg.Share()
	for ctx.Err() == nil {
		mu.Lock()
		free := c.cfg.Concurrency - running
		var skip []string
		perTenant := share
		for tenant, n := range inflight {
			if n >= share {
				skip = append(skip, tenant)
			} else {
				perTenant = min(perTenant, share-n)
			}
		}
		mu.Unlock()
		if free <= 0 {
			select {
			case <-ctx.Done():
			case <-freed:
			}
			continue
		}
		picked, err := c.pick(ctx, free, perTenant, skip)
		if err != nil && ctx.Err() == nil {
			c.logger.Error("completer pass failed", "err", err)
		}
		mu.Lock()
		for _, pc := range picked {
			running++
			inflight[pc.Record.TenantID]++
		}
		mu.Unlock()
		for _, pc := range picked {
			wg.Go(func() {
				if err := c.attempt(ctx, pc); err != nil {
					c.logger.Error("completer attempt failed", "err", err)
				}
				mu.Lock()
				running--
				if inflight[pc.Record.TenantID]--; inflight[pc.Record.TenantID] <= 0 {
					delete(inflight, pc.Record.TenantID)
				}
				mu.Unlock()
				select {
				case freed <- struct{}{}:
				default:
				}
			})
		}
		if len(picked) > 0 && err == nil {
			continue // more may be due
		}
		// Nothing due (or the store failed): wait for the interval, or
		// for a slot of a skipped tenant to free.
		t := time.NewTimer(c.cfg.Interval)
		select {
		case <-ctx.Done():
		case <-t.C:
		case <-freed:
			if len(skip) == 0 {
				// Nobody was left out of the pick: a freed slot alone
				// makes nothing due; wait out the interval.
				select {
				case <-ctx.Done():
				case <-t.C:
				}
			}
		}
		t.Stop()
	}
	return nil
}

// RunOnce picks one batch (at most Concurrency records, at most Share of
// one tenant), attempts them all at once and records the outcomes; it
// returns how many it picked.
func (c *Completer) RunOnce(ctx context.Context) (int, error) {
	picked, err := c.pick(ctx, c.cfg.Concurrency, c.cfg.Share(), nil)
	if err != nil {
		return 0, err
	}
	return len(picked), batch.Each(ctx, picked, c.attempt)
}

// pick takes at most limit records, at most perTenant of one tenant and
// none of skip.
func (c *Completer) pick(ctx context.Context, limit, perTenant int, skip []string) ([]idem.PickedCompletion, error) {
	pctx, cancel := context.WithTimeout(ctx, c.cfg.StoreTimeout)
	defer cancel()
	picked, err := c.store.PickCompletions(pctx, idem.PickCompletionsParams{
		Limit: limit, PerTenant: perTenant, SkipTenants: skip, Lease: c.cfg.Lease, Deadline: c.cfg.Deadline,
	})
	if err != nil {
		return nil, fmt.Errorf("pick completions: %w", err)
	}
	return picked, nil
}

// resumeAnswer is an endpoint's answer.
type resumeAnswer struct {
	Outcome           idem.CompletionOutcome `json:"outcome"`
	Response          *answerResponse        `json:"response"`
	RetryAfterSeconds float64                `json:"retry_after_seconds"`
	Note              string                 `json:"note"`
}

type answerResponse struct {
	Status       int               `json:"status"`
	Headers      map[string]string `json:"headers"`
	Body         string            `json:"body"`
	BodyEncoding string            `json:"body_encoding"`
}

// verdict is what one attempt learnt, before it is recorded.
type verdict struct {
	outcome    idem.CompletionOutcome
	response   *idem.Response
	retryAfter time.Duration
	note       string
	// answered: the endpoint gave the protocol's answer, so its attempt
	// is over. Without one (a timeout, a hang-up, a proxy's 502) it may
	// still be running under the attempt's token.
	answered bool
}

// attempt makes one attempt on a picked record and records its outcome.
func (c *Completer) attempt(ctx context.Context, pc idem.PickedCompletion) error {
	start := time.Now()
	rec := pc.Record
	comp := *rec.Completion
	var v verdict
	switch {
	case !pc.Matched:
		v = verdict{outcome: idem.OutcomeReview, note: "no completer of the tenant matches the key's operation any more"}
	case !rec.ObservedAt.Before(comp.Deadline):
		v = verdict{outcome: idem.OutcomeReview, note: fmt.Sprintf("the completer's deadline (%s) passed before attempt %d", comp.Deadline.UTC().Format(time.RFC3339), comp.Attempts)}
	default:
		v = c.call(ctx, pc)
		if ctx.Err() != nil {
			// Shutting down cut the attempt short: record nothing; the
			// record goes back to the completer after the lease.
			return nil
		}
	}
	p := idem.FinishCompletionParams{
		TenantID: rec.TenantID, Key: rec.Key, FencingToken: rec.FencingToken, Attempt: comp.Attempts,
		Outcome: v.outcome, Response: v.response, Note: v.note, CompleterID: pc.Completer.ID,
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.StoreTimeout)
	defer cancel()
	// The database clock now, as far as the job can tell: the pick's
	// instant plus the attempt's time.
	now := rec.ObservedAt.Add(time.Since(start))
	if p.Outcome == idem.OutcomeCompleted {
		t, err := c.tenants.GetTenant(sctx, idem.GetTenantParams{ID: rec.TenantID})
		if err != nil {
			return fmt.Errorf("read tenant %s: %w", rec.TenantID, err)
		}
		p.StorageQuotaBytes = t.Settings.StorageQuotaBytes
		if limit := t.ResponseLimit(rec.CreatedAt); p.Response.Size() > limit {
			p = c.unknown(p, comp, now, fmt.Sprintf("the answer's response of %d bytes is over max_response_bytes (%d)", p.Response.Size(), limit), 0)
		} else if err := p.Validate(); err != nil {
			p = c.unknown(p, comp, now, "the answer's response is invalid: "+err.Error(), 0)
		}
	} else if p.Outcome == idem.OutcomeUnknown {
		retryAfter := v.retryAfter
		if !v.answered {
			// The endpoint may still be at work under this attempt's
			// token (the SDKs' handlers run the function until the
			// call's lease_expires_at after the completer hung up): the
			// next attempt, a new token, must not start it again beside
			// it, so it waits for the lease to run out.
			retryAfter = max(retryAfter, rec.LeaseExpiresAt.Sub(now))
		}
		p = c.unknown(p, comp, now, v.note, retryAfter)
		// Its checkpoints may have extended the lease past the
		// completer's: the store waits out the lease as it holds it.
		p.WaitOutLease = !v.answered
	}
	p.Note = cutNote(p.Note)
	c.m.ObserveCompleterAttempt(p.Outcome)
	c.logger.LogAttrs(ctx, slog.LevelInfo, "completer attempt",
		slog.String("tenant", rec.TenantID), slog.String("completer", pc.Completer.ID),
		slog.Int("attempt", comp.Attempts), slog.String("outcome", string(p.Outcome)),
		slog.Duration("retry_in", p.RetryIn))
	if _, err := c.store.FinishCompletion(sctx, p); err != nil {
		if errors.Is(err, idem.ErrLeaseLost) || errors.Is(err, idem.ErrKeyNotFound) {
			// Taken again after this attempt's lease, or resolved by a
			// person meanwhile: the fencing token decided.
			return nil
		}
		return fmt.Errorf("record attempt %d on a key of %s: %w", comp.Attempts, rec.TenantID, err)
	}
	return nil
}

// unknown turns p into an unknown attempt's record: held until the next
// attempt after the policy's backoff, or review, never a guess, when the
// attempts or the deadline are used up.
func (c *Completer) unknown(p idem.FinishCompletionParams, comp idem.Completion, now time.Time, why string, retryAfter time.Duration) idem.FinishCompletionParams {
	p.Response = nil
	wait, review := c.cfg.NextAttempt(comp.Attempts, now, comp.Deadline, retryAfter)
	if review {
		p.Outcome = idem.OutcomeReview
		p.Note = fmt.Sprintf("gave up after %d attempts of %d, the deadline %s: the last one's outcome is unknown (%s)",
			comp.Attempts, c.cfg.MaxAttempts, comp.Deadline.UTC().Format(time.RFC3339), why)
		return p
	}
	p.Outcome = idem.OutcomeUnknown
	p.RetryIn = wait
	p.Note = "outcome unknown: " + why
	return p
}

// call calls the endpoint and reads its answer: anything but a valid
// answer is unknown, with why in the note.
func (c *Completer) call(ctx context.Context, pc idem.PickedCompletion) verdict {
	rec, comp := pc.Record, pc.Record.Completion
	body := resumecall.Body{
		Type: resumecall.Type, Tenant: rec.TenantID, Key: rec.Key, Operation: rec.Operation,
		Attempt: comp.Attempts, MaxAttempts: c.cfg.MaxAttempts, FencingToken: rec.FencingToken,
		RecoveryData: []byte("null"), LeaseExpiresAt: rec.LeaseExpiresAt.UTC(), Deadline: comp.Deadline.UTC(),
	}
	if rec.RecoveryPoint != "" {
		body.RecoveryPoint = &rec.RecoveryPoint
	}
	if len(rec.RecoveryData) > 0 {
		body.RecoveryData = rec.RecoveryData
	}
	payload, err := json.Marshal(body)
	if err != nil {
		return unknownVerdict("the call could not be encoded")
	}
	id := idem.NewID("rsm_")
	now := time.Now()
	sig, err := webhooks.Sign(pc.Completer.Secret, id, now, payload)
	if err != nil {
		return unknownVerdict("the completer's secret is invalid")
	}
	cctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(cctx, http.MethodPost, pc.Completer.URL, bytes.NewReader(payload))
	if err != nil {
		return unknownVerdict("invalid endpoint URL")
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "idem-completer/1")
	req.Header.Set("webhook-id", id)
	req.Header.Set("webhook-timestamp", strconv.FormatInt(now.Unix(), 10))
	req.Header.Set("webhook-signature", sig)
	resp, err := c.client.Do(req)
	if err != nil {
		// The reason says what failed, never the URL nor an address.
		return unknownVerdict(webhooks.Describe(err))
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes+4*int64(maxResponseGuess)))
	if err != nil {
		return unknownVerdict("the answer could not be read: " + webhooks.Describe(err))
	}
	if resp.StatusCode != http.StatusOK {
		return unknownVerdict(fmt.Sprintf("status %d", resp.StatusCode))
	}
	var a resumeAnswer
	if err := json.Unmarshal(data, &a); err != nil {
		return unknownVerdict("the answer is not the protocol's JSON")
	}
	switch a.Outcome {
	case idem.OutcomeCompleted:
		r, err := a.Response.decode()
		if err != nil {
			v := unknownVerdict("completed without a valid response: " + err.Error())
			v.answered = true
			return v
		}
		return verdict{outcome: idem.OutcomeCompleted, response: r, note: "resumed and completed by the endpoint"}
	case idem.OutcomeNotDone:
		return verdict{outcome: idem.OutcomeNotDone, note: "the endpoint says nothing happened: released"}
	case idem.OutcomeReview:
		note := a.Note
		if note == "" {
			note = "the endpoint asked for a person's review"
		}
		return verdict{outcome: idem.OutcomeReview, note: note}
	case idem.OutcomeUnknown:
		v := unknownVerdict("the endpoint does not know yet")
		v.answered = true
		if a.RetryAfterSeconds > 0 {
			v.retryAfter = time.Duration(min(a.RetryAfterSeconds, 86400) * float64(time.Second))
		}
		return v
	}
	v := unknownVerdict(fmt.Sprintf("unknown outcome %q", truncate(string(a.Outcome), 40)))
	v.answered = true
	return v
}

// maxResponseGuess bounds the response an answer may carry when read; the
// tenant's own limit is applied after (attempt).
const maxResponseGuess = 10 << 20

func unknownVerdict(why string) verdict {
	return verdict{outcome: idem.OutcomeUnknown, note: why}
}

// decode turns the answer's response into a stored one.
func (r *answerResponse) decode() (*idem.Response, error) {
	if r == nil {
		return nil, errors.New("no response")
	}
	out := &idem.Response{Status: r.Status, Headers: r.Headers, BodyEncoding: r.BodyEncoding}
	if out.Headers == nil {
		out.Headers = map[string]string{}
	}
	switch r.BodyEncoding {
	case "", idem.BodyEncodingUTF8:
		out.Body, out.BodyEncoding = []byte(r.Body), idem.BodyEncodingUTF8
	case idem.BodyEncodingBase64:
		b, err := base64.StdEncoding.DecodeString(r.Body)
		if err != nil {
			return nil, errors.New("body is not base64")
		}
		out.Body = b
	default:
		return nil, fmt.Errorf("body_encoding %q is neither utf8 nor base64", truncate(r.BodyEncoding, 20))
	}
	if err := idem.ValidateResponseStatus(out.Status); err != nil {
		return nil, err
	}
	return out, nil
}

// cutNote makes a note the audit log takes: valid UTF-8 without control
// characters, at most MaxNoteBytes.
func cutNote(note string) string {
	note = strings.ToValidUTF8(note, "\uFFFD")
	note = strings.Map(func(r rune) rune {
		if r != '\n' && r != '\t' && (r < 0x20 || r == 0x7F || r >= 0x80 && r <= 0x9F) {
			return ' '
		}
		return r
	}, note)
	return truncate(note, idem.MaxNoteBytes)
}

// truncate cuts s to at most n bytes on a rune boundary.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
