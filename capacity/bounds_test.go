package capacity

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/api/v1alpha1"
	seed "github.com/tiergate/tiergate/capacity/capacitytest"
)

// tierRow is the part of TierBounds the tables compare.
type tierRow struct {
	Name                      string
	Bound, Limit, QueueLimit  int32
	MaxWait                   time.Duration
	ExceedsTimeout, Unbounded bool
}

func tierRows(tb []TierBounds) []tierRow {
	var out []tierRow
	for _, t := range tb {
		out = append(out, tierRow{t.Name, t.QueueBound, t.TenantConcurrencyLimit, t.TenantQueueLimit, t.MaxWait, t.MaxWaitExceedsClientTimeout, t.Unbounded})
	}
	return out
}

func TestComputeBoundsPoolAndTiers(t *testing.T) {
	type poolRow struct {
		Concurrency     int32
		ServiceRate     float64
		RateString      string
		ServiceTime     time.Duration
		Ageing, Horizon time.Duration
		Exceeds, NoRepl bool
		TotalBound      int64
	}
	tests := map[string]struct {
		pool      *v1alpha1.ModelPool
		replicas  int32
		tiers     []v1alpha1.ServiceTier
		observed  time.Duration
		wantPool  poolRow
		wantTiers []tierRow
	}{
		"seed example, no client timeout": {
			pool: seed.Pool(), replicas: 6, tiers: seed.Tiers(),
			wantPool: poolRow{24, 4, "4", 6 * time.Second, 6 * time.Second, 120 * time.Second, false, false, 340},
			// maxWait = ageing×(base−0) + 340×6s/24 + 6s = ageing + 85s + 6s.
			wantTiers: []tierRow{
				{"premium", 20, 6, 5, 91 * time.Second, false, false},
				{"standard", 80, 2, 8, 151 * time.Second, false, false},
				{"free", 240, 1, 9, 211 * time.Second, false, false},
			},
		},
		"seed example, client timeout 30s caps free at 120 and flags the horizon": {
			pool: seed.Pool(seed.WithClientTimeout(30 * time.Second)), replicas: 6, tiers: seed.Tiers(),
			wantPool: poolRow{24, 4, "4", 6 * time.Second, 6 * time.Second, 120 * time.Second, true, false, 220},
			// ΣL = 220, drained at 4/s in 55s.
			wantTiers: []tierRow{
				{"premium", 20, 6, 5, 61 * time.Second, true, false},
				{"standard", 80, 2, 8, 121 * time.Second, true, false},
				{"free", 120, 1, 4, 181 * time.Second, true, false},
			},
		},
		"explicit rate 6s equals the starvation bound": {
			pool: seed.Pool(func(p *v1alpha1.ModelPool) {
				p.Spec.Ageing = v1alpha1.Ageing{Rate: seed.Duration(6 * time.Second)}
				p.Spec.ClientTimeout = seed.Duration(180 * time.Second)
			}), replicas: 6, tiers: seed.Tiers(),
			wantPool: poolRow{24, 4, "4", 6 * time.Second, 6 * time.Second, 120 * time.Second, false, false, 340},
			wantTiers: []tierRow{
				{"premium", 20, 6, 5, 91 * time.Second, false, false},
				{"standard", 80, 2, 8, 151 * time.Second, false, false},
				{"free", 240, 1, 9, 211 * time.Second, true, false},
			},
		},
		// Without a cold start nothing is served or held at zero: every
		// request is refused, so the bounds say 0 (the tenant limits keep
		// their floor of 1, which a policy requires).
		"zero ready replicas: P=0, μ=0, every bound 0, no wait promised": {
			pool: seed.Pool(seed.WithClientTimeout(30 * time.Second)), replicas: 0, tiers: seed.Tiers(),
			wantPool: poolRow{0, 0, "0", 6 * time.Second, 6 * time.Second, 120 * time.Second, true, true, 0},
			wantTiers: []tierRow{
				{"premium", 0, 1, 1, 0, false, true},
				{"standard", 0, 1, 1, 0, false, true},
				{"free", 0, 1, 1, 0, false, true},
			},
		},
		"a share that rounds to zero gives 1, never 0": {
			pool: seed.Pool(), replicas: 6,
			tiers: []v1alpha1.ServiceTier{seed.Tier("tiny", 0, 5*time.Second, "0.01")},
			// 24×0.01 = 0.24 and 20×0.01 = 0.2 both floor to 0 and become 1.
			wantPool:  poolRow{24, 4, "4", 6 * time.Second, 120 * time.Second, 0, false, false, 20},
			wantTiers: []tierRow{{"tiny", 1 * 20, 1, 1, 20*6*time.Second/24 + 6*time.Second, false, false}},
		},
		"exact arithmetic: floor(3/0.7s × 0.7s) is 3 (float64 says 2)": {
			pool: seed.Pool(func(p *v1alpha1.ModelPool) {
				p.Spec.ConcurrencyPerReplica = 1
				p.Spec.ServiceTime.Mean.Duration = 700 * time.Millisecond
				p.Spec.Ageing = v1alpha1.Ageing{Rate: seed.Duration(time.Second)}
			}), replicas: 3,
			tiers:     []v1alpha1.ServiceTier{seed.Tier("only", 0, 700*time.Millisecond, "1")},
			wantPool:  poolRow{3, 3.0 / 0.7, "4.286", 700 * time.Millisecond, time.Second, 0, false, false, 3},
			wantTiers: []tierRow{{"only", 3, 3, 3, 700*time.Millisecond + 700*time.Millisecond, false, false}},
		},
		"exact share: floor(100 × 0.29) is 29 (float64 says 28)": {
			pool: seed.Pool(func(p *v1alpha1.ModelPool) {
				p.Spec.ConcurrencyPerReplica = 100
				p.Spec.ServiceTime.Mean.Duration = time.Second
			}), replicas: 1,
			tiers:     []v1alpha1.ServiceTier{seed.Tier("only", 0, time.Second, "0.29")},
			wantPool:  poolRow{100, 100, "100", time.Second, 120 * time.Second, 0, false, false, 100},
			wantTiers: []tierRow{{"only", 100, 29, 29, 2 * time.Second, false, false}},
		},
		"starvation bound with all bases equal uses the bound itself as the rate": {
			pool: seed.Pool(), replicas: 6,
			tiers: []v1alpha1.ServiceTier{seed.Tier("a", 5, 5*time.Second, "0.5"), seed.Tier("b", 5, 5*time.Second, "0.5")},
			// ΣL = 40 drained at 4/s = 10s, + S.
			wantPool: poolRow{24, 4, "4", 6 * time.Second, 120 * time.Second, 0, false, false, 40},
			wantTiers: []tierRow{
				{"a", 20, 12, 10, 16 * time.Second, false, false},
				{"b", 20, 12, 10, 16 * time.Second, false, false},
			},
		},
		"no ageing set defaults to 6s": {
			pool:     seed.Pool(func(p *v1alpha1.ModelPool) { p.Spec.Ageing = v1alpha1.Ageing{} }),
			replicas: 6, tiers: seed.Tiers()[1:2],
			wantPool:  poolRow{24, 4, "4", 6 * time.Second, 6 * time.Second, 0, false, false, 20},
			wantTiers: []tierRow{{"premium", 20, 6, 5, 11 * time.Second, false, false}},
		},
		"measured service time replaces the declared mean": {
			pool: seed.Pool(func(p *v1alpha1.ModelPool) { p.Spec.ServiceTime.Source = v1alpha1.ServiceTimeMeasured }),
			// S = 3s doubles μ to 8/s and the bounds with it.
			replicas: 6, tiers: seed.Tiers()[1:2], observed: 3 * time.Second,
			wantPool:  poolRow{24, 8, "8", 3 * time.Second, 120 * time.Second, 0, false, false, 40},
			wantTiers: []tierRow{{"premium", 40, 6, 10, 8 * time.Second, false, false}},
		},
		"declared source ignores an observed service time": {
			pool:     seed.Pool(),
			replicas: 6, tiers: seed.Tiers()[1:2], observed: 3 * time.Second,
			wantPool:  poolRow{24, 4, "4", 6 * time.Second, 120 * time.Second, 0, false, false, 20},
			wantTiers: []tierRow{{"premium", 20, 6, 5, 11 * time.Second, false, false}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := ComputeBounds(BoundsInput{Pool: tc.pool, ReadyReplicas: tc.replicas, Tiers: tc.tiers, ObservedServiceTime: tc.observed, Dispatchers: 1})
			if err != nil {
				t.Fatalf("ComputeBounds: %v", err)
			}
			gp := poolRow{got.Pool.Concurrency, got.Pool.ServiceRate, got.Pool.ServiceRateString, got.Pool.ServiceTime,
				got.Pool.AgeingRate, got.Pool.AgeingHorizon, got.Pool.HorizonExceedsClientTimeout, got.Pool.NoReadyReplicas, got.Pool.TotalQueueBound}
			if diff := cmp.Diff(tc.wantPool, gp, cmpopts.EquateApprox(0, 1e-12)); diff != "" {
				t.Errorf("pool (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantTiers, tierRows(got.Tiers)); diff != "" {
				t.Errorf("tiers (-want +got):\n%s", diff)
			}
			// With one dispatcher the policy carries the pool-wide numbers.
			pol := got.PolicyFor(0)
			if pol.Slots != int(got.Pool.Concurrency) {
				t.Errorf("policy slots = %d, want %d", pol.Slots, got.Pool.Concurrency)
			}
			for i, pt := range pol.Tiers {
				want := got.Tiers[i]
				if pt.Name != want.Name || pt.QueueBound != int(want.QueueBound) || pt.TenantConcurrencyLimit != int(want.TenantConcurrencyLimit) || pt.TenantQueueLimit != int(want.TenantQueueLimit) {
					t.Errorf("policy tier %d = %+v, want the pool-wide bounds %+v", i, pt, want)
				}
			}
		})
	}
}

func TestComputeBoundsSeedPolicy(t *testing.T) {
	hashes := map[string][]string{"acme": {"bb", "aa"}}
	in := BoundsInput{
		Pool:          seed.Pool(seed.WithClientTimeout(30 * time.Second)),
		ReadyReplicas: 6,
		Tiers:         seed.Tiers(),
		Quotas: []v1alpha1.TenantQuota{
			seed.Quota("zeta", "zeta-corp", "free", nil),
			seed.Quota("acme", "acme", "premium", ptr.To[int32](10)),
			seed.Quota("globex", "globex", "standard", nil),
		},
		Dispatchers:  1,
		Backends:     []policy.Backend{{Address: "10.0.0.7:8000", Scheme: "http"}},
		APIKeyHashes: hashes,
	}
	got, err := ComputeBounds(in)
	if err != nil {
		t.Fatal(err)
	}
	want := policy.Policy{
		Pool: "default/llm", Slots: 24, ServiceRate: 4, AgeingRate: 6, ClientTimeoutSeconds: 30,
		SharedState:    policy.StateLocal,
		Authentication: policy.Authentication{Mode: policy.AuthTrustedHeader, HeaderName: "X-Tenant-ID"},
		DefaultTier:    "free", ExemptPaths: []string{"/health"},
		Tiers: []policy.Tier{
			{Name: "premium", BasePriority: 0, TolerableWaitSeconds: 5, QueueBound: 20, TenantConcurrencyLimit: 6, TenantQueueLimit: 5},
			{Name: "standard", BasePriority: 10, TolerableWaitSeconds: 20, QueueBound: 80, TenantConcurrencyLimit: 2, TenantQueueLimit: 8},
			{Name: "free", BasePriority: 20, TolerableWaitSeconds: 60, QueueBound: 120, TenantConcurrencyLimit: 1, TenantQueueLimit: 4},
		},
		Tenants: []policy.Tenant{
			{ID: "acme", Tier: "premium", MaxConcurrency: 10, APIKeySHA256: []string{"aa", "bb"}},
			{ID: "globex", Tier: "standard"},
			{ID: "zeta-corp", Tier: "free"},
		},
		Backends: []policy.Backend{{Address: "10.0.0.7:8000", Scheme: "http"}},
	}
	if diff := cmp.Diff(want, got.PolicyFor(0)); diff != "" {
		t.Errorf("policy (-want +got):\n%s", diff)
	}
	wantTenants := []TenantBounds{
		{QuotaName: "acme", Tenant: "acme", Tier: "premium", EffectiveLimit: 10, APIKeys: 2, Weight: 1},
		{QuotaName: "globex", Tenant: "globex", Tier: "standard", EffectiveLimit: 2, Weight: 1},
		{QuotaName: "zeta", Tenant: "zeta-corp", Tier: "free", EffectiveLimit: 1, Weight: 1},
	}
	if diff := cmp.Diff(wantTenants, got.Tenants); diff != "" {
		t.Errorf("tenants (-want +got):\n%s", diff)
	}
	if hashes["acme"][0] != "bb" {
		t.Errorf("ComputeBounds reordered its input's hashes: %v", hashes["acme"])
	}
	for _, tb := range got.Tiers {
		if !strings.Contains(tb.Guarantee, tb.MaxWait.String()) || !strings.Contains(tb.Guarantee, "client timeout of 30s") {
			t.Errorf("tier %s guarantee %q does not state maxWait %s and the 30s timeout", tb.Name, tb.Guarantee, tb.MaxWait)
		}
	}
	wantPremium := "Under sustained overload a premium request whose tenant is under its own limits waits at most 1m1s: " +
		"0s of ageing behind premium work, 55s to drain at most 220 queued requests at 4 req/s, and one service time of 6s. " +
		"Older lower-tier requests that have aged past it may be served first; that cost is inside this bound. " +
		"A tenant at its own limit also waits for its own earlier requests. " +
		"This exceeds the client timeout of 30s, so under sustained overload such a request may expire instead of being served."
	if diff := cmp.Diff(wantPremium, got.Tiers[0].Guarantee); diff != "" {
		t.Errorf("premium guarantee (-want +got):\n%s", diff)
	}
}

func TestComputeBoundsZeroReplicasPolicy(t *testing.T) {
	got, err := ComputeBounds(BoundsInput{Pool: seed.Pool(), ReadyReplicas: 0, Tiers: seed.Tiers(), Dispatchers: 2})
	if err != nil {
		t.Fatal(err)
	}
	for i, pol := range got.Policies {
		if pol.Slots != 0 || pol.ServiceRate != 0 || len(pol.Backends) != 0 || pol.Backends == nil {
			t.Errorf("dispatcher %d: slots %d rate %v backends %#v, want 0, 0 and an empty (non-nil) list", i, pol.Slots, pol.ServiceRate, pol.Backends)
		}
		for _, pt := range pol.Tiers {
			if pt.QueueBound != 0 || pt.TenantConcurrencyLimit != 1 || pt.TenantQueueLimit != 1 {
				t.Errorf("dispatcher %d tier %s: %+v, want bound 0 and tenant limits 1", i, pt.Name, pt)
			}
		}
		if err := pol.Validate(); err != nil {
			t.Errorf("dispatcher %d: the policy at zero is invalid: %v", i, err)
		}
		if pol.HoldsForColdStart() {
			t.Errorf("dispatcher %d: a policy without a cold start holds requests", i)
		}
	}
	if !strings.Contains(got.Tiers[2].Guarantee, "no ready replicas") {
		t.Errorf("guarantee %q does not say the pool has no ready replicas", got.Tiers[2].Guarantee)
	}
}

// slice is one dispatcher's numbers, per tier: bound/limit/queue limit.
type slice struct {
	Slots int
	Rate  float64
	Tiers [3][3]int
	// AcmeMax is the acme override's share (maxConcurrency 10 pool-wide).
	AcmeMax int
}

func TestComputeBoundsSplit(t *testing.T) {
	tests := map[string]struct {
		dispatchers int
		redis       bool
		want        []slice
	}{
		"1 dispatcher holds the whole pool": {1, false, []slice{
			{24, 4, [3][3]int{{20, 6, 5}, {80, 2, 8}, {120, 1, 4}}, 10},
		}},
		"2 dispatchers halve everything": {2, false, []slice{
			{12, 2, [3][3]int{{10, 3, 2}, {40, 1, 4}, {60, 1, 2}}, 5},
			{12, 2, [3][3]int{{10, 3, 2}, {40, 1, 4}, {60, 1, 2}}, 5},
		}},
		"5 dispatchers: 5,5,5,5,4": {5, false, []slice{
			{5, 5.0 / 6, [3][3]int{{4, 1, 1}, {16, 1, 1}, {25, 1, 1}}, 2},
			{5, 5.0 / 6, [3][3]int{{4, 1, 1}, {16, 1, 1}, {25, 1, 1}}, 2},
			{5, 5.0 / 6, [3][3]int{{4, 1, 1}, {16, 1, 1}, {25, 1, 1}}, 2},
			{5, 5.0 / 6, [3][3]int{{4, 1, 1}, {16, 1, 1}, {25, 1, 1}}, 2},
			{4, 4.0 / 6, [3][3]int{{3, 1, 1}, {13, 1, 1}, {20, 1, 1}}, 1},
		}},
		"7 dispatchers: 4,4,4,3,3,3,3": {7, false, []slice{
			{4, 4.0 / 6, [3][3]int{{3, 1, 1}, {13, 1, 1}, {20, 1, 1}}, 1},
			{4, 4.0 / 6, [3][3]int{{3, 1, 1}, {13, 1, 1}, {20, 1, 1}}, 1},
			{4, 4.0 / 6, [3][3]int{{3, 1, 1}, {13, 1, 1}, {20, 1, 1}}, 1},
			{3, 3.0 / 6, [3][3]int{{2, 1, 1}, {10, 1, 1}, {15, 1, 1}}, 1},
			{3, 3.0 / 6, [3][3]int{{2, 1, 1}, {10, 1, 1}, {15, 1, 1}}, 1},
			{3, 3.0 / 6, [3][3]int{{2, 1, 1}, {10, 1, 1}, {15, 1, 1}}, 1},
			{3, 3.0 / 6, [3][3]int{{2, 1, 1}, {10, 1, 1}, {15, 1, 1}}, 1},
		}},
		"30 dispatchers: six get no slot but every bound stays at least 1": {30, false, func() []slice {
			var out []slice
			for i := 0; i < 30; i++ {
				if i < 24 {
					out = append(out, slice{1, 1.0 / 6, [3][3]int{{1, 1, 1}, {3, 1, 1}, {5, 1, 1}}, 1})
				} else {
					out = append(out, slice{0, 0, [3][3]int{{1, 1, 1}, {1, 1, 1}, {1, 1, 1}}, 1})
				}
			}
			return out
		}()},
		"Redis: every dispatcher gets the pool-wide numbers": {3, true, []slice{
			{24, 4, [3][3]int{{20, 6, 5}, {80, 2, 8}, {120, 1, 4}}, 10},
			{24, 4, [3][3]int{{20, 6, 5}, {80, 2, 8}, {120, 1, 4}}, 10},
			{24, 4, [3][3]int{{20, 6, 5}, {80, 2, 8}, {120, 1, 4}}, 10},
		}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			pool := seed.Pool(seed.WithClientTimeout(30 * time.Second))
			wantState := policy.StateLocal
			if tc.redis {
				pool.Spec.SharedState = v1alpha1.SharedStateRedis
				wantState = policy.StateRedis
			}
			got, err := ComputeBounds(BoundsInput{
				Pool: pool, ReadyReplicas: 6, Tiers: seed.Tiers(), Dispatchers: tc.dispatchers,
				Quotas: []v1alpha1.TenantQuota{seed.Quota("acme", "acme", "premium", ptr.To[int32](10))},
			})
			if err != nil {
				t.Fatal(err)
			}
			var gotSlices []slice
			sum := 0
			for _, pol := range got.Policies {
				s := slice{Slots: pol.Slots, Rate: pol.ServiceRate, AcmeMax: pol.Tenants[0].MaxConcurrency}
				for j, pt := range pol.Tiers {
					s.Tiers[j] = [3]int{pt.QueueBound, pt.TenantConcurrencyLimit, pt.TenantQueueLimit}
				}
				gotSlices = append(gotSlices, s)
				sum += pol.Slots
				if pol.SharedState != wantState {
					t.Errorf("sharedState = %q, want %q", pol.SharedState, wantState)
				}
			}
			if diff := cmp.Diff(tc.want, gotSlices, cmpopts.EquateApprox(0, 1e-12)); diff != "" {
				t.Errorf("slices (-want +got):\n%s", diff)
			}
			wantSum := 24
			if tc.redis {
				wantSum = 24 * tc.dispatchers
			}
			if sum != wantSum {
				t.Errorf("slots sum to %d, want %d", sum, wantSum)
			}
			// Status values stay pool-wide whatever the split.
			if got.Tiers[0].QueueBound != 20 || got.Tiers[2].QueueBound != 120 {
				t.Errorf("status bounds %d/%d, want the pool-wide 20/120", got.Tiers[0].QueueBound, got.Tiers[2].QueueBound)
			}
		})
	}
}

