package capacity

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/api/v1alpha1"
	seed "github.com/tiergate/tiergate/capacity/capacitytest"
)

// The seed's pool at zero, with its first replica Ready after 12s: μ₁ =
// C/S = 4/6s = 2/3 req/s. With clientTimeout 30s, L = max(0, ⌊2/3 ×
// (min(W, 30s) − 12s)⌋): premium (5s) 0, standard (20s) ⌊16/3⌋ = 5, free
// (30s) ⌊12⌋ = 12, so ΣL = 17, drained by one replica in ⌈17 × 6s / 4⌉ =
// 25.5s. Tenant limits are those of P = C = 4.
func TestComputeBoundsAtZeroWithColdStart(t *testing.T) {
	type held struct {
		ColdStart      time.Duration
		FirstRate      float64
		FirstRateWords string
		Concurrency    int32
		ServiceRate    float64
		NoReady        bool
		TotalBound     int64
	}
	tests := map[string]struct {
		pool      *v1alpha1.ModelPool
		replicas  int32
		tiers     []v1alpha1.ServiceTier
		wantPool  held
		wantTiers []tierRow
	}{
		"seed at zero, cold start 12s: premium cannot wait it out": {
			pool: seed.Pool(seed.WithClientTimeout(30*time.Second), seed.WithColdStart(12*time.Second)), tiers: seed.Tiers(),
			wantPool: held{12 * time.Second, 2.0 / 3, "0.667", 0, 0, true, 17},
			// maxWait = 12s + ageing × base + 25.5s + 6s.
			wantTiers: []tierRow{
				{"premium", 0, 1, 1, 0, false, true},
				{"standard", 5, 1, 1, 103500 * time.Millisecond, true, false},
				{"free", 12, 1, 1, 163500 * time.Millisecond, true, false},
			},
		},
		"a wait equal to the cold start leaves no time": {
			pool:     seed.Pool(seed.WithColdStart(20 * time.Second)),
			tiers:    []v1alpha1.ServiceTier{seed.Tier("standard", 10, 20*time.Second, "0.10")},
			wantPool: held{20 * time.Second, 2.0 / 3, "0.667", 0, 0, true, 0},
			wantTiers: []tierRow{
				{"standard", 0, 1, 1, 0, false, true},
			},
		},
		"a client timeout shorter than the cold start refuses every tier": {
			pool: seed.Pool(seed.WithClientTimeout(10*time.Second), seed.WithColdStart(12*time.Second)), tiers: seed.Tiers(),
			wantPool: held{12 * time.Second, 2.0 / 3, "0.667", 0, 0, true, 0},
			wantTiers: []tierRow{
				{"premium", 0, 1, 1, 0, false, true},
				{"standard", 0, 1, 1, 0, false, true},
				{"free", 0, 1, 1, 0, false, true},
			},
		},
		"exact arithmetic: ⌊3/0.7s × (1.4s − 0.7s)⌋ is 3 (float64 says 2)": {
			pool: seed.Pool(func(p *v1alpha1.ModelPool) {
				p.Spec.ConcurrencyPerReplica = 3
				p.Spec.ServiceTime.Mean.Duration = 700 * time.Millisecond
				p.Spec.Ageing = v1alpha1.Ageing{Rate: seed.Duration(time.Second)}
			}, seed.WithColdStart(700*time.Millisecond)),
			tiers:    []v1alpha1.ServiceTier{seed.Tier("only", 0, 1400*time.Millisecond, "1")},
			wantPool: held{700 * time.Millisecond, 3.0 / 0.7, "4.286", 0, 0, true, 3},
			// 0.7s + 3 × 0.7s / 3 + 0.7s.
			wantTiers: []tierRow{{"only", 3, 3, 3, 2100 * time.Millisecond, false, false}},
		},
		"a ready replica ignores the cold start": {
			pool: seed.Pool(seed.WithClientTimeout(30*time.Second), seed.WithColdStart(12*time.Second)), replicas: 6, tiers: seed.Tiers(),
			wantPool: held{0, 0, "", 24, 4, false, 220},
			wantTiers: []tierRow{
				{"premium", 20, 6, 5, 61 * time.Second, true, false},
				{"standard", 80, 2, 8, 121 * time.Second, true, false},
				{"free", 120, 1, 4, 181 * time.Second, true, false},
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := ComputeBounds(BoundsInput{Pool: tc.pool, ReadyReplicas: tc.replicas, Tiers: tc.tiers, Dispatchers: 1,
				Backends: []policy.Backend{{Address: "10.0.0.7:8000"}}})
			if err != nil {
				t.Fatal(err)
			}
			gp := held{got.Pool.ColdStart, got.Pool.FirstReplicaRate, got.Pool.FirstReplicaRateString, got.Pool.Concurrency,
				got.Pool.ServiceRate, got.Pool.NoReadyReplicas, got.Pool.TotalQueueBound}
			if diff := cmp.Diff(tc.wantPool, gp, cmpopts.EquateApprox(0, 1e-12)); diff != "" {
				t.Errorf("pool (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantTiers, tierRows(got.Tiers)); diff != "" {
				t.Errorf("tiers (-want +got):\n%s", diff)
			}
			pol := got.PolicyFor(0)
			if err := pol.Validate(); err != nil {
				t.Errorf("the policy is invalid: %v", err)
			}
			for i, pt := range pol.Tiers {
				if pt.QueueBound != int(got.Tiers[i].QueueBound) {
					t.Errorf("policy tier %s bound %d, want the pool-wide %d", pt.Name, pt.QueueBound, got.Tiers[i].QueueBound)
				}
			}
		})
	}
}

// slice at zero: per tier the bound, limit and queue limit.
type heldSlice struct {
	Slots     int
	Rate      float64
	ColdStart float64
	Backends  int
	Tiers     [3][3]int
}

func TestComputeBoundsAtZeroSplit(t *testing.T) {
	// The pool-wide bounds of the test above; each dispatcher's share of
	// the first replica's 4 slots scales them, and 0 stays 0.
	tests := map[string]struct {
		dispatchers int
		redis       bool
		want        []heldSlice
	}{
		"1 dispatcher holds the pool-wide bounds": {1, false, []heldSlice{
			{0, 4.0 / 6, 12, 0, [3][3]int{{0, 1, 1}, {5, 1, 1}, {12, 1, 1}}},
		}},
		"2 dispatchers halve them": {2, false, []heldSlice{
			{0, 2.0 / 6, 12, 0, [3][3]int{{0, 1, 1}, {2, 1, 1}, {6, 1, 1}}},
			{0, 2.0 / 6, 12, 0, [3][3]int{{0, 1, 1}, {2, 1, 1}, {6, 1, 1}}},
		}},
		"5 dispatchers: the one with no slot of the first replica holds nothing": {5, false, []heldSlice{
			{0, 1.0 / 6, 12, 0, [3][3]int{{0, 1, 1}, {1, 1, 1}, {3, 1, 1}}},
			{0, 1.0 / 6, 12, 0, [3][3]int{{0, 1, 1}, {1, 1, 1}, {3, 1, 1}}},
			{0, 1.0 / 6, 12, 0, [3][3]int{{0, 1, 1}, {1, 1, 1}, {3, 1, 1}}},
			{0, 1.0 / 6, 12, 0, [3][3]int{{0, 1, 1}, {1, 1, 1}, {3, 1, 1}}},
			{0, 0, 12, 0, [3][3]int{{0, 1, 1}, {0, 1, 1}, {0, 1, 1}}},
		}},
		"Redis: every dispatcher holds the pool-wide bounds": {2, true, []heldSlice{
			{0, 4.0 / 6, 12, 0, [3][3]int{{0, 1, 1}, {5, 1, 1}, {12, 1, 1}}},
			{0, 4.0 / 6, 12, 0, [3][3]int{{0, 1, 1}, {5, 1, 1}, {12, 1, 1}}},
		}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			pool := seed.Pool(seed.WithClientTimeout(30*time.Second), seed.WithColdStart(12*time.Second))
			if tc.redis {
				pool.Spec.SharedState = v1alpha1.SharedStateRedis
			}
			got, err := ComputeBounds(BoundsInput{Pool: pool, Tiers: seed.Tiers(), Dispatchers: tc.dispatchers,
				Backends: []policy.Backend{{Address: "10.0.0.7:8000"}}})
			if err != nil {
				t.Fatal(err)
			}
			var slices []heldSlice
			for i, pol := range got.Policies {
				if err := pol.Validate(); err != nil {
					t.Errorf("dispatcher %d: the policy is invalid: %v", i, err)
				}
				if pol.Backends == nil {
					t.Errorf("dispatcher %d: backends is nil, want an empty list", i)
				}
				s := heldSlice{Slots: pol.Slots, Rate: pol.ServiceRate, ColdStart: pol.ColdStartSeconds, Backends: len(pol.Backends)}
				for j, pt := range pol.Tiers {
					s.Tiers[j] = [3]int{pt.QueueBound, pt.TenantConcurrencyLimit, pt.TenantQueueLimit}
				}
				slices = append(slices, s)
			}
			if diff := cmp.Diff(tc.want, slices, cmpopts.EquateApprox(0, 1e-12)); diff != "" {
				t.Errorf("policies (-want +got):\n%s", diff)
			}
		})
	}
}

