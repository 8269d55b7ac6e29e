package controllers

import (
	"context"
	"sync"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/tiergate/tiergate/api/v1alpha1"
)

// Field indexes on the manager's cache.
const (
	indexTierPool       = "spec.poolRef.name"
	indexQuotaTier      = "spec.tierRef.name"
	indexQuotaSecret    = "spec.apiKeySecretRef.name"
	indexPoolDeployment = "spec.deploymentRef.name"
	indexPoolJWKSSecret = "spec.authentication.jwt.jwks.secretRef.name"
	indexPoolJWKSMap    = "spec.authentication.jwt.jwks.configMapRef.name"
)

// fieldIndex is one field index: the reconcilers list by these fields.
type fieldIndex struct {
	obj     client.Object
	field   string
	extract client.IndexerFunc
}

// fieldIndexes are registered on the manager's cache by Setup, and on fake
// clients by the tests.
var fieldIndexes = []fieldIndex{
	{&v1alpha1.ServiceTier{}, indexTierPool, func(o client.Object) []string {
		return []string{o.(*v1alpha1.ServiceTier).Spec.PoolRef.Name}
	}},
	{&v1alpha1.TenantQuota{}, indexQuotaTier, func(o client.Object) []string {
		return []string{o.(*v1alpha1.TenantQuota).Spec.TierRef.Name}
	}},
	{&v1alpha1.TenantQuota{}, indexQuotaSecret, func(o client.Object) []string {
		if ref := o.(*v1alpha1.TenantQuota).Spec.APIKeySecretRef; ref != nil {
			return []string{ref.Name}
		}
		return nil
	}},
	{&v1alpha1.ModelPool{}, indexPoolDeployment, func(o client.Object) []string {
		return []string{o.(*v1alpha1.ModelPool).Spec.DeploymentRef.Name}
	}},
	{&v1alpha1.ModelPool{}, indexPoolJWKSSecret, func(o client.Object) []string { return jwksRefOf(o, false) }},
	{&v1alpha1.ModelPool{}, indexPoolJWKSMap, func(o client.Object) []string { return jwksRefOf(o, true) }},
}

// Setup registers the field indexes, the Pusher and both controllers with
// the manager.
func Setup(ctx context.Context, mgr ctrl.Manager, opts Config) error {
	if err := opts.Validate(); err != nil {
		return err
	}
	if err := setupIndexes(ctx, mgr.GetFieldIndexer()); err != nil {
		return err
	}
	notes := newNotifier()
	if err := mgr.Add(notes); err != nil {
		return err
	}
	tokens, err := setupPushTokens(mgr, opts)
	if err != nil {
		return err
	}
	pushOpts := opts.pusherOptions()
	pushOpts.Tokens, pushOpts.Notify, pushOpts.Log = tokens, notes.Notify, mgr.GetLogger().WithName("push")
	pusher, err := NewPusher(pushOpts)
	if err != nil {
		return err
	}
	if err := mgr.Add(pusher); err != nil {
		return err
	}
	jwksOpts := opts.jwksOptions()
	jwksOpts.Notify, jwksOpts.Log = notes.Notify, mgr.GetLogger().WithName("jwks")
	jwks, err := NewJWKSFetcher(jwksOpts)
	if err != nil {
		return err
	}
	if err := mgr.Add(jwks); err != nil {
		return err
	}
	pools := &PoolReconciler{
		Client:                 mgr.GetClient(),
		APIReader:              mgr.GetAPIReader(),
		Recorder:               mgr.GetEventRecorder("tiergate-controller"),
		Pusher:                 pusher,
		Clock:                  opts.Clock,
		ResyncPeriod:           opts.ResyncPeriod,
		MeasuredMinCompletions: opts.MeasuredMinCompletions,
		MeasuredTolerance:      opts.MeasuredTolerance,
		UnreachableStrike:      opts.UnreachableStrike,
		PrometheusAddress:      opts.PrometheusAddress,
		JWKS:                   jwks,
		StatusDelay:            poolStatusDelay,
	}
	if opts.PushTokenSecret.Name != "" {
		pools.TokenSecret = opts.PushTokenSecret.String()
	}
	pools.quotaStatus = newStatusBatches(mgr.GetLogger().WithName("quota-status"), opts.Clock)
	if err := mgr.Add(pools.quotaStatus); err != nil {
		return err
	}
	pools.tierStatus = newLatestWrites(mgr.GetLogger().WithName("tier-status"))
	if err := mgr.Add(pools.tierStatus); err != nil {
		return err
	}
	if err := setupPoolController(mgr, pools, notes, opts.MaxConcurrentReconciles); err != nil {
		return err
	}
	c := mgr.GetClient()
	return ctrl.NewControllerManagedBy(mgr).
		Named("tenantquota").
		For(&v1alpha1.TenantQuota{}).
		Watches(&v1alpha1.ServiceTier{}, handler.EnqueueRequestsFromMapFunc(tierToQuotas(c))).
		Complete(&QuotaReconciler{Client: c, Clock: opts.Clock})
}

