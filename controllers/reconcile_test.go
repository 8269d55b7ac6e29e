package controllers

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/tiergate/tiergate/api/v1alpha1"
	seed "github.com/tiergate/tiergate/capacity/capacitytest"
)

// fakePusher records what the reconciler hands the Pusher and answers
// States with what the test says the dispatchers reported.
type fakePusher struct {
	states []PodState
	synced bool
	pushed []Target
	resync bool
	forgot []types.NamespacedName
}

func (f *fakePusher) Sync(_ types.NamespacedName, targets []Target, resync bool) {
	f.synced, f.pushed, f.resync = true, targets, resync
}

func (f *fakePusher) Forget(pool types.NamespacedName) { f.forgot = append(f.forgot, pool) }

func (f *fakePusher) States(types.NamespacedName) []PodState { return f.states }

var (
	seedKey     = types.NamespacedName{Namespace: seed.Namespace, Name: seed.PoolName}
	modelLabels = map[string]string{"app": "vllm"}
	dispLabels  = map[string]string{"app": "dispatcher"}
)

func readyPod(name, ip string, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: seed.Namespace, Name: name, Labels: labels, UID: types.UID("uid-" + name)},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
}

// seedWorld is the seed's pool on 6 ready replicas with 2 dispatchers,
// its three tiers and one quota.
func seedWorld() []client.Object {
	pool := seed.Pool(seed.WithClientTimeout(30 * time.Second))
	pool.Spec.Dispatchers.Selector = metav1.LabelSelector{MatchLabels: dispLabels}
	pool.Generation = 1
	objs := []client.Object{pool, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: seed.Namespace, Name: "vllm"},
		Spec:       appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: modelLabels}},
		Status:     appsv1.DeploymentStatus{Replicas: 6, ReadyReplicas: 6},
	}}
	for i := range 6 {
		objs = append(objs, readyPod(fmt.Sprintf("vllm-%d", i), fmt.Sprintf("10.0.0.%d", i+1), modelLabels))
	}
	objs = append(objs, readyPod("d-0", "10.1.0.1", dispLabels), readyPod("d-1", "10.1.0.2", dispLabels))
	for _, t := range seed.Tiers() {
		objs = append(objs, &t)
	}
	acme := seed.Quota("acme", "acme", "premium", nil)
	return append(objs, &acme)
}

func without(objs []client.Object, kind client.Object, name string) []client.Object {
	var out []client.Object
	for _, o := range objs {
		if fmt.Sprintf("%T", o) == fmt.Sprintf("%T", kind) && o.GetName() == name {
			continue
		}
		out = append(out, o)
	}
	return out
}

// newFakeClient serves objs with the status subresources and field indexes
// of the real cache; funcs intercept calls.
func newFakeClient(t *testing.T, objs []client.Object, funcs interceptor.Funcs) client.Client {
	t.Helper()
	b := fake.NewClientBuilder().WithScheme(testScheme(t)).WithObjects(objs...).
		WithStatusSubresource(&v1alpha1.ModelPool{}, &v1alpha1.ServiceTier{}, &v1alpha1.TenantQuota{}).
		WithInterceptorFuncs(funcs)
	for _, ix := range fieldIndexes {
		b = b.WithIndex(ix.obj, ix.field, ix.extract)
	}
	return b.Build()
}

// outcome is what one reconcile leaves behind, in the terms of the API.
type outcome struct {
	Err string // "", "conflict", "terminal", "requeued" (a quiet retry) or the error
	// Pool is the pool's status: version, P and the Ready reason; zero
	// when the pool does not exist.
	Pool   poolRow
	Synced bool
	Pushed []pushRow
	Forgot bool
	Tiers  map[string]tierStatusRow
	Quotas map[string]string // quota -> Ready reason
	Events []string
	// StatusWrites counts status patches of this reconcile.
	StatusWrites int
}

type poolRow struct {
	Version     int64
	Concurrency int32
	Ready       string
}

