// Package faultproxy is a loopback HTTP proxy for tests that forwards each
// request to an upstream server and, when told to, closes the client's
// connection after the upstream has answered but before the answer is
// forwarded: the server did the work, the client never hears of it.
package faultproxy

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
)

// Proxy is a running fault proxy.
type Proxy struct {
	ln       net.Listener
	upstream string
	drop     func(r *http.Request) bool
	rt       http.RoundTripper

	mu      sync.Mutex
	dropped int
	conns   map[net.Conn]struct{}
	wg      sync.WaitGroup
}

// Start listens on 127.0.0.1:0 and forwards to upstreamURL's host. drop is
// asked for every request (after its body was forwarded) whether to swallow
// the answer and close the connection. The proxy stops when the test ends.
func Start(t testing.TB, upstreamHost string, drop func(r *http.Request) bool) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("faultproxy: listen: %v", err)
	}
	p := &Proxy{ln: ln, upstream: upstreamHost, drop: drop, rt: &http.Transport{}, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(p.close)
	return p
}

// URL returns the proxy's base URL.
func (p *Proxy) URL() string { return "http://" + p.ln.Addr().String() }

// Dropped returns how many answers were swallowed.
func (p *Proxy) Dropped() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dropped
}

func (p *Proxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		conn, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.conns[conn] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(1)
		go p.handle(conn)
	}
}

func (p *Proxy) handle(conn net.Conn) {
	defer p.wg.Done()
	defer func() {
		p.mu.Lock()
		delete(p.conns, conn)
		p.mu.Unlock()
		_ = conn.Close()
	}()
	br := bufio.NewReader(conn)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		req.RequestURI = ""
		req.URL.Scheme = "http"
		req.URL.Host = p.upstream
		resp, err := p.rt.RoundTrip(req)
		if err != nil {
			return
		}
		body, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil {
			return
		}
		if p.drop(req) {
			p.mu.Lock()
			p.dropped++
			p.mu.Unlock()
			return // close without answering
		}
		resp.Body = io.NopCloser(bytes.NewReader(body))
		resp.ContentLength = int64(len(body))
		resp.TransferEncoding = nil
		if err := resp.Write(conn); err != nil {
			return
		}
	}
}
