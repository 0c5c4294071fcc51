package webhooks

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/idem-dev/idem"
)

// Defaults used for zero Config fields.
const (
	DefaultInterval           = 2 * time.Second
	DefaultBatchSize          = 50
	DefaultConcurrency        = 8
	DefaultTimeout            = 10 * time.Second
	DefaultRetryBase          = 5 * time.Second
	DefaultRetryCap           = time.Hour
	DefaultMaxAge             = 24 * time.Hour
	DefaultDisableAfter       = 24 * time.Hour
	DefaultDisableMinFailures = 10
	DefaultMaxResponseBytes   = 4096
	DefaultRetention          = 7 * 24 * time.Hour
	// purgeEvery is the pause between purges of finished deliveries.
	purgeEvery = 10 * time.Minute
)

// Config tunes the delivery job. Zero fields take the defaults.
type Config struct {
	// Interval is the pause between polls of the outbox when it is empty.
	Interval time.Duration
	// BatchSize bounds the deliveries one claim takes.
	BatchSize int
	// Concurrency bounds the attempts in flight at once on this replica.
	// It also bounds how many deliveries of one tenant a claim takes, so
	// that one tenant's slow or busy endpoints take no more than one round
	// of attempts per pass and cannot hold back the other tenants.
	Concurrency int
	// Timeout bounds one attempt: connect, TLS, request and response.
	Timeout time.Duration
	// Lease is how long a claimed delivery stays away from other replicas;
	// a replica that dies mid-attempt leaves it to be taken again after
	// this. Zero: 2×Timeout + 5 s.
	Lease time.Duration
	// RetryBase and RetryCap shape the full-jitter backoff: the pause after
	// attempt n is uniform in [0, min(RetryCap, RetryBase×2^(n-1))).
	RetryBase time.Duration
	RetryCap  time.Duration
	// MaxAge is how long after its event a delivery is retried; past it the
	// delivery becomes failed.
	MaxAge time.Duration
	// DisableAfter and DisableMinFailures: an endpoint whose attempts have
	// all failed for at least DisableAfter, and at least DisableMinFailures
	// times in a row, is disabled (disabled_reason "sustained_failure").
	DisableAfter       time.Duration
	DisableMinFailures int
	// MaxResponseBytes bounds how much of a response is read (and thrown
	// away); the connection is then closed.
	MaxResponseBytes int64
	// Retention is how long delivered and failed deliveries stay in the log.
	Retention time.Duration
	// StoreTimeout bounds every store call of the job (a frozen database
	// must not hold the job forever).
	StoreTimeout time.Duration
	// AllowPrivate lets webhooks go to loopback, link-local and private
	// addresses (IDEM_WEBHOOK_ALLOW_PRIVATE): for tests and private
	// networks only.
	AllowPrivate bool
}

func (c Config) withDefaults() Config {
	def := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.Interval, DefaultInterval)
	def(&c.Timeout, DefaultTimeout)
	def(&c.Lease, 2*c.Timeout+5*time.Second)
	def(&c.RetryBase, DefaultRetryBase)
	def(&c.RetryCap, DefaultRetryCap)
	def(&c.MaxAge, DefaultMaxAge)
	def(&c.DisableAfter, DefaultDisableAfter)
	def(&c.Retention, DefaultRetention)
	def(&c.StoreTimeout, 5*time.Second)
	if c.BatchSize <= 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.Concurrency <= 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.DisableMinFailures <= 0 {
		c.DisableMinFailures = DefaultDisableMinFailures
	}
	if c.MaxResponseBytes <= 0 {
		c.MaxResponseBytes = DefaultMaxResponseBytes
	}
	return c
}

// Deliverer runs the delivery job.
type Deliverer struct {
	store    idem.WebhookStore
	cfg      Config
	client   *http.Client
	logger   *slog.Logger
	observer Observer
}

// Observer counts attempts by result ("delivered", "retry", "gave_up"),
// for metrics.
type Observer interface {
	ObserveWebhookAttempt(result string)
}

