package controllers

import (
	"context"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tiergate/tiergate/api/v1alpha1"
	"github.com/tiergate/tiergate/capacity"
)

// QuotaReconciler writes the status of TenantQuotas whose ServiceTier does
// not exist (TierNotFound). A quota whose tier exists belongs to that tier's
// pool, and the PoolReconciler writes its status, so each quota has exactly
// one writer.
type QuotaReconciler struct {
	Client client.Client
	Clock  clock.PassiveClock
}

// Reconcile implements reconcile.Reconciler.
func (r *QuotaReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	now := metav1.NewTime(r.Clock.Now().Truncate(time.Second))
	var q v1alpha1.TenantQuota
	if err := r.Client.Get(ctx, req.NamespacedName, &q); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	var tier v1alpha1.ServiceTier
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: q.Namespace, Name: q.Spec.TierRef.Name}, &tier)
	switch {
	case err == nil:
		return ctrl.Result{}, nil // the pool reconciler owns this quota's status
	case !apierrors.IsNotFound(err):
		return ctrl.Result{}, err
	}
	st := desiredQuotaStatus(q.Status, quotaView{Generation: q.Generation, TierMissing: true,
		Tenant: capacity.TenantBounds{QuotaName: q.Name, Tenant: q.Spec.Tenant, Tier: q.Spec.TierRef.Name, TierNotFound: true}}, now)
	_, err = patchStatus(ctx, r.Client, &q, &q.Status, st, lastWriteWins)
	return ctrl.Result{}, client.IgnoreNotFound(err)
}
