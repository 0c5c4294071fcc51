package logsink

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// recorder is an underlying writer that keeps what it got, counts its
// Writes and can be held: a held Write blocks until release.
type recorder struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	writes int
	gate   chan struct{} // nil: never blocks
	in     atomic.Int32  // Writes that entered
	err    error
}

func (r *recorder) Write(p []byte) (int, error) {
	r.in.Add(1)
	if r.gate != nil {
		<-r.gate
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.writes++
	if r.err != nil {
		return 0, r.err
	}
	return r.buf.Write(p)
}

func (r *recorder) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.buf.String()
}

// Many goroutines writing at once: every line arrives once, whole, and each
// goroutine's lines in the order it wrote them.
func TestConcurrentLinesWholeOnceInOrder(t *testing.T) {
	const writers, lines = 16, 500
	rec := &recorder{}
	s := New(rec, 4096) // small cap: Writes also block and resume
	var wg sync.WaitGroup
	for g := range writers {
		wg.Go(func() {
			for i := range lines {
				// lines of different lengths, some longer than others' batches
				line := fmt.Sprintf("g=%d i=%d pad=p%s end\n", g, i, strings.Repeat("x", (g*7+i)%300))
				n, err := s.Write([]byte(line))
				if err != nil || n != len(line) {
					t.Errorf("Write = %d, %v", n, err)
					return
				}
			}
		})
	}
	wg.Wait()
	require.NoError(t, s.Close())

	next := make([]int, writers)
	got := strings.Split(strings.TrimSuffix(rec.String(), "\n"), "\n")
	require.Len(t, got, writers*lines)
	for _, l := range got {
		var g, i int
		var pad string
		_, err := fmt.Sscanf(l, "g=%d i=%d pad=%s end", &g, &i, &pad)
		require.NoError(t, err, "a split or interleaved line: %q", l)
		require.Equal(t, (g*7+i)%300+1, len(pad), "line %q is not whole", l)
		require.Equal(t, next[g], i, "goroutine %d: line %d out of order", g, i)
		next[g]++
	}
	for g := range writers {
		require.Equal(t, lines, next[g])
	}
	t.Logf("%d lines in %d writes", writers*lines, rec.writes)
}

// Close passes on every pending line, and lines written after Close are
// written through.
func TestCloseFlushes(t *testing.T) {
	rec := &recorder{gate: make(chan struct{})}
	s := New(rec, 0)
	for i := range 100 {
		_, _ = s.Write([]byte("line " + strconv.Itoa(i) + "\n"))
	}
	require.Eventually(t, func() bool { return rec.in.Load() >= 1 }, testWait, testPoll)
	require.Empty(t, rec.String(), "the underlying writer is held")
	closed := make(chan error)
	go func() { closed <- s.Close() }()
	close(rec.gate) // let it go
	require.NoError(t, <-closed)
	var want strings.Builder
	for i := range 100 {
		want.WriteString("line " + strconv.Itoa(i) + "\n")
	}
	require.Equal(t, want.String(), rec.String())

	_, err := s.Write([]byte("after close\n"))
	require.NoError(t, err)
	require.Equal(t, want.String()+"after close\n", rec.String(), "a Write after Close is written at once")
	require.NoError(t, s.Close(), "Close twice")
}

// Flush returns once the lines written before it have been passed on.
func TestFlush(t *testing.T) {
	rec := &recorder{}
	s := New(rec, 0)
	defer s.Close()
	for i := range 10 {
		_, _ = s.Write([]byte("line " + strconv.Itoa(i) + "\n"))
		require.NoError(t, s.Flush())
		require.True(t, strings.HasSuffix(rec.String(), "line "+strconv.Itoa(i)+"\n"), "after Flush: %q", rec.String())
	}
}

// With the underlying writer blocked, Write blocks once the cap is pending,
// and every line arrives when the writer is released.
func TestBackpressureAtTheCap(t *testing.T) {
	const maxPending = 1000
	line := []byte(strings.Repeat("a", 99) + "\n") // 100 bytes
	rec := &recorder{gate: make(chan struct{})}
	s := New(rec, maxPending)

	// The first line is taken by the goroutine, whose Write now blocks.
	_, _ = s.Write(line)
	require.Eventually(t, func() bool { return rec.in.Load() == 1 }, testWait, testPoll)
	// Ten more fill the pending buffer to the cap without blocking.
	for range 10 {
		_, _ = s.Write(line)
	}
	// The next one must wait.
	var wrote atomic.Int32
	blocked := make(chan struct{})
	go func() {
		defer close(blocked)
		for range 5 {
			_, _ = s.Write(line)
			wrote.Add(1)
		}
	}()
	// Wait until that Write waits for room, with the pending buffer full.
	require.Eventually(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.atCap == 1 && len(s.pending) == maxPending
	}, testWait, testPoll)
	require.Zero(t, wrote.Load(), "a Write past the cap returned while the writer was blocked")

	close(rec.gate)
	<-blocked
	require.NoError(t, s.Close())
	require.Equal(t, strings.Repeat(string(line), 16), rec.String(), "every line arrives, none dropped")
}

// A failing underlying writer: each batch is tried once (no spinning), the
// error comes back from Flush and Close, and Write keeps accepting lines.
func TestWriteErrorReportedNoSpin(t *testing.T) {
	boom := errors.New("disk full")
	rec := &recorder{err: boom}
	s := New(rec, 0)
	_, err := s.Write([]byte("one\n"))
	require.NoError(t, err)
	require.ErrorIs(t, s.Flush(), boom)
	rec.mu.Lock()
	require.Equal(t, 1, rec.writes, "one batch, one attempt")
	rec.mu.Unlock()
	_, err = s.Write([]byte("two\n"))
	require.NoError(t, err)
	require.ErrorIs(t, s.Close(), boom)
	rec.mu.Lock()
	require.Equal(t, 2, rec.writes)
	rec.mu.Unlock()
}

// A line longer than the cap goes out alone, whole.
func TestLineLongerThanCap(t *testing.T) {
	rec := &recorder{}
	s := New(rec, 10)
	long := strings.Repeat("z", 100) + "\n"
	_, _ = s.Write([]byte("short\n"))
	_, _ = s.Write([]byte(long))
	_, _ = s.Write([]byte("short\n"))
	require.NoError(t, s.Close())
	require.Equal(t, "short\n"+long+"short\n", rec.String())
}
