package api

import (
	"errors"
	"io"
	"net/http"
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

// DefaultMinBodyRate is Options.MinBodyRate when unset, the server's
// default IDEM_MIN_BODY_RATE: 1 MiB/s, so a body of the default 10 MiB
// limit must arrive within 15 s, one of 1 MiB within 6 s.
const DefaultMinBodyRate = 1 << 20

// largeBody is the declared size from which a body's read gets a deadline
// of its own (bodyDeadline). Below it a body holds at most 4 × 64 KiB of
// the budget, which the tenant's share bounds; the claims and completes of
// the hot path stay free of the deadline's cost.
const largeBody = 64 << 10

// bodyReadGrace is the part of a large body's read deadline that does not
// depend on its size: a client's first bytes after the headers, a pause
// of the network.
const bodyReadGrace = 5 * time.Second

// bodyDeadline bounds the read of a body of n declared bytes, reserved in
// full before it is read, by its size: bodyReadGrace plus n at the
// minimum rate. Without it a client that announces the largest body and
// sends one byte holds BodyMemoryFactor times it until the server's read
// timeout (30 s by default). The server's read timeout still applies when
// it is sooner; a body that misses the deadline is answered 400 and its
// reservation given back.
func (s *service) bodyDeadline(w http.ResponseWriter, n int64) {
	if n < largeBody || s.minRate <= 0 {
		return
	}
	d := bodyReadGrace + time.Duration(float64(n)/float64(s.minRate)*float64(time.Second))
	// ErrNotSupported (a writer that cannot set it) leaves the read timeout.
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(d))
}

// inflight is the server-wide budget of request body bytes in flight. A
// request reserves its body (times BodyMemoryFactor) before a byte of it is
// read, from Content-Length when the client sends one, or chunk by chunk as
// it is read otherwise, and gives it back when its answer is written. Past
// the budget the request is refused with 503 server_busy and Retry-After:
// the server answers more requests later instead of running out of memory
// now. The bytes count in the share of the request's tenant
// (Options.InflightShare): past its share a tenant's request is refused
// unless a whole share stays free for the others, so one tenant's slow or
// large bodies and unread answers cannot refuse every other tenant.
type inflight = budget.Bytes

// errBusy ends the read of a body whose next bytes the budget cannot hold.
var errBusy = errors.New("request body bytes in flight are over the server's budget")

// busy is the problem of a request refused for lack of budget.
func busy() error {
	return &idem.Error{
		Code:       idem.CodeServerBusy,
		Detail:     "the server holds as many request bodies as it may (for this tenant or in all); retry after the Retry-After delay",
		RetryAfter: busyRetryAfter,
		Err:        errBusy,
	}
}

// answerHold is the in-flight budget a request holds for the stored bytes
// its answer carries (a replayed response, recovery data), charged once the
// store has read them and given back, like the body's, once the answer is
// written. Requests whose answers carry stored bytes embed it. owner is
// whose share the bytes count in: the request's tenant (handle sets it).
type answerHold struct {
	owner string
	held  int64
}

func (a *answerHold) answerHeld() (string, int64) { return a.owner, a.held }
func (a *answerHold) setAnswerOwner(owner string) { a.owner = owner }

// answerHolder is a request that may hold budget for its answer.
type answerHolder interface {
	answerHeld() (owner string, n int64)
	setAnswerOwner(owner string)
}

// holdAnswer charges the in-flight budget for the stored bytes rec carries
// into the answer, BodyMemoryFactor times (the record as read, its JSON
// text, the buffer the answer is encoded into, and that buffer's growth),
// before they are copied into the answer, in the share of the request's
// tenant. Past the budget, or past the tenant's share while the budget
// keeps no share free for the others, it returns 503 server_busy: a stored
// response can be asked for again and again (replays and reads change
// nothing), so without the charge many reads of large responses at once
// would run the server out of memory however small their requests, and
// without the share one tenant's clients that never read their large
// answers would hold the whole budget until the write timeout. Refusing
// is safe for every answer it is called for: a replay or a read decided
// nothing, and a claim that took over or recovered a key is recovered by
// the caller's retry with the same attempt id (or, without one, once the
// new lease runs out), as after a lost answer.
func (s *service) holdAnswer(a *answerHold, rec idem.Record) error {
	n := int64(len(rec.RecoveryData))
	if rec.Response != nil {
		n += int64(rec.Response.Size())
	}
	if n == 0 {
		return nil
	}
	n *= BodyMemoryFactor
	if !s.inflight.Acquire(a.owner, n) {
		return &idem.Error{
			Code: idem.CodeServerBusy,
			Detail: "the server holds as many request and stored response bodies as it may (for this tenant or in all); nothing was sent: " +
				"retry after the Retry-After delay (a claim with the same attempt id)",
			RetryAfter: busyRetryAfter,
			Err:        errBusy,
		}
	}
	a.held += n
	return nil
}

// meteredBody reserves budget for the bytes of a body of unknown length
// (chunked) before it reads them, and counts what it holds. Each read is
// bounded by meteredChunk and by what is left up to limit (the body size
// limit), so a body of the largest size fits a budget of exactly
// BodyMemoryFactor × limit.
type meteredBody struct {
	r      io.Reader
	budget *inflight
	owner  string
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
	if !m.budget.Acquire(m.owner, want) {
		return 0, errBusy
	}
	n, err := m.r.Read(p)
	m.read += int64(n)
	used := min(int64(n)*BodyMemoryFactor, want)
	m.budget.Release(m.owner, want-used)
	m.held += used
	return n, err
}
