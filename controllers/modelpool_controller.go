package controllers

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net"
	"sort"
	"strconv"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/tiergate/tiergate/api/v1alpha1"
	"github.com/tiergate/tiergate/dispatcher/policy"
)

// +kubebuilder:rbac:groups=tiergate.dev,resources=modelpools;servicetiers;tenantquotas,verbs=get;list;watch
// +kubebuilder:rbac:groups=tiergate.dev,resources=modelpools/status;servicetiers/status;tenantquotas/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=pods;secrets,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// PoolReconciler reconciles one ModelPool: it reads the pool, its tiers and
// quotas, their Secrets, the model Deployment and pods and the dispatcher
// pods, computes the bounds, writes the status of the pool and of its tiers
// and quotas, and hands each dispatcher pod its policy through the Pusher.
type PoolReconciler struct {
	Client   ctrl.Client
	Recorder events.EventRecorder
	Pusher   *Pusher
	Clock    clock.PassiveClock
	// ResyncPeriod is how often every dispatcher is pushed to even when it
	// acknowledged the current version.
	ResyncPeriod time.Duration
	// MeasuredMinCompletions and MeasuredTolerance are the hysteresis of
	// the measured service time.
	MeasuredMinCompletions int64
	MeasuredTolerance      float64
	// UnreachableStrike is how many consecutive failed pushes make an
	// unreachable pod degrade the pool.
	UnreachableStrike int

	mu    sync.Mutex
	pools map[types.NamespacedName]*poolMemory
}

// poolMemory is what the reconciler remembers of a pool between reconciles.
// It is lost on restart; the persisted status.policyVersion then makes the
// next version larger than any pushed before.
type poolMemory struct {
	contentHash string
	version     int64
	lastResync  time.Time
	// maxWaitTiers are the tiers whose tiergate_tier_max_wait_seconds
	// series this pool exports.
	maxWaitTiers map[string]bool
}

func (r *PoolReconciler) memory(key types.NamespacedName) *poolMemory {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pools == nil {
		r.pools = map[types.NamespacedName]*poolMemory{}
	}
	m, ok := r.pools[key]
	if !ok {
		m = &poolMemory{}
		r.pools[key] = m
	}
	return m
}

// observed is everything read for one reconcile.
type observed struct {
	deployment  *appsv1.Deployment
	tiers       []v1alpha1.ServiceTier
	quotas      []v1alpha1.TenantQuota
	hashes      map[string][]string // quota name -> key hashes
	secretState map[string]secretState
	backends    []policy.Backend
	dispatchers []corev1.Pod
}

type secretState struct {
	name    string
	missing bool
	keys    []string // requested keys absent from the Secret
}

