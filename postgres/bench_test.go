package postgres

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/storetest"
	"github.com/idem-dev/idem/testkit/pgtest"
)

// BenchmarkClaim measures the claim hot path (a create: one upsert) on the
// database clock, with parallel callers. scripts/bench-claim runs it next to
// pgbench executing the same SQL.
func BenchmarkClaim(b *testing.B) {
	ctx := context.Background()
	store, err := Open(ctx, pgtest.URL(b), Options{MaxConns: 8})
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	if _, err := store.CreateTenant(ctx, idem.CreateTenantParams{ID: "acme", Name: "Acme", Settings: idem.DefaultSettings()}); err != nil {
		b.Fatal(err)
	}
	var n atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			p := storetest.ClaimParams("acme", fmt.Sprintf("bench-%d", n.Add(1)))
			if _, err := store.Claim(ctx, p); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