func TestComputeBoundsAtZeroWithoutColdStartIsUnchanged(t *testing.T) {
	in := BoundsInput{Pool: seed.Pool(seed.WithClientTimeout(30 * time.Second)), Tiers: seed.Tiers(), Dispatchers: 1,
		Backends: []policy.Backend{{Address: "10.0.0.7:8000"}}}
	got, err := ComputeBounds(in)
	if err != nil {
		t.Fatal(err)
	}
	pol := got.PolicyFor(0)
	if pol.ColdStartSeconds != 0 || pol.HoldsForColdStart() || got.Pool.ColdStart != 0 || got.Pool.FirstReplicaRateString != "" {
		t.Errorf("coldStartSeconds %v, pool cold start %s, first rate %q: want none", pol.ColdStartSeconds, got.Pool.ColdStart, got.Pool.FirstReplicaRateString)
	}
	if len(pol.Backends) != 1 {
		t.Errorf("backends %v, want the one given (slots 0 refuses every request)", pol.Backends)
	}
}

func TestColdStartGuarantee(t *testing.T) {
	got, err := ComputeBounds(BoundsInput{Pool: seed.Pool(seed.WithClientTimeout(30*time.Second), seed.WithColdStart(12*time.Second)), Tiers: seed.Tiers()})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"No premium request is held while the pool is at zero replicas: after the cold start of 12s its tolerable wait of 5s " +
			"leaves the first replica no time to serve one (bound 0), so it is refused at once until a replica is Ready.",
		"While the pool is at zero replicas a standard request whose tenant is under its own limits is held and waits at most 1m43.5s: " +
			"12s of cold start until the first replica is Ready, then 1m0s of ageing behind premium work, 25.5s to drain at most 17 queued requests at 0.667 req/s, and one service time of 6s. " +
			"A tenant at its own limit also waits for its own earlier requests. " +
			"This exceeds the client timeout of 30s, so under sustained overload such a request may expire instead of being served.",
	}
	if diff := cmp.Diff(want, []string{got.Tiers[0].Guarantee, got.Tiers[1].Guarantee}); diff != "" {
		t.Errorf("guarantees (-want +got):\n%s", diff)
	}
	// A tier whose own wait is cut by the client timeout says so.
	got, err = ComputeBounds(BoundsInput{Pool: seed.Pool(seed.WithClientTimeout(10*time.Second), seed.WithColdStart(12*time.Second)), Tiers: seed.Tiers()})
	if err != nil {
		t.Fatal(err)
	}
	if w := "its tolerable wait of 10s (the client timeout; the tier's own is 1m0s) leaves"; !strings.Contains(got.Tiers[2].Guarantee, w) {
		t.Errorf("free guarantee %q does not contain %q", got.Tiers[2].Guarantee, w)
	}
}

func TestComputeBoundsColdStartInvalid(t *testing.T) {
	_, err := ComputeBounds(BoundsInput{Pool: seed.Pool(seed.WithColdStart(-time.Second)), Tiers: seed.Tiers()})
	if want := "invalid bounds input: spec.coldStart: -1s must be greater than 0"; err == nil || err.Error() != want {
		t.Errorf("err = %v, want %q", err, want)
	}
}
