package queue

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

// tokensPolicy: one tier "std" bounded in weighted tokens (weights 1 and
// 2), one slot, Tokens fairness.
func tokensPolicy() *policy.Policy {
	return &policy.Policy{
		Version: 1, Pool: "default/llm", Slots: 1, ServiceRate: 2, AgeingRate: 6, TokenServiceRate: 100,
		Authentication: policy.Authentication{Mode: policy.AuthAPIKey},
		Fairness:       &policy.Fairness{Mode: policy.FairnessTokens},
		Tiers: []policy.Tier{{
			Name: "std", BasePriority: 10, TolerableWaitSeconds: 60, QueueBound: 1,
			TenantConcurrencyLimit: 1, TenantQueueLimit: 2, QueueTokenBound: 1000, TenantQueueTokenLimit: 600,
		}},
		Backends: []policy.Backend{{Address: "127.0.0.1:8000"}},
	}
}

type costAdmit struct {
	tenant string
	cost   Cost
}

// TestTokenBoundRefusals: every refusal of a token bound, its exact error,
// sentinel and Retry-After, and the admissions beside them.
func TestTokenBoundRefusals(t *testing.T) {
	cases := map[string]struct {
		mutate func(*policy.Policy)
		// before are admitted first (each must be admitted); then, if
		// measure, the clock runs 2s with the slot busy.
		before  []costAdmit
		measure bool
		try     costAdmit
		want    error // nil: admitted
	}{
		"tier bound: queued tokens plus the request pass it": {
			before: []costAdmit{{"busy", Cost{100, 0}}, {"a", Cost{300, 0}}, {"b", Cost{500, 0}}},
			try:    costAdmit{"c", Cost{100, 60}}, // 220 weighted: 1020 > 1000
			// ahead 1020 tokens at TokenServiceRate 100/s: 10.2s, rounded up
			want: &Refusal{Cause: ErrQueueFull, Tier: "std", Position: 3, RetryAfter: 11 * time.Second},
		},
		"tier bound: exactly reached is admitted": {
			before: []costAdmit{{"busy", Cost{100, 0}}, {"a", Cost{300, 0}}, {"b", Cost{500, 0}}},
			try:    costAdmit{"c", Cost{100, 50}},
		},
		"tier bound: the request-count bound is not applied": {
			mutate: func(p *policy.Policy) { p.Tiers[0].QueueBound = 1 },
			before: []costAdmit{{"busy", Cost{1, 0}}, {"a", Cost{1, 0}}, {"b", Cost{1, 0}}},
			try:    costAdmit{"c", Cost{1, 0}},
		},
		"tier bound: a request larger than the bound enters an empty tier queue": {
			before: []costAdmit{{"busy", Cost{100, 0}}},
			try:    costAdmit{"a", Cost{5000, 0}},
		},
		"tier bound: a request larger than the bound is refused behind others": {
			before: []costAdmit{{"busy", Cost{100, 0}}, {"a", Cost{1, 0}}},
			try:    costAdmit{"b", Cost{5000, 0}},
			want:   &Refusal{Cause: ErrQueueFull, Tier: "std", Position: 2, RetryAfter: 51 * time.Second},
		},
		"tier bound: Retry-After from the measured token drain rate": {
			// 2s after a dispatch of 100 tokens: the EWMA reads
			// 100 e^−0.2 / (10 (1 − e^−0.2)) ≈ 45.2 tokens/s, not the
			// policy's 100; 1020 / 45.2 ≈ 22.6s
			before:  []costAdmit{{"busy", Cost{100, 0}}, {"a", Cost{300, 0}}, {"b", Cost{500, 0}}},
			measure: true,
			try:     costAdmit{"c", Cost{100, 60}},
			want:    &Refusal{Cause: ErrQueueFull, Tier: "std", Position: 3, RetryAfter: 23 * time.Second},
		},
		"tier bound: without TokenServiceRate, ServiceRate × the request's cost": {
			mutate: func(p *policy.Policy) { p.TokenServiceRate = 0 },
			before: []costAdmit{{"busy", Cost{100, 0}}, {"a", Cost{300, 0}}, {"b", Cost{500, 0}}},
			try:    costAdmit{"c", Cost{100, 60}}, // 1020 / (2 × 220) = 2.3s
			want:   &Refusal{Cause: ErrQueueFull, Tier: "std", Position: 3, RetryAfter: 3 * time.Second},
		},
		"tier bound: clamped to the tier's tolerable wait": {
			mutate: func(p *policy.Policy) { p.TokenServiceRate = 1 },
			before: []costAdmit{{"busy", Cost{100, 0}}, {"a", Cost{300, 0}}, {"b", Cost{500, 0}}},
			try:    costAdmit{"c", Cost{100, 60}},
			want:   &Refusal{Cause: ErrQueueFull, Tier: "std", Position: 3, RetryAfter: 60 * time.Second},
		},
		"tenant token limit": {
			before: []costAdmit{{"busy", Cost{100, 0}}, {"a", Cost{300, 0}}, {"a", Cost{200, 0}}},
			try:    costAdmit{"a", Cost{150, 0}}, // 650 > 600; the tier has room
			want:   &Refusal{Cause: ErrTenantLimit, Tier: "std", Position: 3, RetryAfter: 7 * time.Second},
		},
		"tenant token limit: a request larger than it enters the tenant's empty queue": {
			before: []costAdmit{{"busy", Cost{100, 0}}, {"b", Cost{10, 0}}},
			try:    costAdmit{"a", Cost{900, 0}},
		},
		"tenant request limit without a token limit": {
			mutate: func(p *policy.Policy) { p.Tiers[0].TenantQueueTokenLimit = 0 },
			before: []costAdmit{{"busy", Cost{100, 0}}, {"a", Cost{1, 0}}, {"a", Cost{1, 0}}},
			try:    costAdmit{"a", Cost{1, 0}},
			want:   &Refusal{Cause: ErrTenantLimit, Tier: "std", Position: 3, RetryAfter: 1 * time.Second},
		},
		"zero cost without token rates falls back on the request rule": {
			mutate: func(p *policy.Policy) {
				p.TokenServiceRate, p.ServiceRate = 0, 0.5
				p.Tiers[0].QueueTokenBound, p.Tiers[0].TenantQueueTokenLimit = 1, 0
			},
			before: []costAdmit{{"busy", Cost{0, 0}}, {"a", Cost{5, 0}}}, // 5 > 1 enters the empty queue
			try:    costAdmit{"b", Cost{0, 0}},                           // position 2 at 0.5 requests/s
			want:   &Refusal{Cause: ErrQueueFull, Tier: "std", Position: 2, RetryAfter: 4 * time.Second},
		},
		"held at zero slots: the cold start, then the tokens at TokenServiceRate": {
			mutate: func(p *policy.Policy) { p.Slots = 0; p.Backends = nil; p.ColdStartSeconds = 30 },
			before: []costAdmit{{"a", Cost{400, 0}}, {"b", Cost{500, 0}}},
			try:    costAdmit{"c", Cost{200, 0}}, // 30 + 1100/100 = 41s
			want:   &Refusal{Cause: ErrQueueFull, Tier: "std", Position: 3, RetryAfter: 41 * time.Second},
		},
		"held at zero slots: a tier with neither bound is refused for the cold start": {
			mutate: func(p *policy.Policy) {
				p.Slots, p.Backends, p.ColdStartSeconds = 0, nil, 30
				p.Tiers = append(p.Tiers, policy.Tier{Name: "zero", TolerableWaitSeconds: 1, QueueBound: 0, TenantConcurrencyLimit: 1, TenantQueueLimit: 1})
				p.Tenants = []policy.Tenant{{ID: "c", Tier: "zero"}}
			},
			try:  costAdmit{"c", Cost{1, 0}},
			want: &ColdStartRefusal{Tier: "zero", ColdStart: 30 * time.Second},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			p := tokensPolicy()
			if tc.mutate != nil {
				tc.mutate(p)
			}
			if err := p.Validate(); err != nil {
				t.Fatalf("policy: %v", err)
			}
			q, clk := newTestQueue(t, p)
			for _, a := range tc.before {
				if _, err := q.AdmitCost(a.tenant, "std", a.cost); err != nil {
					t.Fatalf("AdmitCost(%s, %+v): %v", a.tenant, a.cost, err)
				}
			}
			if tc.measure {
				clk.Step(2 * time.Second)
			}
			before := q.Stats().Tiers["std"]
			h, err := q.AdmitCost(tc.try.tenant, "std", tc.try.cost)
			switch want := tc.want.(type) {
			case nil:
				if err != nil || h == nil {
					t.Fatalf("AdmitCost = %v, want admitted", err)
				}
				return
			case *Refusal:
				var got *Refusal
				if !errors.As(err, &got) {
					t.Fatalf("AdmitCost = %v, want %v", err, want)
				}
				if diff := cmp.Diff(*want, *got, cmpopts.EquateErrors()); diff != "" {
					t.Errorf("refusal (-want +got):\n%s", diff)
				}
			case *ColdStartRefusal:
				var got *ColdStartRefusal
				if !errors.As(err, &got) {
					t.Fatalf("AdmitCost = %v, want %v", err, want)
				}
				if diff := cmp.Diff(*want, *got); diff != "" {
					t.Errorf("refusal (-want +got):\n%s", diff)
				}
			}
			if err.Error() != tc.want.Error() {
				t.Errorf("message %q, want %q", err, tc.want)
			}
			var r *Refusal
			if errors.As(tc.want, &r) {
				if !errors.Is(err, r.Cause) {
					t.Errorf("errors.Is(%v, %v) = false", err, r.Cause)
				}
				after := q.Stats().Tiers["std"]
				if diff := cmp.Diff(before.Refused[r.CauseLabel()]+1, after.Refused[r.CauseLabel()]); diff != "" {
					t.Errorf("refusals counted (-want +got):\n%s", diff)
				}
				if after.QueuedTokens != before.QueuedTokens {
					t.Errorf("queued tokens %d after a refusal, %d before", after.QueuedTokens, before.QueuedTokens)
				}
			} else if !errors.Is(err, ErrNoCapacity) {
				t.Errorf("errors.Is(%v, ErrNoCapacity) = false", err)
			}
		})
	}
}
