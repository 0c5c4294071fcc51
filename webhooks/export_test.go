package webhooks

import "net"

// WithResolver returns c resolving endpoint names with r.
func WithResolver(c Config, r *net.Resolver) Config {
	c.resolver = r
	return c
}
