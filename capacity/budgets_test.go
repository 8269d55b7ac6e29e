package capacity

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/api/v1alpha1"
	seed "github.com/tiergate/tiergate/capacity/capacitytest"
)

// budgetTiers are the seed's tiers with tenant budgets: premium both,
// standard a tokens budget smaller than most dispatcher counts, free none.
func budgetTiers() []v1alpha1.ServiceTier {
	tiers := seed.Tiers()
	for i := range tiers {
		switch tiers[i].Name {
		case "premium":
			tiers[i].Spec.TenantLimits = &v1alpha1.Limits{RequestsPerMinute: 600, TokensPerMinute: 100000}
		case "standard":
			tiers[i].Spec.TenantLimits = &v1alpha1.Limits{TokensPerMinute: 2}
		}
	}
	return tiers
}

func quotaWithLimits(name, tenant, tier string, l *v1alpha1.Limits) v1alpha1.TenantQuota {
	q := seed.Quota(name, tenant, tier, nil)
	q.Spec.Limits = l
	return q
}

// budgetQuotas: acme sets tokens and inherits premium's requests, globex
// inherits standard's tokens, initech sets requests in free (which has
// none), zeta has no budget at all.
func budgetQuotas() []v1alpha1.TenantQuota {
	return []v1alpha1.TenantQuota{
		quotaWithLimits("acme", "acme", "premium", &v1alpha1.Limits{TokensPerMinute: 60001}),
		quotaWithLimits("globex", "globex", "standard", nil),
		quotaWithLimits("initech", "initech", "free", &v1alpha1.Limits{RequestsPerMinute: 5}),
		quotaWithLimits("zeta", "zeta", "free", nil),
	}
}

// budgetRow is what one dispatcher's policy says of the budgets: the
// tiers' tenantLimits (premium, standard, free) and the tenants' own
// limits (acme, globex, initech, zeta), as "requests/tokens" or "-".
type budgetRow struct {
	Tiers   [3]string
	Tenants [4]string
}

func lim(l *policy.Limits) string {
	if l == nil {
		return "-"
	}
	return fmt.Sprintf("%d/%d", l.RequestsPerMinute, l.TokensPerMinute)
}

func budgetRows(t *testing.T, pols []policy.Policy) []budgetRow {
	t.Helper()
	var out []budgetRow
	for i, p := range pols {
		if err := p.Validate(); err != nil {
			t.Errorf("dispatcher %d: invalid policy: %v", i, err)
		}
		var r budgetRow
		for j, tr := range p.Tiers {
			r.Tiers[j] = lim(tr.TenantLimits)
		}
		for j, tn := range p.Tenants {
			r.Tenants[j] = lim(tn.Limits)
		}
		out = append(out, r)
	}
	return out
}

func rows(n int, r budgetRow) []budgetRow {
	out := make([]budgetRow, n)
	for i := range out {
		out[i] = r
	}
	return out
}

