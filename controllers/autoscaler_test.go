package controllers

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/yaml"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/api/v1alpha1"
	seed "github.com/tiergate/tiergate/capacity/capacitytest"
)

// The ScaledObject of the seed's pool with spec.autoscaling {0, 4}, as the
// API server would store it.
const seedScaledObject = `apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata:
  labels:
    app.kubernetes.io/managed-by: tiergate
    tiergate.dev/pool: llm
  name: llm
  namespace: default
  ownerReferences:
  - apiVersion: tiergate.dev/v1alpha1
    controller: true
    kind: ModelPool
    name: llm
    uid: pool-uid
spec:
  advanced:
    horizontalPodAutoscalerConfig:
      behavior:
        scaleDown:
          tolerance: "0"
        scaleUp:
          tolerance: "0"
  maxReplicaCount: 4
  minReplicaCount: 0
  scaleTargetRef:
    apiVersion: apps/v1
    kind: Deployment
    name: vllm
  triggers:
  - metadata:
      activationThreshold: "0"
      ignoreNullValues: "false"
      query: max(tiergate_pool_desired_replicas{pool="default/llm"})
      serverAddress: http://prometheus.monitoring:9090
      threshold: "1"
    metricType: AverageValue
    name: desired-replicas
    type: prometheus
`

func TestScaledObject(t *testing.T) {
	pool := seed.Pool(seed.WithAutoscaling(0, 4, ""))
	pool.UID = "pool-uid"
	got, err := yaml.Marshal(ScaledObjectFor(pool, "http://prometheus.monitoring:9090").Object)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(seedScaledObject, string(got)); diff != "" {
		t.Errorf("ScaledObject (-want +got):\n%s", diff)
	}
}

// kedaSwitch plays KEDA's CRD being installed or not, and counts the
// calls that reach ScaledObjects.
type kedaSwitch struct {
	absent bool
	calls  []string
}

func isScaledObject(obj client.Object) bool {
	u, ok := obj.(*unstructured.Unstructured)
	return ok && u.GroupVersionKind() == ScaledObjectGVK
}

func (k *kedaSwitch) funcs() interceptor.Funcs {
	noMatch := func(verb string) error {
		k.calls = append(k.calls, verb)
		if k.absent {
			return &meta.NoKindMatchError{GroupKind: ScaledObjectGVK.GroupKind(), SearchedVersions: []string{"v1alpha1"}}
		}
		return nil
	}
	return interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if isScaledObject(obj) {
				if err := noMatch("get"); err != nil {
					return err
				}
			}
			return c.Get(ctx, key, obj, opts...)
		},
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if isScaledObject(obj) {
				if err := noMatch("create"); err != nil {
					return err
				}
			}
			return c.Create(ctx, obj, opts...)
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			if isScaledObject(obj) {
				if err := noMatch("update"); err != nil {
					return err
				}
			}
			return c.Update(ctx, obj, opts...)
		},
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			if isScaledObject(obj) {
				if err := noMatch("delete"); err != nil {
					return err
				}
			}
			return c.Delete(ctx, obj, opts...)
		},
	}
}

// autoRow is one reconcile's outcome for autoscaling.
type autoRow struct {
	Condition string // status/reason of AutoscalerUnavailable
	Calls     []string
	// MinMax is the ScaledObject's min and max, nil when there is none.
	MinMax  []int64
	Desired int32
	Metric  float64
	Pushed  int // dispatchers handed a policy
	Events  []string
}

type autoStep struct {
	change  func(ctx context.Context, c client.Client, k *kedaSwitch) error
	advance time.Duration
	states  []PodState
	want    autoRow
}

// setAutoscaling sets the pool's spec.autoscaling, as an edit that bumps
// the generation.
func setAutoscaling(a *v1alpha1.Autoscaling) func(ctx context.Context, c client.Client, _ *kedaSwitch) error {
	return func(ctx context.Context, c client.Client, _ *kedaSwitch) error {
		var p v1alpha1.ModelPool
		if err := c.Get(ctx, seedKey, &p); err != nil {
			return err
		}
		p.Spec.Autoscaling = a
		p.Generation++
		return c.Update(ctx, &p)
	}
}

func autoscaledWorld(a *v1alpha1.Autoscaling, extra ...client.Object) []client.Object {
	objs := seedWorld()
	pool := objs[0].(*v1alpha1.ModelPool)
	pool.UID = "pool-uid"
	pool.Spec.Autoscaling = a
	return append(objs, extra...)
}

func offered(perSecond float64, queued int64) []PodState {
	return []PodState{
		{UID: "uid-d-0", Name: "d-0", AckedVersion: 1, Result: PushOK, Stats: policy.Measured{OfferedLoad: map[string]float64{"free": perSecond / 2}, Queued: queued}},
		{UID: "uid-d-1", Name: "d-1", AckedVersion: 1, Result: PushOK, Stats: policy.Measured{OfferedLoad: map[string]float64{"premium": perSecond / 2}}},
	}
}

