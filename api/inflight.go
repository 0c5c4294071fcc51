package api

import (
	"errors"
	"io"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/internal/budget"
)

// DefaultMaxInflightBytes is the server-wide budget of request body bytes
// in flight when Options.MaxInflightBytes is zero or less: room for six
// bodies of the default 10 MiB limit at once, or tens of thousands of the
// usual few-hundred-byte claims.
const DefaultMaxInflightBytes = 64 << 20

// BodyMemoryFactor is how many times its body size an admitted request is
// charged against the in-flight budget: a body is held as read, as decoded
// (a stored response body once as JSON text and once as bytes) and as the
// copy the store writes, while the answer repeats it. Charging the estimate
// rather than the wire size keeps the process's memory, not only its
// socket reads, under the budget.
const BodyMemoryFactor = 4

// busyRetryAfter is the Retry-After of a request refused for lack of
// budget: bodies in flight drain within a second on a healthy server.
const busyRetryAfter = time.Second

// inflight is the server-wide budget of request body bytes in flight. A
// request reserves its body (times BodyMemoryFactor) before a byte of it is
// read, from Content-Length when the client sends one, or chunk by chunk as
// it is read otherwise, and gives it back when its answer is written. Past
// the budget the request is refused with 503 server_busy and Retry-After:
// the server answers more requests later instead of running out of memory
// now.
type inflight = budget.Bytes

// errBusy ends the read of a body whose next bytes the budget cannot hold.
var errBusy = errors.New("request body bytes in flight are over the server's budget")

// busy is the problem of a request refused for lack of budget.
func busy() error {
	return &idem.Error{
		Code:       idem.CodeServerBusy,
		Detail:     "the server holds as many request bodies as it may; retry after the Retry-After delay",
		RetryAfter: busyRetryAfter,
		Err:        errBusy,
	}
}

// meteredBody reserves budget for the bytes of a body of unknown length
// (chunked) before it reads them, and counts what it holds. Each read is
// bounded by meteredChunk and by what is left up to limit (the body size
// limit), so a body of the largest size fits a budget of exactly
// BodyMemoryFactor × limit.
type meteredBody struct {
	r      io.Reader
	budget *inflight
	limit  int64
	read   int64
	held   int64 // charged bytes, released by the request when it ends
}

// meteredChunk bounds one read of a metered body, so that a large read
// buffer does not reserve more than the bytes that may come.
const meteredChunk = 32 << 10

func (m *meteredBody) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	// At the limit one more byte is read, unreserved, only to learn
	// whether the body goes on (http.MaxBytesReader then refuses it).
	room := max(min(int64(len(p)), meteredChunk, m.limit-m.read), 1)
	p = p[:room]
	want := room * BodyMemoryFactor
	if m.read >= m.limit {
		want = 0
	}
	if !m.budget.Acquire(want) {
		return 0, errBusy
	}
	n, err := m.r.Read(p)
	m.read += int64(n)
	used := min(int64(n)*BodyMemoryFactor, want)
	m.budget.Release(want - used)
	m.held += used
	return n, err
}