// Reconcile implements reconcile.Reconciler.
func (r *PoolReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	logger := log.FromContext(ctx)
	var pool v1alpha1.ModelPool
	if err := r.Client.Get(ctx, req.NamespacedName, &pool); err != nil {
		if apierrors.IsNotFound(err) {
			return reconcile.Result{}, r.forget(ctx, req.NamespacedName)
		}
		return reconcile.Result{}, err
	}
	if !pool.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, r.forget(ctx, req.NamespacedName)
	}

	obs, err := r.observe(ctx, &pool)
	if err != nil {
		return reconcile.Result{}, err
	}
	states := r.Pusher.States(req.NamespacedName)

	// S from the dispatchers' acks, with hysteresis. Recorded in every mode;
	// used for the bounds only when the source is Measured.
	var stats []policy.Measured
	for _, s := range states {
		stats = append(stats, s.Stats)
	}
	var curObserved time.Duration
	if pool.Status.ObservedServiceTime != nil {
		curObserved = pool.Status.ObservedServiceTime.Duration
	}
	reference := curObserved
	if reference == 0 {
		reference = pool.Spec.ServiceTime.Mean.Duration
	}
	newObserved, moved := foldServiceTime(reference, stats, r.MeasuredMinCompletions, r.MeasuredTolerance)
	if !moved {
		newObserved = curObserved
	}

	var readyReplicas int32
	if obs.deployment != nil {
		readyReplicas = obs.deployment.Status.ReadyReplicas
	}
	bounds, err := ComputeBounds(BoundsInput{
		Pool:                &pool,
		ReadyReplicas:       readyReplicas,
		Tiers:               obs.tiers,
		Quotas:              obs.quotas,
		Dispatchers:         len(obs.dispatchers),
		ObservedServiceTime: newObserved,
		Backends:            obs.backends,
		APIKeyHashes:        obs.hashes,
	})
	if err != nil {
		// The schema refuses such specs; this is a pool written around it.
		logger.Error(err, "cannot compute bounds")
		return reconcile.Result{}, reconcile.TerminalError(err)
	}
	policies := bounds.Policies
	if len(obs.backends) == 0 {
		// Nothing to serve on: a policy with slots but no backends is
		// invalid, and 0 slots makes dispatchers answer 503 at once.
		for i := range policies {
			policies[i].Slots = 0
		}
	}

	// Version: bump on any content change, and after a restart, above both
	// the persisted version and any version a dispatcher reported holding.
	mem := r.memory(req.NamespacedName)
	hash := contentHash(policies)
	var held int64
	for _, s := range states {
		held = max(held, s.HeldVersion)
	}
	version := mem.version
	if mem.contentHash != hash || mem.version == 0 || held >= mem.version {
		version = max(pool.Status.PolicyVersion, mem.version, held) + 1
	}
	for i := range policies {
		policies[i].Version = version
	}

	targets := dispatcherTargets(obs.dispatchers, pool.Spec.Dispatchers.AdminPort, policies)
	byUID := map[types.UID]PodState{}
	for _, s := range states {
		byUID[s.UID] = s
	}
	var views []dispatcherView
	for _, t := range targets {
		s := byUID[t.UID]
		views = append(views, dispatcherView{Name: t.Name, Ready: t.Ready, Acked: s.AckedVersion, State: s})
	}

	now := metav1.NewTime(r.Clock.Now().Truncate(time.Second))
	newStatus := desiredPoolStatus(pool.Status, poolView{
		Generation:        pool.Generation,
		DeploymentFound:   obs.deployment != nil,
		Bounds:            bounds,
		Backends:          len(obs.backends),
		HasTiers:          len(obs.tiers) > 0,
		Version:           version,
		ObservedService:   newObserved,
		Dispatchers:       views,
		UnreachableStrike: r.UnreachableStrike,
	}, now)

	oldStatus := pool.Status
	if !equality.Semantic.DeepEqual(oldStatus, newStatus) {
		// The version is persisted before any dispatcher sees it, so a
		// restarted controller never reuses or lowers a version.
		pool.Status = newStatus
		if err := r.Client.Status().Update(ctx, &pool); err != nil {
			if apierrors.IsConflict(err) {
				// The cache is behind our own last write; its watch event
				// brings this pool back with the fresh object.
				logger.V(1).Info("status conflict, waiting for the fresh object")
				return reconcile.Result{}, nil
			}
			return reconcile.Result{}, err
		}
		r.poolEvents(&pool, oldStatus, newStatus, newObserved, curObserved)
	}
	mem.contentHash, mem.version = hash, version
	poolConcurrency.WithLabelValues(req.String()).Set(float64(bounds.Pool.Concurrency))
	// The same maxWait the tiers' status states (desiredTierStatus).
	mem.maxWaitTiers = setTierMaxWait(tierMaxWait, req.String(), mem.maxWaitTiers, bounds.Tiers)

	// Push. With no tiers there is no valid policy: dispatchers keep theirs.
	resync := false
	nowT := r.Clock.Now()
	if r.ResyncPeriod > 0 && nowT.Sub(mem.lastResync) >= r.ResyncPeriod {
		resync = true
		mem.lastResync = nowT
	}
	if len(obs.tiers) == 0 {
		targets = nil
	}
	r.Pusher.Sync(req.NamespacedName, targets, resync)

	// Tier and quota status after the push has started: it is for people,
	// the push is for traffic.
	if err := r.writeTierStatus(ctx, &pool, obs, bounds, now); err != nil {
		return reconcile.Result{}, err
	}
	if err := r.writeQuotaStatus(ctx, &pool, obs, bounds, now); err != nil {
		return reconcile.Result{}, err
	}

	if r.ResyncPeriod > 0 {
		return reconcile.Result{RequeueAfter: r.ResyncPeriod - nowT.Sub(mem.lastResync)}, nil
	}
	return reconcile.Result{}, nil
}