func TestReconcileAutoscaling(t *testing.T) {
	const inSync = "False/ScaledObjectInSync"
	const notRequested = "False/AutoscalingNotRequested"
	upTo4 := &v1alpha1.Autoscaling{MinReplicas: 0, MaxReplicas: 4}
	tests := map[string]struct {
		objs   []client.Object
		absent bool
		server string
		steps  []autoStep
	}{
		"no spec.autoscaling: one look after a start, then none": {
			objs: autoscaledWorld(nil),
			steps: []autoStep{
				{want: autoRow{Condition: notRequested, Calls: []string{"get"}, Pushed: 2}},
				{advance: 2 * time.Minute, want: autoRow{Condition: notRequested, Pushed: 2}},
			},
		},
		"created, left alone, updated on a change, deleted with spec.autoscaling": {
			objs: autoscaledWorld(upTo4), server: "http://prometheus.monitoring:9090",
			steps: []autoStep{
				{want: autoRow{Condition: inSync, Calls: []string{"get", "create"}, MinMax: []int64{0, 4}, Pushed: 2}},
				{want: autoRow{Condition: inSync, MinMax: []int64{0, 4}, Pushed: 2}},
				{advance: 2 * time.Minute, want: autoRow{Condition: inSync, Calls: []string{"get"}, MinMax: []int64{0, 4}, Pushed: 2}},
				{change: setAutoscaling(&v1alpha1.Autoscaling{MinReplicas: 1, MaxReplicas: 6}),
					want: autoRow{Condition: inSync, Calls: []string{"get", "update"}, MinMax: []int64{1, 6}, Desired: 1, Metric: 1, Pushed: 2,
						Events: []string{"Normal DesiredReplicas desired replicas 0→1: 0 requests/s offered, 0 queued or held"}}},
				{change: setAutoscaling(nil),
					want: autoRow{Condition: notRequested, Calls: []string{"get", "delete"}, Pushed: 2,
						Events: []string{"Normal DesiredReplicas desired replicas 1→0: 0 requests/s offered, 0 queued or held"}}},
			},
		},
		"KEDA absent: AutoscalerUnavailable, the pool still pushes; installed later, it recovers at the resync": {
			objs: autoscaledWorld(upTo4), absent: true, server: "http://prometheus.monitoring:9090",
			steps: []autoStep{
				{want: autoRow{Condition: "True/KEDANotInstalled", Calls: []string{"get"}, Pushed: 2,
					Events: []string{"Warning KEDANotInstalled KEDA's ScaledObject CRD (scaledobjects.keda.sh) is not installed, so nothing scales the Deployment; " +
						`once it is, the ScaledObject is created within a resync period (no matches for kind "ScaledObject" in version "keda.sh/v1alpha1")`}}},
				{change: func(_ context.Context, _ client.Client, k *kedaSwitch) error { k.absent = false; return nil },
					want: autoRow{Condition: "True/KEDANotInstalled", Pushed: 2}},
				{advance: time.Minute, want: autoRow{Condition: inSync, Calls: []string{"get", "create"}, MinMax: []int64{0, 4}, Pushed: 2}},
			},
		},
		"the server address from the pool beats the flag's": {
			objs: autoscaledWorld(&v1alpha1.Autoscaling{MaxReplicas: 2, Prometheus: v1alpha1.AutoscalingPrometheus{ServerAddress: "https://prom.example:9091"}}),
			steps: []autoStep{
				{want: autoRow{Condition: inSync, Calls: []string{"get", "create"}, MinMax: []int64{0, 2}, Pushed: 2}},
			},
		},
		"no Prometheus anywhere: nothing is created": {
			objs: autoscaledWorld(upTo4),
			steps: []autoStep{{want: autoRow{Condition: "True/NoPrometheusAddress", Pushed: 2,
				Events: []string{"Warning NoPrometheusAddress spec.autoscaling.prometheus.serverAddress is empty and the controller runs without --prometheus-address: KEDA would have no Prometheus to query"}}}},
		},
		"a ScaledObject this pool does not control is left alone": {
			objs: autoscaledWorld(upTo4, func() client.Object {
				u := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"minReplicaCount": int64(3), "maxReplicaCount": int64(9)}}}
				u.SetGroupVersionKind(ScaledObjectGVK)
				u.SetNamespace(seed.Namespace)
				u.SetName(seed.PoolName)
				return u
			}()), server: "http://prometheus.monitoring:9090",
			steps: []autoStep{{want: autoRow{Condition: "True/ScaledObjectNotOwned", Calls: []string{"get"}, MinMax: []int64{3, 9}, Pushed: 2,
				Events: []string{"Warning ScaledObjectNotOwned ScaledObject default/llm exists and is not controlled by this ModelPool; it is left alone (delete it to let the controller create its own)"}}}},
		},
		"desired replicas follow the offered load, clamped to maxReplicas, and a held request wakes the pool": {
			objs: autoscaledWorld(upTo4), server: "http://prometheus.monitoring:9090",
			steps: []autoStep{
				{want: autoRow{Condition: inSync, Calls: []string{"get", "create"}, MinMax: []int64{0, 4}, Pushed: 2}},
				// 2 req/s × 6s over 4 slots at 0.8: ⌈3.75⌉ = 4.
				{states: offered(2, 0), want: autoRow{Condition: inSync, MinMax: []int64{0, 4}, Desired: 4, Metric: 4, Pushed: 2,
					Events: []string{"Normal DesiredReplicas desired replicas 0→4: 2 requests/s offered, 0 queued or held"}}},
				{states: offered(20, 0), want: autoRow{Condition: inSync, MinMax: []int64{0, 4}, Desired: 4, Metric: 4, Pushed: 2}},
				{states: offered(0, 1), want: autoRow{Condition: inSync, MinMax: []int64{0, 4}, Desired: 1, Metric: 1, Pushed: 2,
					Events: []string{"Normal DesiredReplicas desired replicas 4→1: 0 requests/s offered, 1 queued or held"}}},
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			k := &kedaSwitch{absent: tc.absent}
			c := newFakeClient(t, tc.objs, k.funcs())
			rec := events.NewFakeRecorder(20)
			clk := clocktesting.NewFakePassiveClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
			r := &PoolReconciler{Client: c, Recorder: rec, Clock: clk, ResyncPeriod: time.Minute,
				MeasuredMinCompletions: 20, MeasuredTolerance: 0.1, UnreachableStrike: 3, PrometheusAddress: tc.server}
			t.Cleanup(func() { forgetPoolMetrics(seedKey.String()) })
			for i, s := range tc.steps {
				if s.change != nil {
					if err := s.change(ctx, c, k); err != nil {
						t.Fatal(err)
					}
				}
				clk.SetTime(clk.Now().Add(s.advance))
				p := &fakePusher{states: s.states}
				r.Pusher = p
				k.calls = nil
				if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: seedKey}); err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				got := autoOutcome(ctx, t, c, k, p, rec)
				if diff := cmp.Diff(s.want, got); diff != "" {
					t.Errorf("step %d (-want +got):\n%s", i, diff)
				}
			}
		})
	}
}

