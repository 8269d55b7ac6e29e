package controllers

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tiergate/tiergate/api/v1alpha1"
	"github.com/tiergate/tiergate/capacity"
	seed "github.com/tiergate/tiergate/capacity/capacitytest"
)

// budgetSeedTiers are the seed's tiers, premium with tenant budgets.
func budgetSeedTiers() []v1alpha1.ServiceTier {
	tiers := seed.Tiers()
	for i := range tiers {
		if tiers[i].Name == "premium" {
			tiers[i].Spec.TenantLimits = &v1alpha1.Limits{RequestsPerMinute: 600, TokensPerMinute: 100000}
		}
	}
	return tiers
}

func limitedQuota(name, tenant, tier string, l *v1alpha1.Limits) v1alpha1.TenantQuota {
	q := seed.Quota(name, tenant, tier, nil)
	q.Spec.Limits = l
	return q
}

// TestQuotaStatusShowsTheBudgets: status.limits and the Ready message of
// a quota, from the bounds ComputeBounds gives for the seed's pool on 6
// replicas.
func TestQuotaStatusShowsTheBudgets(t *testing.T) {
	const acmeActive = `tenant "acme" in tier "premium" may hold 6 requests in flight`
	acmeOwn := &v1alpha1.Limits{TokensPerMinute: 60001}
	acmeBudgets := `; budgets per minute: 600 requests (from ServiceTier "premium") and 60001 tokens (from this TenantQuota)`
	tests := map[string]struct {
		state       v1alpha1.SharedStateMode
		dispatchers int
		excluded    []bool
		quota       v1alpha1.TenantQuota
		wantLimits  *v1alpha1.LimitsStatus
		wantReady   condRow
	}{
		"Local, two dispatchers: the parts and the caveat": {
			dispatchers: 2, quota: limitedQuota("acme", "acme", "premium", acmeOwn),
			wantLimits: &v1alpha1.LimitsStatus{RequestsPerMinute: 600, TokensPerMinute: 60001, Source: v1alpha1.LimitsFromBoth,
				PerDispatcher: &v1alpha1.LimitsSplit{Dispatchers: 2, RequestsPerMinute: &v1alpha1.BudgetRange{Min: 300, Max: 300},
					TokensPerMinute: &v1alpha1.BudgetRange{Min: 30000, Max: 30001}}},
			wantReady: condRow{"Ready", "True", "Active", acmeActive + acmeBudgets +
				"; in Local mode each of the 2 dispatchers that serve enforces its own part, 300 requests and 30000 to 30001 tokens, " +
				"so a tenant whose requests do not spread evenly over them gets less than its budget (sharedState Redis enforces it exactly)"},
		},
		"Local, one of three excluded: two serve": {
			dispatchers: 3, excluded: []bool{false, false, true}, quota: limitedQuota("acme", "acme", "premium", acmeOwn),
			wantLimits: &v1alpha1.LimitsStatus{RequestsPerMinute: 600, TokensPerMinute: 60001, Source: v1alpha1.LimitsFromBoth,
				PerDispatcher: &v1alpha1.LimitsSplit{Dispatchers: 2, RequestsPerMinute: &v1alpha1.BudgetRange{Min: 300, Max: 300},
					TokensPerMinute: &v1alpha1.BudgetRange{Min: 30000, Max: 30001}}},
			wantReady: condRow{"Ready", "True", "Active", acmeActive + acmeBudgets +
				"; in Local mode each of the 2 dispatchers that serve enforces its own part, 300 requests and 30000 to 30001 tokens, " +
				"so a tenant whose requests do not spread evenly over them gets less than its budget (sharedState Redis enforces it exactly)"},
		},
		"Redis: pool-wide and exact": {
			state: v1alpha1.SharedStateRedis, dispatchers: 2, quota: limitedQuota("acme", "acme", "premium", acmeOwn),
			wantLimits: &v1alpha1.LimitsStatus{RequestsPerMinute: 600, TokensPerMinute: 60001, Source: v1alpha1.LimitsFromBoth},
			wantReady: condRow{"Ready", "True", "Active", acmeActive + acmeBudgets +
				"; every dispatcher takes them from the same buckets in Redis, so they hold exactly across the pool"},
		},
		"Local, one dispatcher: whole": {
			dispatchers: 1, quota: limitedQuota("acme", "acme", "premium", nil),
			wantLimits: &v1alpha1.LimitsStatus{RequestsPerMinute: 600, TokensPerMinute: 100000, Source: v1alpha1.LimitsFromServiceTier,
				PerDispatcher: &v1alpha1.LimitsSplit{Dispatchers: 1, RequestsPerMinute: &v1alpha1.BudgetRange{Min: 600, Max: 600},
					TokensPerMinute: &v1alpha1.BudgetRange{Min: 100000, Max: 100000}}},
			wantReady: condRow{"Ready", "True", "Active", acmeActive +
				`; budgets per minute: 600 requests (from ServiceTier "premium") and 100000 tokens (from ServiceTier "premium"); one dispatcher serves and enforces them whole`},
		},
		"Local, a budget smaller than the dispatchers": {
			dispatchers: 3, quota: limitedQuota("initech", "initech", "free", &v1alpha1.Limits{RequestsPerMinute: 2}),
			wantLimits: &v1alpha1.LimitsStatus{RequestsPerMinute: 2, Source: v1alpha1.LimitsFromTenantQuota,
				PerDispatcher: &v1alpha1.LimitsSplit{Dispatchers: 3, RequestsPerMinute: &v1alpha1.BudgetRange{Min: 1, Max: 1}}},
			wantReady: condRow{"Ready", "True", "Active", `tenant "initech" in tier "free" may hold 1 requests in flight; ` +
				`budgets per minute: 2 requests (from this TenantQuota); in Local mode each of the 3 dispatchers that serve enforces its own part, 1 request, ` +
				"so a tenant whose requests do not spread evenly over them gets less than its budget (sharedState Redis enforces it exactly); " +
				"2 requests is fewer than the 3 dispatchers, so each admits 1 and together up to 3"},
		},
		"Local, no dispatcher yet": {
			dispatchers: 0, quota: limitedQuota("initech", "initech", "free", &v1alpha1.Limits{TokensPerMinute: 1}),
			wantLimits: &v1alpha1.LimitsStatus{TokensPerMinute: 1, Source: v1alpha1.LimitsFromTenantQuota},
			wantReady: condRow{"Ready", "True", "Active", `tenant "initech" in tier "free" may hold 1 requests in flight; ` +
				`budgets per minute: 1 token (from this TenantQuota); no dispatcher enforces them yet`},
		},
		"no budget: no limits and the message as before": {
			dispatchers: 2, quota: limitedQuota("globex", "globex", "standard", nil),
			wantReady: condRow{"Ready", "True", "Active", `tenant "globex" in tier "standard" may hold 2 requests in flight`},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			pool := seed.Pool()
			if tc.state != "" {
				pool.Spec.SharedState = tc.state
			}
			b, err := capacity.ComputeBounds(capacity.BoundsInput{Pool: pool, ReadyReplicas: 6, Tiers: budgetSeedTiers(),
				Quotas: []v1alpha1.TenantQuota{tc.quota}, Dispatchers: tc.dispatchers, Excluded: tc.excluded})
			if err != nil {
				t.Fatal(err)
			}
			st := desiredQuotaStatus(v1alpha1.TenantQuotaStatus{}, quotaView{Pool: "llm", Tenant: b.Tenants[0],
				OwnLimits: tc.quota.Spec.Limits, SharedState: pool.Spec.SharedState}, t0)
			if diff := cmp.Diff(tc.wantLimits, st.Limits); diff != "" {
				t.Errorf("status.limits (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantReady, condRows(st.Conditions)["Ready"]); diff != "" {
				t.Errorf("Ready (-want +got):\n%s", diff)
			}
		})
	}
}

