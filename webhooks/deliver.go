package webhooks

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"syscall"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/client/backoff"
	"github.com/idem-dev/idem/internal/batch"
	"github.com/idem-dev/idem/internal/defaults"
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

// Config tunes the delivery job. Zero fields take the defaults. It is
// server.Config.Webhooks as it is: the settings IDEM_WEBHOOK_*.
type Config struct {
	// Interval is the pause between polls of the outbox when it is empty.
	Interval time.Duration
	// BatchSize bounds the deliveries one claim takes; a claim never
	// takes more than the free slots (Concurrency) anyway.
	BatchSize int
	// Concurrency bounds the attempts in flight at once on this replica:
	// the job claims only for free slots and starts each attempt as soon
	// as it is claimed (see Run).
	Concurrency int
	// Timeout bounds one attempt: connect, TLS, request and response.
	Timeout time.Duration
	// Lease is how long a claimed delivery stays away from other replicas;
	// a replica that dies mid-attempt leaves it to be taken again after
	// this. Zero: 2×Timeout + 5 s. An attempt starts when it is claimed
	// and ends within Timeout, then StoreTimeout to record it: keep Lease
	// above their sum, or another replica may send it again meanwhile.
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

	// resolver resolves endpoint names; nil is the system's. Tests set it
	// (export_test.go) to a resolver whose server they control.
	resolver *net.Resolver
}