type pushRow struct {
	Pod, Address string
	Version      int64
	Slots        int
	// Bounds are the queue bounds of premium, standard and free.
	Bounds []int
}

type tierStatusRow struct {
	Bound int32
	Ready string
}

// step is one reconcile: change runs first, then the reconcile, whose
// outcome must be want.
type step struct {
	change func(ctx context.Context, c client.Client) error
	states []PodState
	want   outcome
}

func reasonOf(conds []metav1.Condition) string {
	if c := meta.FindStatusCondition(conds, v1alpha1.ConditionReady); c != nil {
		return c.Reason
	}
	return ""
}

func errKind(err error) string {
	switch {
	case err == nil:
		return ""
	case apierrors.IsConflict(err):
		return "conflict"
	case errors.Is(err, reconcile.TerminalError(nil)):
		return "terminal"
	}
	return err.Error()
}

// observeOutcome reads back what the reconcile left in the store and
// handed the Pusher.
func observeOutcome(ctx context.Context, t *testing.T, c client.Client, p *fakePusher, rec *events.FakeRecorder, err error, writes int) outcome {
	t.Helper()
	got := outcome{Err: errKind(err), Synced: p.synced, Forgot: len(p.forgot) > 0, StatusWrites: writes,
		Tiers: map[string]tierStatusRow{}, Quotas: map[string]string{}}
	// List, not Get: staleCache serves the reconciler's Gets.
	var pools v1alpha1.ModelPoolList
	if err := c.List(ctx, &pools); err != nil {
		t.Fatal(err)
	}
	for _, pool := range pools.Items {
		got.Pool = poolRow{pool.Status.PolicyVersion, pool.Status.PoolConcurrency, reasonOf(pool.Status.Conditions)}
	}
	for _, tg := range p.pushed {
		row := pushRow{Pod: tg.Name, Address: tg.Address, Version: tg.Policy.Version, Slots: tg.Policy.Slots}
		for _, pt := range tg.Policy.Tiers {
			row.Bounds = append(row.Bounds, pt.QueueBound)
		}
		got.Pushed = append(got.Pushed, row)
	}
	var tiers v1alpha1.ServiceTierList
	var quotas v1alpha1.TenantQuotaList
	if err := c.List(ctx, &tiers); err != nil {
		t.Fatal(err)
	}
	if err := c.List(ctx, &quotas); err != nil {
		t.Fatal(err)
	}
	for _, tr := range tiers.Items {
		got.Tiers[tr.Name] = tierStatusRow{tr.Status.QueueBound, reasonOf(tr.Status.Conditions)}
	}
	for _, q := range quotas.Items {
		got.Quotas[q.Name] = reasonOf(q.Status.Conditions)
	}
	for len(rec.Events) > 0 {
		got.Events = append(got.Events, <-rec.Events)
	}
	return got
}

// conflictOnce makes the first status write of a ModelPool fail with a
// Conflict, as when the cache is behind the pool's last write.
func conflictOnce() interceptor.Funcs {
	done := false
	return interceptor.Funcs{SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
		if _, ok := obj.(*v1alpha1.ModelPool); ok && !done {
			done = true
			return apierrors.NewConflict(schema.GroupResource{Group: "tiergate.dev", Resource: "modelpools"}, obj.GetName(), errors.New("the object has been modified"))
		}
		return c.Status().Patch(ctx, obj, patch, opts...)
	}}
}

// staleCache serves every Get of a ModelPool with the pool as the first Get
// saw it, as a cache that never catches up with the status writes would.
func staleCache() interceptor.Funcs {
	var first *v1alpha1.ModelPool
	return interceptor.Funcs{Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
		p, ok := obj.(*v1alpha1.ModelPool)
		switch {
		case !ok:
			return c.Get(ctx, key, obj, opts...)
		case first != nil:
			first.DeepCopyInto(p)
			return nil
		}
		if err := c.Get(ctx, key, obj, opts...); err != nil {
			return err
		}
		first = p.DeepCopy()
		return nil
	}}
}

