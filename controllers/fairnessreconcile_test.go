package controllers

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/api/v1alpha1"
	seed "github.com/tiergate/tiergate/capacity/capacitytest"
)

// fairnessWorld is seedWorld (24 slots over two dispatchers, Local,
// clientTimeout 30s) in Tokens fairness, bounded by tokens at 2000
// prompt and 50 output tokens per slot-second, acme of weight 3.
func fairnessWorld(source v1alpha1.ServiceTimeSource) []client.Object {
	objs := seedWorld()
	for _, o := range objs {
		switch x := o.(type) {
		case *v1alpha1.ModelPool:
			x.Spec.ServiceTime.Source = source
			x.Spec.Fairness = &v1alpha1.Fairness{Mode: v1alpha1.FairnessTokens, InputWeight: 1, OutputWeight: 2}
			x.Spec.Tokens = &v1alpha1.Tokens{DefaultMaxTokens: 1024, BoundBy: v1alpha1.BoundByTokens, PrefillTokensPerSecond: 2000, DecodeTokensPerSecond: 50}
		case *v1alpha1.TenantQuota:
			x.Spec.Weight = 3
		}
	}
	return objs
}

// fairnessOutcome is what a reconcile put in the policies and the status.
type fairnessOutcome struct {
	Fairness *policy.Fairness
	Weight   int
	// Pushed are each tier's queueTokenBound/tenantQueueTokenLimit in
	// d-0's policy, premium first; TokenServiceRate is d-0's.
	Pushed           [][2]int64
	TokenServiceRate float64
	// Status are the tiers' status, premium first, and the pool's rates.
	Status                  [][2]int64
	TokenRate, ObservedRate string
}

func fairnessReconcile(t *testing.T, h *budgetHarness, states []PodState) fairnessOutcome {
	t.Helper()
	h.reconcile(states)
	ctx := context.Background()
	var got fairnessOutcome
	for _, tg := range h.last.pushed {
		if tg.Name != "d-0" {
			continue
		}
		got.Fairness, got.Weight, got.TokenServiceRate = tg.Policy.Fairness, tg.Policy.Tenants[0].Weight, tg.Policy.TokenServiceRate
		for _, pt := range tg.Policy.Tiers {
			got.Pushed = append(got.Pushed, [2]int64{pt.QueueTokenBound, pt.TenantQueueTokenLimit})
		}
	}
	for _, name := range []string{"premium", "standard", "free"} {
		var st v1alpha1.ServiceTier
		if err := h.c.Get(ctx, types.NamespacedName{Namespace: seed.Namespace, Name: name}, &st); err != nil {
			t.Fatal(err)
		}
		got.Status = append(got.Status, [2]int64{st.Status.QueueTokenBound, st.Status.TenantQueueTokenLimit})
	}
	var pool v1alpha1.ModelPool
	if err := h.c.Get(ctx, seedKey, &pool); err != nil {
		t.Fatal(err)
	}
	got.TokenRate, got.ObservedRate = pool.Status.TokenRate, pool.Status.ObservedTokenRate
	return got
}