// poolStatusDelay is how long a pool status change that carries no new
// policy version may wait for its write (PoolReconciler.StatusDelay).
const poolStatusDelay = 500 * time.Millisecond

// setupPoolController reconciles a pool on a change of anything its bounds
// or its policy depend on, and after every push attempt.
func setupPoolController(mgr ctrl.Manager, pools *PoolReconciler, notes *notifier, workers int) error {
	c := mgr.GetClient()
	return ctrl.NewControllerManagedBy(mgr).
		Named("modelpool").
		For(&v1alpha1.ModelPool{}).
		Watches(&v1alpha1.ServiceTier{}, handler.EnqueueRequestsFromMapFunc(tierToPool)).
		Watches(&v1alpha1.TenantQuota{}, handler.EnqueueRequestsFromMapFunc(quotaToPool(c))).
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(secretToPools(c))).
		Watches(&corev1.ConfigMap{}, handler.EnqueueRequestsFromMapFunc(poolsByIndex(c, indexPoolJWKSMap))).
		Watches(&appsv1.Deployment{}, handler.EnqueueRequestsFromMapFunc(poolsByIndex(c, indexPoolDeployment))).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(podToPools(c, mgr.GetLogger().WithName("pods"))), builder.WithPredicates(podChanged())).
		WatchesRawSource(source.Channel(notes.out, &handler.EnqueueRequestForObject{})).
		WithOptions(controller.Options{MaxConcurrentReconciles: workers}).
		Complete(pools)
}

func setupIndexes(ctx context.Context, ix client.FieldIndexer) error {
	for _, f := range fieldIndexes {
		if err := ix.IndexField(ctx, f.obj, f.field, f.extract); err != nil {
			return err
		}
	}
	return nil
}

func poolRequest(ns, name string) ctrl.Request {
	return ctrl.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}}
}

func tierToPool(_ context.Context, o client.Object) []ctrl.Request {
	t := o.(*v1alpha1.ServiceTier)
	return []ctrl.Request{poolRequest(t.Namespace, t.Spec.PoolRef.Name)}
}

func quotaToPool(c client.Reader) handler.MapFunc {
	return func(ctx context.Context, o client.Object) []ctrl.Request {
		q := o.(*v1alpha1.TenantQuota)
		var t v1alpha1.ServiceTier
		if err := c.Get(ctx, types.NamespacedName{Namespace: q.Namespace, Name: q.Spec.TierRef.Name}, &t); err != nil {
			return nil
		}
		return []ctrl.Request{poolRequest(t.Namespace, t.Spec.PoolRef.Name)}
	}
}

func tierToQuotas(c client.Reader) handler.MapFunc {
	return func(ctx context.Context, o client.Object) []ctrl.Request {
		var quotas v1alpha1.TenantQuotaList
		if err := c.List(ctx, &quotas, client.InNamespace(o.GetNamespace()), client.MatchingFields{indexQuotaTier: o.GetName()}); err != nil {
			return nil
		}
		out := make([]ctrl.Request, 0, len(quotas.Items))
		for _, q := range quotas.Items {
			out = append(out, poolRequest(q.Namespace, q.Name))
		}
		return out
	}
}

