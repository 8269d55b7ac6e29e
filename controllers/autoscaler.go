package controllers

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tiergate/tiergate/api/v1alpha1"
)

// +kubebuilder:rbac:groups=keda.sh,resources=scaledobjects,verbs=get;create;update;delete

// ScaledObjectGVK is KEDA's ScaledObject. The controller builds it as
// unstructured, so KEDA's module (and its dependency tree) stays out of
// the product; the suites check the object against KEDA's own CRD.
var ScaledObjectGVK = schema.GroupVersionKind{Group: "keda.sh", Version: "v1alpha1", Kind: "ScaledObject"}

// DesiredReplicasQuery is the PromQL of the ScaledObject's trigger for the
// pool "namespace/name". max() makes it one sample, which KEDA requires,
// however many series Prometheus holds for the pool (a second scrape job,
// or an old controller pod's series in its last minutes).
func DesiredReplicasQuery(pool string) string {
	return fmt.Sprintf("max(tiergate_pool_desired_replicas{pool=%q})", pool)
}

// ScaledObjectFor is the ScaledObject spec.autoscaling asks for, named and
// controlled by the pool; server is the Prometheus address.
//
// The trigger asks for exactly status.desiredReplicas. KEDA hands the HPA
// an External metric: with metricType Value the HPA wants ⌈current ×
// value / threshold⌉ replicas, which multiplies by the replicas it has,
// and with AverageValue it wants ⌈value / threshold⌉, whatever it has. So
// AverageValue with threshold 1 yields the metric itself. Tolerance 0
// lifts the HPA's 10% dead band (ratios within it keep the current
// count), which would otherwise ignore 20→21. activationThreshold 0
// wakes a pool at zero when the metric is 1 (KEDA activates above the
// threshold), which one held request makes it. ignoreNullValues false
// turns a missing series into a scaler error instead of 0, so a
// controller or Prometheus outage keeps the replicas rather than scaling
// the pool to minReplicas.
func ScaledObjectFor(pool *v1alpha1.ModelPool, server string) *unstructured.Unstructured {
	a := pool.Spec.Autoscaling
	noDeadBand := map[string]any{"tolerance": "0"}
	u := &unstructured.Unstructured{Object: map[string]any{
		"spec": map[string]any{
			"scaleTargetRef":  map[string]any{"apiVersion": "apps/v1", "kind": "Deployment", "name": pool.Spec.DeploymentRef.Name},
			"minReplicaCount": int64(a.MinReplicas),
			"maxReplicaCount": int64(a.MaxReplicas),
			"advanced": map[string]any{"horizontalPodAutoscalerConfig": map[string]any{
				"behavior": map[string]any{"scaleUp": noDeadBand, "scaleDown": noDeadBand},
			}},
			"triggers": []any{map[string]any{
				"type":       "prometheus",
				"name":       "desired-replicas",
				"metricType": "AverageValue",
				"metadata": map[string]any{
					"serverAddress":       server,
					"query":               DesiredReplicasQuery(pool.Namespace + "/" + pool.Name),
					"threshold":           "1",
					"activationThreshold": "0",
					"ignoreNullValues":    "false",
				},
			}},
		},
	}}
	u.SetGroupVersionKind(ScaledObjectGVK)
	u.SetNamespace(pool.Namespace)
	u.SetName(pool.Name)
	u.SetLabels(map[string]string{"app.kubernetes.io/managed-by": "tiergate", "tiergate.dev/pool": pool.Name})
	u.SetOwnerReferences([]metav1.OwnerReference{{
		APIVersion: v1alpha1.GroupVersion.String(), Kind: "ModelPool", Name: pool.Name, UID: pool.UID, Controller: ptr.To(true),
	}})
	return u
}

// autoscalerState is the AutoscalerUnavailable condition it leads to.
type autoscalerState struct {
	unavailable bool
	reason      v1alpha1.ModelPoolReason
	message     string
}

// autoscalerMemory paces the ScaledObject's reads: they are redone when
// the pool's spec changes and once per resync, which also repairs drift
// and notices a KEDA installed meanwhile.
type autoscalerMemory struct {
	checked    bool
	generation int64
	at         time.Time
	state      autoscalerState
	// owned is true when a ScaledObject of this pool may exist; it is
	// unknown (true) until the first check after a start.
	owned bool
}

func (m *autoscalerMemory) due(gen int64, now time.Time, period time.Duration) bool {
	return !m.checked || m.generation != gen || now.Sub(m.at) >= period
}

// syncAutoscaler creates, updates or deletes the pool's ScaledObject as
// spec.autoscaling says, when due. Failures become the state, never an
// error: the bounds and the pushes do not depend on KEDA.
func (r *PoolReconciler) syncAutoscaler(ctx context.Context, pool *v1alpha1.ModelPool, m *autoscalerMemory, now time.Time) autoscalerState {
	if !m.due(pool.Generation, now, r.ResyncPeriod) {
		return m.state
	}
	if !m.checked {
		m.owned = true
	}
	var st autoscalerState
	switch {
	case pool.Spec.Autoscaling != nil:
		st = r.applyScaledObject(ctx, pool, m)
	case m.owned:
		st = r.removeScaledObject(ctx, pool, m)
	default:
		st = notRequested
	}
	m.checked, m.generation, m.at, m.state = true, pool.Generation, now, st
	return st
}