// The reconciler pushes the fairness, the tenant's weight and each
// dispatcher's half of the token bounds, and writes the pool-wide token
// bounds to the tiers' status; a measured rate replaces the declared one
// when the service time is Measured, once enough completions back it.
func TestReconcilePushesTokenFairnessAndBounds(t *testing.T) {
	h := newBudgetHarness(t, fairnessWorld(v1alpha1.ServiceTimeMeasured))
	tokens := &policy.Fairness{Mode: policy.FairnessTokens, InputWeight: 1, OutputWeight: 2}
	// r = 3 × 2000 × 50 / 2050; free's 60s are capped at the 30s timeout.
	want := fairnessOutcome{Fairness: tokens, Weight: 3,
		Pushed:           [][2]int64{{8780, 2195}, {35121, 3512}, {52682, 2107}},
		TokenServiceRate: 12 * 300000.0 / 2050,
		Status:           [][2]int64{{17560, 4390}, {70243, 7024}, {105365, 4214}},
		TokenRate:        "146.341"}
	if diff := cmp.Diff(want, fairnessReconcile(t, h, nil)); diff != "" {
		t.Fatalf("declared rate (-want +got):\n%s", diff)
	}

	measuring := func(completed int64, rate float64) []PodState {
		return []PodState{
			{UID: "uid-d-0", Name: "d-0", SchemaKnown: true, SchemaVersion: policy.SchemaVersion, Stats: policy.Measured{Completed: completed, TokensPerSlotSecond: rate}},
			{UID: "uid-d-1", Name: "d-1", SchemaKnown: true, SchemaVersion: policy.SchemaVersion, Stats: policy.Measured{Completed: completed, TokensPerSlotSecond: rate * 3}},
		}
	}
	if diff := cmp.Diff(want, fairnessReconcile(t, h, measuring(5, 250))); diff != "" {
		t.Errorf("10 completions are too few to trust (-want +got):\n%s", diff)
	}
	// (250 × 30 + 750 × 30) / 60 = 500: premium 24 × 500 × 5 = 60000.
	want = fairnessOutcome{Fairness: tokens, Weight: 3,
		Pushed:           [][2]int64{{30000, 7500}, {120000, 12000}, {180000, 7200}},
		TokenServiceRate: 12 * 500,
		Status:           [][2]int64{{60000, 15000}, {240000, 24000}, {360000, 14400}},
		TokenRate:        "500", ObservedRate: "500"}
	if diff := cmp.Diff(want, fairnessReconcile(t, h, measuring(30, 250))); diff != "" {
		t.Errorf("measured (-want +got):\n%s", diff)
	}
	// 520 is within the 10% tolerance of 500: nothing moves.
	if diff := cmp.Diff(want, fairnessReconcile(t, h, measuring(30, 260))); diff != "" {
		t.Errorf("a small change is ignored (-want +got):\n%s", diff)
	}

	// Back to Requests mode and request bounds: none of the new fields
	// is pushed and the token status is cleared.
	pool := &v1alpha1.ModelPool{}
	pool.Namespace, pool.Name = seed.Namespace, seed.PoolName
	h.update(pool, func() {
		pool.Spec.Fairness = &v1alpha1.Fairness{Mode: v1alpha1.FairnessRequests, InputWeight: 1, OutputWeight: 2}
		pool.Spec.Tokens.BoundBy = v1alpha1.BoundByRequests
	})
	acme := &v1alpha1.TenantQuota{}
	acme.Namespace, acme.Name = seed.Namespace, "acme"
	h.update(acme, func() { acme.Spec.Weight = 1 })
	want = fairnessOutcome{Pushed: [][2]int64{{0, 0}, {0, 0}, {0, 0}}, Status: [][2]int64{{0, 0}, {0, 0}, {0, 0}}, ObservedRate: "500"}
	if diff := cmp.Diff(want, fairnessReconcile(t, h, measuring(30, 250))); diff != "" {
		t.Errorf("by requests again (-want +got):\n%s", diff)
	}
	for _, tg := range h.last.pushed {
		if _, dropped := tg.Policy.At(2); len(dropped) != 0 {
			t.Errorf("%s: revision 2 would lose %v", tg.Name, dropped)
		}
	}
}

// A revision-2 dispatcher is sent the policy without the fields of
// revision 3, and the pool says which it cannot enforce.
func TestReconcileNamesTheTokenFeaturesAnOlderDispatcherLoses(t *testing.T) {
	h := newBudgetHarness(t, fairnessWorld(v1alpha1.ServiceTimeDeclared))
	h.reconcile(nil)
	h.skewEvents()
	_, dropped := h.last.pushed[0].Policy.At(2)
	states := []PodState{
		{UID: "uid-d-0", Name: "d-0", SchemaKnown: true, SchemaVersion: 2, Dropped: dropped},
		{UID: "uid-d-1", Name: "d-1", SchemaKnown: true, SchemaVersion: policy.SchemaVersion},
	}
	h.reconcile(states)
	var pool v1alpha1.ModelPool
	if err := h.c.Get(context.Background(), seedKey, &pool); err != nil {
		t.Fatal(err)
	}
	c := meta.FindStatusCondition(pool.Status.Conditions, v1alpha1.ModelPoolDispatcherSkew)
	lost := "d-0: fairness, tokenServiceRate, tiers[].queueTokenBound, tiers[].tenantQueueTokenLimit, tenants[].weight"
	if c == nil || c.Reason != string(v1alpha1.ReasonFeaturesNotEnforced) || !strings.HasSuffix(c.Message, "which they cannot enforce: "+lost) {
		t.Errorf("DispatcherSkew %+v, want FeaturesNotEnforced ending %q", c, lost)
	}
	wantEvents := []string{"Warning FeaturesNotEnforced 1 dispatcher pod(s) cannot enforce fairness, tenants[].weight, tiers[].queueTokenBound, " +
		"tiers[].tenantQueueTokenLimit, tokenServiceRate (they read an older policy schema; upgrade them): " + lost}
	if diff := cmp.Diff(wantEvents, h.skewEvents()); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}
