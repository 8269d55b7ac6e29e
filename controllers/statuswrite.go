package controllers

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/tiergate/tiergate/api/v1alpha1"
	"github.com/tiergate/tiergate/capacity"
)

// statusLock says whether a status write may overwrite a status written
// since the object was read.
type statusLock bool

const (
	// lastWriteWins suits tiers and quotas: whatever the pool reconciler
	// computes last is right.
	lastWriteWins statusLock = false
	// optimisticLock suits the pool, whose status holds the policy version:
	// a write from a stale object fails with a Conflict instead.
	optimisticLock statusLock = true
)

// patchOp is one RFC 6902 JSON Patch operation.
type patchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value"`
}

// patchStatus writes want as obj's status when it differs from *cur, which
// must be obj's status field, and reports whether it wrote. The JSON Patch
// replaces the whole status, so what want leaves empty is cleared and a
// struct is never written in part (a merge patch from a status the server
// never stored would leave out its zero-valued required fields). With
// optimisticLock it also sets the resourceVersion the object was read at,
// which the API server then requires to be current.
func patchStatus[S any](ctx context.Context, c client.Client, obj client.Object, cur *S, want S, lock statusLock) (bool, error) {
	if equality.Semantic.DeepEqual(*cur, want) {
		return false, nil
	}
	ops := []patchOp{{Op: "add", Path: "/status", Value: want}}
	if lock {
		ops = append(ops, patchOp{Op: "replace", Path: "/metadata/resourceVersion", Value: obj.GetResourceVersion()})
	}
	body, err := json.Marshal(ops)
	if err != nil {
		return false, err
	}
	*cur = want
	return true, c.Status().Patch(ctx, obj, client.RawPatch(types.JSONPatchType, body))
}

// writePoolStatus writes the pool's status when it changed and records the
// events of the change and the write in mem. A Conflict is returned, so
// nothing of this reconcile is pushed (see statusWriteFailed).
func (r *PoolReconciler) writePoolStatus(ctx context.Context, pool *v1alpha1.ModelPool, st v1alpha1.ModelPoolStatus, c computed, mem *statusMemory) error {
	old := *pool.Status.DeepCopy()
	readAt := pool.ResourceVersion
	if !mem.reported.set && old.ObservedGeneration != 0 {
		mem.reported = markOf(old) // a restarted controller reports from here
	}
	wrote, err := patchStatus(ctx, r.Client, pool, &pool.Status, st, optimisticLock)
	if err != nil || !wrote {
		return err
	}
	mem.wrote(readAt, pool) // the Patch left the API server's answer in pool
	r.poolEvents(pool, old, st, c)
	return nil
}

// conflictRequeue is when a pool whose status write met a Conflict is
// reconciled again, unless the write that caused it (whose watch event
// queues the pool at once) brings it back sooner.
const conflictRequeue = 50 * time.Millisecond

// statusWriteFailed is the result of a reconcile whose pool status write
// failed. A Conflict is the optimistic lock doing its job (the pool
// changed since it was read): the pool is reconciled again from the fresh
// object, quietly. Any other error is returned, which controller-runtime
// logs and backs off.
func statusWriteFailed(ctx context.Context, err error) (ctrl.Result, error) {
	if !apierrors.IsConflict(err) {
		return ctrl.Result{}, err
	}
	log.FromContext(ctx).V(1).Info("the pool changed since it was read; reconciling it again", "reason", err.Error())
	return ctrl.Result{RequeueAfter: conflictRequeue}, nil
}

// maxSuperseded bounds statusMemory.superseded: a cache that lags further
// behind the controller's own writes is read as it is (a conflict then
// retries).
const maxSuperseded = 16

// statusMemory lets a reconcile start from the pool as the controller last
// wrote it when the cache still holds a version that write replaced: the
// cache's watch lags the controller's own writes by a few milliseconds,
// and a write from that stale copy would only meet a Conflict. The
// resourceVersions are compared for equality only, never ordered.
type statusMemory struct {
	// superseded are the resourceVersions the writes since the cache was
	// last seen current replaced.
	superseded map[string]bool
	// written is the pool the last write returned.
	written *v1alpha1.ModelPool
	// reported is the pool's scale as the last ScaledPool event (or the
	// first status seen) gave it.
	reported scaleMark
}

// wrote records a status write from the pool read at readAt, which
// returned pool.
func (m *statusMemory) wrote(readAt string, pool *v1alpha1.ModelPool) {
	if m.superseded == nil || len(m.superseded) >= maxSuperseded {
		m.superseded = map[string]bool{}
	}
	m.superseded[readAt] = true
	m.written = pool.DeepCopy()
}

// freshen replaces a cached pool that one of the remembered writes
// replaced by the last write's pool. A pool at any other version (the
// cache caught up, or someone else changed it) is kept, and the memory
// is cleared.
func (m *statusMemory) freshen(pool *v1alpha1.ModelPool) {
	if m.written == nil {
		return
	}
	if m.superseded[pool.ResourceVersion] && pool.UID == m.written.UID {
		m.written.DeepCopyInto(pool)
		return
	}
	m.superseded, m.written = nil, nil
}

