package controllers

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/api/v1alpha1"
	"github.com/tiergate/tiergate/capacity"
	seed "github.com/tiergate/tiergate/capacity/capacitytest"
)

func TestFewerSlotsThanDispatchersCondition(t *testing.T) {
	b := func(replicas int32, n int) capacity.Bounds { return seedBounds(t, replicas, n) }
	views := func(names ...string) []dispatcherView {
		var out []dispatcherView
		for _, n := range names {
			out = append(out, dispatcherView{Name: n})
		}
		return out
	}
	idle := func(vs []dispatcherView, idx ...int) []dispatcherView {
		for _, i := range idx {
			vs[i].NoSlot = true
		}
		return vs
	}
	for name, tc := range map[string]struct {
		view poolView
		want condRow
	}{
		"every dispatcher holds slots": {
			view: poolView{Bounds: b(6, 2), Backends: 6, Dispatchers: views("d-0", "d-1")},
			want: everyDispatcherHoldsSlots,
		},
		"4 slots for 5 dispatchers": {
			view: poolView{Bounds: b(1, 5), Backends: 6, Dispatchers: idle(views("d-4", "d-3", "d-2", "d-1", "d-0"), 4)},
			want: condRow{"FewerSlotsThanDispatchers", "True", "FewerSlotsThanDispatchers",
				"1 of 5 healthy dispatchers holds no slot: the pool has 4 slots and Local mode gives each dispatcher a whole number of them; d-0 reports NotReady so the Service routes around it. " +
					"Set spec.sharedState: Redis to share every slot among all dispatchers, or run at most 4 dispatcher replicas"},
		},
		"a failing one is named and not counted as idle": {
			view: poolView{Bounds: b(1, 5), Backends: 6, Dispatchers: func() []dispatcherView {
				vs := idle(views("d-4", "d-3", "d-2", "d-1", "d-0"), 1)
				vs[1].Excluded = "CrashLoopBackOff"
				return vs
			}()},
			want: condRow{"FewerSlotsThanDispatchers", "False", "DispatchersHoldSlots", "no healthy dispatcher is left without a slot; failing, so holding no slot: d-3 (CrashLoopBackOff)"},
		},
		"two idle and one failing": {
			view: poolView{Bounds: b(1, 7), Backends: 6, Dispatchers: func() []dispatcherView {
				vs := idle(views("d-6", "d-5", "d-4", "d-3", "d-2", "d-1", "d-0"), 0, 5, 6)
				vs[0].Excluded = "restarted within the last 2m0s"
				return vs
			}()},
			want: condRow{"FewerSlotsThanDispatchers", "True", "FewerSlotsThanDispatchers",
				"2 of 6 healthy dispatchers hold no slot: the pool has 4 slots and Local mode gives each dispatcher a whole number of them; d-0, d-1 report NotReady so the Service routes around them. " +
					"Set spec.sharedState: Redis to share every slot among all dispatchers, or run at most 4 dispatcher replicas; failing, so holding no slot: d-6 (restarted within the last 2m0s)"},
		},
		"no backend: nobody holds a slot and nobody is idle for it": {
			view: poolView{Bounds: b(1, 5), Backends: 0, Dispatchers: idle(views("d-1", "d-0"), 0, 1)},
			want: everyDispatcherHoldsSlots,
		},
		"Redis mode": {
			view: poolView{Bounds: b(1, 5), Backends: 6, SharedState: v1alpha1.SharedStateRedis, Dispatchers: idle(views("d-1", "d-0"), 1)},
			want: everyDispatcherHoldsSlots,
		},
	} {
		t.Run(name, func(t *testing.T) {
			st := desiredPoolStatus(v1alpha1.ModelPoolStatus{}, tc.view, t0)
			got := condRows(st.Conditions)[v1alpha1.ModelPoolFewerSlotsThanDispatchers]
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// slotsWorld is the seed's pool on R ready replicas (4 slots each) with
// dispatchers d-0 … d-(n-1), d-0 the oldest.
func slotsWorld(replicas int32, n int) []client.Object {
	objs := seedWorld()
	objs = without(without(objs, &corev1.Pod{}, "d-0"), &corev1.Pod{}, "d-1")
	for _, o := range objs {
		if d, ok := o.(*appsv1.Deployment); ok {
			d.Status.ReadyReplicas = replicas
		}
	}
	created := time.Date(2025, 12, 1, 0, 0, 0, 0, time.UTC)
	for i := 0; i < n; i++ {
		p := readyPod(fmt.Sprintf("d-%d", i), fmt.Sprintf("10.1.0.%d", i+1), dispLabels)
		p.CreationTimestamp = metav1.NewTime(created.Add(time.Duration(i) * time.Minute))
		objs = append(objs, p)
	}
	return objs
}

// slotRow is one reconcile's split and FewerSlotsThanDispatchers.
type slotRow struct {
	Slots      map[string]int
	Order      []string // the targets' order: newest first
	Condition  string   // status/reason
	Events     []string
	RequeueMax time.Duration // the reconcile must come back within this
}

func (r *PoolReconciler) reconcileSlots(ctx context.Context, t *testing.T, c client.Client, rec *events.FakeRecorder) (slotRow, time.Duration) {
	t.Helper()
	p := &fakePusher{}
	r.Pusher = p
	res, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: seedKey})
	if err != nil {
		t.Fatal(err)
	}
	got := slotRow{Slots: map[string]int{}}
	for _, tg := range p.pushed {
		got.Slots[tg.Name] = tg.Policy.Slots
		got.Order = append(got.Order, tg.Name)
	}
	var pool v1alpha1.ModelPool
	if err := c.Get(ctx, seedKey, &pool); err != nil {
		t.Fatal(err)
	}
	if cond := meta.FindStatusCondition(pool.Status.Conditions, v1alpha1.ModelPoolFewerSlotsThanDispatchers); cond != nil {
		got.Condition = string(cond.Status) + "/" + cond.Reason
	}
	for len(rec.Events) > 0 {
		// The unprotected tenant header is the authentication tests' business.
		if e := <-rec.Events; !strings.HasPrefix(e, "Warning TenantHeaderUnprotected") {
			got.Events = append(got.Events, e)
		}
	}
	return got, res.RequeueAfter
}

// The newest dispatchers hold the slots when there are fewer slots than
// dispatchers; the pool says so; a crash-looping pod's share goes to the
// others at once, and the reconcile comes back when its hold-down ends.
func TestReconcileSplitsAmongHealthyDispatchers(t *testing.T) {
	ctx := context.Background()
	c := newFakeClient(t, slotsWorld(1, 5), interceptor.Funcs{})
	rec := events.NewFakeRecorder(20)
	clk := clocktesting.NewFakePassiveClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	r := &PoolReconciler{Client: c, Recorder: rec, Clock: clk, ResyncPeriod: time.Minute, MeasuredMinCompletions: 20, MeasuredTolerance: 0.1, UnreachableStrike: 3}
	fewer := "Warning FewerSlotsThanDispatchers 1 of 5 healthy dispatchers holds no slot: the pool has 4 slots and Local mode gives each dispatcher a whole number of them; " +
		"d-0 reports NotReady so the Service routes around it. Set spec.sharedState: Redis to share every slot among all dispatchers, or run at most 4 dispatcher replicas"
	horizon := "Warning AgeingHorizonExceedsClientTimeout ageing horizon 2m0s (6s per point × 20 points) exceeds clientTimeout 30s: " +
		"under sustained load of the top tier a request of the lowest tier expires before ageing lifts it, so the starvation guarantee is void"
	order := []string{"d-4", "d-3", "d-2", "d-1", "d-0"}

	got, _ := r.reconcileSlots(ctx, t, c, rec)
	want := slotRow{Slots: map[string]int{"d-0": 0, "d-1": 1, "d-2": 1, "d-3": 1, "d-4": 1}, Order: order,
		Condition: "True/FewerSlotsThanDispatchers", Events: []string{horizon, fewer}}
	if diff := cmp.Diff(want, got, cmpopts.EquateEmpty()); diff != "" {
		t.Fatalf("4 slots, 5 dispatchers (-want +got):\n%s", diff)
	}

	// d-2 crash-loops: d-0, idle so far, takes its slot.
	var d2 corev1.Pod
	if err := c.Get(ctx, types.NamespacedName{Namespace: seed.Namespace, Name: "d-2"}, &d2); err != nil {
		t.Fatal(err)
	}
	d2.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "dispatcher", RestartCount: 3,
		State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}}}
	setPodReadyFalse(&d2)
	if err := c.Status().Update(ctx, &d2); err != nil {
		t.Fatal(err)
	}
	clk.SetTime(clk.Now().Add(time.Second))
	got, requeue := r.reconcileSlots(ctx, t, c, rec)
	want = slotRow{Slots: map[string]int{"d-0": 1, "d-1": 1, "d-2": 0, "d-3": 1, "d-4": 1}, Order: order,
		Condition: "False/DispatchersHoldSlots", Events: []string{"Warning DispatcherExcluded d-2 (CrashLoopBackOff) is failing: it holds no slot and its share goes to the other dispatchers"}}
	if diff := cmp.Diff(want, got, cmpopts.EquateEmpty()); diff != "" {
		t.Fatalf("d-2 crash-looping (-want +got):\n%s", diff)
	}
	if requeue <= 0 || requeue > defaultHealthTuning.HoldDownBase {
		t.Errorf("requeue after %s, want within the hold-down %s", requeue, defaultHealthTuning.HoldDownBase)
	}
}

