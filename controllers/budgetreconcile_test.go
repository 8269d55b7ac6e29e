package controllers

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/api/v1alpha1"
	seed "github.com/tiergate/tiergate/capacity/capacitytest"
)

// budgetWorld is seedWorld (two dispatchers, Local mode) with budgets:
// premium's tenants 600 requests and 100000 tokens, acme 60001 tokens of
// its own.
func budgetWorld() []client.Object {
	objs := seedWorld()
	for _, o := range objs {
		switch x := o.(type) {
		case *v1alpha1.ServiceTier:
			if x.Name == "premium" {
				x.Spec.TenantLimits = &v1alpha1.Limits{RequestsPerMinute: 600, TokensPerMinute: 100000}
			}
		case *v1alpha1.TenantQuota:
			x.Spec.Limits = &v1alpha1.Limits{TokensPerMinute: 60001}
		}
	}
	return objs
}

// budgetOutcome is what a reconcile did with the budgets.
type budgetOutcome struct {
	// Pushed maps a pod to premium's tenantLimits and acme's limits in its
	// policy.
	Pushed      map[string][2]*policy.Limits
	Version     int64
	Limits      *v1alpha1.LimitsStatus // acme's status.limits
	QuotaWrites int
}

type budgetHarness struct {
	t           *testing.T
	c           client.Client
	r           *PoolReconciler
	rec         *events.FakeRecorder
	quotaWrites atomic.Int64 // the quotas' status writes run in parallel
	last        *fakePusher
}

func newBudgetHarness(t *testing.T, objs []client.Object) *budgetHarness {
	h := &budgetHarness{t: t, rec: events.NewFakeRecorder(50)}
	h.c = newFakeClient(t, objs, interceptor.Funcs{SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
		if _, ok := obj.(*v1alpha1.TenantQuota); ok {
			h.quotaWrites.Add(1)
		}
		return c.Status().Patch(ctx, obj, p, opts...)
	}})
	h.r = &PoolReconciler{Client: h.c, Recorder: h.rec, Clock: clocktesting.NewFakePassiveClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)),
		ResyncPeriod: time.Minute, MeasuredMinCompletions: 20, MeasuredTolerance: 0.1, UnreachableStrike: 3}
	return h
}

// reconcile runs one reconcile with the Pusher reporting states.
func (h *budgetHarness) reconcile(states []PodState) budgetOutcome {
	h.t.Helper()
	ctx := context.Background()
	h.quotaWrites.Store(0)
	h.last = &fakePusher{states: states}
	h.r.Pusher = h.last
	if _, err := h.r.Reconcile(ctx, ctrl.Request{NamespacedName: seedKey}); err != nil {
		h.t.Fatal(err)
	}
	got := budgetOutcome{Pushed: map[string][2]*policy.Limits{}, QuotaWrites: int(h.quotaWrites.Load())}
	for _, tg := range h.last.pushed {
		got.Version = tg.Policy.Version
		got.Pushed[tg.Name] = [2]*policy.Limits{tg.Policy.Tiers[0].TenantLimits, tg.Policy.Tenants[0].Limits}
	}
	var q v1alpha1.TenantQuota
	if err := h.c.Get(ctx, types.NamespacedName{Namespace: seed.Namespace, Name: "acme"}, &q); err != nil {
		h.t.Fatal(err)
	}
	got.Limits = q.Status.Limits
	return got
}

// events are the Warning FeaturesNotEnforced events since the last call.
func (h *budgetHarness) skewEvents() []string {
	var out []string
	for len(h.rec.Events) > 0 {
		if e := <-h.rec.Events; strings.HasPrefix(e, "Warning "+string(v1alpha1.ReasonFeaturesNotEnforced)) {
			out = append(out, e)
		}
	}
	return out
}

func (h *budgetHarness) update(obj client.Object, mut func()) {
	h.t.Helper()
	ctx := context.Background()
	if err := h.c.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
		h.t.Fatal(err)
	}
	mut()
	if err := h.c.Update(ctx, obj); err != nil {
		h.t.Fatal(err)
	}
}