var notRequested = autoscalerState{reason: v1alpha1.ReasonAutoscalingNotRequested, message: "spec.autoscaling is not set; the controller keeps no ScaledObject"}

func unavailable(reason v1alpha1.ModelPoolReason, format string, args ...any) autoscalerState {
	return autoscalerState{unavailable: true, reason: reason, message: fmt.Sprintf(format, args...)}
}

func kedaMissing(err error) autoscalerState {
	return unavailable(v1alpha1.ReasonKEDANotInstalled,
		"KEDA's ScaledObject CRD (scaledobjects.keda.sh) is not installed, so nothing scales the Deployment; once it is, the ScaledObject is created within a resync period (%v)", err)
}

// resourceMissing is true when discovery does not know the ScaledObject
// kind. With the kind known from before, a deleted CRD shows as a 404,
// which a Get cannot tell from a missing object but a Create can.
func resourceMissing(err error) bool { return meta.IsNoMatchError(err) }

// applyScaledObject makes the pool's ScaledObject match spec.autoscaling.
func (r *PoolReconciler) applyScaledObject(ctx context.Context, pool *v1alpha1.ModelPool, m *autoscalerMemory) autoscalerState {
	server := pool.Spec.Autoscaling.Prometheus.ServerAddress
	if server == "" {
		server = r.PrometheusAddress
	}
	if server == "" {
		return unavailable(v1alpha1.ReasonNoPrometheusAddress,
			"spec.autoscaling.prometheus.serverAddress is empty and the controller runs without --prometheus-address: KEDA would have no Prometheus to query")
	}
	want := ScaledObjectFor(pool, server)
	name := pool.Namespace + "/" + pool.Name
	cur := &unstructured.Unstructured{}
	cur.SetGroupVersionKind(ScaledObjectGVK)
	err := r.Client.Get(ctx, client.ObjectKeyFromObject(want), cur)
	switch {
	case resourceMissing(err):
		m.owned = false
		return kedaMissing(err)
	case apierrors.IsNotFound(err):
		if err := r.Client.Create(ctx, want, client.FieldValidation(metav1.FieldValidationStrict)); err != nil {
			if resourceMissing(err) || apierrors.IsNotFound(err) {
				return kedaMissing(err)
			}
			return unavailable(v1alpha1.ReasonScaledObjectWriteFailed, "cannot create ScaledObject %s: %v", name, err)
		}
		m.owned = true
		return inSync(pool, server)
	case err != nil:
		return unavailable(v1alpha1.ReasonScaledObjectWriteFailed, "cannot read ScaledObject %s: %v", name, err)
	}
	if !metav1.IsControlledBy(cur, pool) {
		m.owned = false
		return unavailable(v1alpha1.ReasonScaledObjectConflict,
			"ScaledObject %s exists and is not controlled by this ModelPool; it is left alone (delete it to let the controller create its own)", name)
	}
	m.owned = true
	if equality.Semantic.DeepEqual(cur.Object["spec"], want.Object["spec"]) &&
		equality.Semantic.DeepEqual(cur.GetLabels(), want.GetLabels()) {
		return inSync(pool, server)
	}
	cur.Object["spec"] = want.Object["spec"]
	cur.SetLabels(want.GetLabels())
	if err := r.Client.Update(ctx, cur, client.FieldValidation(metav1.FieldValidationStrict)); err != nil {
		return unavailable(v1alpha1.ReasonScaledObjectWriteFailed, "cannot update ScaledObject %s: %v", name, err)
	}
	return inSync(pool, server)
}

func inSync(pool *v1alpha1.ModelPool, server string) autoscalerState {
	a := pool.Spec.Autoscaling
	return autoscalerState{reason: v1alpha1.ReasonScaledObjectInSync, message: fmt.Sprintf(
		"ScaledObject %s scales Deployment %s between %d and %d replicas to tiergate_pool_desired_replicas, read from %s; KEDA's HPA is keda-hpa-%s",
		pool.Name, pool.Spec.DeploymentRef.Name, a.MinReplicas, a.MaxReplicas, server, pool.Name)}
}

// removeScaledObject deletes the pool's ScaledObject once spec.autoscaling
// is gone. One the pool does not control is left alone.
func (r *PoolReconciler) removeScaledObject(ctx context.Context, pool *v1alpha1.ModelPool, m *autoscalerMemory) autoscalerState {
	cur := &unstructured.Unstructured{}
	cur.SetGroupVersionKind(ScaledObjectGVK)
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: pool.Namespace, Name: pool.Name}, cur)
	switch {
	case resourceMissing(err) || apierrors.IsNotFound(err):
		m.owned = false
		return notRequested
	case err != nil:
		return unavailable(v1alpha1.ReasonScaledObjectWriteFailed, "cannot read ScaledObject %s/%s: %v", pool.Namespace, pool.Name, err)
	}
	if !metav1.IsControlledBy(cur, pool) {
		m.owned = false
		return notRequested
	}
	uid := cur.GetUID()
	if err := r.Client.Delete(ctx, cur, client.Preconditions{UID: &uid}); client.IgnoreNotFound(err) != nil {
		return unavailable(v1alpha1.ReasonScaledObjectWriteFailed, "cannot delete ScaledObject %s/%s, which spec.autoscaling no longer asks for: %v", pool.Namespace, pool.Name, err)
	}
	m.owned = false
	return notRequested
}