func TestComputeBoundsSplitsTheBudgets(t *testing.T) {
	whole := budgetRow{Tiers: [3]string{"600/100000", "0/2", "-"}, Tenants: [4]string{"0/60001", "-", "5/0", "-"}}
	// Not serving: the least part of every budget.
	idle := budgetRow{Tiers: [3]string{"1/1", "0/1", "-"}, Tenants: [4]string{"0/1", "-", "1/0", "-"}}
	tests := map[string]struct {
		redis       bool
		replicas    int32
		coldStart   time.Duration
		dispatchers int
		excluded    []bool
		want        []budgetRow
	}{
		"Redis: every dispatcher gets the pool-wide budgets": {redis: true, replicas: 6, dispatchers: 3, want: rows(3, whole)},
		"Redis ignores exclusions":                           {redis: true, replicas: 6, dispatchers: 2, excluded: []bool{true, false}, want: rows(2, whole)},
		"Local, one dispatcher: the whole budgets":           {replicas: 6, dispatchers: 1, want: rows(1, whole)},
		// 100000 = 33334+33333+33333, 60001 = 20001+20000+20000, 5 =
		// 2+2+1; 2 tokens over 3 dispatchers is 1 each, 3 in all.
		"Local, three dispatchers: the parts sum to each budget, the first get one more": {replicas: 6, dispatchers: 3, want: []budgetRow{
			{Tiers: [3]string{"200/33334", "0/1", "-"}, Tenants: [4]string{"0/20001", "-", "2/0", "-"}},
			{Tiers: [3]string{"200/33333", "0/1", "-"}, Tenants: [4]string{"0/20000", "-", "2/0", "-"}},
			{Tiers: [3]string{"200/33333", "0/1", "-"}, Tenants: [4]string{"0/20000", "-", "1/0", "-"}},
		}},
		"Local, an excluded dispatcher: the two that serve share the budgets, it gets 1": {replicas: 6, dispatchers: 3, excluded: []bool{false, true, false}, want: []budgetRow{
			{Tiers: [3]string{"300/50000", "0/1", "-"}, Tenants: [4]string{"0/30001", "-", "3/0", "-"}},
			idle,
			{Tiers: [3]string{"300/50000", "0/1", "-"}, Tenants: [4]string{"0/30000", "-", "2/0", "-"}},
		}},
		"Local, every dispatcher excluded: all hold slots, so all share": {replicas: 6, dispatchers: 2, excluded: []bool{true, true}, want: []budgetRow{
			{Tiers: [3]string{"300/50000", "0/1", "-"}, Tenants: [4]string{"0/30001", "-", "3/0", "-"}},
			{Tiers: [3]string{"300/50000", "0/1", "-"}, Tenants: [4]string{"0/30000", "-", "2/0", "-"}},
		}},
		// P = 4 slots over 5 dispatchers: the fifth has none.
		"Local, more dispatchers than slots: the slotless one gets 1": {replicas: 1, dispatchers: 5, want: []budgetRow{
			{Tiers: [3]string{"150/25000", "0/1", "-"}, Tenants: [4]string{"0/15001", "-", "2/0", "-"}},
			{Tiers: [3]string{"150/25000", "0/1", "-"}, Tenants: [4]string{"0/15000", "-", "1/0", "-"}},
			{Tiers: [3]string{"150/25000", "0/1", "-"}, Tenants: [4]string{"0/15000", "-", "1/0", "-"}},
			{Tiers: [3]string{"150/25000", "0/1", "-"}, Tenants: [4]string{"0/15000", "-", "1/0", "-"}},
			idle,
		}},
		"Local, at zero without a cold start: nobody serves, so all share": {replicas: 0, dispatchers: 2, want: []budgetRow{
			{Tiers: [3]string{"300/50000", "0/1", "-"}, Tenants: [4]string{"0/30001", "-", "3/0", "-"}},
			{Tiers: [3]string{"300/50000", "0/1", "-"}, Tenants: [4]string{"0/30000", "-", "2/0", "-"}},
		}},
		// The first replica's C = 4 slots go 2, 1, 1: all three will serve.
		"Local, held for a cold start: split over the first replica's holders": {replicas: 0, coldStart: 10 * time.Second, dispatchers: 3, want: []budgetRow{
			{Tiers: [3]string{"200/33334", "0/1", "-"}, Tenants: [4]string{"0/20001", "-", "2/0", "-"}},
			{Tiers: [3]string{"200/33333", "0/1", "-"}, Tenants: [4]string{"0/20000", "-", "2/0", "-"}},
			{Tiers: [3]string{"200/33333", "0/1", "-"}, Tenants: [4]string{"0/20000", "-", "1/0", "-"}},
		}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			pool := seed.Pool(seed.WithClientTimeout(30 * time.Second))
			if tc.redis {
				pool.Spec.SharedState = v1alpha1.SharedStateRedis
			}
			if tc.coldStart > 0 {
				pool.Spec.ColdStart = seed.Duration(tc.coldStart)
			}
			tiers, quotas := budgetTiers(), budgetQuotas()
			got, err := ComputeBounds(BoundsInput{Pool: pool, ReadyReplicas: tc.replicas, Tiers: tiers, Quotas: quotas,
				Dispatchers: tc.dispatchers, Excluded: tc.excluded, Backends: []policy.Backend{{Address: "10.0.0.7:8000"}}})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, budgetRows(t, got.Policies)); diff != "" {
				t.Errorf("budgets per dispatcher (-want +got):\n%s", diff)
			}
			// The status values stay pool-wide.
			if diff := cmp.Diff(&policy.Limits{RequestsPerMinute: 600, TokensPerMinute: 100000}, got.Tiers[0].TenantLimits); diff != "" {
				t.Errorf("premium's TenantLimits (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(budgetTiers(), tiers); diff != "" {
				t.Errorf("ComputeBounds changed its tiers (-before +after):\n%s", diff)
			}
			if diff := cmp.Diff(budgetQuotas(), quotas); diff != "" {
				t.Errorf("ComputeBounds changed its quotas (-before +after):\n%s", diff)
			}
		})
	}
}

