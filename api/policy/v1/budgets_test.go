package v1

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// budgetPolicy is a valid policy with every field of revision 2 set.
func budgetPolicy() *Policy {
	return &Policy{
		Slots: 1, ServiceRate: 1, AgeingRate: 6,
		Authentication: Authentication{Mode: AuthAPIKey},
		Tiers: []Tier{
			{Name: "premium", TolerableWaitSeconds: 5, QueueBound: 1, TenantConcurrencyLimit: 1, TenantQueueLimit: 1,
				TenantLimits: &Limits{RequestsPerMinute: 600, TokensPerMinute: 100000}},
			{Name: "free", TolerableWaitSeconds: 60, QueueBound: 1, TenantConcurrencyLimit: 1, TenantQueueLimit: 1},
		},
		Tenants:  []Tenant{{ID: "acme", Tier: "premium", Limits: &Limits{TokensPerMinute: 1}}, {ID: "initech", Tier: "free"}},
		Backends: []Backend{{Address: "10.0.0.7:8000"}},
		Tokens:   &Tokens{DefaultMaxTokens: 512},
	}
}

func TestValidateBudgets(t *testing.T) {
	tests := map[string]struct {
		mutate func(p *Policy)
		want   ValidationErrors
	}{
		"every budget and the token settings set": {mutate: func(*Policy) {}},
		"one budget each is enough": {mutate: func(p *Policy) {
			p.Tiers[0].TenantLimits = &Limits{TokensPerMinute: 1}
			p.Tenants[0].Limits = &Limits{RequestsPerMinute: 1}
		}},
		"the largest values": {mutate: func(p *Policy) {
			p.Tiers[0].TenantLimits = &Limits{RequestsPerMinute: 1<<63 - 1, TokensPerMinute: 1<<63 - 1}
			p.Tokens.DefaultMaxTokens = 1<<31 - 1
		}},
		"tokens without a default: the dispatcher's own": {mutate: func(p *Policy) { p.Tokens = &Tokens{} }},
		"negative tier budgets": {
			mutate: func(p *Policy) { p.Tiers[1].TenantLimits = &Limits{RequestsPerMinute: -1, TokensPerMinute: -60} },
			want: ValidationErrors{
				{Field: "tiers[1].tenantLimits.requestsPerMinute", Message: "must be >= 1 when set, got -1"},
				{Field: "tiers[1].tenantLimits.tokensPerMinute", Message: "must be >= 1 when set, got -60"},
			},
		},
		"empty tier budgets": {
			mutate: func(p *Policy) { p.Tiers[0].TenantLimits = &Limits{} },
			want:   ValidationErrors{{Field: "tiers[0].tenantLimits", Message: "sets neither requestsPerMinute nor tokensPerMinute"}},
		},
		"empty tenant budgets": {
			mutate: func(p *Policy) { p.Tenants[1].Limits = &Limits{} },
			want:   ValidationErrors{{Field: "tenants[1].limits", Message: "sets neither requestsPerMinute nor tokensPerMinute"}},
		},
		"a negative tenant budget beside a valid one": {
			mutate: func(p *Policy) { p.Tenants[0].Limits = &Limits{RequestsPerMinute: 5, TokensPerMinute: -1} },
			want:   ValidationErrors{{Field: "tenants[0].limits.tokensPerMinute", Message: "must be >= 1 when set, got -1"}},
		},
		"negative defaultMaxTokens": {
			mutate: func(p *Policy) { p.Tokens.DefaultMaxTokens = -1 },
			want:   ValidationErrors{{Field: "tokens.defaultMaxTokens", Message: "must be >= 1 when set, got -1"}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := budgetPolicy()
			tc.mutate(p)
			err := p.Validate()
			var got ValidationErrors
			if err != nil && !errors.As(err, &got) {
				t.Fatalf("Validate = %T %v, want ValidationErrors", err, err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestLimitsOf(t *testing.T) {
	both := &Limits{RequestsPerMinute: 600, TokensPerMinute: 100000}
	tests := map[string]struct {
		tenant *Tenant
		tier   *Tier
		want   Limits
	}{
		"neither":                    {},
		"no tier, no tenant budgets": {tenant: &Tenant{ID: "a"}, tier: &Tier{Name: "x"}},
		"the tier's for a tenant without its own":   {tenant: &Tenant{ID: "a"}, tier: &Tier{TenantLimits: both}, want: *both},
		"the tier's for an unknown tenant (nil)":    {tier: &Tier{TenantLimits: both}, want: *both},
		"the tenant's own without a tier":           {tenant: &Tenant{Limits: &Limits{TokensPerMinute: 5}}, want: Limits{TokensPerMinute: 5}},
		"the tenant's own replace the tier's":       {tenant: &Tenant{Limits: &Limits{RequestsPerMinute: 1, TokensPerMinute: 2}}, tier: &Tier{TenantLimits: both}, want: Limits{RequestsPerMinute: 1, TokensPerMinute: 2}},
		"tokens its own, requests from the tier":    {tenant: &Tenant{Limits: &Limits{TokensPerMinute: 7}}, tier: &Tier{TenantLimits: both}, want: Limits{RequestsPerMinute: 600, TokensPerMinute: 7}},
		"requests its own, tokens from the tier":    {tenant: &Tenant{Limits: &Limits{RequestsPerMinute: 3}}, tier: &Tier{TenantLimits: both}, want: Limits{RequestsPerMinute: 3, TokensPerMinute: 100000}},
		"a budget neither sets stays none":          {tenant: &Tenant{Limits: &Limits{TokensPerMinute: 7}}, tier: &Tier{TenantLimits: &Limits{TokensPerMinute: 9}}, want: Limits{TokensPerMinute: 7}},
		"an empty own Limits inherits both budgets": {tenant: &Tenant{Limits: &Limits{}}, tier: &Tier{TenantLimits: both}, want: *both},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, LimitsOf(tc.tenant, tc.tier)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
	// LimitsOf reads only: the tier's Limits are not handed out to write.
	tier := &Tier{TenantLimits: &Limits{RequestsPerMinute: 1}}
	l := LimitsOf(nil, tier)
	l.RequestsPerMinute = 99
	if tier.TenantLimits.RequestsPerMinute != 1 {
		t.Errorf("writing LimitsOf's result changed the tier to %+v", tier.TenantLimits)
	}
}

func TestMaxTokens(t *testing.T) {
	for _, tc := range []struct {
		tokens *Tokens
		want   int
	}{{nil, DefaultMaxTokens}, {&Tokens{}, DefaultMaxTokens}, {&Tokens{DefaultMaxTokens: 7}, 7}} {
		if got := (&Policy{Tokens: tc.tokens}).MaxTokens(); got != tc.want {
			t.Errorf("MaxTokens with %+v = %d, want %d", tc.tokens, got, tc.want)
		}
	}
	if DefaultMaxTokens != 1024 {
		t.Errorf("DefaultMaxTokens = %d; the CRD's default for spec.tokens.defaultMaxTokens is 1024", DefaultMaxTokens)
	}
}
