package fleet

import (
	"context"
	"testing"
	"time"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/dispatcher/tokens"
	"github.com/tiergate/tiergate/internal/redistest"
)

// BenchmarkRedisBudgetReserveSettle is the token path's Redis cost per
// request: one Reserve and one Settle (two EVALSHA round trips) against a
// real redis-server on loopback, with budgets large enough never to
// refuse. Run it with BenchmarkAdmitRelease (the Gate's cost per request)
// and BenchmarkRedisRoundTrip (a bare PING) for the ratios.
func BenchmarkRedisBudgetReserveSettle(b *testing.B) {
	s := redistest.Start(b, redistest.Options{})
	g, err := New(Config{URL: s.URL(0), DispatcherID: "bench", OpTimeout: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = g.Close() })
	lim := g.Budgets()
	k := tokens.Key{Pool: "bench/pool", Tenant: "acme"}
	l := policy.Limits{RequestsPerMinute: 1 << 40, TokensPerMinute: 1 << 40}
	ctx := context.Background()
	// Warm the script cache and a connection.
	if _, err := lim.Reserve(ctx, k, l, 1); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		d, err := lim.Reserve(ctx, k, l, 1300)
		if err != nil || !d.OK {
			b.Fatalf("Reserve: %+v, %v", d, err)
		}
		if _, err := lim.Settle(ctx, k, l, tokens.Settlement{Reserved: 1300, Used: 700}); err != nil {
			b.Fatal(err)
		}
	}
}