// The reconciler pushes each dispatcher its part of the budgets, writes
// the quota's status.limits only when they change, and follows changes
// of the quota and of the tier.
func TestReconcilePushesAndReportsTheBudgets(t *testing.T) {
	h := newBudgetHarness(t, budgetWorld())
	lim := func(r, tk int64) *policy.Limits { return &policy.Limits{RequestsPerMinute: r, TokensPerMinute: tk} }
	split := func(rLo, rHi, tLo, tHi int64) *v1alpha1.LimitsSplit {
		s := &v1alpha1.LimitsSplit{Dispatchers: 2, TokensPerMinute: &v1alpha1.BudgetRange{Min: tLo, Max: tHi}}
		if rHi > 0 {
			s.RequestsPerMinute = &v1alpha1.BudgetRange{Min: rLo, Max: rHi}
		}
		return s
	}
	// d-0 comes first (same creation time, by name) and gets the odd token.
	want := budgetOutcome{Version: 1, QuotaWrites: 1,
		Pushed: map[string][2]*policy.Limits{"d-0": {lim(300, 50000), lim(0, 30001)}, "d-1": {lim(300, 50000), lim(0, 30000)}},
		Limits: &v1alpha1.LimitsStatus{RequestsPerMinute: 600, TokensPerMinute: 60001, Source: v1alpha1.LimitsFromBoth, PerDispatcher: split(300, 300, 30000, 30001)}}
	if diff := cmp.Diff(want, h.reconcile(nil)); diff != "" {
		t.Fatalf("first reconcile (-want +got):\n%s", diff)
	}
	want.QuotaWrites = 0
	if diff := cmp.Diff(want, h.reconcile(nil)); diff != "" {
		t.Fatalf("nothing changed: nothing written (-want +got):\n%s", diff)
	}

	acme := &v1alpha1.TenantQuota{}
	acme.Namespace, acme.Name = seed.Namespace, "acme"
	h.update(acme, func() { acme.Spec.Limits = &v1alpha1.Limits{TokensPerMinute: 90000} })
	want = budgetOutcome{Version: 2, QuotaWrites: 1,
		Pushed: map[string][2]*policy.Limits{"d-0": {lim(300, 50000), lim(0, 45000)}, "d-1": {lim(300, 50000), lim(0, 45000)}},
		Limits: &v1alpha1.LimitsStatus{RequestsPerMinute: 600, TokensPerMinute: 90000, Source: v1alpha1.LimitsFromBoth, PerDispatcher: split(300, 300, 45000, 45000)}}
	if diff := cmp.Diff(want, h.reconcile(nil)); diff != "" {
		t.Fatalf("acme's budget raised (-want +got):\n%s", diff)
	}

	premium := &v1alpha1.ServiceTier{}
	premium.Namespace, premium.Name = seed.Namespace, "premium"
	h.update(premium, func() { premium.Spec.TenantLimits = nil })
	h.update(acme, func() { acme.Spec.Limits = nil })
	want = budgetOutcome{Version: 3, QuotaWrites: 1, Pushed: map[string][2]*policy.Limits{"d-0": {nil, nil}, "d-1": {nil, nil}}}
	if diff := cmp.Diff(want, h.reconcile(nil)); diff != "" {
		t.Fatalf("every budget removed (-want +got):\n%s", diff)
	}
}

// An older dispatcher that loses budgets in use makes DispatcherSkew
// FeaturesNotEnforced with one Warning event naming the fields and the
// pod; the same state again records none, and once no budget is in use
// the condition is OlderDispatchers.
func TestReconcileWarnsOnceWhenOlderDispatchersLoseBudgets(t *testing.T) {
	h := newBudgetHarness(t, budgetWorld())
	h.reconcile(nil)
	h.skewEvents()
	// d-0 answered as revision 1; what it loses is what the Pusher works
	// out from its policy (pushqueue.go's record).
	older := func() []PodState {
		_, dropped := h.last.pushed[0].Policy.At(1)
		return []PodState{
			{UID: "uid-d-0", Name: "d-0", SchemaKnown: true, SchemaVersion: 1, Dropped: dropped},
			{UID: "uid-d-1", Name: "d-1", SchemaKnown: true, SchemaVersion: policy.SchemaVersion},
		}
	}
	skew := func() (string, string) {
		t.Helper()
		var pool v1alpha1.ModelPool
		if err := h.c.Get(context.Background(), seedKey, &pool); err != nil {
			t.Fatal(err)
		}
		c := meta.FindStatusCondition(pool.Status.Conditions, v1alpha1.ModelPoolDispatcherSkew)
		return string(c.Status) + "/" + c.Reason, c.Message
	}
	h.reconcile(older())
	gotCond, gotMsg := skew()
	if gotCond != "True/FeaturesNotEnforced" || !strings.HasSuffix(gotMsg, "which they cannot enforce: d-0: tiers[].tenantLimits, tenants[].limits") {
		t.Errorf("DispatcherSkew %s: %q", gotCond, gotMsg)
	}
	wantEvents := []string{"Warning FeaturesNotEnforced 1 dispatcher pod(s) cannot enforce tenants[].limits, tiers[].tenantLimits " +
		"(they read an older policy schema; upgrade them): d-0: tiers[].tenantLimits, tenants[].limits"}
	if diff := cmp.Diff(wantEvents, h.skewEvents()); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	h.reconcile(older())
	if got := h.skewEvents(); len(got) != 0 {
		t.Errorf("the same skew again recorded %q", got)
	}

	acme := &v1alpha1.TenantQuota{}
	acme.Namespace, acme.Name = seed.Namespace, "acme"
	h.update(acme, func() { acme.Spec.Limits = nil })
	premium := &v1alpha1.ServiceTier{}
	premium.Namespace, premium.Name = seed.Namespace, "premium"
	h.update(premium, func() { premium.Spec.TenantLimits = nil })
	h.reconcile(older()) // pushes the policy without budgets
	h.reconcile(older()) // the states of that push
	if gotCond, gotMsg = skew(); gotCond != "True/OlderDispatchers" || !strings.Contains(gotMsg, "d-0 (revision 1)") {
		t.Errorf("without budgets: DispatcherSkew %s: %q, want True/OlderDispatchers naming d-0 (revision 1)", gotCond, gotMsg)
	}
	if got := h.skewEvents(); len(got) != 0 {
		t.Errorf("without budgets: events %q", got)
	}
}
