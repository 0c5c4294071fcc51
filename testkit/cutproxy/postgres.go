package cutproxy

import (
	"net/url"
	"testing"

	"github.com/idem-dev/idem/testkit/pgtest"
)

// Postgres returns a connection URL of a fresh test schema (pgtest.URL)
// whose path goes through a new Proxy, and the proxy: its Cut takes
// PostgreSQL away from whoever connects by that URL, Restore brings it
// back. The proxy closes when the test ends.
func Postgres(tb testing.TB) (string, *Proxy) {
	tb.Helper()
	u, err := url.Parse(pgtest.URL(tb))
	if err != nil {
		tb.Fatalf("cutproxy: test database URL: %v", err)
	}
	p, err := New(u.Host)
	if err != nil {
		tb.Fatalf("cutproxy: %v", err)
	}
	tb.Cleanup(p.Close)
	u.Host = p.Addr()
	return u.String(), p
}