func secretToPools(c client.Reader) handler.MapFunc {
	return func(ctx context.Context, o client.Object) []ctrl.Request {
		var quotas v1alpha1.TenantQuotaList
		if err := c.List(ctx, &quotas, client.InNamespace(o.GetNamespace()), client.MatchingFields{indexQuotaSecret: o.GetName()}); err != nil {
			return nil
		}
		seen := map[string]bool{}
		out := poolsByIndex(c, indexPoolJWKSSecret)(ctx, o)
		for _, r := range out {
			seen[r.Name] = true
		}
		for _, q := range quotas.Items {
			var t v1alpha1.ServiceTier
			if err := c.Get(ctx, types.NamespacedName{Namespace: q.Namespace, Name: q.Spec.TierRef.Name}, &t); err != nil {
				continue
			}
			if !seen[t.Spec.PoolRef.Name] {
				seen[t.Spec.PoolRef.Name] = true
				out = append(out, poolRequest(t.Namespace, t.Spec.PoolRef.Name))
			}
		}
		return out
	}
}

// podToPools maps a pod to the pools it is a dispatcher or a model pod of.
// A terminating pod's event is logged at V(1): it starts the path whose
// latency a drop from the policies has (docs/architecture.md).
func podToPools(c client.Reader, lg logr.Logger) handler.MapFunc {
	return func(ctx context.Context, o client.Object) []ctrl.Request {
		var pools v1alpha1.ModelPoolList
		if err := c.List(ctx, &pools, client.InNamespace(o.GetNamespace())); err != nil {
			return nil
		}
		var out []ctrl.Request
		for _, p := range pools.Items {
			match := selectorMatches(&p.Spec.Dispatchers.Selector, o.GetLabels())
			if !match {
				var d appsv1.Deployment
				if err := c.Get(ctx, types.NamespacedName{Namespace: p.Namespace, Name: p.Spec.DeploymentRef.Name}, &d); err == nil {
					match = selectorMatches(d.Spec.Selector, o.GetLabels())
				}
			}
			if match {
				out = append(out, poolRequest(p.Namespace, p.Name))
			}
		}
		if o.GetDeletionTimestamp() != nil && len(out) > 0 {
			lg.V(1).Info("terminating pod: queueing its pools", "namespace", o.GetNamespace(), "pod", o.GetName(), "pools", len(out))
		}
		return out
	}
}

// podChanged passes pod updates that matter to a pool: labels, IP,
// readiness, phase, restarts, a crash loop and deletion. Status churn such as probe
// timestamps is dropped.
func podChanged() predicate.Predicate {
	view := func(p *corev1.Pod) []any {
		return []any{p.Labels, p.Status.PodIP, podReady(p), p.Status.Phase, podRestarts(p), crashLooping(p), p.DeletionTimestamp != nil}
	}
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		o, ok1 := e.ObjectOld.(*corev1.Pod)
		n, ok2 := e.ObjectNew.(*corev1.Pod)
		if !ok1 || !ok2 {
			return true
		}
		return !equality.Semantic.DeepEqual(view(o), view(n))
	}}
}

// notifier turns the Pusher's per-attempt callbacks into reconcile events
// without blocking the pusher and without losing one: pending pools are
// coalesced in a set and drained into the controller's channel.
type notifier struct {
	mu      sync.Mutex
	pending map[types.NamespacedName]bool
	wake    chan struct{}
	out     chan event.GenericEvent
}

func newNotifier() *notifier {
	return &notifier{pending: map[types.NamespacedName]bool{}, wake: make(chan struct{}, 1), out: make(chan event.GenericEvent)}
}

// Notify asks for the pool to be reconciled; it never blocks.
func (n *notifier) Notify(pool types.NamespacedName) {
	n.mu.Lock()
	n.pending[pool] = true
	n.mu.Unlock()
	select {
	case n.wake <- struct{}{}:
	default:
	}
}

// Start drains pending notifications until ctx ends.
func (n *notifier) Start(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-n.wake:
		}
		n.mu.Lock()
		batch := n.pending
		n.pending = map[types.NamespacedName]bool{}
		n.mu.Unlock()
		for pool := range batch {
			ev := event.GenericEvent{Object: &v1alpha1.ModelPool{ObjectMeta: metav1.ObjectMeta{Namespace: pool.Namespace, Name: pool.Name}}}
			select {
			case n.out <- ev:
			case <-ctx.Done():
				return nil
			}
		}
	}
}
