package v1

import (
	"errors"
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// heldPolicy is a pool at zero whose first replica is expected in 90s:
// premium (W 5s) cannot be served in time and has bound 0.
func heldPolicy() Policy {
	return Policy{
		Pool: "default/llm", Slots: 0, ServiceRate: 4.0 / 6, AgeingRate: 6, ClientTimeoutSeconds: 120,
		ColdStartSeconds: 90,
		Authentication:   Authentication{Mode: AuthTrustedHeader, HeaderName: "X-Tenant-ID"},
		Tiers: []Tier{
			{Name: "premium", BasePriority: 0, TolerableWaitSeconds: 5, QueueBound: 0, TenantConcurrencyLimit: 1, TenantQueueLimit: 1},
			{Name: "free", BasePriority: 20, TolerableWaitSeconds: 120, QueueBound: 20, TenantConcurrencyLimit: 1, TenantQueueLimit: 1},
		},
		Backends: []Backend{},
	}
}

func TestValidateColdStart(t *testing.T) {
	tests := map[string]struct {
		mutate   func(*Policy)
		want     ValidationErrors // nil: valid
		wantHold bool
	}{
		"held at zero, a tier with bound 0":     {mutate: func(*Policy) {}, wantHold: true},
		"held at zero, every tier with bound 0": {mutate: func(p *Policy) { p.Tiers[1].QueueBound = 0 }, wantHold: true},
		"fractional cold start":                 {mutate: func(p *Policy) { p.ColdStartSeconds = 0.5 }, wantHold: true},
		// Without a cold start a pool at zero refuses every request, and its
		// bounds say so.
		"zero without a cold start, bounds 0": {
			mutate: func(p *Policy) { p.ColdStartSeconds = 0; p.Tiers[1].QueueBound = 0 },
		},
		"zero without a cold start, bounds 1": {
			mutate: func(p *Policy) { p.ColdStartSeconds = 0; p.Tiers[0].QueueBound = 1 },
		},
		"negative cold start": {
			mutate: func(p *Policy) { p.ColdStartSeconds = -1 },
			want: ValidationErrors{
				{Field: "coldStartSeconds", Message: "must be a finite number >= 0 (0 when the pool is not at zero), got -1"},
			},
		},
		"NaN cold start": {
			mutate: func(p *Policy) { p.ColdStartSeconds = math.NaN(); p.Tiers[0].QueueBound = 1 },
			want:   ValidationErrors{{Field: "coldStartSeconds", Message: "must be a finite number >= 0 (0 when the pool is not at zero), got NaN"}},
		},
		"infinite cold start": {
			mutate: func(p *Policy) { p.ColdStartSeconds = math.Inf(1); p.Tiers[0].QueueBound = 1 },
			want:   ValidationErrors{{Field: "coldStartSeconds", Message: "must be a finite number >= 0 (0 when the pool is not at zero), got +Inf"}},
		},
		"bound 0 with slots and no cold start": {
			mutate: func(p *Policy) {
				p.ColdStartSeconds = 0
				p.Slots = 4
				p.Backends = []Backend{{Address: "10.0.0.7:8000"}}
			},
			want: ValidationErrors{{Field: "tiers[0].queueBound", Message: "must be >= 1, got 0"}},
		},
		"cold start with slots": {
			mutate: func(p *Policy) {
				p.Slots = 4
				p.Backends = []Backend{{Address: "10.0.0.7:8000"}}
			},
			want: ValidationErrors{
				{Field: "tiers[0].queueBound", Message: "must be >= 1, got 0"},
				{Field: "coldStartSeconds", Message: "is 90 but slots is 4; a cold start is only set while the pool is at zero (slots 0)"},
			},
		},
		"held: other tier errors stay": {
			mutate: func(p *Policy) { p.Tiers[0].QueueBound = -1; p.Tiers[1].TenantQueueLimit = 0 },
			want: ValidationErrors{
				{Field: "tiers[0].queueBound", Message: "must be >= 1, got -1"},
				{Field: "tiers[1].tenantQueueLimit", Message: "must be >= 1, got 0"},
			},
			wantHold: true,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := heldPolicy()
			tc.mutate(&p)
			err := p.Validate()
			var got ValidationErrors
			if err != nil && !errors.As(err, &got) {
				t.Fatalf("Validate = %v, want ValidationErrors", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("errors (-want +got):\n%s", diff)
			}
			if p.HoldsForColdStart() != tc.wantHold {
				t.Errorf("HoldsForColdStart = %v, want %v", p.HoldsForColdStart(), tc.wantHold)
			}
		})
	}
}