// forget stops pushing for a deleted pool and marks its tiers and their
// quotas. Its version memory is kept, so a pool recreated under the same
// name continues above the versions its dispatchers still hold.
func (r *PoolReconciler) forget(ctx context.Context, key types.NamespacedName) error {
	r.Pusher.Forget(key)
	r.mu.Lock()
	if m, ok := r.pools[key]; ok {
		m.contentHash = ""
		m.maxWaitTiers = nil
	}
	r.mu.Unlock()
	poolConcurrency.DeleteLabelValues(key.String())
	deleteTierMaxWait(tierMaxWait, key.String())

	now := metav1.NewTime(r.Clock.Now().Truncate(time.Second))
	var tiers v1alpha1.ServiceTierList
	if err := r.Client.List(ctx, &tiers, ctrl.InNamespace(key.Namespace), ctrl.MatchingFields{IndexTierPool: key.Name}); err != nil {
		return err
	}
	for i := range tiers.Items {
		t := &tiers.Items[i]
		if err := patchTierStatus(ctx, r.Client, t, orphanTierStatus(t.Status, t.Generation, key.Name, now)); err != nil {
			return err
		}
		var quotas v1alpha1.TenantQuotaList
		if err := r.Client.List(ctx, &quotas, ctrl.InNamespace(key.Namespace), ctrl.MatchingFields{IndexQuotaTier: t.Name}); err != nil {
			return err
		}
		for j := range quotas.Items {
			q := &quotas.Items[j]
			st := desiredQuotaStatus(q.Status, quotaView{Generation: q.Generation, PoolMissing: true,
				Tenant: TenantBounds{QuotaName: q.Name, Tenant: q.Spec.Tenant, Tier: q.Spec.TierRef.Name}}, now)
			if err := patchQuotaStatus(ctx, r.Client, q, st); err != nil {
				return err
			}
		}
	}
	return nil
}

// observe reads everything the pool's bounds depend on, from the cache.
func (r *PoolReconciler) observe(ctx context.Context, pool *v1alpha1.ModelPool) (*observed, error) {
	ns := pool.Namespace
	obs := &observed{hashes: map[string][]string{}, secretState: map[string]secretState{}}

	var dep appsv1.Deployment
	switch err := r.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: pool.Spec.DeploymentRef.Name}, &dep); {
	case err == nil:
		obs.deployment = &dep
	case apierrors.IsNotFound(err):
	default:
		return nil, err
	}

	var tiers v1alpha1.ServiceTierList
	if err := r.Client.List(ctx, &tiers, ctrl.InNamespace(ns), ctrl.MatchingFields{IndexTierPool: pool.Name}); err != nil {
		return nil, err
	}
	obs.tiers = tiers.Items
	for _, t := range obs.tiers {
		var quotas v1alpha1.TenantQuotaList
		if err := r.Client.List(ctx, &quotas, ctrl.InNamespace(ns), ctrl.MatchingFields{IndexQuotaTier: t.Name}); err != nil {
			return nil, err
		}
		obs.quotas = append(obs.quotas, quotas.Items...)
	}
	for _, q := range obs.quotas {
		ref := q.Spec.APIKeySecretRef
		if ref == nil {
			continue
		}
		var secret corev1.Secret
		err := r.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: ref.Name}, &secret)
		switch {
		case apierrors.IsNotFound(err):
			obs.secretState[q.Name] = secretState{name: ref.Name, missing: true}
			continue
		case err != nil:
			return nil, err
		}
		hashes, missing := hashAPIKeys(&secret, ref.Keys)
		obs.hashes[q.Name] = hashes
		obs.secretState[q.Name] = secretState{name: ref.Name, keys: missing}
	}

	// Backends: the Ready pods the Deployment selects.
	if obs.deployment != nil && obs.deployment.Spec.Selector != nil {
		sel, err := metav1.LabelSelectorAsSelector(obs.deployment.Spec.Selector)
		if err != nil {
			return nil, err
		}
		if !sel.Empty() {
			var pods corev1.PodList
			if err := r.Client.List(ctx, &pods, ctrl.InNamespace(ns), ctrl.MatchingLabelsSelector{Selector: sel}); err != nil {
				return nil, err
			}
			scheme := pool.Spec.Backend.Scheme
			if scheme == "" {
				scheme = "http"
			}
			seen := map[string]bool{}
			for _, p := range pods.Items {
				if !podServing(&p) || !podReady(&p) {
					continue
				}
				addr := net.JoinHostPort(p.Status.PodIP, strconv.Itoa(int(pool.Spec.Backend.Port)))
				if !seen[addr] {
					seen[addr] = true
					obs.backends = append(obs.backends, policy.Backend{Address: addr, Scheme: scheme})
				}
			}
			sort.Slice(obs.backends, func(a, b int) bool { return obs.backends[a].Address < obs.backends[b].Address })
		}
	}

	// Dispatchers: every pod the selector matches that has an IP, Ready or
	// not (a fresh one becomes Ready only once it holds a policy).
	sel, err := metav1.LabelSelectorAsSelector(&pool.Spec.Dispatchers.Selector)
	if err != nil {
		return nil, err
	}
	if !sel.Empty() {
		var pods corev1.PodList
		if err := r.Client.List(ctx, &pods, ctrl.InNamespace(ns), ctrl.MatchingLabelsSelector{Selector: sel}); err != nil {
			return nil, err
		}
		for _, p := range pods.Items {
			if podServing(&p) {
				obs.dispatchers = append(obs.dispatchers, p)
			}
		}
		sort.Slice(obs.dispatchers, func(a, b int) bool { return obs.dispatchers[a].Name < obs.dispatchers[b].Name })
	}
	return obs, nil
}