func TestPoolReconcile(t *testing.T) {
	twoDispatchers := func(version int64, slots int, bounds ...int) []pushRow {
		return []pushRow{
			{Pod: "d-0", Address: "10.1.0.1:9090", Version: version, Slots: slots, Bounds: bounds},
			{Pod: "d-1", Address: "10.1.0.2:9090", Version: version, Slots: slots, Bounds: bounds},
		}
	}
	seedTiers := map[string]tierStatusRow{"premium": {20, "BoundsComputed"}, "standard": {80, "BoundsComputed"}, "free": {120, "BoundsComputed"}}
	first := outcome{Pool: poolRow{1, 24, "PoolReady"}, Synced: true, Pushed: twoDispatchers(1, 12, 10, 40, 60),
		Tiers: seedTiers, Quotas: map[string]string{"acme": "Active"}, StatusWrites: 5,
		Events: []string{"Warning AgeingHorizonExceedsClientTimeout ageing horizon 2m0s (6s per point × 20 points) exceeds clientTimeout 30s: " +
			"under sustained load of the top tier a request of the lowest tier expires before ageing lifts it, so the starvation guarantee is void",
			"Warning TenantHeaderUnprotected any client that reaches the dispatchers can name any tenant in the X-Tenant-ID header; " +
				"set spec.authentication.trustedSources to the CIDRs of the gateway that sets it (for example 10.0.12.0/24), or use mode APIKey or JWT"}}
	tests := map[string]struct {
		objs  []client.Object
		funcs interceptor.Funcs
		steps []step
	}{
		"the seed's pool: version 1 is written, then pushed, each dispatcher with half": {
			objs:  seedWorld(),
			steps: []step{{want: first}},
		},
		"nothing changed: the version stays and nothing is written": {
			objs: seedWorld(),
			steps: []step{{want: first}, {
				want: outcome{Pool: poolRow{1, 24, "PoolReady"}, Synced: true, Pushed: twoDispatchers(1, 12, 10, 40, 60),
					Tiers: seedTiers, Quotas: map[string]string{"acme": "Active"}},
			}},
		},
		"a tier change bumps the version and pushes the new bounds": {
			objs: seedWorld(),
			steps: []step{{want: first}, {
				change: func(ctx context.Context, c client.Client) error {
					var premium v1alpha1.ServiceTier
					if err := c.Get(ctx, types.NamespacedName{Namespace: seed.Namespace, Name: "premium"}, &premium); err != nil {
						return err
					}
					premium.Spec.TolerableWait.Duration = 10 * time.Second // L 20→40
					return c.Update(ctx, &premium)
				},
				want: outcome{Pool: poolRow{2, 24, "PoolReady"}, Synced: true, Pushed: twoDispatchers(2, 12, 20, 40, 60),
					Tiers: map[string]tierStatusRow{"premium": {40, "BoundsComputed"}, "standard": {80, "BoundsComputed"}, "free": {120, "BoundsComputed"}},
					// ΣL moves every tier's maxWait, so all three are written.
					Quotas: map[string]string{"acme": "Active"}, StatusWrites: 4, Events: []string{"Normal ScaledBounds premium 20→40"}},
			}},
		},
		"a dispatcher holding a later version (a restarted controller) is overtaken": {
			objs: seedWorld(),
			steps: []step{{
				states: []PodState{{UID: "uid-d-0", Name: "d-0", HeldVersion: 7}},
				want: func() outcome {
					o := first
					o.Pool.Version, o.Pushed = 8, twoDispatchers(8, 12, 10, 40, 60)
					return o
				}(),
			}},
		},
		"status conflict: requeued without an error, nothing is pushed, the retry writes and pushes version 1": {
			objs:  seedWorld(),
			funcs: conflictOnce(),
			steps: []step{
				{want: outcome{Err: "requeued", Tiers: map[string]tierStatusRow{"premium": {}, "standard": {}, "free": {}},
					Quotas: map[string]string{"acme": ""}, StatusWrites: 1}},
				{want: func() outcome { o := first; o.StatusWrites = 5; return o }()},
			},
		},
		"a cache behind the controller's own write: the reconcile starts from that write, so nothing is written and version 1 stays": {
			objs:  seedWorld(),
			funcs: staleCache(),
			steps: []step{{want: first}, {
				want: outcome{Pool: poolRow{1, 24, "PoolReady"}, Synced: true, Pushed: twoDispatchers(1, 12, 10, 40, 60),
					Tiers: seedTiers, Quotas: map[string]string{"acme": "Active"}},
			}},
		},
		"a cache behind someone else's write: a version within the reserved block is pushed, the store refuses the status write and keeps its status, and the retry is quiet": {
			objs:  seedWorld(),
			funcs: staleCache(),
			steps: []step{{want: first}, {
				change: func(ctx context.Context, c client.Client) error {
					// Another writer moves the pool on past the controller's
					// write, and a model pod goes, so there is a status to write.
					var pools v1alpha1.ModelPoolList
					if err := c.List(ctx, &pools); err != nil {
						return err
					}
					pool := pools.Items[0]
					pool.Labels = map[string]string{"moved": "on"}
					if err := c.Update(ctx, &pool); err != nil {
						return err
					}
					return c.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: seed.Namespace, Name: "vllm-5"}})
				},
				want: outcome{Err: "requeued", Pool: poolRow{1, 24, "PoolReady"}, Synced: true, Pushed: twoDispatchers(2, 10, 8, 33, 50),
					Tiers: seedTiers, Quotas: map[string]string{"acme": "Active"}, StatusWrites: 1},
			}},
		},
		"deleted Deployment: 0 slots pushed under a new version, bounds 0": {
			objs: seedWorld(),
			steps: []step{{want: first}, {
				change: func(ctx context.Context, c client.Client) error {
					return c.Delete(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: seed.Namespace, Name: "vllm"}})
				},
				want: outcome{Pool: poolRow{2, 0, "DeploymentNotFound"}, Synced: true, Pushed: twoDispatchers(2, 0, 0, 0, 0),
					Tiers: map[string]tierStatusRow{"premium": {0, "PoolNotReady"}, "standard": {0, "PoolNotReady"}, "free": {0, "PoolNotReady"}},
					// The pool, the tiers, and acme's limit of 6 falls to 1.
					Quotas: map[string]string{"acme": "Active"}, StatusWrites: 5,
					Events: []string{"Normal ScaledPool pool concurrency 24→0 (6→0 ready replicas)", "Normal ScaledBounds premium 20→0, standard 80→0, free 120→0"}},
			}},
		},
		"orphaned tier: a pool that never existed marks its tiers and their quotas": {
			objs: without(seedWorld(), &v1alpha1.ModelPool{}, seed.PoolName),
			steps: []step{{want: outcome{Forgot: true, StatusWrites: 4,
				Tiers:  map[string]tierStatusRow{"premium": {0, "PoolNotFound"}, "standard": {0, "PoolNotFound"}, "free": {0, "PoolNotFound"}},
				Quotas: map[string]string{"acme": "PoolNotFound"}}}},
		},
		"orphaned tier: deleting the pool stops its pushes and marks its tiers": {
			objs: seedWorld(),
			steps: []step{{want: first}, {
				change: func(ctx context.Context, c client.Client) error {
					return c.Delete(ctx, seed.Pool())
				},
				want: outcome{Forgot: true, StatusWrites: 4,
					Tiers:  map[string]tierStatusRow{"premium": {0, "PoolNotFound"}, "standard": {0, "PoolNotFound"}, "free": {0, "PoolNotFound"}},
					Quotas: map[string]string{"acme": "PoolNotFound"}},
			}},
		},
		"no tiers: the status says so and nothing is pushed": {
			objs: func() []client.Object {
				objs := seedWorld()
				for _, n := range []string{"premium", "standard", "free"} {
					objs = without(objs, &v1alpha1.ServiceTier{}, n)
				}
				return without(objs, &v1alpha1.TenantQuota{}, "acme")
			}(),
			steps: []step{{want: outcome{Pool: poolRow{1, 24, "NoTiers"}, Synced: true, StatusWrites: 1,
				Tiers: map[string]tierStatusRow{}, Quotas: map[string]string{}, Events: first.Events[1:]}}},
		},
		"a spec written around the schema is a terminal error": {
			objs: func() []client.Object {
				objs := without(seedWorld(), &v1alpha1.ModelPool{}, seed.PoolName)
				return append(objs, seed.Pool(func(p *v1alpha1.ModelPool) { p.Spec.ConcurrencyPerReplica = 0 }))
			}(),
			steps: []step{{want: outcome{Err: "terminal",
				Tiers:  map[string]tierStatusRow{"premium": {}, "standard": {}, "free": {}},
				Quotas: map[string]string{"acme": ""}}}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			var writes atomic.Int64 // the tiers' and quotas' writes run in parallel
			funcs := tc.funcs
			patch := funcs.SubResourcePatch
			funcs.SubResourcePatch = func(ctx context.Context, c client.Client, sub string, obj client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
				writes.Add(1)
				if patch != nil {
					return patch(ctx, c, sub, obj, p, opts...)
				}
				return c.Status().Patch(ctx, obj, p, opts...)
			}
			c := newFakeClient(t, tc.objs, funcs)
			rec := events.NewFakeRecorder(20)
			r := &PoolReconciler{Client: c, Recorder: rec, Clock: clocktesting.NewFakePassiveClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)),
				ResyncPeriod: time.Minute, MeasuredMinCompletions: 20, MeasuredTolerance: 0.1, UnreachableStrike: 3}
			for i, s := range tc.steps {
				if s.change != nil {
					if err := s.change(ctx, c); err != nil {
						t.Fatal(err)
					}
				}
				p := &fakePusher{states: s.states}
				r.Pusher = p
				writes.Store(0)
				res, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: seedKey})
				got := observeOutcome(ctx, t, c, p, rec, err, int(writes.Load()))
				if err == nil && res.RequeueAfter == conflictRequeue {
					got.Err = "requeued"
				}
				if diff := cmp.Diff(s.want, got, cmpopts.EquateEmpty()); diff != "" {
					t.Errorf("step %d (-want +got):\n%s", i, diff)
				}
			}
		})
	}
}