func (c Config) withDefaults() Config {
	defaults.Set(&c.Interval, DefaultInterval)
	defaults.Set(&c.Timeout, DefaultTimeout)
	defaults.Set(&c.Lease, 2*c.Timeout+5*time.Second)
	defaults.Set(&c.RetryBase, DefaultRetryBase)
	defaults.Set(&c.RetryCap, DefaultRetryCap)
	defaults.Set(&c.MaxAge, DefaultMaxAge)
	defaults.Set(&c.DisableAfter, DefaultDisableAfter)
	defaults.Set(&c.Retention, DefaultRetention)
	defaults.Set(&c.StoreTimeout, 5*time.Second)
	defaults.Set(&c.BatchSize, DefaultBatchSize)
	defaults.Set(&c.Concurrency, DefaultConcurrency)
	defaults.Set(&c.DisableMinFailures, DefaultDisableMinFailures)
	defaults.Set(&c.MaxResponseBytes, DefaultMaxResponseBytes)
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
	dialer := &net.Dialer{Timeout: cfg.Timeout, Resolver: cfg.resolver}
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

// Run delivers until ctx is done. It is a pool of at most Concurrency
// attempts in flight: at start, and as soon as an attempt ends, it claims
// as many due deliveries as there are free slots (at most BatchSize at
// once) and starts each attempt as soon as it is claimed, so a claimed
// delivery never waits for a slot and its attempt ends within Timeout
// (plus StoreTimeout to record it) of its claim, well inside its Lease.
// The claim takes the least recently served tenant first (see
// idem.WebhookStore), so a slot that frees up goes round the tenants with
// something due instead of back to the oldest backlog: a tenant's new
// delivery waits at most for one attempt of each tenant served less
// recently, Concurrency at a time (about one attempt timeout while fewer
// than Concurrency tenants are busy), never for whole backlogs or a whole
// batch. A tenant may fill every slot while no other has anything due,
// and the next slot that frees up goes to another tenant that has. When a claim comes back short and slots stay
// free, the next claim waits for an attempt to end or Interval; after a
// failed claim, Interval (no tight loop on a store that fails). Finished
// deliveries past Retention are purged every ten minutes. Failures are
// logged, never fatal. Once ctx is done it claims nothing more and returns
// when the attempts in flight have ended (shutting down cuts them short;
// see deliver).
func (d *Deliverer) Run(ctx context.Context) error {
	type ended struct {
		tenant string
		err    error
	}
	done := make(chan ended, d.cfg.Concurrency)
	inFlight := 0
	// served is when this replica last took a delivery of each tenant (a
	// counter), for the claim's least recently served order. It is
	// forgotten at each purge, so it holds only the tenants served lately.
	served := map[string]int64{}
	var seq int64
	var lastPurge time.Time
	claim := true             // claim as soon as a slot is free
	claimOnEnd := true        // an ended attempt calls for a claim (not while backing off)
	var tick <-chan time.Time // Interval after a short or failed claim
	stop := ctx.Done()
	for {
		if stop != nil && time.Since(lastPurge) >= purgeEvery {
			lastPurge = time.Now()
			clear(served)
			pctx, cancel := context.WithTimeout(ctx, d.cfg.StoreTimeout)
			_, err := d.store.PurgeWebhookDeliveries(pctx, idem.PurgeWebhookDeliveriesParams{OlderThan: d.cfg.Retention, Limit: 1000})
			cancel()
			if err != nil && ctx.Err() == nil {
				d.logger.Error("webhook delivery purge failed", "err", err)
			}
		}
		if claim && stop != nil && inFlight < d.cfg.Concurrency {
			claim = false
			limit := min(d.cfg.Concurrency-inFlight, d.cfg.BatchSize)
			batch, err := d.claim(ctx, limit, served)
			for _, del := range batch {
				seq++
				served[del.TenantID] = seq
				inFlight++
				go func() { done <- ended{del.TenantID, d.deliver(ctx, del)} }()
			}
			switch {
			case err != nil:
				if ctx.Err() == nil {
					d.logger.Error("webhook delivery claim failed", "err", err)
				}
				claimOnEnd, tick = false, time.After(d.cfg.Interval)
			case len(batch) == limit && inFlight < d.cfg.Concurrency:
				// BatchSize filled but slots are free: more may be due.
				claim = true
				continue
			case len(batch) == limit:
				// Every slot taken: claim again when one frees up.
				claimOnEnd, tick = true, nil
			default:
				// Nothing more due now: claim again when a slot frees up
				// (a new event may have come) or after Interval.
				claimOnEnd, tick = true, time.After(d.cfg.Interval)
			}
		}
		if stop == nil && inFlight == 0 {
			return nil
		}
		select {
		case e := <-done:
			// Take every attempt that has ended by now, so that one claim
			// fills all their slots: claims are made one at a time, so
			// with fast endpoints the job claims at most as often as a
			// claim takes, not once per attempt.
			for more := true; more; {
				inFlight--
				if e.err != nil && ctx.Err() == nil {
					d.logger.Error("webhook delivery failed", "tenant", e.tenant, "err", e.err)
				}
				select {
				case e = <-done:
				default:
					more = false
				}
			}
			claim = claim || claimOnEnd
		case <-tick:
			tick, claim, claimOnEnd = nil, true, true
		case <-stop:
			// Claim nothing more; wait for the attempts in flight, which
			// shutting down cuts short (see deliver).
			stop, tick = nil, nil
		}
	}
}

// claim takes up to limit due deliveries for this replica's free slots,
// least recently served tenant first. A tenant may take up to every slot
// (Concurrency): a lone tenant with a backlog gets the whole pool, and a
// tenant whose delivery comes due meanwhile gets the next slot that
// frees up, since it was served less recently.
func (d *Deliverer) claim(ctx context.Context, limit int, served map[string]int64) ([]idem.WebhookDelivery, error) {
	cctx, cancel := context.WithTimeout(ctx, d.cfg.StoreTimeout)
	defer cancel()
	batch, err := d.store.ClaimWebhookDeliveries(cctx, idem.ClaimWebhookDeliveriesParams{Limit: limit, PerTenant: d.cfg.Concurrency, Served: served, Lease: d.cfg.Lease})
	if err != nil {
		return nil, fmt.Errorf("claim deliveries: %w", err)
	}
	return batch, nil
}

// DeliverOnce claims one round of due deliveries (at most Concurrency and
// BatchSize), attempts them all at once and records the outcomes; it
// returns how many it claimed. Run is the job; this is one step of it for
// tests and tools.
func (d *Deliverer) DeliverOnce(ctx context.Context) (int, error) {
	claimed, err := d.claim(ctx, min(d.cfg.Concurrency, d.cfg.BatchSize), nil)
	if err != nil {
		return 0, err
	}
	return len(claimed), batch.Each(ctx, claimed, d.deliver)
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
	attrs := []slog.Attr{
		slog.String("tenant", del.TenantID),
		slog.String("endpoint", del.EndpointID),
		slog.String("event_id", del.EventID),
		slog.String("event_type", string(del.EventType)),
		slog.Int("attempt", del.Attempts),
		slog.Int("status", status),
		slog.String("error", res.Error),
		slog.Duration("retry_in", res.RetryIn),
	}
	if cause := causeOf(attemptErr); cause != nil {
		// The operator's view: the addresses the tenant is not shown.
		attrs = append(attrs, slog.String("cause", cause.Error()))
	}
	d.logger.LogAttrs(ctx, level, "webhook attempt", attrs...)
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
	ceiling := backoff.Ceiling(d.cfg.RetryBase, d.cfg.RetryCap, del.Attempts-1)
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
		return 0, &requestError{reason: describe(err), cause: withoutURL(err)}
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, d.cfg.MaxResponseBytes))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return resp.StatusCode, fmt.Errorf("status %d", resp.StatusCode)
	}
	return resp.StatusCode, nil
}

