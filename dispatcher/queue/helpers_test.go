package queue

import (
	"context"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// seedPolicy is the seed's worked example (DESIGN.md section 4) with the
// given slots.
func seedPolicy(slots int) *policy.Policy {
	return &policy.Policy{
		Version:              1,
		Pool:                 "default/llm",
		Slots:                slots,
		ServiceRate:          4,
		AgeingRate:           6,
		ClientTimeoutSeconds: 0,
		Authentication:       policy.Authentication{Mode: policy.AuthTrustedHeader, HeaderName: "X-Tenant-ID"},
		Tiers: []policy.Tier{
			{Name: "premium", BasePriority: 0, TolerableWaitSeconds: 5, QueueBound: 20, TenantConcurrencyLimit: 6, TenantQueueLimit: 5},
			{Name: "standard", BasePriority: 10, TolerableWaitSeconds: 20, QueueBound: 80, TenantConcurrencyLimit: 2, TenantQueueLimit: 8},
			{Name: "free", BasePriority: 20, TolerableWaitSeconds: 60, QueueBound: 120, TenantConcurrencyLimit: 1, TenantQueueLimit: 4},
		},
		Backends: []policy.Backend{{Address: "127.0.0.1:8000", Scheme: "http"}},
	}
}

func newTestQueue(t testing.TB, p *policy.Policy, opts ...Option) (*Queue, *clocktesting.FakeClock) {
	t.Helper()
	clk := clocktesting.NewFakeClock(t0)
	q := New(clk, opts...)
	if p != nil {
		q.UpdatePolicy(p)
	}
	return q, clk
}

func mustAdmit(t testing.TB, q *Queue, tenant, tier string) *Handle {
	t.Helper()
	h, err := q.Admit(tenant, tier)
	if err != nil {
		t.Fatalf("Admit(%q, %q): %v", tenant, tier, err)
	}
	return h
}

// state reads a handle's state under the lock.
func state(h *Handle) uint8 {
	h.q.mu.Lock()
	defer h.q.mu.Unlock()
	return h.state
}

func dispatched(h *Handle) bool { return state(h) == stDispatched }

// waitDone calls Wait with a context that is already cancelled if the job
// is still queued, so it never blocks: it reports the outcome for a job that
// has ended and abandons one that has not.
func waitNow(h *Handle) error {
	if state(h) == stQueued {
		return errStillQueued
	}
	return h.Wait(context.Background())
}

type testErr string

func (e testErr) Error() string { return string(e) }

const errStillQueued = testErr("still queued")

type policyTenant = policy.Tenant

// tenantOf is the tenant of a queued or running job.
func tenantOf(h *Handle) string {
	h.q.mu.Lock()
	defer h.q.mu.Unlock()
	return h.j.ts.id
}