// podServing is true for a pod with an IP that is neither terminating nor
// finished.
func podServing(p *corev1.Pod) bool {
	return p.Status.PodIP != "" && p.DeletionTimestamp == nil &&
		p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func podRestarts(p *corev1.Pod) int32 {
	var n int32
	for _, c := range p.Status.ContainerStatuses {
		n += c.RestartCount
	}
	return n
}

// dispatcherTargets pairs the sorted dispatcher pods with their policies.
func dispatcherTargets(pods []corev1.Pod, adminPort int32, policies []policy.Policy) []Target {
	if adminPort == 0 {
		adminPort = 9090
	}
	out := make([]Target, 0, len(pods))
	for i := range pods {
		p := &pods[i]
		out = append(out, Target{
			UID:      p.UID,
			Name:     p.Name,
			Address:  net.JoinHostPort(p.Status.PodIP, strconv.Itoa(int(adminPort))),
			Ready:    podReady(p),
			Restarts: podRestarts(p),
			Policy:   policies[i],
		})
	}
	return out
}

// contentHash identifies the policies' content, whatever their version.
func contentHash(policies []policy.Policy) string {
	h := sha256.New()
	for _, p := range policies {
		p.Version = 0
		b, _ := json.Marshal(p)
		h.Write(b)
		h.Write([]byte{'\n'})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// poolEvents records the changes people care about.
func (r *PoolReconciler) poolEvents(pool *v1alpha1.ModelPool, old, cur v1alpha1.ModelPoolStatus, observedS, prevObservedS time.Duration) {
	if r.Recorder == nil {
		return
	}
	changed := func(typ string) (*metav1.Condition, bool) {
		n := findCondition(cur.Conditions, typ)
		o := findCondition(old.Conditions, typ)
		return n, n != nil && (o == nil || o.Status != n.Status || o.Reason != n.Reason)
	}
	if c, ok := changed(v1alpha1.ModelPoolAgeingHorizonExceedsClientTimeout); ok && c.Status == metav1.ConditionTrue {
		r.Recorder.Eventf(pool, nil, corev1.EventTypeWarning, v1alpha1.ModelPoolAgeingHorizonExceedsClientTimeout, "ComputeBounds", "%s", c.Message)
	}
	if c, ok := changed(v1alpha1.ModelPoolDegraded); ok && c.Status == metav1.ConditionTrue {
		r.Recorder.Eventf(pool, nil, corev1.EventTypeWarning, c.Reason, "PushPolicy", "%s", c.Message)
	}
	if old.PoolConcurrency != cur.PoolConcurrency && old.ObservedGeneration != 0 {
		r.Recorder.Eventf(pool, nil, corev1.EventTypeNormal, "ScaledPool", "ComputeBounds",
			"pool concurrency %d→%d (%d→%d ready replicas)", old.PoolConcurrency, cur.PoolConcurrency, old.ReadyReplicas, cur.ReadyReplicas)
	}
	if observedS != prevObservedS && observedS > 0 {
		r.Recorder.Eventf(pool, nil, corev1.EventTypeNormal, "ServiceTimeMeasured", "ComputeBounds",
			"dispatchers measure a service time of %s (was %s)", observedS, prevObservedS)
	}
}

func findCondition(conds []metav1.Condition, typ string) *metav1.Condition {
	for i := range conds {
		if conds[i].Type == typ {
			return &conds[i]
		}
	}
	return nil
}

func (r *PoolReconciler) writeTierStatus(ctx context.Context, pool *v1alpha1.ModelPool, obs *observed, bounds Bounds, now metav1.Time) error {
	byName := map[string]TierBounds{}
	for _, tb := range bounds.Tiers {
		byName[tb.Name] = tb
	}
	before := map[string]int32{}
	for i := range obs.tiers {
		t := &obs.tiers[i]
		before[t.Name] = t.Status.QueueBound
		st := desiredTierStatus(t.Status, t.Generation, byName[t.Name], bounds.Pool, now)
		if err := patchTierStatus(ctx, r.Client, t, st); err != nil {
			return err
		}
	}
	if msg := boundChanges(before, bounds.Tiers); msg != "" && r.Recorder != nil {
		r.Recorder.Eventf(pool, nil, corev1.EventTypeNormal, "ScaledBounds", "ComputeBounds", "%s", msg)
	}
	return nil
}

func (r *PoolReconciler) writeQuotaStatus(ctx context.Context, pool *v1alpha1.ModelPool, obs *observed, bounds Bounds, now metav1.Time) error {
	byQuota := map[string]TenantBounds{}
	for _, tb := range bounds.Tenants {
		byQuota[tb.QuotaName] = tb
	}
	for i := range obs.quotas {
		q := &obs.quotas[i]
		ss := obs.secretState[q.Name]
		st := desiredQuotaStatus(q.Status, quotaView{
			Generation:    q.Generation,
			Pool:          pool.Name,
			Tenant:        byQuota[q.Name],
			SecretName:    ss.name,
			SecretMissing: ss.missing,
			KeysMissing:   ss.keys,
		}, now)
		if err := patchQuotaStatus(ctx, r.Client, q, st); err != nil {
			return err
		}
	}
	return nil
}

// patchTierStatus writes a tier's status when it changed.
func patchTierStatus(ctx context.Context, c ctrl.Client, t *v1alpha1.ServiceTier, st v1alpha1.ServiceTierStatus) error {
	if equality.Semantic.DeepEqual(t.Status, st) {
		return nil
	}
	orig := t.DeepCopy()
	t.Status = st
	return ignoreNotFound(c.Status().Patch(ctx, t, ctrl.MergeFrom(orig)))
}

// patchQuotaStatus writes a quota's status when it changed.
func patchQuotaStatus(ctx context.Context, c ctrl.Client, q *v1alpha1.TenantQuota, st v1alpha1.TenantQuotaStatus) error {
	if equality.Semantic.DeepEqual(q.Status, st) {
		return nil
	}
	orig := q.DeepCopy()
	q.Status = st
	return ignoreNotFound(c.Status().Patch(ctx, q, ctrl.MergeFrom(orig)))
}

func ignoreNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// selectorMatches reports whether sel selects the labels; an empty or
// invalid selector selects nothing.
func selectorMatches(sel *metav1.LabelSelector, l map[string]string) bool {
	if sel == nil {
		return false
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil || s.Empty() {
		return false
	}
	return s.Matches(labels.Set(l))
}