func TestQuotaReconcile(t *testing.T) {
	acme := seed.Quota("acme", "acme", "premium", ptr.To[int32](3))
	orphan := seed.Quota("orphan", "initech", "gold", nil)
	tests := map[string]struct {
		objs       []client.Object
		quota      string
		wantReason string // "" when the status is not written
		wantLimit  int32
		wantWrites int
	}{
		"the tier exists: the pool reconciler owns the status": {
			objs:  []client.Object{&acme, func() *v1alpha1.ServiceTier { t := seed.Tier("premium", 0, 5*time.Second, "0.25"); return &t }()},
			quota: "acme",
		},
		"the tier is gone: TierNotFound and no limit": {
			objs: []client.Object{&orphan}, quota: "orphan", wantReason: "TierNotFound", wantWrites: 1,
		},
		"the quota is gone: nothing to do": {
			quota: "acme",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			writes := 0
			c := newFakeClient(t, tc.objs, interceptor.Funcs{SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
				writes++
				return c.Status().Patch(ctx, obj, p, opts...)
			}})
			r := &QuotaReconciler{Client: c, Clock: clocktesting.NewFakePassiveClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))}
			key := types.NamespacedName{Namespace: seed.Namespace, Name: tc.quota}
			res, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: key})
			if err != nil || res != (ctrl.Result{}) {
				t.Fatalf("Reconcile = %+v, %v; want no requeue and no error", res, err)
			}
			var q v1alpha1.TenantQuota
			if err := c.Get(ctx, key, &q); client.IgnoreNotFound(err) != nil {
				t.Fatal(err)
			}
			got := []any{reasonOf(q.Status.Conditions), q.Status.EffectiveConcurrencyLimit, writes}
			if diff := cmp.Diff([]any{tc.wantReason, tc.wantLimit, tc.wantWrites}, got); diff != "" {
				t.Errorf("reason, limit, writes (-want +got):\n%s", diff)
			}
		})
	}
}