// poolEvents records the changes people care about.
func (r *PoolReconciler) poolEvents(pool *v1alpha1.ModelPool, old, cur v1alpha1.ModelPoolStatus, c computed) {
	if r.Recorder == nil {
		return
	}
	changed := func(typ string) (*metav1.Condition, bool) {
		n := meta.FindStatusCondition(cur.Conditions, typ)
		o := meta.FindStatusCondition(old.Conditions, typ)
		return n, n != nil && (o == nil || o.Status != n.Status || o.Reason != n.Reason)
	}
	warnTrue := func(types ...string) {
		for _, typ := range types {
			if cond, ok := changed(typ); ok && cond.Status == metav1.ConditionTrue {
				reason := cond.Reason
				if typ == v1alpha1.ModelPoolAgeingHorizonExceedsClientTimeout || typ == v1alpha1.ModelPoolTenantHeaderUnprotected {
					reason = typ
				}
				r.Recorder.Eventf(pool, nil, corev1.EventTypeWarning, reason, eventAction[typ], "%s", cond.Message)
			}
		}
	}
	warnTrue(v1alpha1.ModelPoolAgeingHorizonExceedsClientTimeout, v1alpha1.ModelPoolTenantHeaderUnprotected)
	if c, ok := changed(v1alpha1.ModelPoolJWKSReady); ok && c.Status == metav1.ConditionFalse && c.Reason != string(v1alpha1.ReasonJWKSPending) {
		r.Recorder.Eventf(pool, nil, corev1.EventTypeWarning, c.Reason, "ReadJWKS", "%s", c.Message)
	}
	if c, ok := changed(v1alpha1.ModelPoolFewerSlotsThanDispatchers); ok && c.Status == metav1.ConditionTrue {
		r.Recorder.Eventf(pool, nil, corev1.EventTypeWarning, v1alpha1.ModelPoolFewerSlotsThanDispatchers, "SplitSlots", "%s", c.Message)
	}
	warnTrue(v1alpha1.ModelPoolDegraded, v1alpha1.ModelPoolAutoscalerUnavailable)
	// Features in use that older dispatchers cannot enforce.
	if cond, ok := changed(v1alpha1.ModelPoolDispatcherSkew); ok && cond.Reason == string(v1alpha1.ReasonFeaturesNotEnforced) {
		r.Recorder.Eventf(pool, nil, corev1.EventTypeWarning, cond.Reason, "PushPolicy", "%s", skewEventNote(c.skewWarning, cond))
	}
	r.changeEvents(pool, old, cur, c)
}

// changeEvents records the Normal events of values that changed in a
// status written before; the first write is no change.
func (r *PoolReconciler) changeEvents(pool *v1alpha1.ModelPool, old, cur v1alpha1.ModelPoolStatus, c computed) {
	if old.DesiredReplicas != cur.DesiredReplicas && old.ObservedGeneration != 0 {
		r.Recorder.Eventf(pool, nil, corev1.EventTypeNormal, "DesiredReplicas", "ComputeDemand",
			"desired replicas %d→%d: %s requests/s offered, %d queued or held", old.DesiredReplicas, cur.DesiredReplicas, c.demand.OfferedLoadString, c.demand.Queued)
	}
	if c.serviceTime != c.prevS && c.serviceTime > 0 {
		r.Recorder.Eventf(pool, nil, corev1.EventTypeNormal, "ServiceTimeMeasured", "ComputeBounds",
			"dispatchers measure a service time of %s (was %s)", c.serviceTime, c.prevS)
	}
}

// skewEventNote is the FeaturesNotEnforced event's text: the skew rule's
// warning, which names the features and the pods, else the condition's
// message.
func skewEventNote(warning string, cond *metav1.Condition) string {
	if warning != "" {
		return warning
	}
	return cond.Message
}

// eventAction is the action of the Warning event of a pool condition.
var eventAction = map[string]string{
	v1alpha1.ModelPoolAgeingHorizonExceedsClientTimeout: "ComputeBounds",
	v1alpha1.ModelPoolDegraded:                          "PushPolicy",
	v1alpha1.ModelPoolAutoscalerUnavailable:             "SyncScaledObject",
	v1alpha1.ModelPoolTenantHeaderUnprotected:           "Authenticate",
}

// tierWants are the tiers' statuses for bounds, in obs.tiers' order.
func tierWants(obs *observed, bounds capacity.Bounds, stamp metav1.Time) []v1alpha1.ServiceTierStatus {
	byName := map[string]capacity.TierBounds{}
	for _, tb := range bounds.Tiers {
		byName[tb.Name] = tb
	}
	want := make([]v1alpha1.ServiceTierStatus, len(obs.tiers))
	for i := range obs.tiers {
		t := &obs.tiers[i]
		want[i] = desiredTierStatus(t.Status, t.Generation, byName[t.Name], bounds.Pool, stamp)
	}
	return want
}