func TestComputeBoundsTenantBudgets(t *testing.T) {
	type row struct {
		Limits policy.Limits
		Source v1alpha1.LimitsSource
		Split  *LimitsSplit
	}
	acme := policy.Limits{RequestsPerMinute: 600, TokensPerMinute: 60001}
	globex := policy.Limits{TokensPerMinute: 2}
	initech := policy.Limits{RequestsPerMinute: 5}
	tests := map[string]struct {
		redis       bool
		dispatchers int
		excluded    []bool
		quotas      []v1alpha1.TenantQuota
		want        map[string]row
	}{
		"Local, three dispatchers": {dispatchers: 3, quotas: budgetQuotas(), want: map[string]row{
			"acme": {acme, v1alpha1.LimitsFromBoth, &LimitsSplit{Dispatchers: 3,
				Min: policy.Limits{RequestsPerMinute: 200, TokensPerMinute: 20000}, Max: policy.Limits{RequestsPerMinute: 200, TokensPerMinute: 20001}}},
			// 2 tokens over 3: each part is 1.
			"globex":  {globex, v1alpha1.LimitsFromServiceTier, &LimitsSplit{Dispatchers: 3, Min: policy.Limits{TokensPerMinute: 1}, Max: policy.Limits{TokensPerMinute: 1}}},
			"initech": {initech, v1alpha1.LimitsFromTenantQuota, &LimitsSplit{Dispatchers: 3, Min: policy.Limits{RequestsPerMinute: 1}, Max: policy.Limits{RequestsPerMinute: 2}}},
			"zeta":    {},
		}},
		"Local, one of three excluded: two share": {dispatchers: 3, excluded: []bool{true, false, false}, quotas: budgetQuotas(), want: map[string]row{
			"acme": {acme, v1alpha1.LimitsFromBoth, &LimitsSplit{Dispatchers: 2,
				Min: policy.Limits{RequestsPerMinute: 300, TokensPerMinute: 30000}, Max: policy.Limits{RequestsPerMinute: 300, TokensPerMinute: 30001}}},
			"globex":  {globex, v1alpha1.LimitsFromServiceTier, &LimitsSplit{Dispatchers: 2, Min: policy.Limits{TokensPerMinute: 1}, Max: policy.Limits{TokensPerMinute: 1}}},
			"initech": {initech, v1alpha1.LimitsFromTenantQuota, &LimitsSplit{Dispatchers: 2, Min: policy.Limits{RequestsPerMinute: 2}, Max: policy.Limits{RequestsPerMinute: 3}}},
			"zeta":    {},
		}},
		"Redis: pool-wide, no split": {redis: true, dispatchers: 3, quotas: budgetQuotas(), want: map[string]row{
			"acme": {acme, v1alpha1.LimitsFromBoth, nil}, "globex": {globex, v1alpha1.LimitsFromServiceTier, nil},
			"initech": {initech, v1alpha1.LimitsFromTenantQuota, nil}, "zeta": {},
		}},
		"no dispatcher: no split": {dispatchers: 0, quotas: budgetQuotas(), want: map[string]row{
			"acme": {acme, v1alpha1.LimitsFromBoth, nil}, "globex": {globex, v1alpha1.LimitsFromServiceTier, nil},
			"initech": {initech, v1alpha1.LimitsFromTenantQuota, nil}, "zeta": {},
		}},
		"a quota that sets both overrides the tier entirely": {dispatchers: 1, quotas: []v1alpha1.TenantQuota{
			quotaWithLimits("acme", "acme", "premium", &v1alpha1.Limits{RequestsPerMinute: 1, TokensPerMinute: 1}),
		}, want: map[string]row{
			"acme": {policy.Limits{RequestsPerMinute: 1, TokensPerMinute: 1}, v1alpha1.LimitsFromTenantQuota, &LimitsSplit{Dispatchers: 1,
				Min: policy.Limits{RequestsPerMinute: 1, TokensPerMinute: 1}, Max: policy.Limits{RequestsPerMinute: 1, TokensPerMinute: 1}}},
		}},
		"quotas not in force have no budgets": {dispatchers: 1, quotas: []v1alpha1.TenantQuota{
			quotaWithLimits("gone", "acme", "gold", &v1alpha1.Limits{TokensPerMinute: 9}),
		}, want: map[string]row{"gone": {}}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			pool := seed.Pool()
			if tc.redis {
				pool.Spec.SharedState = v1alpha1.SharedStateRedis
			}
			got, err := ComputeBounds(BoundsInput{Pool: pool, ReadyReplicas: 6, Tiers: budgetTiers(), Quotas: tc.quotas,
				Dispatchers: tc.dispatchers, Excluded: tc.excluded})
			if err != nil {
				t.Fatal(err)
			}
			gotRows := map[string]row{}
			for _, tb := range got.Tenants {
				gotRows[tb.QuotaName] = row{tb.Limits, tb.LimitsSource, tb.LimitsSplit}
			}
			if diff := cmp.Diff(tc.want, gotRows); diff != "" {
				t.Errorf("tenant budgets (-want +got):\n%s", diff)
			}
		})
	}
}