// requestError is a request that failed: reason is what the tenant's
// delivery log shows (see describe), cause the error itself, without the
// URL, for the operator's log only.
type requestError struct {
	reason string
	cause  error
}

func (e *requestError) Error() string { return e.reason }
func (e *requestError) Unwrap() error { return e.cause }

// causeOf is the operator's view of an attempt's error: a request error's
// cause (addresses and all), nil when there is none.
func causeOf(err error) error {
	var re *requestError
	if errors.As(err, &re) {
		return re.cause
	}
	return nil
}

// withoutURL is err without the *url.Error that carries the URL (which may
// hold a token in its query).
func withoutURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// The reasons an attempt failed, as the delivery log shows them to the
// tenant. None holds an address: the text of a dial or DNS error names the
// address the name resolved to and the resolver the server uses, both
// of the operator's network and none of the tenant's business.
const (
	reasonPrivateTarget = "refused: the target resolves to a private or reserved address"
	reasonTimeout       = "timeout"
	reasonNoSuchHost    = "the endpoint's host name does not resolve"
	reasonDNSTimeout    = "timeout resolving the endpoint's host name"
	reasonDNSFailed     = "the endpoint's host name could not be resolved"
	reasonRefused       = "connection refused"
	reasonReset         = "connection reset"
	reasonUnreachable   = "the endpoint's address is unreachable"
	reasonClosed        = "the connection closed before a complete answer"
	reasonTLSAuthority  = "TLS: the certificate is signed by an unknown authority"
	reasonTLSHostname   = "TLS: the certificate is not valid for the endpoint's host"
	reasonTLSInvalid    = "TLS: the certificate is invalid or expired"
	reasonTLSFailed     = "TLS handshake failed"
	reasonConnFailed    = "connection failed"
	reasonNoAnswer      = "the request failed (no valid HTTP answer)"
)

// describe says why a request failed, as one of the reasons above: never
// the URL *url.Error carries, nor an address (see the reasons). The whole
// error, without the URL, goes to the operator's log (see attempt).
func describe(err error) string {
	err = withoutURL(err)
	var dnsErr *net.DNSError
	var certAuthority x509.UnknownAuthorityError
	var certHostname x509.HostnameError
	var certInvalid x509.CertificateInvalidError
	var tlsRecord tls.RecordHeaderError
	var tlsAlert tls.AlertError
	var opErr *net.OpError
	switch {
	case errors.Is(err, ErrPrivateTarget):
		return reasonPrivateTarget
	case errors.As(err, &dnsErr):
		switch {
		case dnsErr.IsNotFound:
			return reasonNoSuchHost
		case dnsErr.IsTimeout:
			return reasonDNSTimeout
		}
		return reasonDNSFailed
	case errors.Is(err, context.DeadlineExceeded) || isTimeout(err):
		return reasonTimeout
	case errors.Is(err, syscall.ECONNREFUSED):
		return reasonRefused
	case errors.Is(err, syscall.ECONNRESET):
		return reasonReset
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH), errors.Is(err, syscall.EADDRNOTAVAIL):
		return reasonUnreachable
	case errors.As(err, &certAuthority):
		return reasonTLSAuthority
	case errors.As(err, &certHostname):
		return reasonTLSHostname
	case errors.As(err, &certInvalid):
		return reasonTLSInvalid
	case errors.As(err, &tlsRecord), errors.As(err, &tlsAlert):
		return reasonTLSFailed
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return reasonClosed
	case errors.As(err, &opErr):
		return reasonConnFailed
	}
	return reasonNoAnswer
}

// Describe is describe for the completer's calls, which share the
// delivery client's rules (NewClient): why a request failed, without the
// URL or any address.
func Describe(err error) string { return describe(err) }

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
