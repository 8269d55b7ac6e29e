package limitertest

import (
	"context"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/dispatcher/tokens"
)

// The fleet case: 32 clients spread over the store's Limiters, each making
// up to 100 reservations of 1 to 20 tokens (bounded by 2s of wall time),
// for two tenants at random: one bound by its tokens budget, one by its
// requests budget, so the clients ask for several times either budget.
// Half of the admitted reservations are settled, giving back a random part
// of what they reserved, and one in eight refunds its request.
const (
	fleetClients   = 32
	fleetAttempts  = 100
	fleetMaxTokens = 20
	fleetRunFor    = 2 * time.Second
)

// SeedEnv names the environment variable that, set to an integer, replays
// the fleet case with that seed.
const SeedEnv = "LIMITERTEST_SEED"

// fleetTenant is one tenant of the fleet case and what it was admitted.
type fleetTenant struct {
	key    tokens.Key
	limits policy.Limits
	binds  string // the budget expected to refuse
	// net tokens and requests taken: reserved, less what settlements gave back.
	tokens, requests  atomic.Int64
	admitted, refused atomic.Int64
}

func fleetTenants() []*fleetTenant {
	return []*fleetTenant{
		{key: tokens.Key{Pool: "ns/fleet", Tenant: "by-tokens"}, binds: tokens.BudgetTokens,
			limits: policy.Limits{RequestsPerMinute: 60_000, TokensPerMinute: 3000}},
		{key: tokens.Key{Pool: "ns/fleet", Tenant: "by-requests"}, binds: tokens.BudgetRequests,
			limits: policy.Limits{RequestsPerMinute: 300, TokensPerMinute: 1_000_000}},
	}
}

func fleetSeed(t *testing.T) uint64 {
	if v := os.Getenv(SeedEnv); v != "" {
		seed, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", SeedEnv, v, err)
		}
		return seed
	}
	return uint64(time.Now().UnixNano())
}

// caseFleet checks, for k Limiters sharing st, that what every tenant was
// admitted over the run, net of settlements, never exceeds its budget plus
// the refill over the run's store time, and logs by how much it stayed
// under (a positive excess fails).
func caseFleet(t *testing.T, st Store, k int) {
	seed := fleetSeed(t)
	t.Logf("seed %d (%s=%d replays it)", seed, SeedEnv, seed)
	ts := fleetTenants()
	stop := make(chan struct{})
	var ticker sync.WaitGroup
	ticker.Add(1)
	go func() {
		// A fake clock moves as a real one would; a real store just sleeps.
		defer ticker.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			st.Sleep(time.Millisecond)
			time.Sleep(time.Millisecond)
		}
	}()
	start := st.Now()
	begin := time.Now()
	var wg sync.WaitGroup
	for c := range fleetClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fleetClient(t, st.Limiters[c%k], ts, rand.New(rand.NewPCG(seed, uint64(c))), begin)
		}()
	}
	wg.Wait()
	close(stop)
	ticker.Wait()
	elapsed := st.Now().Sub(start)
	for _, ft := range ts {
		checkFleetTenant(t, ft, k, elapsed)
	}
}

// fleetClient makes one client's reservations and settlements.
func fleetClient(t *testing.T, lim tokens.Limiter, ts []*fleetTenant, rng *rand.Rand, begin time.Time) {
	ctx := context.Background()
	for i := 0; i < fleetAttempts && time.Since(begin) < fleetRunFor; i++ {
		ft := ts[rng.IntN(len(ts))]
		n := 1 + rng.Int64N(fleetMaxTokens)
		d, err := lim.Reserve(ctx, ft.key, ft.limits, n)
		if err != nil {
			t.Errorf("Reserve(%s, %d): %v", ft.key.Tenant, n, err)
			return
		}
		if !d.OK {
			ft.refused.Add(1)
			if d.Budget != ft.binds || d.Never || d.RetryAfter < time.Millisecond {
				t.Errorf("%s: refusal %+v, want the %s budget with a wait of 1ms or more", ft.key.Tenant, d, ft.binds)
			}
			continue
		}
		ft.admitted.Add(1)
		ft.tokens.Add(n)
		ft.requests.Add(1)
		if rng.IntN(2) == 0 {
			continue
		}
		s := tokens.Settlement{Reserved: n, Used: rng.Int64N(n + 1), RefundRequest: rng.IntN(8) == 0}
		if _, err := lim.Settle(ctx, ft.key, ft.limits, s); err != nil {
			t.Errorf("Settle(%s, %+v): %v", ft.key.Tenant, s, err)
			return
		}
		ft.tokens.Add(s.Used - s.Reserved)
		if s.RefundRequest {
			ft.requests.Add(-1)
		}
	}
}

// checkFleetTenant compares what ft was admitted with its budgets over
// elapsed store time.
func checkFleetTenant(t *testing.T, ft *fleetTenant, k int, elapsed time.Duration) {
	t.Helper()
	for _, b := range []struct {
		name  string
		limit int64
		net   int64
	}{
		{tokens.BudgetTokens, ft.limits.TokensPerMinute, ft.tokens.Load()},
		{tokens.BudgetRequests, ft.limits.RequestsPerMinute, ft.requests.Load()},
	} {
		bound := float64(b.limit) + rate(b.limit)*elapsed.Seconds()
		excess := float64(b.net) - bound
		if excess > 1e-6*bound {
			t.Errorf("tenant %s took %d %s, more than its budget plus refill %.1f", ft.key.Tenant, b.net, b.name, bound)
		}
		if b.name != ft.binds {
			continue
		}
		t.Logf("%d limiters, %d clients, tenant %s, %s budget %d/min: %d taken net in %d reservations (%d refused) over %s of store time; budget plus refill %.1f; excess %+.1f",
			k, fleetClients, ft.key.Tenant, b.name, b.limit, b.net, ft.admitted.Load(), ft.refused.Load(),
			elapsed.Round(time.Millisecond), bound, excess)
		if float64(b.net) < float64(b.limit)/2 {
			t.Errorf("tenant %s took only %d %s of %d: the limiter refused what fitted", ft.key.Tenant, b.net, b.name, b.limit)
		}
	}
	if ft.refused.Load() == 0 {
		t.Errorf("tenant %s was never refused: the case did not reach its %s budget", ft.key.Tenant, ft.binds)
	}
}