// TestBudgetSplitSumsExactly: over every pool size, dispatcher count and
// pattern of exclusions, and budgets from 1 to the CRD's maximum, the
// parts of the dispatchers that serve sum to the budget (or to their
// count, when it is smaller), differ by at most one, are at least 1, and
// the summary's min and max are theirs; one that serves nothing has 1.
func TestBudgetSplitSumsExactly(t *testing.T) {
	budgets := []int64{1, 2, 3, 7, 100, 999_999_999, v1alpha1.MaxBudgetPerMinute}
	for r := int32(0); r <= 4; r++ {
		for n := 1; n <= 9; n++ {
			for mask := 0; mask < 1<<min(n, 4); mask++ {
				excluded := make([]bool, n)
				for i := 0; i < min(n, 4); i++ {
					excluded[i] = mask&(1<<i) != 0
				}
				slots := shareSlots(int64(r)*4, n, excluded)
				b := newBudgetSplit(slots)
				for _, limit := range budgets {
					checkSplit(t, fmt.Sprintf("R=%d N=%d excluded=%v budget=%d", r, n, excluded, limit), b, slots, limit)
				}
			}
		}
	}
}

func checkSplit(t *testing.T, name string, b budgetSplit, slots []int64, limit int64) {
	t.Helper()
	anyServes := false
	for _, s := range slots {
		anyServes = anyServes || s > 0
	}
	var sum, lo, hi int64 = 0, 1 << 62, 0
	serving := 0
	for i, s := range slots {
		p := b.part(limit, i)
		if anyServes && s == 0 {
			if p != 1 {
				t.Errorf("%s: dispatcher %d serves nothing and has %d, want 1", name, i, p)
			}
			continue
		}
		serving++
		sum += p
		lo, hi = min(lo, p), max(hi, p)
	}
	want := max(limit, int64(serving))
	if sum != want || lo < 1 || hi-lo > 1 {
		t.Errorf("%s: %d serving parts sum to %d (want %d), spread %d..%d", name, serving, sum, want, lo, hi)
	}
	s := b.summary(policy.Limits{TokensPerMinute: limit})
	if s == nil || s.Dispatchers != serving || s.Min.TokensPerMinute != lo || s.Max.TokensPerMinute != hi || s.Min.RequestsPerMinute != 0 || s.Max.RequestsPerMinute != 0 {
		t.Errorf("%s: summary %+v, want %d dispatchers with tokens %d..%d", name, s, serving, lo, hi)
	}
}

// The CRD maxima in the policies: 10⁹ over 7 dispatchers is 142857143 six
// times and 142857142 once.
func TestComputeBoundsBudgetAtTheCRDMaximum(t *testing.T) {
	tiers := seed.Tiers()
	tiers[1].Spec.TenantLimits = &v1alpha1.Limits{RequestsPerMinute: v1alpha1.MaxBudgetPerMinute, TokensPerMinute: v1alpha1.MaxBudgetPerMinute}
	got, err := ComputeBounds(BoundsInput{Pool: seed.Pool(), ReadyReplicas: 6, Tiers: tiers, Dispatchers: 7})
	if err != nil {
		t.Fatal(err)
	}
	var parts []int64
	var sum int64
	for _, p := range got.Policies {
		l := p.Tiers[0].TenantLimits
		if l.RequestsPerMinute != l.TokensPerMinute {
			t.Errorf("requests %d and tokens %d parts differ", l.RequestsPerMinute, l.TokensPerMinute)
		}
		parts = append(parts, l.TokensPerMinute)
		sum += l.TokensPerMinute
	}
	want := []int64{142857143, 142857143, 142857143, 142857143, 142857143, 142857143, 142857142}
	if diff := cmp.Diff(want, parts); diff != "" || sum != v1alpha1.MaxBudgetPerMinute {
		t.Errorf("parts sum to %d (want %d) (-want +got):\n%s", sum, int64(v1alpha1.MaxBudgetPerMinute), diff)
	}
}

