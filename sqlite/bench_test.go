package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/sqlite/internal/dbsqlc"
	"github.com/idem-dev/idem/storetest"
)

// benchParallelism × GOMAXPROCS goroutines call at once in the pair
// benchmarks (16 on the 2-core bench machine, as scripts/bench's loadgen).
const benchParallelism = 8

// cpuTime is the CPU time (user + system) this process used so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU reports the process's CPU per operation since start (the wall
// time of a pair is mostly the two fsyncs of synchronous=FULL).
func reportCPU(b *testing.B, start time.Duration) {
	b.ReportMetric(float64(cpuTime(b)-start)/float64(time.Microsecond)/float64(b.N), "cpu-µs/op")
}

// benchResponse is the response every benchmark complete stores.
var benchResponse = idem.Response{Status: 201, Headers: map[string]string{"Content-Type": "application/json"}, Body: []byte(`{"id":"ord_1"}`), BodyEncoding: idem.BodyEncodingUTF8}

// BenchmarkClaimComplete measures one claim (a create) and its complete
// through the Store, with parallel callers. scripts/bench-floor divides
// BenchmarkClaimCompleteRaw's ns/op by this one's.
func BenchmarkClaimComplete(b *testing.B) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(b.TempDir(), "idem.db"), Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	if _, err := s.CreateTenant(ctx, idem.CreateTenantParams{ID: "acme", Name: "acme", Settings: idem.DefaultSettings()}); err != nil {
		b.Fatal(err)
	}
	var n atomic.Int64
	b.SetParallelism(benchParallelism)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime(b)
	defer func() { reportCPU(b, cpu0) }()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			key := fmt.Sprintf("bench-%d", n.Add(1))
			res, err := s.Claim(ctx, storetest.ClaimParams("acme", key))
			if err == nil {
				_, err = s.Complete(ctx, idem.CompleteParams{TenantID: "acme", Key: key, FencingToken: res.Record.FencingToken, Response: benchResponse})
			}
			if err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkClaimCompleteRaw is the floor of BenchmarkClaimComplete: a plain
// loop running the statements the Store runs for the same pair (read,
// next token, insert; read, update), each pair half in its own BEGIN
// IMMEDIATE transaction behind one writer slot, on a pool with the same DSN
// (pragmas) and size, with every statement prepared once per connection, and
// none of the Store's decisions, conversions or file checks.
func BenchmarkClaimCompleteRaw(b *testing.B) {
	ctx := context.Background()
	path := filepath.Join(b.TempDir(), "idem.db")
	s, err := Open(ctx, path, Options{})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := s.CreateTenant(ctx, idem.CreateTenantParams{ID: "acme", Name: "acme", Settings: idem.DefaultSettings()}); err != nil {
		b.Fatal(err)
	}
	_ = s.Close()
	db, _, err := openDB(ctx, path, false)
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	q, err := dbsqlc.Prepare(ctx, db)
	if err != nil {
		b.Fatal(err)
	}
	defer q.Close()
	slot := make(chan struct{}, 1)
	inTx := func(fn func(q *dbsqlc.Queries, now int64) error) error {
		slot <- struct{}{}
		defer func() { <-slot }()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }()
		if err := fn(q.WithTx(tx), time.Now().UnixMicro()); err != nil {
			return err
		}
		return tx.Commit()
	}
	headers, _ := json.Marshal(benchResponse.Headers)
	headersText := string(headers)
	status := int64(benchResponse.Status)
	enc := benchResponse.BodyEncoding
	var n atomic.Int64
	b.SetParallelism(benchParallelism)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime(b)
	defer func() { reportCPU(b, cpu0) }()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			key := fmt.Sprintf("bench-%d", n.Add(1))
			err := inTx(func(q *dbsqlc.Queries, now int64) error {
				if _, err := q.GetKey(ctx, dbsqlc.GetKeyParams{TenantID: "acme", Key: key}); err != sql.ErrNoRows {
					return fmt.Errorf("read key: %v", err)
				}
				token, err := q.NextFencingToken(ctx)
				if err != nil {
					return err
				}
				lease := now + 30e6
				_, err = q.CreateKey(ctx, dbsqlc.CreateKeyParams{
					TenantID: "acme", Key: key, Operation: "POST /v1/payments", Fingerprint: "fp-1",
					FencingToken: token, LeaseExpiresAt: &lease, ReplayWindowSeconds: 86400,
					ReaperThresholdSeconds: 259200, Now: now,
				})
				return err
			})
			if err == nil {
				err = inTx(func(q *dbsqlc.Queries, now int64) error {
					if _, err := q.GetKey(ctx, dbsqlc.GetKeyParams{TenantID: "acme", Key: key}); err != nil {
						return err
					}
					_, err := q.CompleteKey(ctx, dbsqlc.CompleteKeyParams{
						TenantID: "acme", Key: key, ResponseStatus: &status, ResponseHeaders: &headersText,
						ResponseBody: benchResponse.Body, ResponseBodyEncoding: &enc, Now: now,
					})
					return err
				})
			}
			if err != nil {
				b.Error(err)
				return
			}
		}
	})
}
