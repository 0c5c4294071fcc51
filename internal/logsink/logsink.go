// Package logsink takes the write(2) of each log line off the caller's path:
// Writer appends whole lines to a buffer and one goroutine passes everything
// pending to the underlying writer in one Write (group commit). At rest a
// line goes out at once, microseconds later; under load the lines that
// arrive while one Write is under way share the next. There is no timer.
package logsink

import (
	"io"
	"runtime"
	"sync"
)

// DefaultMaxPending is how many bytes may wait for the underlying writer
// before Write blocks (1 MiB, a few thousand access log lines).
const DefaultMaxPending = 1 << 20

// Writer is an io.Writer for whole log lines in front of a slower one
// (stderr, a file). Each Write must carry whole lines, as slog's handlers
// write them; lines are written to the underlying writer whole, never
// interleaved, in the order their Writes returned.
//
// Memory is bounded: once MaxPending bytes wait, Write blocks until the
// underlying writer has taken them (backpressure, as a slow stderr blocks a
// synchronous writer); nothing is dropped. Flush waits until everything
// written so far has been passed on; Close flushes and stops the goroutine,
// after which Write writes through synchronously, so a line logged late in
// shutdown is still written.
//
// What changes against writing synchronously: a process killed hard
// (SIGKILL, power loss) can lose the lines of the last microseconds that the
// goroutine had not yet passed to the kernel, as a crash in the middle of a
// synchronous write could lose that line.
//
// A failed Write of the underlying writer loses the lines of that batch, as
// the synchronous write would have lost its line; each batch is tried once
// (no retry loop) and the first error is returned by Flush and Close.
type Writer struct {
	w   io.Writer
	max int

	mu       sync.Mutex
	work     sync.Cond // the goroutine waits here for lines or Close
	progress sync.Cond // Write waits for room, Flush for its lines
	pending  []byte    // lines not yet taken by the goroutine
	spare    []byte    // the other buffer, swapped with pending
	queued   uint64    // bytes ever appended to pending
	done     uint64    // bytes ever passed to w (or lost to its error)
	atCap    int       // Writes waiting for room (tests look at it)
	closing  bool
	closed   bool // the goroutine has exited; Write writes through
	err      error
	exited   chan struct{}
}

// New returns a Writer in front of w that lets at most maxPending bytes
// wait (DefaultMaxPending when maxPending <= 0) and starts its goroutine;
// Close stops it.
func New(w io.Writer, maxPending int) *Writer {
	if maxPending <= 0 {
		maxPending = DefaultMaxPending
	}
	s := &Writer{w: w, max: maxPending, exited: make(chan struct{})}
	s.work.L = &s.mu
	s.progress.L = &s.mu
	go s.run()
	return s
}

// Write queues p, which must be whole lines, and returns len(p), nil; it
// blocks while MaxPending bytes already wait. p is copied: the caller may
// reuse it at once.
func (s *Writer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// A line longer than the cap waits for an empty buffer, then goes alone.
	for len(s.pending) > 0 && len(s.pending)+len(p) > s.max && !s.closing {
		s.atCap++
		s.progress.Wait()
		s.atCap--
	}
	if s.closing {
		// Close has begun: wait for the goroutine to pass on what it
		// holds, then write through, keeping the order.
		for !s.closed {
			s.progress.Wait()
		}
		return s.w.Write(p)
	}
	if len(s.pending) == 0 {
		s.work.Signal()
	}
	s.pending = append(s.pending, p...)
	s.queued += uint64(len(p))
	return len(p), nil
}

// Flush waits until every line written before it has been passed to the
// underlying writer and returns the first error that writer returned.
func (s *Writer) Flush() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for target := s.queued; s.done < target && !s.closed; {
		s.progress.Wait()
	}
	return s.err
}

// Close passes on every pending line, stops the goroutine and returns the
// first error of the underlying writer. Later Writes write through; Close
// may be called more than once.
func (s *Writer) Close() error {
	s.mu.Lock()
	s.closing = true
	s.work.Signal()
	s.mu.Unlock()
	<-s.exited
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// run is the goroutine: it takes all pending lines at once and passes them
// on with one Write, until Close and nothing is left.
func (s *Writer) run() {
	defer close(s.exited)
	s.mu.Lock()
	for {
		for len(s.pending) == 0 && !s.closing {
			s.work.Wait()
		}
		if len(s.pending) == 0 { // closing, and everything is passed on
			s.closed = true
			s.progress.Broadcast()
			s.mu.Unlock()
			return
		}
		if !s.closing {
			// Let the goroutines that are already runnable append their
			// lines first, so that they share this write: without it the
			// goroutine, woken by one line, wrote it alone almost every
			// time, and the wake-up cost what the write saved (measured:
			// 4–7 % more CPU per request than writing in place; with it, the
			// same). At rest nothing else is runnable and it returns at once.
			s.mu.Unlock()
			runtime.Gosched()
			s.mu.Lock()
		}
		batch := s.pending
		s.pending, s.spare = s.spare[:0], nil
		s.progress.Broadcast() // room for Writes waiting at the cap
		s.mu.Unlock()

		_, err := s.w.Write(batch)

		s.mu.Lock()
		if err != nil && s.err == nil {
			s.err = err
		}
		s.done += uint64(len(batch))
		s.spare = batch[:0]
		s.progress.Broadcast() // Flushes waiting for these lines
	}
}