// The periodic resync comes a period after the last resync or the last
// new version, whichever is later: a new version is pushed to every pod,
// so a resync soon after it would only make each re-apply it.
func TestResyncIsAPeriodAfterTheLastNewVersion(t *testing.T) {
	ctx := context.Background()
	objs := seedWorld()
	c := newFakeClient(t, objs, interceptor.Funcs{})
	clk := clocktesting.NewFakePassiveClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	p := &fakePusher{}
	r := &PoolReconciler{Client: c, Recorder: events.NewFakeRecorder(100), Clock: clk, Pusher: p,
		ResyncPeriod: time.Minute, MeasuredMinCompletions: 20, MeasuredTolerance: 0.1, UnreachableStrike: 3}
	type step struct {
		at         time.Duration // since the start
		deletePod  string        // a model pod deleted before the reconcile
		wantResync bool
		wantAfter  time.Duration
	}
	steps := []step{
		{at: 0, wantAfter: time.Minute}, // the first version: every pod is pushed
		{at: 50 * time.Second, deletePod: "vllm-5", wantAfter: time.Minute},
		{at: 70 * time.Second, wantAfter: 40 * time.Second}, // a minute after the first, 20 s after the new version
		{at: 110 * time.Second, wantResync: true, wantAfter: time.Minute},
	}
	start := clk.Now()
	var versions []int64
	for i, s := range steps {
		clk.SetTime(start.Add(s.at))
		if s.deletePod != "" {
			if err := c.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: seed.Namespace, Name: s.deletePod}}); err != nil {
				t.Fatal(err)
			}
		}
		res, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: seedKey})
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if p.resync != s.wantResync || res.RequeueAfter != s.wantAfter {
			t.Errorf("step %d at +%s: resync %v, requeue after %s; want %v, %s", i, s.at, p.resync, res.RequeueAfter, s.wantResync, s.wantAfter)
		}
		versions = append(versions, p.pushed[0].Policy.Version)
	}
	if diff := cmp.Diff([]int64{1, 2, 2, 2}, versions); diff != "" {
		t.Errorf("versions pushed (-want +got):\n%s", diff)
	}
}

