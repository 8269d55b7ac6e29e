package controllers

import (
	"context"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/tiergate/tiergate/api/v1alpha1"
)

// QuotaReconciler writes the status of TenantQuotas whose ServiceTier does
// not exist (TierNotFound). A quota whose tier exists belongs to that tier's
// pool, and the PoolReconciler writes its status, so each quota has exactly
// one writer.
type QuotaReconciler struct {
	Client ctrl.Client
	Clock  clock.PassiveClock
}

// Reconcile implements reconcile.Reconciler.
func (r *QuotaReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var q v1alpha1.TenantQuota
	if err := r.Client.Get(ctx, req.NamespacedName, &q); err != nil {
		return reconcile.Result{}, ctrl.IgnoreNotFound(err)
	}
	var tier v1alpha1.ServiceTier
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: q.Namespace, Name: q.Spec.TierRef.Name}, &tier)
	switch {
	case err == nil:
		return reconcile.Result{}, nil // the pool reconciler owns this quota's status
	case !apierrors.IsNotFound(err):
		return reconcile.Result{}, err
	}
	now := metav1.NewTime(r.Clock.Now().Truncate(time.Second))
	st := desiredQuotaStatus(q.Status, quotaView{Generation: q.Generation, TierMissing: true,
		Tenant: TenantBounds{QuotaName: q.Name, Tenant: q.Spec.Tenant, Tier: q.Spec.TierRef.Name, TierNotFound: true}}, now)
	return reconcile.Result{}, patchQuotaStatus(ctx, r.Client, &q, st)
}