func TestComputeBoundsSplitSumsExactly(t *testing.T) {
	// Every pool size over every dispatcher count: slices sum to P, differ by
	// at most one, and no bound or limit is ever below 1, but for the
	// queue bounds of a pool at zero (no cold start), which are 0.
	for r := int32(0); r <= 9; r++ {
		for n := 1; n <= 12; n++ {
			got, err := ComputeBounds(BoundsInput{Pool: seed.Pool(seed.WithClientTimeout(30 * time.Second)), ReadyReplicas: r, Tiers: seed.Tiers(), Dispatchers: n})
			if err != nil {
				t.Fatal(err)
			}
			sum, lo, hi := 0, 1<<30, -1
			for _, pol := range got.Policies {
				sum += pol.Slots
				lo, hi = min(lo, pol.Slots), max(hi, pol.Slots)
				for _, pt := range pol.Tiers {
					badBound := pt.QueueBound < 1
					if r == 0 {
						badBound = pt.QueueBound != 0
					}
					if badBound || pt.TenantConcurrencyLimit < 1 || pt.TenantQueueLimit < 1 {
						t.Errorf("R=%d N=%d tier %s: %+v has a value below 1", r, n, pt.Name, pt)
					}
				}
			}
			if sum != int(r)*4 || hi-lo > 1 {
				t.Errorf("R=%d N=%d: slices sum %d (want %d), spread %d..%d", r, n, sum, r*4, lo, hi)
			}
		}
	}
}