// A status change (the dispatchers' acks, a new version within the
// reserved block) waits up to StatusDelay for its write, or
// movingStatusDelay while replicas are on their way, and the pool is
// requeued for it; only the version that needs a new block is written at
// once, before it is pushed.
func TestPoolStatusWaits(t *testing.T) {
	ctx := context.Background()
	writes := 0
	c := newFakeClient(t, seedWorld(), interceptor.Funcs{SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
		if _, ok := obj.(*v1alpha1.ModelPool); ok {
			writes++
		}
		return c.Status().Patch(ctx, obj, p, opts...)
	}})
	clk := clocktesting.NewFakePassiveClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	p := &fakePusher{}
	r := &PoolReconciler{Client: c, Recorder: events.NewFakeRecorder(100), Clock: clk, Pusher: p, StatusDelay: 500 * time.Millisecond,
		ResyncPeriod: time.Minute, MeasuredMinCompletions: 20, MeasuredTolerance: 0.1, UnreachableStrike: 3}
	acked := func(v int64) []PodState {
		return []PodState{{UID: "uid-d-0", Name: "d-0", AckedVersion: v, Result: PushOK}, {UID: "uid-d-1", Name: "d-1", AckedVersion: v, Result: PushOK}}
	}
	// change: "down" deletes a model pod and settles the Deployment at 5;
	// "up" scales it to 8 with the pod back and 6 Ready (moving).
	changes := map[string]func() error{
		"down": func() error {
			if err := c.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: seed.Namespace, Name: "vllm-5"}}); err != nil {
				return err
			}
			return setDeployment(ctx, c, 5, 5, 5)
		},
		"up": func() error {
			if err := c.Create(ctx, readyPod("vllm-5", "10.0.0.6", modelLabels)); err != nil {
				return err
			}
			return setDeployment(ctx, c, 8, 8, 6)
		},
	}
	type step struct {
		after  time.Duration // since the previous step
		states []PodState
		change string
		// want: the version pushed, the pool's status writes so far, the
		// requeue, and what the stored status says.
		pushed                    int64
		writes                    int
		requeue                   time.Duration
		version, reserved, synced int64
	}
	const minute, ms = time.Minute, time.Millisecond
	steps := []step{
		{pushed: 1, writes: 1, requeue: minute, version: 1, reserved: 64},                                     // a new block: at once
		{after: 10 * ms, states: acked(1), pushed: 1, writes: 1, requeue: 500 * ms, version: 1, reserved: 64}, // acks wait
		{after: 200 * ms, states: acked(1), pushed: 1, writes: 1, requeue: 300 * ms, version: 1, reserved: 64},
		{after: 300 * ms, states: acked(1), pushed: 1, writes: 2, requeue: minute - 510*ms, version: 1, reserved: 64, synced: 2},
		// "acked 2" is no version in force.
		{after: time.Second, states: acked(2), pushed: 1, writes: 2, requeue: 500 * ms, version: 1, reserved: 64, synced: 2},
		// A new version within the block is pushed at once and waits with
		// the rest, since when the acks first did.
		{after: 100 * ms, states: acked(2), change: "down", pushed: 2, writes: 2, requeue: 400 * ms, version: 1, reserved: 64, synced: 2},
		{after: 400 * ms, states: acked(2), pushed: 2, writes: 3, requeue: minute - 400*ms, version: 2, reserved: 64, synced: 2},
		// A moving pool's status waits up to 5s.
		{after: time.Second, states: acked(2), change: "up", pushed: 3, writes: 3, requeue: 5 * time.Second, version: 2, reserved: 64, synced: 2},
		{after: 4500 * ms, states: acked(3), pushed: 3, writes: 3, requeue: 500 * ms, version: 2, reserved: 64, synced: 2},
		{after: 500 * ms, states: acked(3), pushed: 3, writes: 4, requeue: minute - 5*time.Second, version: 3, reserved: 64, synced: 2},
	}
	for i, s := range steps {
		clk.SetTime(clk.Now().Add(s.after))
		if s.change != "" {
			if err := changes[s.change](); err != nil {
				t.Fatal(err)
			}
		}
		p.states = s.states
		res, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: seedKey})
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		var pool v1alpha1.ModelPool
		if err := c.Get(ctx, seedKey, &pool); err != nil {
			t.Fatal(err)
		}
		got := step{after: s.after, states: s.states, change: s.change, pushed: p.pushed[0].Policy.Version, writes: writes, requeue: res.RequeueAfter,
			version: pool.Status.PolicyVersion, reserved: pool.Status.PolicyVersionReserved, synced: int64(pool.Status.Dispatchers.Synced)}
		if diff := cmp.Diff(s, got, cmp.AllowUnexported(step{})); diff != "" {
			t.Errorf("step %d (-want +got):\n%s", i, diff)
		}
	}
}

// setDeployment sets the seed's model Deployment's spec.replicas and its
// status's replicas and readyReplicas, as its controller would report them.
func setDeployment(ctx context.Context, c client.Client, spec, replicas, ready int32) error {
	var d appsv1.Deployment
	if err := c.Get(ctx, types.NamespacedName{Namespace: seed.Namespace, Name: "vllm"}, &d); err != nil {
		return err
	}
	d.Spec.Replicas = &spec
	if err := c.Update(ctx, &d); err != nil {
		return err
	}
	d.Status.Replicas, d.Status.ReadyReplicas = replicas, ready
	return c.Status().Update(ctx, &d)
}