// quotaWants are the quotas' statuses for bounds, in obs.quotas' order.
func quotaWants(pool *v1alpha1.ModelPool, obs *observed, bounds capacity.Bounds, stamp metav1.Time) []v1alpha1.TenantQuotaStatus {
	byQuota := map[string]capacity.TenantBounds{}
	for _, tb := range bounds.Tenants {
		byQuota[tb.QuotaName] = tb
	}
	want := make([]v1alpha1.TenantQuotaStatus, len(obs.quotas))
	for i := range obs.quotas {
		q := &obs.quotas[i]
		ss := obs.secretState[q.Name]
		want[i] = desiredQuotaStatus(q.Status, quotaView{
			Generation:       q.Generation,
			Pool:             pool.Name,
			Tenant:           byQuota[q.Name],
			Namespace:        q.Namespace,
			SecretName:       ss.name,
			SecretMissing:    ss.missing,
			SecretUnlabelled: ss.unlabelled,
			KeysMissing:      ss.keys,
			OwnLimits:        q.Spec.Limits,
			SharedState:      pool.Spec.SharedState,
		}, stamp)
	}
	return want
}

// writeTierStatus writes want (tierWants) as the tiers' statuses where
// they changed and records a ScaledBounds event when a bound moved; a
// tier deleted meanwhile is skipped. Each write waits for pace, when not
// nil.
func (r *PoolReconciler) writeTierStatus(ctx context.Context, pool *v1alpha1.ModelPool, obs *observed, want []v1alpha1.ServiceTierStatus, bounds capacity.Bounds, pace *pacer) error {
	before := map[string]int32{}
	for i := range obs.tiers {
		before[obs.tiers[i].Name] = obs.tiers[i].Status.QueueBound
	}
	err := inParallel(len(obs.tiers), func(i int) error {
		t := &obs.tiers[i]
		if err := pace.before(ctx, t.Status, want[i]); err != nil {
			return err
		}
		_, err := patchStatus(ctx, r.Client, t, &t.Status, want[i], lastWriteWins)
		return client.IgnoreNotFound(err)
	})
	if err != nil {
		return err
	}
	if msg := boundChanges(before, bounds.Tiers); msg != "" && r.Recorder != nil {
		r.Recorder.Eventf(pool, nil, corev1.EventTypeNormal, "ScaledBounds", "ComputeBounds", "%s", msg)
	}
	return nil
}

// writeQuotaStatus writes want (quotaWants) as the quotas' statuses where
// they changed; a quota deleted meanwhile is skipped. Each write waits for
// pace, when not nil.
func (r *PoolReconciler) writeQuotaStatus(ctx context.Context, obs *observed, want []v1alpha1.TenantQuotaStatus, pace *pacer) error {
	return inParallel(len(obs.quotas), func(i int) error {
		q := &obs.quotas[i]
		if err := pace.before(ctx, q.Status, want[i]); err != nil {
			return err
		}
		_, err := patchStatus(ctx, r.Client, q, &q.Status, want[i], lastWriteWins)
		return client.IgnoreNotFound(err)
	})
}

// statusWriters bounds the tier and quota status writes in flight at once.
const statusWriters = 8

// inParallel runs f(0) … f(n-1), at most statusWriters at a time, and
// joins their errors. The tiers' and quotas' status writes go out
// together rather than one after another: the pool's next reconcile (the
// next push) waits for them, and one after another they took as long as
// all the writes' round trips (tens of milliseconds with a few quotas).
func inParallel(n int, f func(i int) error) error {
	errs := make([]error, n)
	sem := make(chan struct{}, statusWriters)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			errs[i] = f(i)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// scaleMark is a pool's scale as a ScaledPool event states it.
type scaleMark struct {
	concurrency, ready int32
	set                bool
}

func markOf(st v1alpha1.ModelPoolStatus) scaleMark {
	return scaleMark{concurrency: st.PoolConcurrency, ready: st.ReadyReplicas, set: true}
}

// scaledPool records a ScaledPool event when a settled pool's concurrency
// differs from the one last reported: one event per change of scale, not
// one per policy version on the way (a scale-up of 500 pods goes through
// dozens). The first status seen is no change.
func (r *PoolReconciler) scaledPool(pool *v1alpha1.ModelPool, b capacity.PoolBounds, moving bool, mem *statusMemory) {
	// From the bounds, which the pool's status states, whether or not
	// this reconcile wrote it.
	cur := scaleMark{concurrency: b.Concurrency, ready: b.ReadyReplicas, set: true}
	switch {
	case !mem.reported.set:
		mem.reported = cur
	case moving || cur.concurrency == mem.reported.concurrency:
	default:
		if r.Recorder != nil {
			r.Recorder.Eventf(pool, nil, corev1.EventTypeNormal, "ScaledPool", "ComputeBounds",
				"pool concurrency %d→%d (%d→%d ready replicas)", mem.reported.concurrency, cur.concurrency, mem.reported.ready, cur.ready)
		}
		mem.reported = cur
	}
}
