package server

import (
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/metrics"
)

// outageLogEvery is how often an outage that lasts is logged again, with
// the 503s answered meanwhile: once per interval, never per request.
const outageLogEvery = 10 * time.Second

// outageLog makes a store outage visible: its start with the cause class
// (the store's detail: "the database cannot be reached", a timeout, a
// replaced file), a line every outageLogEvery while it lasts with the
// unavailable calls counted, and its end with its length; it counts the
// outages and their seconds. The ledger guard feeds it every key write,
// readiness check and ledger check it passes to the store.
type outageLog struct {
	logger  *slog.Logger
	outages prometheus.Counter
	seconds prometheus.Counter

	// down is set during an outage: a call that succeeds while it is not
	// set (every call, when the store answers) takes no lock.
	down atomic.Bool

	mu      sync.Mutex
	start   time.Time // zero while the store answers
	cause   string
	calls   int // unavailable calls in this outage
	logged  time.Time
	sinceLg int // unavailable calls since the last line
}

func newOutageLog(logger *slog.Logger, reg prometheus.Registerer) *outageLog {
	o := &outageLog{logger: logger}
	o.outages, o.seconds = metrics.RegisterOutages(reg)
	return o
}

// causeOf is the cause class of a store_unavailable error: the store's
// detail, a short sentence safe to show ("the database cannot be
// reached", the store deadline's, a replaced SQLite file's).
func causeOf(err error) string {
	var e *idem.Error
	if errors.As(err, &e) && e.Detail != "" {
		return e.Detail
	}
	return "store unavailable"
}

// observe records the outcome of one store call.
func (o *outageLog) observe(err error) {
	if o == nil {
		return
	}
	unavailable := idem.ErrorCode(err) == idem.CodeStoreUnavailable
	if !unavailable && !o.down.Load() {
		return // the store answered, as before
	}
	// A call that the store answered, even with a refusal, ends the outage.
	now := time.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	switch {
	case unavailable && o.start.IsZero():
		o.start, o.cause, o.calls, o.logged, o.sinceLg = now, causeOf(err), 1, now, 0
		o.down.Store(true)
		o.outages.Inc()
		o.logger.Warn("store outage began: answering 503 store_unavailable", "cause", o.cause)
	case unavailable:
		o.calls++
		o.sinceLg++
		if now.Sub(o.logged) >= outageLogEvery {
			o.logger.Warn("store outage continues", "cause", causeOf(err), "for", now.Sub(o.start).Round(time.Millisecond).String(),
				"unavailable_calls", o.sinceLg)
			o.logged, o.sinceLg = now, 0
		}
	case !o.start.IsZero():
		d := now.Sub(o.start)
		o.seconds.Add(d.Seconds())
		o.logger.Warn("store outage ended", "lasted", d.Round(time.Millisecond).String(), "cause", o.cause, "unavailable_calls", o.calls)
		o.start = time.Time{}
		o.down.Store(false)
	}
}

// watchKeyEvents gives the store's listening connection the logger, so
// its losses and reconnections are logged, and counts the reconnections
// (idem_key_events_reconnects_total); nothing for a store without one.
func watchKeyEvents(raw idem.Driver, logger *slog.Logger, reg prometheus.Registerer) {
	if r := raw.Listener(); r != nil {
		r.SetLogger(logger)
		metrics.RegisterListenReconnects(reg, r.ListenReconnects)
	}
}