func TestComputeBoundsTenants(t *testing.T) {
	older := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	newer := metav1.NewTime(older.Add(time.Hour))
	dupOld := seed.Quota("b-first", "acme", "premium", nil)
	dupOld.CreationTimestamp = older
	dupNew := seed.Quota("a-second", "acme", "standard", nil)
	dupNew.CreationTimestamp = newer
	tests := map[string]struct {
		quotas      []v1alpha1.TenantQuota
		wantTenants []TenantBounds
		wantPolicy  []policy.Tenant
	}{
		"a quota whose tier is missing is reported and left out": {
			quotas: []v1alpha1.TenantQuota{seed.Quota("q1", "initech", "gold", nil), seed.Quota("q2", "acme", "free", nil)},
			wantTenants: []TenantBounds{
				{QuotaName: "q1", Tenant: "initech", Tier: "gold", TierNotFound: true},
				{QuotaName: "q2", Tenant: "acme", Tier: "free", EffectiveLimit: 1, Weight: 1},
			},
			wantPolicy: []policy.Tenant{{ID: "acme", Tier: "free"}},
		},
		"an override replaces the share-derived limit, even below it": {
			quotas: []v1alpha1.TenantQuota{seed.Quota("q", "acme", "premium", ptr.To[int32](2))},
			wantTenants: []TenantBounds{
				{QuotaName: "q", Tenant: "acme", Tier: "premium", EffectiveLimit: 2, Weight: 1},
			},
			wantPolicy: []policy.Tenant{{ID: "acme", Tier: "premium", MaxConcurrency: 2}},
		},
		"the older of two quotas for one tenant wins, whatever the names": {
			quotas: []v1alpha1.TenantQuota{dupNew, dupOld},
			wantTenants: []TenantBounds{
				{QuotaName: "a-second", Tenant: "acme", Tier: "standard", Duplicate: true, DuplicateOf: "b-first"},
				{QuotaName: "b-first", Tenant: "acme", Tier: "premium", EffectiveLimit: 6, Weight: 1},
			},
			wantPolicy: []policy.Tenant{{ID: "acme", Tier: "premium"}},
		},
		"a duplicate whose tier is missing does not take the tenant": {
			quotas: []v1alpha1.TenantQuota{func() v1alpha1.TenantQuota {
				q := seed.Quota("a-old", "acme", "gold", nil)
				q.CreationTimestamp = older
				return q
			}(), func() v1alpha1.TenantQuota {
				q := seed.Quota("b-new", "acme", "free", nil)
				q.CreationTimestamp = newer
				return q
			}()},
			wantTenants: []TenantBounds{
				{QuotaName: "a-old", Tenant: "acme", Tier: "gold", TierNotFound: true},
				{QuotaName: "b-new", Tenant: "acme", Tier: "free", EffectiveLimit: 1, Weight: 1},
			},
			wantPolicy: []policy.Tenant{{ID: "acme", Tier: "free"}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := ComputeBounds(BoundsInput{Pool: seed.Pool(), ReadyReplicas: 6, Tiers: seed.Tiers(), Quotas: tc.quotas, Dispatchers: 1})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.wantTenants, got.Tenants); diff != "" {
				t.Errorf("tenants (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantPolicy, got.PolicyFor(0).Tenants); diff != "" {
				t.Errorf("policy tenants (-want +got):\n%s", diff)
			}
		})
	}
}