func autoOutcome(ctx context.Context, t *testing.T, c client.Client, k *kedaSwitch, p *fakePusher, rec *events.FakeRecorder) autoRow {
	t.Helper()
	calls := k.calls
	var pool v1alpha1.ModelPool
	if err := c.Get(ctx, seedKey, &pool); err != nil {
		t.Fatal(err)
	}
	got := autoRow{Calls: calls, Desired: pool.Status.DesiredReplicas, Pushed: len(p.pushed),
		Metric: testutil.ToFloat64(poolDesiredReplicas.WithLabelValues(seedKey.String()))}
	if cond := meta.FindStatusCondition(pool.Status.Conditions, v1alpha1.ModelPoolAutoscalerUnavailable); cond != nil {
		got.Condition = string(cond.Status) + "/" + cond.Reason
	}
	absent := k.absent
	k.absent = false
	so := &unstructured.Unstructured{}
	so.SetGroupVersionKind(ScaledObjectGVK)
	err := c.Get(ctx, types.NamespacedName{Namespace: seed.Namespace, Name: seed.PoolName}, so)
	k.absent, k.calls = absent, calls
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		t.Fatal(err)
	default:
		lo, _, _ := unstructured.NestedInt64(so.Object, "spec", "minReplicaCount")
		hi, _, _ := unstructured.NestedInt64(so.Object, "spec", "maxReplicaCount")
		got.MinMax = []int64{lo, hi}
	}
	// The seed's ageing and unprotected-header warnings are the other
	// tests' business.
	for len(rec.Events) > 0 {
		if e := <-rec.Events; !strings.HasPrefix(e, "Warning AgeingHorizonExceedsClientTimeout") &&
			!strings.HasPrefix(e, "Warning TenantHeaderUnprotected") {
			got.Events = append(got.Events, e)
		}
	}
	return got
}

func TestSyncAutoscalerWriteFailure(t *testing.T) {
	ctx := context.Background()
	refused := errors.New("admission webhook \"vscaledobject.kb.io\" denied the request: the workload 'vllm' of type 'apps/v1.Deployment' is already managed by the hpa 'mine'")
	c := newFakeClient(t, autoscaledWorld(&v1alpha1.Autoscaling{MaxReplicas: 3}), interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if isScaledObject(obj) {
				return apierrors.NewForbidden(schema.GroupResource{Group: "keda.sh", Resource: "scaledobjects"}, "llm", refused)
			}
			return c.Create(ctx, obj, opts...)
		},
	})
	r := &PoolReconciler{Client: c, ResyncPeriod: time.Minute, PrometheusAddress: "http://p:9090"}
	var pool v1alpha1.ModelPool
	if err := c.Get(ctx, seedKey, &pool); err != nil {
		t.Fatal(err)
	}
	got := r.syncAutoscaler(ctx, &pool, &autoscalerMemory{}, time.Now())
	want := autoscalerState{unavailable: true, reason: v1alpha1.ReasonScaledObjectWriteFailed,
		message: `cannot create ScaledObject default/llm: scaledobjects.keda.sh "llm" is forbidden: ` + refused.Error()}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(autoscalerState{})); diff != "" {
		t.Errorf("state (-want +got):\n%s", diff)
	}
}