func setPodReadyFalse(p *corev1.Pod) {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == corev1.PodReady {
			p.Status.Conditions[i].Status = corev1.ConditionFalse
		}
	}
}

// A pool with no slots pushes no backends, so no dispatcher mistakes its 0
// slots for a missing share (and reports NotReady, as all would); with
// slots but no Ready backend the backends stay empty and the slots go to 0.
func TestServablePolicies(t *testing.T) {
	withBackends := func(b capacity.Bounds, n int) capacity.Bounds {
		for i := range b.Policies {
			for j := 0; j < n; j++ {
				b.Policies[i].Backends = append(b.Policies[i].Backends, policy.Backend{Address: fmt.Sprintf("10.0.0.%d:8000", j+1)})
			}
		}
		return b
	}
	type row struct{ Slots, Backends int }
	for name, tc := range map[string]struct {
		b        capacity.Bounds
		backends int
		want     []row
	}{
		"slots and backends":                           {withBackends(seedBounds(t, 6, 2), 6), 6, []row{{12, 6}, {12, 6}}},
		"fewer slots than dispatchers":                 {withBackends(seedBounds(t, 1, 5), 6), 6, []row{{1, 6}, {1, 6}, {1, 6}, {1, 6}, {0, 6}}},
		"no Ready backend":                             {seedBounds(t, 6, 2), 0, []row{{0, 0}, {0, 0}}},
		"no ready replica, pods that still look Ready": {withBackends(seedBounds(t, 0, 2), 2), 2, []row{{0, 0}, {0, 0}}},
	} {
		t.Run(name, func(t *testing.T) {
			var got []row
			for _, p := range servablePolicies(tc.b, tc.backends) {
				got = append(got, row{p.Slots, len(p.Backends)})
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}