func TestComputeBoundsAuthentication(t *testing.T) {
	tests := map[string]struct {
		auth v1alpha1.Authentication
		want policy.Authentication
	}{
		"unset defaults to TrustedHeader X-Tenant-ID": {v1alpha1.Authentication{}, policy.Authentication{Mode: "TrustedHeader", HeaderName: "X-Tenant-ID"}},
		"custom header":                {v1alpha1.Authentication{Mode: "TrustedHeader", HeaderName: "X-Org"}, policy.Authentication{Mode: "TrustedHeader", HeaderName: "X-Org"}},
		"APIKey drops the header name": {v1alpha1.Authentication{Mode: "APIKey", HeaderName: "X-Tenant-ID"}, policy.Authentication{Mode: "APIKey"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := ComputeBounds(BoundsInput{Pool: seed.Pool(func(p *v1alpha1.ModelPool) { p.Spec.Authentication = tc.auth }), ReadyReplicas: 1, Tiers: seed.Tiers(), Dispatchers: 1})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got.PolicyFor(0).Authentication); diff != "" {
				t.Errorf("authentication (-want +got):\n%s", diff)
			}
		})
	}
}

func TestComputeBoundsNoDispatchers(t *testing.T) {
	got, err := ComputeBounds(BoundsInput{Pool: seed.Pool(), ReadyReplicas: 6, Tiers: seed.Tiers()})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Policies) != 0 || got.Tiers[0].QueueBound != 20 {
		t.Errorf("0 dispatchers: %d policies and premium bound %d, want none and 20", len(got.Policies), got.Tiers[0].QueueBound)
	}
}

