package controllers

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/api/v1alpha1"
	seed "github.com/tiergate/tiergate/capacity/capacitytest"
)

// heldRow is what a reconcile at zero pushes and states.
type heldRow struct {
	Slots, Backends []int
	ColdStart       []float64
	Bounds          [][]int
	PoolReady       string
	Tiers           map[string]tierStatusRow
	MaxWait         map[string]string
}

func TestReconcileAtZeroHoldsForTheColdStart(t *testing.T) {
	// The seed's pool at zero with a cold start of 12s: pool-wide bounds
	// 0/5/12 (capacity's tests), halved for each of 2 dispatchers.
	held := heldRow{
		Slots: []int{0, 0}, Backends: []int{0, 0}, ColdStart: []float64{12, 12},
		Bounds:    [][]int{{0, 2, 6}, {0, 2, 6}},
		PoolReady: "HeldForColdStart",
		Tiers:     map[string]tierStatusRow{"premium": {0, "PoolNotReady"}, "standard": {5, "HeldForColdStart"}, "free": {12, "HeldForColdStart"}},
		MaxWait:   map[string]string{"premium": "", "standard": "1m43.5s", "free": "2m43.5s"},
	}
	// Without the Deployment no first replica is coming: refused, as
	// without a cold start, so every bound is 0.
	gone := heldRow{
		Slots: []int{0, 0}, Backends: []int{0, 0}, ColdStart: []float64{0, 0},
		Bounds:    [][]int{{0, 0, 0}, {0, 0, 0}},
		PoolReady: "DeploymentNotFound",
		Tiers:     map[string]tierStatusRow{"premium": {0, "PoolNotReady"}, "standard": {0, "PoolNotReady"}, "free": {0, "PoolNotReady"}},
		MaxWait:   map[string]string{"premium": "", "standard": "", "free": ""},
	}
	objs := seedWorld()
	objs[0].(*v1alpha1.ModelPool).Spec.ColdStart = seed.Duration(12 * time.Second)
	// The model pods are still Ready (the Deployment is scaling down), so
	// only the ready replica count says the pool is at zero.
	objs[1].(*appsv1.Deployment).Status.ReadyReplicas = 0
	ctx := context.Background()
	c := newFakeClient(t, objs, interceptor.Funcs{})
	r := &PoolReconciler{Client: c, Recorder: events.NewFakeRecorder(20), Clock: clocktesting.NewFakePassiveClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)),
		ResyncPeriod: time.Minute, MeasuredMinCompletions: 20, MeasuredTolerance: 0.1, UnreachableStrike: 3}
	for i, want := range []heldRow{held, gone} {
		if i == 1 {
			if err := c.Delete(ctx, objs[1]); err != nil {
				t.Fatal(err)
			}
		}
		p := &fakePusher{}
		r.Pusher = p
		res, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: seedKey})
		if err != nil {
			t.Fatal(err)
		}
		// While held the acks that carry the held requests come back at
		// least every heldResyncPeriod, not once a minute.
		if wantAfter := []time.Duration{heldResyncPeriod, time.Minute}[i]; res.RequeueAfter != wantAfter {
			t.Errorf("step %d: requeue after %s, want %s", i, res.RequeueAfter, wantAfter)
		}
		got := heldOutcome(ctx, t, c, p)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("step %d (-want +got):\n%s", i, diff)
		}
	}
}

func heldOutcome(ctx context.Context, t *testing.T, c client.Client, p *fakePusher) heldRow {
	t.Helper()
	got := heldRow{Tiers: map[string]tierStatusRow{}, MaxWait: map[string]string{}}
	for _, tg := range p.pushed {
		if err := tg.Policy.Validate(); err != nil {
			t.Errorf("%s: invalid policy: %v", tg.Name, err)
		}
		got.Slots = append(got.Slots, tg.Policy.Slots)
		got.Backends = append(got.Backends, len(tg.Policy.Backends))
		got.ColdStart = append(got.ColdStart, tg.Policy.ColdStartSeconds)
		got.Bounds = append(got.Bounds, queueBounds(tg.Policy))
	}
	var pool v1alpha1.ModelPool
	if err := c.Get(ctx, seedKey, &pool); err != nil {
		t.Fatal(err)
	}
	got.PoolReady = reasonOf(pool.Status.Conditions)
	var tiers v1alpha1.ServiceTierList
	if err := c.List(ctx, &tiers); err != nil {
		t.Fatal(err)
	}
	for _, tr := range tiers.Items {
		got.Tiers[tr.Name] = tierStatusRow{tr.Status.QueueBound, reasonOf(tr.Status.Conditions)}
		got.MaxWait[tr.Name] = ""
		if tr.Status.MaxWait != nil {
			got.MaxWait[tr.Name] = tr.Status.MaxWait.Duration.String()
		}
	}
	return got
}

func queueBounds(p policy.Policy) []int {
	var out []int
	for _, pt := range p.Tiers {
		out = append(out, pt.QueueBound)
	}
	return out
}
