package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/go-json-experiment/json"

	"github.com/idem-dev/idem"
)

// Backoff of Start between attempts to open the store.
const (
	startRetryFirst = 100 * time.Millisecond
	startRetryCap   = 5 * time.Second
)

// Start is New for the serve command, for a database that may not answer
// yet (a replica started while the database fails over): it binds
// cfg.Addr first and answers there itself while the store does not open —
// GET /healthz 200 (the process lives), GET /readyz and every other
// request 503 store_unavailable — and retries New with backoff (100 ms,
// doubling to 5 s, each attempt logged) for up to cfg.DBStartTimeout, so
// an orchestrator sees a replica that is not ready rather than one that
// exits and must be restarted. Past the bound it returns New's last error.
// Only an unreachable store is retried: a configuration error, a missing
// ledger or a failed migration is returned at once. The Server returned
// has its public listener bound (the same socket: no connection is
// refused at the handover) and its operator listeners too.
func Start(ctx context.Context, cfg Config, logger *slog.Logger, opts ...Option) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, &ConfigError{Err: err}
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if cfg.DBStartTimeout <= 0 {
		return New(ctx, cfg, logger, opts...)
	}

	ln, lerr := net.Listen("tcp", cfg.Addr)
	if lerr != nil {
		return nil, fmt.Errorf("listen on %s (IDEM_ADDR): %w", cfg.Addr, lerr)
	}
	w := &startListener{Listener: ln}
	var real atomic.Pointer[http.Handler]
	tmp := cfg.httpServer(waitingHandler(&real), logger)
	served := make(chan struct{})
	go func() { defer close(served); _ = tmp.Serve(w) }()

	began := time.Now()
	srv, err := New(ctx, cfg, logger, opts...)
	if err != nil && startRetryable(err) {
		// "listening" is logged once the store is open (Run); until then
		// this line says where the 503s come from.
		logger.Warn("waiting for the store", "addr", ln.Addr().String(), "store", redactURL(cfg.DatabaseURL),
			"db_start_timeout", cfg.DBStartTimeout.String())
	}
	wait := startRetryFirst
	for attempt := 2; err != nil && startRetryable(err) && ctx.Err() == nil; attempt++ {
		waited := time.Since(began)
		if waited >= cfg.DBStartTimeout {
			err = fmt.Errorf("the store did not open within IDEM_DB_START_TIMEOUT (%s, %d attempts): %w", cfg.DBStartTimeout, attempt-1, err)
			break
		}
		// The last attempt is made at the bound.
		wait = min(wait, cfg.DBStartTimeout-waited)
		logger.Warn("the store does not answer at start; serving 503 and retrying", "attempt", attempt-1,
			"retry_in", wait.Round(time.Millisecond).String(), "waited", waited.Round(time.Millisecond).String(), "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(wait):
			srv, err = New(ctx, cfg, logger, opts...)
		}
		wait = min(2*wait, startRetryCap)
	}
	if err != nil && ctx.Err() != nil {
		err = fmt.Errorf("stopped while waiting for the store: %w (%w)", ctx.Err(), err)
	}

	// Hand the socket over: the waiting server accepts no more (a blocked
	// Accept is woken by a deadline), then drains what it holds; a
	// connection it accepted meanwhile is served by the real handler.
	if err == nil {
		h := srv.Handler()
		real.Store(&h)
	}
	w.stop.Store(true)
	_ = ln.(*net.TCPListener).SetDeadline(time.Now())
	<-served
	_ = ln.(*net.TCPListener).SetDeadline(time.Time{})
	drain, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownGrace)
	_ = tmp.Shutdown(drain)
	cancel()
	if err != nil {
		_ = ln.Close()
		return nil, err
	}
	logger.Info("the store opened", "waited", time.Since(began).Round(time.Millisecond).String())
	if err := srv.adopt(ln); err != nil {
		_ = srv.Close()
		return nil, err
	}
	return srv, nil
}

// startRetryable reports whether New failed because the store does not
// answer (worth another attempt), not for a reason that waiting cannot
// mend.
func startRetryable(err error) bool {
	var cfgErr *ConfigError
	if errors.As(err, &cfgErr) || errors.Is(err, idem.ErrNoLedger) {
		return false
	}
	var netErr net.Error
	return idem.ErrorCode(err) == idem.CodeStoreUnavailable || errors.As(err, &netErr)
}

// adopt makes ln the server's public listener and binds the operator
// listeners, as Listen would.
func (s *Server) adopt(ln net.Listener) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, o := range s.operator {
		oln, err := net.Listen("tcp", o.addr)
		if err != nil {
			for _, bound := range s.operator[:i] {
				_ = bound.ln.Close()
				bound.ln = nil
			}
			_ = ln.Close()
			return fmt.Errorf("listen on %s (%s): %w", o.addr, o.setting, err)
		}
		o.ln = oln
	}
	s.listener = ln
	return nil
}

// startListener is the public listener while Start waits for the store:
// once stop is set it accepts nothing more and its Close leaves the socket
// open for the real server.
type startListener struct {
	net.Listener
	stop atomic.Bool
}

func (l *startListener) Accept() (net.Conn, error) {
	if l.stop.Load() {
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil && l.stop.Load() {
		return nil, net.ErrClosed
	}
	return c, err
}

func (l *startListener) Close() error { return nil }

// waitingHandler answers while the store does not open: /healthz 200,
// everything else 503 store_unavailable (problem+json, Retry-After), or
// the real handler once real is set.
func waitingHandler(real *atomic.Pointer[http.Handler]) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Every answer of the waiting server closes its connection, the
		// real handler's too (a request read in the handover, once real is
		// set): kept alive, the connection would be closed by the
		// handover's Shutdown under a client sending its next request on
		// it (an EOF instead of an answer); on a new connection that
		// request reaches the real server.
		w.Header().Set("Connection", "close")
		if h := real.Load(); h != nil {
			(*h).ServeHTTP(w, r)
			return
		}
		if r.URL.Path == "/healthz" {
			w.Header().Set("X-Request-Id", requestID())
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"status":"ok"}` + "\n"))
			return
		}
		id := requestID()
		w.Header().Set("X-Request-Id", id)
		w.Header().Set("Content-Type", "application/problem+json")
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusServiceUnavailable)
		// A map's members sorted, as encoding/json wrote them.
		_ = json.MarshalWrite(w, map[string]any{
			"type":       "/docs/errors#store_unavailable",
			"title":      "Store unavailable",
			"status":     http.StatusServiceUnavailable,
			"detail":     "the service is starting and its store does not answer yet",
			"code":       idem.CodeStoreUnavailable,
			"retryable":  true,
			"request_id": id,
		}, json.Deterministic(true))
		_, _ = w.Write([]byte("\n"))
	})
}

// requestID returns a random id for an answer of the waiting handler (the
// API's middleware is not in front of it).
func requestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
