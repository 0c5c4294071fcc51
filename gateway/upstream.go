package gateway

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
)

// hopHeaders are the hop-by-hop headers (RFC 9110 §7.6.1) a proxy must not
// forward.
var hopHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// roundTrip sends r to the route's upstream with body and returns the
// upstream's response (headers read, body not yet).
func (g *Gateway) roundTrip(ctx context.Context, r *http.Request, rr *route, body io.ReadCloser, length int64) (*http.Response, error) {
	target := *rr.upstream
	target.Path, target.RawPath = joinPath(rr.upstream, r.URL)
	target.RawQuery = r.URL.RawQuery
	out, err := http.NewRequestWithContext(ctx, r.Method, target.String(), body)
	if err != nil {
		return nil, err
	}
	out.ContentLength = length
	if length == 0 {
		out.Body = http.NoBody
	}
	copyHeader(out.Header, r.Header)
	removeHop(out.Header)
	out.Host = r.Host
	if ip, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		if prior := r.Header.Values("X-Forwarded-For"); len(prior) > 0 {
			ip = strings.Join(prior, ", ") + ", " + ip
		}
		out.Header.Set("X-Forwarded-For", ip)
	}
	proto := "http"
	if r.TLS != nil {
		proto = "https"
	}
	out.Header.Set("X-Forwarded-Proto", proto)
	out.Header.Set("X-Forwarded-Host", r.Host)
	// Go's Transport sends a request again, on a new connection, when a
	// reused one fails after the request was written and the request looks
	// replayable: no body (or a GetBody) and an Idempotency-Key header, which
	// the gateway forwards. The upstream may have acted on the first send;
	// only the gateway decides whether a request runs again. The key still
	// goes out, under a spelling of the name the Transport does not look up
	// (header names are case-insensitive on the wire; HTTP/2 lowercases
	// them anyway).
	for _, name := range []string{"Idempotency-Key", "X-Idempotency-Key"} {
		if v, ok := out.Header[name]; ok {
			delete(out.Header, name)
			out.Header[strings.ToLower(name)] = v
		}
	}
	resp, err := g.transport.RoundTrip(out)
	if err != nil {
		return nil, err
	}
	removeHop(resp.Header)
	return resp, nil
}

// joinPath appends the request's path to the upstream's base path.
func joinPath(base, req *url.URL) (path, rawPath string) {
	bp := strings.TrimSuffix(base.Path, "/")
	if bp == "" {
		return req.Path, req.RawPath
	}
	path = bp + req.Path
	if req.RawPath != "" {
		rawPath = strings.TrimSuffix(base.EscapedPath(), "/") + req.RawPath
	}
	return path, rawPath
}

// copyHeader adds every value of src to dst.
func copyHeader(dst, src http.Header) {
	for k, vs := range src {
		for _, v := range vs {
			dst.Add(k, v)
		}
	}
}

// removeHop deletes the hop-by-hop headers, including those the Connection
// header names.
func removeHop(h http.Header) {
	for _, f := range h.Values("Connection") {
		for _, name := range strings.Split(f, ",") {
			if name = strings.TrimSpace(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, name := range hopHeaders {
		h.Del(name)
	}
}

// isTimeout reports whether a transport error is a timeout.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
