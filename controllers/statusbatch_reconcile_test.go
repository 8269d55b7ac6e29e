package controllers

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/tiergate/tiergate/api/v1alpha1"
	seed "github.com/tiergate/tiergate/capacity/capacitytest"
)

// TestScaleWritesPeopleStatusOnce: a scale-up 3 → 6 whose pods turn Ready
// one by one goes through a policy version per pod, each persisted in the
// pool's status before its push, but the tiers' and the quota's statuses
// are written once, when the Deployment has settled (and the quota a
// quiet second later), with one ScaledPool and one ScaledBounds event from
// the scale before to the scale after. Before, every version wrote every
// tier and (at the latest 5 s on) every quota and recorded both events.
func TestScaleWritesPeopleStatusOnce(t *testing.T) {
	ctx := context.Background()
	objs := seedWorld()
	for _, o := range objs {
		switch o := o.(type) {
		case *appsv1.Deployment:
			o.Spec.Replicas = ptr.To[int32](3)
			o.Status = appsv1.DeploymentStatus{Replicas: 3, ReadyReplicas: 3}
		case *corev1.Pod:
			if n := o.Name; n == "vllm-3" || n == "vllm-4" || n == "vllm-5" {
				o.Status.Conditions[0].Status = corev1.ConditionFalse
			}
		}
	}
	var mu sync.Mutex
	writes := map[string]int{}
	c := newFakeClient(t, objs, interceptor.Funcs{SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
		mu.Lock()
		writes[fmt.Sprintf("%T", obj)]++
		mu.Unlock()
		return c.Status().Patch(ctx, obj, p, opts...)
	}})
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	rec := events.NewFakeRecorder(50)
	r := &PoolReconciler{Client: c, Recorder: rec, Clock: clk, Pusher: &fakePusher{},
		ResyncPeriod: time.Minute, MeasuredMinCompletions: 20, MeasuredTolerance: 0.1, UnreachableStrike: 3,
		quotaStatus: newStatusBatches(logr.Discard(), clk)}
	// runDue writes the batches due, as the worker would.
	runDue := func() {
		for {
			_, write, _, ok := r.quotaStatus.next(clk.Now())
			if !ok {
				return
			}
			if err := write(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	reconcile := func(step string) {
		t.Helper()
		if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: seedKey}); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		clk.Step(300 * time.Millisecond)
		runDue()
	}
	// drain takes the Normal events (the Warnings are the seed pool's
	// own, tested elsewhere).
	drain := func() (got []string) {
		for len(rec.Events) > 0 {
			if e := <-rec.Events; strings.HasPrefix(e, corev1.EventTypeNormal) {
				got = append(got, e)
			}
		}
		return got
	}
	type tally struct {
		Pool, Tiers, Quotas int
		Events              []string
	}
	take := func() tally {
		mu.Lock()
		defer mu.Unlock()
		got := tally{writes["*v1alpha1.ModelPool"], writes["*v1alpha1.ServiceTier"], writes["*v1alpha1.TenantQuota"], drain()}
		clear(writes)
		return got
	}
	check := func(step string, want tally) {
		t.Helper()
		if diff := cmp.Diff(want, take()); diff != "" {
			t.Errorf("%s: writes and events (-want +got):\n%s", step, diff)
		}
	}

	reconcile("settled at 3")
	clk.Step(time.Second)
	runDue()
	check("settled at 3", tally{Pool: 1, Tiers: 3, Quotas: 1})

	update := func(obj client.Object, f func()) {
		t.Helper()
		if err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			t.Fatal(err)
		}
		f()
		if err := c.Update(ctx, obj); err != nil {
			t.Fatal(err)
		}
		f() // Update left the stored status in obj
		if err := c.Status().Update(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	dep := &appsv1.Deployment{}
	dep.Namespace, dep.Name = seed.Namespace, "vllm"
	update(dep, func() { dep.Spec.Replicas, dep.Status.Replicas = ptr.To[int32](6), 6 })
	reconcile("kubectl scale 3 → 6")
	for i := 3; i < 6; i++ {
		pod := &corev1.Pod{}
		pod.Namespace, pod.Name = seed.Namespace, fmt.Sprintf("vllm-%d", i)
		update(pod, func() { pod.Status.Conditions[0].Status = corev1.ConditionTrue })
		update(dep, func() { dep.Status.ReadyReplicas = int32(i + 1) })
		reconcile(fmt.Sprintf("%d Ready", i+1))
	}
	// Three versions (4, 5 and 6 replicas), each in the pool's status;
	// the tiers at once when settled, the quota a quiet second later.
	check("up to 6, before the quiet second", tally{Pool: 3, Tiers: 3, Events: []string{
		"Normal ScaledPool pool concurrency 12→24 (3→6 ready replicas)",
		"Normal ScaledBounds premium 10→20, standard 40→80, free 60→120",
	}})
	clk.Step(time.Second)
	runDue()
	check("up to 6, after the quiet second", tally{Quotas: 1})

	// Nothing changes: nothing is written.
	reconcile("resync")
	clk.Step(time.Minute)
	runDue()
	check("nothing changed", tally{})
	var q v1alpha1.TenantQuota
	if err := c.Get(ctx, client.ObjectKey{Namespace: seed.Namespace, Name: "acme"}, &q); err != nil {
		t.Fatal(err)
	}
	if q.Status.EffectiveConcurrencyLimit == 0 {
		t.Errorf("acme's effectiveConcurrencyLimit is 0 after the scale")
	}
}

// TestNewQuotaStatusUnderResyncs: a quota whose status was never written
// is written a quiet second after it appears although the pool is
// reconciled every 500 ms (as with --resync-period 500ms) and each second
// stamps its Ready condition anew: the stamp is no change.
func TestNewQuotaStatusUnderResyncs(t *testing.T) {
	ctx := context.Background()
	var mu sync.Mutex
	quotaWrites := 0
	c := newFakeClient(t, seedWorld(), interceptor.Funcs{SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
		if _, ok := obj.(*v1alpha1.TenantQuota); ok {
			mu.Lock()
			quotaWrites++
			mu.Unlock()
		}
		return c.Status().Patch(ctx, obj, p, opts...)
	}})
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 700_000_000, time.UTC))
	r := &PoolReconciler{Client: c, Recorder: events.NewFakeRecorder(50), Clock: clk, Pusher: &fakePusher{},
		ResyncPeriod: time.Minute, MeasuredMinCompletions: 20, MeasuredTolerance: 0.1, UnreachableStrike: 3,
		quotaStatus: newStatusBatches(logr.Discard(), clk)}
	var got []time.Duration
	start := clk.Now()
	for range 8 {
		if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: seedKey}); err != nil {
			t.Fatal(err)
		}
		clk.Step(500 * time.Millisecond)
		for {
			_, write, _, ok := r.quotaStatus.next(clk.Now())
			if !ok {
				break
			}
			if err := write(ctx); err != nil {
				t.Fatal(err)
			}
			got = append(got, clk.Since(start))
		}
	}
	// Written once, at the first look a second after the first reconcile;
	// the batches after it find nothing to write.
	if diff := cmp.Diff([]time.Duration{time.Second}, got[:1]); diff != "" {
		t.Errorf("first batch written at (-want +got):\n%s", diff)
	}
	mu.Lock()
	defer mu.Unlock()
	if quotaWrites != 1 {
		t.Errorf("acme's status written %d times, want once", quotaWrites)
	}
}