// New returns a Deliverer over store. logger nil discards logs; observer
// nil counts nothing.
func New(store idem.WebhookStore, cfg Config, logger *slog.Logger, observer Observer) *Deliverer {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	cfg = cfg.withDefaults()
	return &Deliverer{store: store, cfg: cfg, client: NewClient(cfg), logger: logger.With("component", "webhooks"), observer: observer}
}

// NewClient returns the HTTP client deliveries use: no proxy, no redirects
// followed (a 3xx is a failed attempt), every phase bounded by cfg.Timeout,
// and unless cfg.AllowPrivate, connections only to public addresses,
// checked on the resolved address at connect time.
func NewClient(cfg Config) *http.Client {
	cfg = cfg.withDefaults()
	dialer := &net.Dialer{Timeout: cfg.Timeout}
	if !cfg.AllowPrivate {
		dialer.Control = dialControl
	}
	return &http.Client{
		Timeout: cfg.Timeout,
		Transport: &http.Transport{
			Proxy:                  nil,
			DialContext:            dialer.DialContext,
			TLSHandshakeTimeout:    cfg.Timeout,
			ResponseHeaderTimeout:  cfg.Timeout,
			MaxIdleConnsPerHost:    2,
			IdleConnTimeout:        30 * time.Second,
			MaxResponseHeaderBytes: 16 << 10,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// Config returns the configuration with defaults applied.
func (d *Deliverer) Config() Config { return d.cfg }

// Run delivers until ctx is done: a pass right away, then again as soon as
// a pass took anything (a claim takes only Concurrency deliveries of one
// tenant, so a short batch does not mean the outbox is drained), else
// after Interval. Finished deliveries past Retention are purged every ten
// minutes. Failures are logged, never fatal.
func (d *Deliverer) Run(ctx context.Context) error {
	lastPurge := time.Time{}
	for ctx.Err() == nil {
		n, err := d.DeliverOnce(ctx)
		if err != nil && ctx.Err() == nil {
			d.logger.Error("webhook delivery pass failed", "err", err)
		}
		if time.Since(lastPurge) >= purgeEvery {
			lastPurge = time.Now()
			pctx, cancel := context.WithTimeout(ctx, d.cfg.StoreTimeout)
			_, err := d.store.PurgeWebhookDeliveries(pctx, d.cfg.Retention, 1000)
			cancel()
			if err != nil && ctx.Err() == nil {
				d.logger.Error("webhook delivery purge failed", "err", err)
			}
		}
		if n > 0 && err == nil {
			continue
		}
		select {
		case <-ctx.Done():
		case <-time.After(d.cfg.Interval):
		}
	}
	return nil
}

// DeliverOnce claims one batch of due deliveries, attempts each (at most
// Concurrency at once) and records the outcomes. It returns how many it
// claimed. The batch holds at most Concurrency deliveries of one tenant,
// in turns across tenants and, within one, across its endpoints (see
// idem.WebhookStore), and is attempted in that order: a slow tenant's
// deliveries run side by side with the others' and keep the pass to about
// one attempt timeout, instead of its backlog filling batch after batch
// while every other tenant waits.
func (d *Deliverer) DeliverOnce(ctx context.Context) (int, error) {
	cctx, cancel := context.WithTimeout(ctx, d.cfg.StoreTimeout)
	batch, err := d.store.ClaimWebhookDeliveries(cctx, d.cfg.BatchSize, d.cfg.Concurrency, d.cfg.Lease)
	cancel()
	if err != nil {
		return 0, fmt.Errorf("claim deliveries: %w", err)
	}
	sem := make(chan struct{}, d.cfg.Concurrency)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for _, del := range batch {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := d.deliver(ctx, del); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return len(batch), errors.Join(errs...)
}

// deliver makes one attempt and records its outcome. An attempt that was
// answered is recorded even when ctx ends meanwhile (bounded by
// StoreTimeout), so it is not sent again needlessly; one that shutting
// down cut short is not recorded at all.
func (d *Deliverer) deliver(ctx context.Context, del idem.WebhookDelivery) error {
	status, attemptErr := d.attempt(ctx, del)
	if attemptErr != nil && ctx.Err() != nil {
		// Shutting down cut the attempt short: not the endpoint's fault.
		// Record nothing; the delivery is sent again once its lease ends.
		return nil
	}
	res := idem.FinishWebhookDeliveryParams{
		ID: del.ID, Attempts: del.Attempts, Status: status,
		OK:                 attemptErr == nil,
		DisableAfter:       d.cfg.DisableAfter,
		DisableMinFailures: d.cfg.DisableMinFailures,
	}
	level, result := slog.LevelInfo, "delivered"
	if attemptErr != nil {
		level, result = slog.LevelWarn, "retry"
		res.Error = attemptErr.Error()
		res.RetryIn = d.retryIn(del)
		if res.RetryIn == 0 {
			result = "gave_up"
		}
	}
	if d.observer != nil {
		d.observer.ObserveWebhookAttempt(result)
	}
	d.logger.LogAttrs(ctx, level, "webhook attempt",
		slog.String("tenant", del.TenantID),
		slog.String("endpoint", del.EndpointID),
		slog.String("event_id", del.EventID),
		slog.String("event_type", string(del.EventType)),
		slog.Int("attempt", del.Attempts),
		slog.Int("status", status),
		slog.String("error", res.Error),
		slog.Duration("retry_in", res.RetryIn),
	)
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.StoreTimeout)
	defer cancel()
	if err := d.store.FinishWebhookDelivery(fctx, res); err != nil {
		return fmt.Errorf("record delivery %d: %w", del.ID, err)
	}
	return nil
}

// retryIn is the full-jitter pause after a failed attempt, or zero (give
// up) when the next attempt would fall past MaxAge.
func (d *Deliverer) retryIn(del idem.WebhookDelivery) time.Duration {
	ceiling := d.cfg.RetryCap
	if n := del.Attempts - 1; n < 40 {
		ceiling = min(ceiling, d.cfg.RetryBase<<n)
	}
	if ceiling <= 0 {
		ceiling = d.cfg.RetryCap
	}
	wait := time.Duration(rand.Int64N(int64(ceiling))) + time.Millisecond
	now := del.ObservedAt
	if now.IsZero() {
		now = time.Now()
	}
	if now.Add(wait).Sub(del.CreatedAt) > d.cfg.MaxAge {
		return 0
	}
	return wait
}

// attempt posts one delivery, signed, and returns the response status and
// nil for a 2xx, or why it failed. The error never holds the URL (which may
// carry a token in its query) nor any body.
func (d *Deliverer) attempt(ctx context.Context, del idem.WebhookDelivery) (int, error) {
	now := time.Now()
	sig, err := Sign(del.Secret, del.EventID, now, del.Payload)
	if err != nil {
		return 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, del.URL, bytes.NewReader(del.Payload))
	if err != nil {
		return 0, errors.New("invalid endpoint URL")
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "idem-webhooks/1")
	req.Header.Set("webhook-id", del.EventID)
	req.Header.Set("webhook-timestamp", strconv.FormatInt(now.Unix(), 10))
	req.Header.Set("webhook-signature", sig)
	resp, err := d.client.Do(req)
	if err != nil {
		return 0, errors.New(describe(err))
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, d.cfg.MaxResponseBytes))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return resp.StatusCode, fmt.Errorf("status %d", resp.StatusCode)
	}
	return resp.StatusCode, nil
}

// describe says why a request failed without the URL *url.Error carries.
func describe(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	switch {
	case errors.Is(err, ErrPrivateTarget):
		return "refused: the endpoint resolved to a loopback, link-local or private address"
	case errors.Is(err, context.DeadlineExceeded) || isTimeout(err):
		return "timeout"
	}
	return err.Error()
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