func TestComputeBoundsTokens(t *testing.T) {
	tests := map[string]struct {
		tokens *v1alpha1.Tokens
		want   *policy.Tokens
	}{
		"absent: no tokens in the policy (the dispatcher's default applies)": {},
		"given without a value: the default, policy.DefaultMaxTokens":        {tokens: &v1alpha1.Tokens{}, want: &policy.Tokens{DefaultMaxTokens: policy.DefaultMaxTokens}},
		"given":             {tokens: &v1alpha1.Tokens{DefaultMaxTokens: 4096}, want: &policy.Tokens{DefaultMaxTokens: 4096}},
		"the int32 maximum": {tokens: &v1alpha1.Tokens{DefaultMaxTokens: 1<<31 - 1}, want: &policy.Tokens{DefaultMaxTokens: 1<<31 - 1}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			for _, state := range []v1alpha1.SharedStateMode{v1alpha1.SharedStateLocal, v1alpha1.SharedStateRedis} {
				pool := seed.Pool(func(p *v1alpha1.ModelPool) { p.Spec.Tokens = tc.tokens; p.Spec.SharedState = state })
				before := pool.DeepCopy()
				got, err := ComputeBounds(BoundsInput{Pool: pool, ReadyReplicas: 6, Tiers: seed.Tiers(), Dispatchers: 2})
				if err != nil {
					t.Fatal(err)
				}
				for i, p := range got.Policies {
					if diff := cmp.Diff(tc.want, p.Tokens); diff != "" {
						t.Errorf("%s dispatcher %d: tokens (-want +got):\n%s", state, i, diff)
					}
				}
				if tc.want != nil && got.Policies[0].Tokens == got.Policies[1].Tokens {
					t.Errorf("%s: two policies share one Tokens", state)
				}
				if diff := cmp.Diff(before, pool); diff != "" {
					t.Errorf("%s: ComputeBounds changed the pool (-before +after):\n%s", state, diff)
				}
			}
		})
	}
}

func TestComputeBoundsRefusesBadBudgets(t *testing.T) {
	tier := func(l *v1alpha1.Limits) []v1alpha1.ServiceTier {
		tr := seed.Tier("x", 0, time.Second, "1")
		tr.Spec.TenantLimits = l
		return []v1alpha1.ServiceTier{tr}
	}
	quota := func(l *v1alpha1.Limits) []v1alpha1.TenantQuota {
		return []v1alpha1.TenantQuota{quotaWithLimits("q", "t", "x", l)}
	}
	tests := map[string]struct {
		in      BoundsInput
		wantMsg string
	}{
		"negative tier budgets": {BoundsInput{Pool: seed.Pool(), Tiers: tier(&v1alpha1.Limits{RequestsPerMinute: -1, TokensPerMinute: -2})},
			`invalid bounds input: tier "x": spec.tenantLimits.requestsPerMinute: -1 must be from 1 to 1000000000; tier "x": spec.tenantLimits.tokensPerMinute: -2 must be from 1 to 1000000000`},
		"empty tier budgets": {BoundsInput{Pool: seed.Pool(), Tiers: tier(&v1alpha1.Limits{})},
			`invalid bounds input: tier "x": spec.tenantLimits: sets neither requestsPerMinute nor tokensPerMinute`},
		"a quota budget above the maximum": {BoundsInput{Pool: seed.Pool(), Quotas: quota(&v1alpha1.Limits{TokensPerMinute: v1alpha1.MaxBudgetPerMinute + 1})},
			`invalid bounds input: quota "q": spec.limits.tokensPerMinute: 1000000001 must be from 1 to 1000000000`},
		"empty quota budgets": {BoundsInput{Pool: seed.Pool(), Quotas: quota(&v1alpha1.Limits{})},
			`invalid bounds input: quota "q": spec.limits: sets neither requestsPerMinute nor tokensPerMinute`},
		"negative defaultMaxTokens": {BoundsInput{Pool: seed.Pool(func(p *v1alpha1.ModelPool) { p.Spec.Tokens = &v1alpha1.Tokens{DefaultMaxTokens: -1} })},
			"invalid bounds input: spec.tokens.defaultMaxTokens: -1 must be at least 1"},
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