func TestComputeBoundsInvalidInput(t *testing.T) {
	tests := map[string]struct {
		in      BoundsInput
		wantMsg string
	}{
		"no pool": {BoundsInput{}, "invalid bounds input: no pool"},
		"zero concurrency per replica": {
			BoundsInput{Pool: seed.Pool(func(p *v1alpha1.ModelPool) { p.Spec.ConcurrencyPerReplica = 0 }), ReadyReplicas: 1},
			"invalid bounds input: spec.concurrencyPerReplica: 0 must be at least 1",
		},
		"zero service time": {
			BoundsInput{Pool: seed.Pool(func(p *v1alpha1.ModelPool) { p.Spec.ServiceTime.Mean.Duration = 0 }), ReadyReplicas: 1},
			"invalid bounds input: spec.serviceTime.mean: 0s must be greater than 0",
		},
		"both ageing fields": {
			BoundsInput{Pool: seed.Pool(func(p *v1alpha1.ModelPool) { p.Spec.Ageing.Rate = seed.Duration(time.Second) }), ReadyReplicas: 1},
			"invalid bounds input: spec.ageing: set exactly one of rate and starvationBound",
		},
		"negative replicas and dispatchers": {
			BoundsInput{Pool: seed.Pool(), ReadyReplicas: -1, Dispatchers: -2},
			"invalid bounds input: readyReplicas: -1 must not be negative; dispatchers: -2 must not be negative",
		},
		"share above 1 and zero wait": {
			BoundsInput{Pool: seed.Pool(), ReadyReplicas: 1, Tiers: []v1alpha1.ServiceTier{seed.Tier("x", 0, 0, "1.5")}},
			`invalid bounds input: tier "x": spec.tolerableWait 0s must be greater than 0; tier "x": spec.tenantShare 1500m must be greater than 0 and at most 1`,
		},
		"tier listed twice": {
			BoundsInput{Pool: seed.Pool(), ReadyReplicas: 1, Tiers: []v1alpha1.ServiceTier{seed.Tier("x", 0, time.Second, "1"), seed.Tier("x", 1, time.Second, "1")}},
			`invalid bounds input: tier "x": listed twice`,
		},
		"zero override": {
			BoundsInput{Pool: seed.Pool(), ReadyReplicas: 1, Quotas: []v1alpha1.TenantQuota{seed.Quota("q", "t", "x", ptr.To[int32](0))}},
			`invalid bounds input: quota "q": spec.maxConcurrency 0 must be at least 1`,
		},
		"pool too large for int32": {
			BoundsInput{Pool: seed.Pool(func(p *v1alpha1.ModelPool) { p.Spec.ConcurrencyPerReplica = 1 << 30 }), ReadyReplicas: 4},
			"invalid bounds input: readyReplicas × concurrencyPerReplica = 4294967296 exceeds 2147483647",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := ComputeBounds(tc.in)
			if !errors.Is(err, ErrInvalidInput) {
				t.Fatalf("err = %v, want ErrInvalidInput", err)
			}
			if diff := cmp.Diff(tc.wantMsg, err.Error()); diff != "" {
				t.Errorf("message (-want +got):\n%s", diff)
			}
		})
	}
}