// A quota not in force shows no budgets, whatever it asks for.
func TestQuotaStatusNoBudgetsWhenNotInForce(t *testing.T) {
	older := seed.Quota("acme-old", "acme", "premium", nil)
	older.CreationTimestamp.Time = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	newer := limitedQuota("acme-new", "acme", "standard", &v1alpha1.Limits{TokensPerMinute: 5})
	newer.CreationTimestamp.Time = older.CreationTimestamp.Add(time.Hour)
	b, err := capacity.ComputeBounds(capacity.BoundsInput{Pool: seed.Pool(), ReadyReplicas: 6, Tiers: seed.Tiers(),
		Quotas: []v1alpha1.TenantQuota{older, newer}, Dispatchers: 1})
	if err != nil {
		t.Fatal(err)
	}
	prev := v1alpha1.TenantQuotaStatus{Limits: &v1alpha1.LimitsStatus{TokensPerMinute: 5, Source: v1alpha1.LimitsFromTenantQuota}}
	for _, tb := range b.Tenants {
		if tb.QuotaName != "acme-new" {
			continue
		}
		st := desiredQuotaStatus(prev, quotaView{Pool: "llm", Tenant: tb, OwnLimits: newer.Spec.Limits}, t1)
		if st.Limits != nil || reasonOf(st.Conditions) != string(v1alpha1.ReasonDuplicateTenant) {
			t.Errorf("duplicate: limits %+v reason %q, want none and DuplicateTenant", st.Limits, reasonOf(st.Conditions))
		}
	}
	st := desiredQuotaStatus(prev, quotaView{TierMissing: true, Tenant: capacity.TenantBounds{Tenant: "acme", Tier: "gold", TierNotFound: true}}, t1)
	if st.Limits != nil {
		t.Errorf("tier missing: limits %+v, want none", st.Limits)
	}
}
