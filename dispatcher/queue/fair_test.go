package queue

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

// oneTier is a Tokens-mode policy of one tier with caps that never bind.
func oneTier(slots int, tenants ...policy.Tenant) *policy.Policy {
	p := tokensPolicy()
	p.Slots = slots
	p.Tiers[0].QueueTokenBound, p.Tiers[0].TenantQueueTokenLimit = 0, 0
	p.Tiers[0].QueueBound, p.Tiers[0].TenantQueueLimit = 1000, 1000
	p.Tiers[0].TenantConcurrencyLimit = slots
	p.Tenants = tenants
	return p
}

func counterOf(q *Queue, id string) float64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	if ts := q.tenants[id]; ts != nil {
		return ts.vc
	}
	return math.NaN()
}

// TestTokensOrderLongAndShort: a tenant of 40× larger prompts gets one
// slot in 41 of the short one's, where Requests mode alternates by age.
func TestTokensOrderLongAndShort(t *testing.T) {
	for _, mode := range []string{policy.FairnessRequests, policy.FairnessTokens} {
		t.Run(mode, func(t *testing.T) {
			p := oneTier(1)
			p.Fairness.Mode = mode
			q, clk := newTestQueue(t, p)
			var order []string
			var running []*Handle
			q.setOnDispatch(func(h *Handle) { order, running = append(order, h.tenant), append(running, h) })
			mustAdmitCost(t, q, "warm", Cost{1, 0}) // holds the slot
			for range 45 {
				mustAdmitCost(t, q, "long", Cost{4000, 0})
				mustAdmitCost(t, q, "short", Cost{100, 0})
				clk.Step(1)
			}
			order = order[1:]
			for i := range 45 {
				running[i].Release()
			}
			got := map[string]int{}
			for _, id := range order[:42] {
				got[id]++
			}
			want := map[string]int{"long": 21, "short": 21}
			if mode == policy.FairnessTokens {
				// Both are lifted to warm's counter; long's first job wins
				// the tie on age and is charged 4000; short then runs 40
				// jobs to the same counter, and long wins that tie on age.
				want = map[string]int{"long": 2, "short": 40}
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("dispatches of the first 42 (-want +got):\n%s\norder %v", diff, order[:42])
			}
		})
	}
}

func mustAdmitCost(t testing.TB, q *Queue, tenant string, c Cost) *Handle {
	t.Helper()
	h, err := q.AdmitCost(tenant, "std", c)
	if err != nil {
		t.Fatalf("AdmitCost(%s, %+v): %v", tenant, c, err)
	}
	return h
}

// TestSettle: the correction of the counter, once, and the tokens per
// slot second, whichever of Settle and ReleaseServed comes first.
func TestSettle(t *testing.T) {
	p := oneTier(1, policy.Tenant{ID: "a", Tier: "std", Weight: 2})
	var deltas []string
	q, clk := newTestQueue(t, p, WithCounterSink(func(tier, tenant string, d float64) {
		deltas = append(deltas, fmt.Sprintf("%s/%s %+g", tier, tenant, d))
	}))
	h1 := mustAdmitCost(t, q, "a", Cost{100, 50}) // 200 weighted, ÷ 2
	queued := mustAdmitCost(t, q, "a", Cost{10, 0})
	queued.Settle(1, 1) // never ran: no-op, and Settle still counts later
	if got := counterOf(q, "a"); got != 100 {
		t.Fatalf("counter after the charge %v, want 100", got)
	}
	h1.Settle(60, 20) // 100 weighted: (100 − 200) ÷ 2
	h1.Settle(1e6, 1e6)
	if got := counterOf(q, "a"); got != 50 {
		t.Fatalf("counter after Settle %v, want 50", got)
	}
	clk.Step(2 * time.Second)
	h1.ReleaseServed() // settled before: 100 tokens in 2s
	if got := q.Stats().TokensPerSlotSecond; got != 50 {
		t.Errorf("TokensPerSlotSecond %v, want 50", got)
	}
	if err := queued.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	clk.Step(time.Second)
	queued.ReleaseServed()
	queued.Settle(10, 45) // 100 weighted in 1s, after the release
	// EWMAs: tokens 100, slot 1.9s
	if got, want := q.Stats().TokensPerSlotSecond, 100/1.9; math.Abs(got-want) > 1e-9 {
		t.Errorf("TokensPerSlotSecond %v, want %v", got, want)
	}
	if got := q.Stats().Measured().TokensPerSlotSecond; math.Abs(got-100/1.9) > 1e-9 {
		t.Errorf("Measured().TokensPerSlotSecond %v", got)
	}
	want := []string{"std/a +100", "std/a -50", "std/a +5", "std/a +45"}
	if diff := cmp.Diff(want, deltas); diff != "" {
		t.Errorf("sink (-want +got):\n%s", diff)
	}
	// The tenant left when released, at 55, the tier's last served
	// counter: a lift would give it that, so it was pruned, and the late
	// correction reached the sink only.
	q.mu.Lock()
	_, kept := q.tiers["std"].idle["a"]
	q.mu.Unlock()
	if kept {
		t.Errorf("the counter of a tenant at the floor was kept")
	}
}
