package api

import (
	"io"
	"log/slog"
	"strconv"
	"sync"
	"time"
)

// NewJSONLogHandler returns slog's JSON handler writing to w, which also
// writes the access log line by itself: the same bytes the JSON handler
// writes for it, appended by hand into a pooled buffer and written with one
// Write, without building a slog.Record and walking its attributes (a line
// with a value the JSON handler would escape goes through it instead). Lines
// of both paths, and of handlers derived with WithAttrs or WithGroup, are
// written whole, one at a time. The server logs JSON through it.
func NewJSONLogHandler(w io.Writer, opts *slog.HandlerOptions) slog.Handler {
	lw := &lockedWriter{w: w}
	return &jsonLogHandler{
		JSONHandler: slog.NewJSONHandler(lw, opts),
		w:           lw,
		plain:       opts == nil || opts.ReplaceAttr == nil && !opts.AddSource,
	}
}

// jsonLogHandler is NewJSONLogHandler's handler: slog's JSON handler, plus
// writeAccessLine.
type jsonLogHandler struct {
	*slog.JSONHandler
	w *lockedWriter
	// plain: no ReplaceAttr or source, so the JSON handler's line for the
	// access log is what writeAccessLine writes.
	plain bool
}

// lockedWriter writes one line at a time for both of jsonLogHandler's paths.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (lw *lockedWriter) Write(p []byte) (int, error) {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	return lw.w.Write(p)
}

var lineBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 256); return &b }}

// writeAccessLine writes the access log line logRequest's record would be
// written as, at info level (the caller checked Enabled), and reports
// whether it did: not when a value would need escaping, or the time falls
// outside the years the JSON handler writes.
func (h *jsonLogHandler) writeAccessLine(end time.Time, id, method, route string, status int, d time.Duration, tenant *string) bool {
	if !h.plain || !plainJSON(id) || !plainJSON(method) || !plainJSON(route) || tenant != nil && !plainJSON(*tenant) {
		return false
	}
	if y := end.Year(); y < 0 || y >= 10000 {
		return false
	}
	bp := lineBuffers.Get().(*[]byte)
	b := append((*bp)[:0], `{"time":"`...)
	b = end.Round(0).AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","level":"INFO","msg":"http request","request_id":"`...)
	b = append(b, id...)
	b = append(b, `","method":"`...)
	b = append(b, method...)
	b = append(b, `","route":"`...)
	b = append(b, route...)
	b = append(b, `","status":`...)
	b = strconv.AppendInt(b, int64(status), 10)
	b = append(b, `,"duration":`...)
	b = strconv.AppendInt(b, int64(d), 10)
	if tenant != nil {
		b = append(b, `,"tenant":"`...)
		b = append(b, *tenant...)
		b = append(b, '"')
	}
	b = append(b, "}\n"...)
	_, _ = h.w.Write(b)
	*bp = b
	lineBuffers.Put(bp)
	return true
}

// plainJSON reports whether s stands in a JSON string as it is: printable
// ASCII without quote or backslash.
func plainJSON(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}