func TestComputeBoundsDefaultTierMissing(t *testing.T) {
	pool := seed.Pool(func(p *v1alpha1.ModelPool) { p.Spec.DefaultTier = "bronze" })
	got, err := ComputeBounds(BoundsInput{Pool: pool, ReadyReplicas: 6, Tiers: seed.Tiers(), Dispatchers: 1})
	if err != nil {
		t.Fatal(err)
	}
	if !got.Pool.DefaultTierNotFound || got.PolicyFor(0).DefaultTier != "" {
		t.Errorf("DefaultTierNotFound=%v, policy defaultTier=%q; want true and empty", got.Pool.DefaultTierNotFound, got.PolicyFor(0).DefaultTier)
	}
}

func TestComputeBoundsSharedKeys(t *testing.T) {
	// Two tenants list the same key: the first by tenant ID keeps it, the
	// other loses it, since a key that names two tenants is refused by
	// policy validation.
	got, err := ComputeBounds(BoundsInput{
		Pool: seed.Pool(), ReadyReplicas: 6, Tiers: seed.Tiers(), Dispatchers: 1,
		Quotas:       []v1alpha1.TenantQuota{seed.Quota("q-b", "bravo", "free", nil), seed.Quota("q-a", "alpha", "free", nil)},
		APIKeyHashes: map[string][]string{"q-a": {"k1", "k1"}, "q-b": {"k2", "k1"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []policy.Tenant{{ID: "alpha", Tier: "free", APIKeySHA256: []string{"k1"}}, {ID: "bravo", Tier: "free", APIKeySHA256: []string{"k2"}}}
	if diff := cmp.Diff(want, got.PolicyFor(0).Tenants); diff != "" {
		t.Errorf("policy tenants (-want +got):\n%s", diff)
	}
	if got.Tenants[0].QuotaName != "q-a" || got.Tenants[0].SharedKeys != 0 || got.Tenants[1].SharedKeys != 1 {
		t.Errorf("SharedKeys: %+v, want q-a 0 and q-b 1", got.Tenants)
	}
}
