package simulate

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

const tokensDir = "../examples/simulate/tokens/"

func tokenScenario(t *testing.T, name string, seed *uint64) *Result {
	t.Helper()
	in := read(t, tokensDir+name+"-pool.yaml", tokensDir+name+".yaml")
	res, err := Run(in, Options{Compare: Variants, Seed: seed, checkInvariants: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: seed %d", name, res.Seed)
	return res
}

// near fails unless got is within tol (relative) of want.
func near(t *testing.T, what string, got, want, tol float64) {
	t.Helper()
	if math.Abs(got-want) > tol*math.Abs(want) {
		t.Errorf("%s = %.4f, want %.4f ± %.0f%%", what, got, want, 100*tol)
	}
}

// TestLongPromptsScenario checks docs/scheduling.md's scenario 5 against
// what the pool's numbers give by hand. 16 slots; a chat request holds a
// slot 5.05 s and costs 500, a rag one 7 s and 4400; both tenants are
// backlogged throughout.
//
//   - Requests: as many requests each, 16 ÷ 12.05 s a second; chat's
//     share of the weighted tokens 500/4900; jainTokens 4900² ÷ (2 ×
//     (500² + 4400²)).
//   - Tokens: the same weighted tokens X each, X × (5.05/500 + 7/4400) =
//     16 slots; rag's 40 queued requests then wait beyond the stated
//     maxWait (36 s).
//   - Token bounds: floor(16 × 3/(1/2000 + 1/40) × 30) = 56470, half each;
//     everyone within maxWait.
func TestLongPromptsScenario(t *testing.T) {
	res := tokenScenario(t, "long-prompts", nil)
	perTenant := 16 / (5.05 + 7)
	x := 16 / (5.05/500 + 7.0/4400)

	req := res.Of(SchedTiergate)
	near(t, "Requests: chat req/s", req.Tenants["chat"].Throughput, perTenant, 0.03)
	near(t, "Requests: rag req/s", req.Tenants["rag"].Throughput, perTenant, 0.03)
	near(t, "Requests: chat's token share", req.Tenants["chat"].TokenShare, 500.0/4900, 0.03)
	near(t, "Requests: jainTokens", req.Tiers["standard"].JainTokens, 4900.0*4900/(2*(500*500+4400*4400)), 0.02)

	for _, sched := range Variants {
		r := res.Of(sched)
		near(t, sched+": chat req/s", r.Tenants["chat"].Throughput, x/500, 0.03)
		near(t, sched+": rag req/s", r.Tenants["rag"].Throughput, x/4400, 0.05)
		if j := r.Tiers["standard"].JainTokens; j < 0.99 {
			t.Errorf("%s: jainTokens %.3f, want at least 0.99", sched, j)
		}
	}
	maxWait := req.Tiers["standard"].MaxWait
	if p99 := res.Of(SchedVTC).Tenants["rag"].Wait.P99; p99 <= 3*maxWait {
		t.Errorf("vtc: rag's p99 wait %.1f s, want beyond 3 × the stated maxWait %.0f s (40 queued at 0.31/s)", p99, maxWait)
	}
	tb := res.Of(SchedVTCTokenBound)
	if b, l := tb.Tiers["standard"].QueueTokenBound, tb.Tiers["standard"].TenantQueueTokenLimit; b != 56470 || l != 28235 {
		t.Errorf("vtc-tokenbound: token bound %d, tenant limit %d; want 56470, 28235", b, l)
	}
	for _, tn := range []string{"chat", "rag"} {
		if w := tb.Tenants[tn].Wait.Max; w > maxWait {
			t.Errorf("vtc-tokenbound: %s waited %.1f s, beyond the stated maxWait %.0f s", tn, w, maxWait)
		}
	}
}

// TestHeavyTailScenario checks docs/scheduling.md's scenario 6: under
// request bounds Tokens fairness breaks the premium tier's guarantee and
// Requests keeps every tier's; token bounds keep every request of every
// tier within its maxWait, serving more, smaller requests. (The token
// bounds themselves are checked after every event by checkInvariants; a
// request larger than a bound may queue alone, so MaxQueuedTokens may
// exceed it.)
func TestHeavyTailScenario(t *testing.T) {
	res := tokenScenario(t, "heavy-tail", nil)
	req, vtc, tb := res.Of(SchedTiergate), res.Of(SchedVTC), res.Of(SchedVTCTokenBound)
	for _, tier := range res.tierOrder() {
		if tr := req.Tiers[tier]; !tr.UnderLimits.WithinMaxWait {
			t.Errorf("Requests: tier %s's under-limit worst wait %.1f s beyond its maxWait %.0f s", tier, tr.UnderLimits.MaxWait, tr.MaxWait)
		}
		if tr := tb.Tiers[tier]; tr.Wait.Max > tr.MaxWait {
			t.Errorf("vtc-tokenbound: tier %s's worst wait %.1f s beyond its maxWait %.0f s", tier, tr.Wait.Max, tr.MaxWait)
		}
	}
	if tr := vtc.Tiers["premium"]; tr.UnderLimits.WithinMaxWait {
		t.Errorf("vtc: premium's worst wait %.1f s is within its maxWait %.0f s; the scenario documents it beyond", tr.UnderLimits.MaxWait, tr.MaxWait)
	}
	if tb.Goodput < 1.2*req.Goodput {
		t.Errorf("vtc-tokenbound goodput %.3f, want at least 1.2 × Requests' %.3f", tb.Goodput, req.Goodput)
	}
	if a, b := tb.Tiers["premium"].TokensServed.Total(), req.Tiers["premium"].TokensServed.Total(); a >= b {
		t.Errorf("vtc-tokenbound served premium %d tokens, Requests %d: want fewer (long prompts are refused more)", a, b)
	}
}

// TestTokensFairnessProperty: on the long-prompts scenario, shortened, for
// random seeds, Tokens fairness gives the two backlogged tenants nearly the
// same weighted tokens, well above Requests mode's jainTokens, and every
// run keeps the simulator's and the queue's invariants (queued tokens
// within the token bound, counts equal) after every event.
func TestTokensFairnessProperty(t *testing.T) {
	base := uint64(time.Now().UnixNano())
	t.Logf("base seed %d", base)
	r := rand.New(rand.NewPCG(base, 23))
	in := read(t, tokensDir+"long-prompts-pool.yaml", tokensDir+"long-prompts.yaml")
	in.Load.Spec.Duration.Duration, in.Load.Spec.Warmup.Duration = 8*time.Minute, 3*time.Minute
	for range 3 {
		seed := r.Uint64()
		res, err := Run(in, Options{Compare: Variants, Seed: &seed, checkInvariants: true})
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		jr := res.Tiers["standard"].JainTokens
		for _, sched := range Variants {
			if j := res.Of(sched).Tiers["standard"].JainTokens; j < 0.97 || j < jr+0.3 {
				t.Errorf("seed %d: %s jainTokens %.3f, want at least 0.97 and Requests' %.3f + 0.3", seed, sched, j, jr)
			}
		}
	}
}
