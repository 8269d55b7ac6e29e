package fleet

import (
	"context"
	"testing"
	"time"

	"k8s.io/utils/clock"

	"github.com/tiergate/tiergate/dispatcher/queue"
	"github.com/tiergate/tiergate/internal/redistest"
)

// BenchmarkAdmitRelease measures one request's way through the queue with
// a free slot: Admit, Wait, Release. "local" is local mode (no Gate);
// "redis" is fleet mode against a real redis-server on loopback, which adds
// the EVALSHA round trips of the enqueue and of the pump's exchanges (the
// claim, then the release, which a later claim may carry). The difference
// is fleet mode's admission and release overhead per request.
func BenchmarkAdmitRelease(b *testing.B) {
	for _, mode := range []string{"local", "redis"} {
		b.Run(mode, func(b *testing.B) {
			q := benchQueue(b, mode)
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				h, err := q.Admit("a", "standard")
				if err != nil {
					b.Fatal(err)
				}
				if err := h.Wait(ctx); err != nil {
					b.Fatal(err)
				}
				h.Release()
			}
		})
	}
}

// BenchmarkAdmitReleaseParallel is the same with concurrent requests of
// several tenants (GOMAXPROCS goroutines), where the queue's lock and the
// Gate's round trips contend.
func BenchmarkAdmitReleaseParallel(b *testing.B) {
	for _, mode := range []string{"local", "redis"} {
		b.Run(mode, func(b *testing.B) {
			q := benchQueue(b, mode)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				for pb.Next() {
					h, err := q.Admit("a", "standard")
					if err != nil {
						b.Error(err)
						return
					}
					if err := h.Wait(ctx); err != nil {
						b.Error(err)
						return
					}
					h.Release()
				}
			})
		})
	}
}

func benchQueue(b *testing.B, mode string) *queue.Queue {
	b.Helper()
	p := fleetPolicy("bench/pool", 1024)
	p.Tiers[0].QueueBound = 1 << 20
	p.Tiers[0].TenantConcurrencyLimit = 1024
	p.Tiers[0].TenantQueueLimit = 1 << 20
	if mode == "local" {
		q := queue.New(clock.RealClock{})
		q.UpdatePolicy(p)
		return q
	}
	s := redistest.Start(b, redistest.Options{})
	g, err := New(Config{URL: s.URL(0), DispatcherID: "bench", OpTimeout: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = g.Close() })
	q := queue.New(clock.RealClock{}, queue.WithGate(g))
	g.ObservePolicy(p)
	q.UpdatePolicy(p)
	g.Start(q.Kick)
	// Warm the script cache and the connection pool.
	for range 10 {
		h, err := q.Admit("a", "standard")
		if err != nil {
			b.Fatal(err)
		}
		_ = h.Wait(context.Background())
		h.Release()
	}
	return q
}

// BenchmarkRedisRoundTrip is one bare PING through the Gate's client
// settings: the floor under each of fleet mode's round trips.
func BenchmarkRedisRoundTrip(b *testing.B) {
	s := redistest.Start(b, redistest.Options{})
	cfg := Config{URL: s.URL(0), OpTimeout: 5 * time.Second}
	cfg.defaults()
	c, err := cfg.newClient()
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if err := c.Ping(ctx).Err(); err != nil {
			b.Fatal(err)
		}
	}
}
