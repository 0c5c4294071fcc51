// Package cutproxy is a loopback TCP proxy whose path can be cut and
// restored, for tests that take a real dependency (PostgreSQL, the idem
// server) away from a process and bring it back: while cut, every proxied
// connection is closed and new ones are closed as soon as they arrive, as
// when a network path or a database host goes away.
package cutproxy

import (
	"io"
	"net"
	"sync"
)

// Proxy forwards connections from a loopback port to a target address.
type Proxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]struct{}
}

// New listens on 127.0.0.1:0 and forwards every connection to target.
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	go p.serve()
	return p, nil
}

// Addr is the proxy's address, host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Cut closes every proxied connection and refuses new ones until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		_ = c.Close()
		delete(p.conns, c)
	}
}

// Restore lets connections through again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
}

// Close stops the proxy and closes every connection.
func (p *Proxy) Close() {
	_ = p.ln.Close()
	p.Cut()
}

func (p *Proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.handle(c)
	}
}

func (p *Proxy) handle(c net.Conn) {
	if !p.track(c) {
		_ = c.Close()
		return
	}
	d, err := net.Dial("tcp", p.target)
	if err != nil || !p.track(d) {
		_ = c.Close()
		if d != nil {
			_ = d.Close()
		}
		return
	}
	go func() { _, _ = io.Copy(d, c); _ = d.Close() }()
	_, _ = io.Copy(c, d)
	_ = c.Close()
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, d)
	p.mu.Unlock()
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}
