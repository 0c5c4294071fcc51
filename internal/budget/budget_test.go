package budget

import (
	"fmt"
	"sync"
	"testing"
)

// The rule of a shared budget: an owner may always hold its share; past it
// only while a whole share stays free for the others; the owner "" counts
// in the total only; an owner holding nothing is forgotten.
func TestSharedBudget(t *testing.T) {
	b := NewShared(100, 40)
	must := func(ok bool, msg string) {
		t.Helper()
		if !ok {
			t.Fatal(msg)
		}
	}
	must(b.Acquire("a", 40), "an owner's share is always its own")
	must(b.Acquire("a", 20), "past its share while 40 stay free")
	must(!b.Acquire("a", 1), "past its share, leaving less than a share free")
	must(b.Acquire("b", 40), "another owner finds its share")
	must(!b.Acquire("c", 1), "nothing past the limit")
	b.Release("a", 60)
	must(b.Held("a") == 0, "all given back")
	must(b.Acquire("", 60), "the owner \"\" counts in the total only")
	must(b.Used() == 100, "the total counts everyone")
	b.Release("", 60)
	b.Release("b", 40)
	must(b.Used() == 0, "all given back")

	must(ShareOf(64<<20, 0.5, 40<<20) == 40<<20, "at least the largest request")
	must(ShareOf(64<<20, 0.25, 1) == 16<<20, "the fraction, rounded up")
	must(ShareOf(64<<20, 1, 1) == 64<<20, "1 turns it off")
	off := NewShared(100, ShareOf(100, 1, 1))
	must(off.Acquire("a", 100), "without shares an owner takes all")
}

// Concurrent reservations never pass the limit nor an owner's bound, and
// all come back.
func TestSharedBudgetConcurrent(t *testing.T) {
	b := NewShared(1000, 400)
	var wg sync.WaitGroup
	for _, owner := range []string{"a", "b", "c", ""} {
		for range 4 {
			wg.Go(func() {
				for range 2000 {
					if b.Acquire(owner, 30) {
						if u := b.Used(); u > 1000 {
							t.Errorf("used %d past the limit", u)
						}
						if h := b.Held(owner); owner != "" && h > 600 {
							t.Errorf("%s holds %d, past limit - share", owner, h)
						}
						b.Release(owner, 30)
					}
				}
			})
		}
	}
	wg.Wait()
	if b.Used() != 0 || b.Held("a")+b.Held("b")+b.Held("c") != 0 {
		t.Fatalf("used %d, owners %v after all released", b.Used(), b.owners)
	}
}

// Owners seen once (the gateway's client addresses) do not pile up: those
// holding nothing are dropped once the map reaches minSweep, and those
// holding bytes are kept.
func TestSharedBudgetForgetsIdleOwners(t *testing.T) {
	b := NewShared(1<<30, 1<<20)
	if !b.Acquire("holder", 10) {
		t.Fatal("holder")
	}
	for i := range 10 * minSweep {
		o := fmt.Sprintf("client-%d", i)
		if !b.Acquire(o, 5) {
			t.Fatal(o)
		}
		b.Release(o, 5)
	}
	if n := len(b.owners); n > 2*minSweep {
		t.Fatalf("%d owners kept for %d seen", n, 10*minSweep)
	}
	if b.Held("holder") != 10 || b.Used() != 10 {
		t.Fatalf("holder %d, used %d", b.Held("holder"), b.Used())
	}
}

// A reservation of an unshared budget allocates nothing, nor does one of a
// shared budget whose owner comes back.
func TestAcquireAllocatesNothing(t *testing.T) {
	for _, b := range []*Bytes{New(1 << 20), NewShared(1<<20, 1<<19)} {
		owner := "tenant-a"
		if n := testing.AllocsPerRun(1000, func() {
			if b.Acquire(owner, 1024) {
				b.Release(owner, 1024)
			}
		}); n != 0 {
			t.Fatalf("%v allocations per reservation", n)
		}
	}
}

// BenchmarkAcquireRelease is one request's body charge and its release:
// without shares (atomics) and with them (a lock and a map lookup), from
// one goroutine and from all.
func BenchmarkAcquireRelease(b *testing.B) {
	for _, c := range []struct {
		name string
		bu   *Bytes
	}{{"unshared", New(1 << 30)}, {"shared", NewShared(1<<30, 1<<29)}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if c.bu.Acquire("tenant-a", 512) {
					c.bu.Release("tenant-a", 512)
				}
			}
		})
		b.Run(c.name+"-parallel", func(b *testing.B) {
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if c.bu.Acquire("tenant-a", 512) {
						c.bu.Release("tenant-a", 512)
					}
				}
			})
		})
	}
}
