// Package statuswriter lets a middleware learn the final status a handler
// sent (the API's access log, the gateway's metrics) without an allocation
// of its own: the Writer is a value the caller keeps where it already
// keeps per-request state.
package statuswriter

import "net/http"

// Writer wraps a ResponseWriter and records the final status sent through
// it: 0 until the handler writes.
type Writer struct {
	http.ResponseWriter
	Status int
}

// WriteHeader records the first final status (an informational 1xx other
// than 101 is not one) and passes code on.
func (w *Writer) WriteHeader(code int) {
	if w.Status == 0 && (code < 100 || code > 199 || code == http.StatusSwitchingProtocols) {
		w.Status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

// Write records the implicit 200 of a body written without a header.
func (w *Writer) Write(p []byte) (int, error) {
	if w.Status == 0 {
		w.Status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

// Unwrap returns the writer underneath, for http.ResponseController.
func (w *Writer) Unwrap() http.ResponseWriter { return w.ResponseWriter }
