package postgres

import (
	"log/slog"
	"sync/atomic"
	"time"
)

// listenWatch makes the listening connection's losses visible: a warning
// when the connection that listened is lost, a line when it listens again
// (with how long it was down: every waiting claim is woken then), and a
// count of the reconnections. failed and listening are called by the
// listener's one goroutine.
type listenWatch struct {
	logger     atomic.Pointer[slog.Logger]
	reconnects atomic.Int64

	up     bool      // a connection listens
	ever   bool      // one has listened before
	lostAt time.Time // when the last one was lost
}

func (w *listenWatch) log() *slog.Logger {
	if l := w.logger.Load(); l != nil {
		return l
	}
	return slog.New(slog.DiscardHandler)
}

// failed is called when a connection failed or could not listen.
func (w *listenWatch) failed(err error) {
	if !w.up {
		return // still down: logged once when it was lost
	}
	w.up = false
	w.lostAt = time.Now()
	w.log().Warn("key events: the listening connection was lost; reconnecting with backoff (waiting claims are woken when it is back)",
		"error", err.Error())
}

// listening is called when a connection listens.
func (w *listenWatch) listening() {
	if w.ever {
		w.reconnects.Add(1)
		w.log().Warn("key events: listening again; every waiting claim is woken to claim again",
			"down", time.Since(w.lostAt).Round(time.Millisecond).String())
	}
	w.up, w.ever = true, true
}

// SetLogger gives the store a logger for the listening connection's losses
// and reconnections; without one they are only counted.
func (s *Store) SetLogger(l *slog.Logger) { s.listener.watch.logger.Store(l) }

// ListenReconnects returns how many times the listening connection was
// lost and listened again.
func (s *Store) ListenReconnects() int64 { return s.listener.watch.reconnects.Load() }
