package controllers

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"math"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/api/v1alpha1"
	"github.com/tiergate/tiergate/capacity"
)

// +kubebuilder:rbac:groups=tiergate.dev,resources=modelpools;servicetiers;tenantquotas,verbs=get;list;watch
// +kubebuilder:rbac:groups=tiergate.dev,resources=modelpools/status;servicetiers/status;tenantquotas/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch
// Secrets: the cache's informer lists and watches only those labelled
// tiergate.dev/api-keys (CacheByObject), but RBAC grants by name, not by
// label, so list and watch are needed on all; get reads the metadata of a
// referenced Secret the cache lacks.
// +kubebuilder:rbac:groups="",resources=pods;secrets,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// PoolReconciler reconciles one ModelPool: it reads the pool, its tiers and
// quotas, their Secrets, the model Deployment and pods and the dispatcher
// pods, computes the bounds, writes the status of the pool and of its tiers
// and quotas, and hands each dispatcher pod its policy through the Pusher.
type PoolReconciler struct {
	// Client reads through the manager's cache, which holds only the
	// Secrets labelled APIKeysLabel (CacheByObject).
	Client client.Client
	// APIReader reads the API server directly: only the metadata of a
	// referenced Secret the cache lacks, to report it as unlabelled.
	APIReader client.Reader
	Recorder  events.EventRecorder
	Pusher    policySyncer
	Clock     clock.PassiveClock
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
	// PrometheusAddress is the serverAddress of a ScaledObject whose pool
	// names none.
	PrometheusAddress string
	// TokenSecret (namespace/name) is named in conditions about refused
	// push tokens; "" when the controller does not manage it.
	TokenSecret string
	// JWKS fetches the key sets of JWT pools whose keys come from a URL.
	JWKS *JWKSFetcher
	// quotaStatus writes the quotas' statuses off the reconcile path;
	// nil writes them inline (unit tests).
	quotaStatus *statusBatches
	// tierStatus writes the tiers' statuses off the reconcile path; nil
	// writes them inline (unit tests).
	tierStatus *latestWrites
	// StatusDelay is how long a pool status change without a new version
	// may wait for its write (persistStatus); 0 writes it at once.
	StatusDelay time.Duration
	// health are the time constants of the failing-dispatcher rules; zero
	// takes defaultHealthTuning (tests shorten them).
	health healthTuning

	mu    sync.Mutex
	pools map[types.NamespacedName]*poolMemory
}

// policySyncer is what the reconciler needs of the Pusher.
type policySyncer interface {
	Sync(pool types.NamespacedName, targets []Target, resync bool)
	Forget(pool types.NamespacedName)
	States(pool types.NamespacedName) []PodState
}

// Reconcile implements reconcile.Reconciler.
func (r *PoolReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	now := r.Clock.Now()
	stamp := metav1.NewTime(now.Truncate(time.Second))
	var pool v1alpha1.ModelPool
	if err := r.Client.Get(ctx, req.NamespacedName, &pool); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, r.forget(ctx, req.NamespacedName, stamp)
		}
		return ctrl.Result{}, err
	}
	if !pool.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, r.forget(ctx, req.NamespacedName, stamp)
	}
	mem := r.memory(req.NamespacedName)
	mem.status.freshen(&pool)
	capacity.ApplyDefaults(&pool.Spec)
	obs, err := r.observe(ctx, &pool)
	if err != nil {
		return ctrl.Result{}, err
	}
	r.assessDispatchers(&pool, obs, mem, now)
	states := r.Pusher.States(req.NamespacedName)
	c, err := r.compute(&pool, obs, states)
	if err != nil {
		// The schema refuses such specs; this is a pool written around it.
		log.FromContext(ctx).Error(err, "cannot compute bounds")
		return ctrl.Result{}, reconcile.TerminalError(err)
	}
	c.autoscaler = r.syncAutoscaler(ctx, &pool, &mem.autoscaler, now)
	want := r.desire(&pool, obs, c, states, mem, stamp)
	c.skewWarning = want.skewWarning
	read := r.Clock.Now()
	if err := r.reserveVersions(ctx, &pool, want, c, mem); err != nil {
		return statusWriteFailed(ctx, err)
	}
	written := r.Clock.Now()
	if want.version != mem.version {
		// Every pod is pushed the new version: that round is the resync,
		// and the next one is a period away (no pod re-applies a version
		// it acknowledged moments ago).
		mem.lastResync = now
	}
	mem.contentHash, mem.version = want.hash, want.version
	mem.maxWaitTiers = exportPoolMetrics(req.String(), mem.maxWaitTiers, c.bounds, c.demand)
	period := resyncPeriod(r.ResyncPeriod, c.bounds)
	r.Pusher.Sync(req.NamespacedName, want.targets, mem.resyncDue(now, period))
	mem.health.noteShares(want.targets, now)
	statusWait, err := r.persistStatus(ctx, &pool, want, c, mem, replicasMoving(obs.deployment, len(obs.backends)), now)
	if err != nil {
		return statusWriteFailed(ctx, err)
	}

	// Tier and quota status after the push has started, and off this
	// reconcile when there are writers: they are for people, the push is
	// for traffic, and the pool's next event must not wait for them
	// (statusbatch.go).
	if err := r.submitStatus(ctx, &pool, obs, c.bounds, stamp, &mem.status); err != nil {
		return ctrl.Result{}, err
	}
	log.FromContext(ctx).V(1).Info("reconciled", "version", want.version, "backends", len(obs.backends),
		"read", read.Sub(now).String(), "reserve", written.Sub(read).String(), "afterPush", r.Clock.Since(written).String(),
		"statusDeferred", statusWait.String())
	res := mem.requeue(now, period)
	if statusWait > 0 && (res.RequeueAfter == 0 || statusWait < res.RequeueAfter) {
		res.RequeueAfter = statusWait
	}
	return res, nil
}

// reserveVersions stores the reserved ceiling of versions before the
// first version above the stored one is pushed (reserve.go), with the rest
// of the status that waited. Any other version is pushed first and written
// by persistStatus: no status write stands between a pod's deletion and
// the dispatchers.
func (r *PoolReconciler) reserveVersions(ctx context.Context, pool *v1alpha1.ModelPool, want desired, c computed, mem *poolMemory) error {
	if want.status.PolicyVersionReserved == pool.Status.PolicyVersionReserved {
		return nil
	}
	mem.dirtySince = time.Time{}
	return r.writePoolStatus(ctx, pool, want.status, c, &mem.status)
}

// persistStatus writes the pool's status when it is due, else says how
// long its write is deferred. A change (a new version within the reserved
// block, the pods' acks, ready counts, conditions) waits up to
// StatusDelay, or movingStatusDelay while replicas are on their way, and
// goes with the next write: a write after each round of acks, or each
// pod's version in a scale step, made the pool's writes O(pods) and held
// its next event for the write's round trip.
func (r *PoolReconciler) persistStatus(ctx context.Context, pool *v1alpha1.ModelPool, want desired, c computed, mem *poolMemory, moving bool, now time.Time) (time.Duration, error) {
	differs := !equality.Semantic.DeepEqual(pool.Status, want.status)
	delay := r.StatusDelay
	if moving && delay > 0 {
		delay = max(delay, movingStatusDelay)
	}
	if wait := mem.statusWait(differs, now, delay); wait > 0 {
		return wait, nil
	}
	return 0, r.writePoolStatus(ctx, pool, want.status, c, &mem.status)
}

// desired is what one reconcile puts in force.
type desired struct {
	hash    string // of the policies' content
	version int64
	// targets are the dispatcher pods with their policies; none when the
	// pool has no tiers, since there is no valid policy then and
	// dispatchers keep theirs.
	targets []Target
	status  v1alpha1.ModelPoolStatus
	// skewWarning is the Warning event's text when older dispatchers
	// cannot enforce features in use.
	skewWarning string
}

// computed is what one reconcile derives from what it observed.
type computed struct {
	bounds capacity.Bounds
	demand capacity.Demand
	// autoscaler is the outcome of the ScaledObject step.
	autoscaler autoscalerState
	// prevS is the observed service time in status, serviceTime the one to
	// record now (0 while nothing was measured).
	prevS, serviceTime time.Duration
	// tokenRate is the measured weighted tokens per slot-second to record
	// now (0 while nothing was measured).
	tokenRate float64
	// skewWarning is desired.skewWarning, for poolEvents.
	skewWarning string
}

// compute folds the measured service time and derives the bounds and the
// desired replicas; an error means a spec the schema would refuse.
func (r *PoolReconciler) compute(pool *v1alpha1.ModelPool, obs *observed, states []PodState) (computed, error) {
	var c computed
	c.prevS, c.serviceTime = r.serviceTime(pool, states)
	c.tokenRate = r.tokenRate(pool, states)
	in := obs.boundsInput(pool, c.serviceTime)
	in.ObservedTokenRate = c.tokenRate
	var err error
	if c.bounds, err = capacity.ComputeBounds(in); err != nil {
		return c, err
	}
	reports := make([]policy.Measured, 0, len(states))
	for _, s := range states {
		reports = append(reports, s.Stats)
	}
	c.demand, err = capacity.DesiredReplicas(capacity.DemandInput{Pool: pool, ServiceTime: c.bounds.Pool.ServiceTime, Reports: reports})
	return c, err
}

// desire derives the policies' version, the push targets and the pool's
// status from what was computed.
func (r *PoolReconciler) desire(pool *v1alpha1.ModelPool, obs *observed, c computed, states []PodState, mem *poolMemory, stamp metav1.Time) desired {
	policies := servablePolicies(c.bounds, len(obs.backends))
	d := desired{hash: contentHash(policies)}
	d.version = mem.nextVersion(d.hash, pool.Status, states)
	reserved := versionCeiling(pool.Status.PolicyVersionReserved, d.version)
	targets := dispatcherTargets(obs.dispatchers, pool.Spec.Dispatchers.AdminPort, policies, d.version)
	d.status = desiredPoolStatus(pool.Status, poolView{
		Generation:        pool.Generation,
		DeploymentFound:   obs.deployment != nil,
		Bounds:            c.bounds,
		Demand:            c.demand,
		Autoscaler:        c.autoscaler,
		Backends:          len(obs.backends),
		HasTiers:          len(obs.tiers) > 0,
		Version:           d.version,
		Reserved:          reserved,
		ObservedService:   c.serviceTime,
		ObservedTokenRate: c.tokenRate,
		SharedState:       pool.Spec.SharedState,
		Dispatchers:       dispatcherViews(targets, states, obs.excluded),
		UnreachableStrike: r.UnreachableStrike,
		TokenSecret:       r.TokenSecret,
		Auth:              newAuthView(pool.Spec.Authentication, obs.jwks),
	}, stamp)
	d.skewWarning = setSkew(&d.status, states, pool.Generation, stamp)
	if len(obs.tiers) > 0 {
		d.targets = targets
	}
	return d
}

// forget stops pushing for a deleted pool and marks its tiers and their
// quotas. Its version memory is kept, so a pool recreated under the same
// name continues above the versions its dispatchers still hold.
func (r *PoolReconciler) forget(ctx context.Context, key types.NamespacedName, stamp metav1.Time) error {
	r.Pusher.Forget(key)
	if r.JWKS != nil {
		r.JWKS.Forget(key)
	}
	r.mu.Lock()
	if m, ok := r.pools[key]; ok {
		m.contentHash = ""
		m.maxWaitTiers = nil
		m.autoscaler = autoscalerMemory{}
	}
	r.mu.Unlock()
	forgetPoolMetrics(key.String())

	var tiers v1alpha1.ServiceTierList
	if err := r.Client.List(ctx, &tiers, client.InNamespace(key.Namespace), client.MatchingFields{indexTierPool: key.Name}); err != nil {
		return err
	}
	orphanTiers := func(ctx context.Context) error {
		for i := range tiers.Items {
			t := &tiers.Items[i]
			if _, err := patchStatus(ctx, r.Client, t, &t.Status, orphanTierStatus(t.Status, t.Generation, key.Name, stamp), lastWriteWins); client.IgnoreNotFound(err) != nil {
				return err
			}
		}
		return nil
	}
	if r.tierStatus != nil {
		// After, and instead of, any of the pool's tier writes still waiting.
		r.tierStatus.submit(key, orphanTiers)
	} else if err := orphanTiers(ctx); err != nil {
		return err
	}
	orphans := func(ctx context.Context) error { return r.orphanQuotas(ctx, key.Namespace, tiers.Items, stamp) }
	if r.quotaStatus != nil {
		// After, and instead of, any batch of the pool still pending.
		r.quotaStatus.submit(key, statusBatch{write: orphans, settled: true})
		return nil
	}
	return orphans(ctx)
}

// orphanQuotas says PoolNotFound in the status of every quota of tiers.
func (r *PoolReconciler) orphanQuotas(ctx context.Context, ns string, tiers []v1alpha1.ServiceTier, stamp metav1.Time) error {
	for i := range tiers {
		var quotas v1alpha1.TenantQuotaList
		if err := r.Client.List(ctx, &quotas, client.InNamespace(ns), client.MatchingFields{indexQuotaTier: tiers[i].Name}); err != nil {
			return err
		}
		for j := range quotas.Items {
			q := &quotas.Items[j]
			st := desiredQuotaStatus(q.Status, quotaView{Generation: q.Generation, PoolMissing: true,
				Tenant: capacity.TenantBounds{QuotaName: q.Name, Tenant: q.Spec.Tenant, Tier: q.Spec.TierRef.Name}}, stamp)
			if _, err := patchStatus(ctx, r.Client, q, &q.Status, st, lastWriteWins); client.IgnoreNotFound(err) != nil {
				return err
			}
		}
	}
	return nil
}

// serviceTime folds the dispatchers' measured service times into S, with
// hysteresis: prev is the value in status, next the one to record now.
// It is recorded in every mode; the bounds use it only when the source is
// Measured.
func (r *PoolReconciler) serviceTime(pool *v1alpha1.ModelPool, states []PodState) (prev, next time.Duration) {
	stats := make([]policy.Measured, 0, len(states))
	for _, s := range states {
		stats = append(stats, s.Stats)
	}
	if pool.Status.ObservedServiceTime != nil {
		prev = pool.Status.ObservedServiceTime.Duration
	}
	reference := prev
	if reference == 0 {
		reference = pool.Spec.ServiceTime.Mean.Duration
	}
	next, moved := foldServiceTime(reference, stats, r.MeasuredMinCompletions, r.MeasuredTolerance)
	if !moved {
		next = prev
	}
	return prev, next
}

// tokenRate folds the dispatchers' measured token rates, with the same
// hysteresis, from the value in status (0 when none or unreadable). Like
// the service time it is recorded in every mode; the token bounds use it
// only when the source is Measured.
func (r *PoolReconciler) tokenRate(pool *v1alpha1.ModelPool, states []PodState) float64 {
	stats := make([]policy.Measured, 0, len(states))
	for _, s := range states {
		stats = append(stats, s.Stats)
	}
	prev, err := strconv.ParseFloat(pool.Status.ObservedTokenRate, 64)
	if err != nil || prev < 0 || math.IsInf(prev, 0) {
		prev = 0
	}
	next, _ := foldTokenRate(prev, stats, r.MeasuredMinCompletions, r.MeasuredTolerance)
	return next
}

// servablePolicies are the bounds' policies, with 0 slots when no backend
// is Ready: a policy with slots but no backends is invalid, and 0 slots
// makes dispatchers answer 503 at once. A pool with no slots (no ready
// replica counted, whatever pods still look Ready) also gets no backends,
// so that no dispatcher takes its 0 slots for a missing share of a pool
// that can serve and reports NotReady: then all would.
func servablePolicies(b capacity.Bounds, backends int) []policy.Policy {
	policies := append([]policy.Policy(nil), b.Policies...)
	for i := range policies {
		switch {
		case b.Pool.Concurrency == 0:
			policies[i].Slots, policies[i].Backends = 0, nil
		case backends == 0:
			policies[i].Slots = 0
		}
	}
	return policies
}

// contentHash identifies the policies' content, whatever their version.
// Each policy's JSON is encoded straight into the hash (the Encoder adds
// the newline that separates them), not into a buffer of its own: with
// 1,000 backends and 200 tenants in each of 20 policies those buffers
// were a sixth of a scale's reconcile CPU and much of its garbage.
func contentHash(policies []policy.Policy) string {
	h := sha256.New()
	enc := json.NewEncoder(h)
	for _, p := range policies {
		p.Version = 0
		_ = enc.Encode(p) // a hash.Hash never fails to write
	}
	return hex.EncodeToString(h.Sum(nil))
}

// dispatcherViews pairs each target with what the Pusher knows of it and
// why it is excluded (excluded is in the targets' order, or nil).
func dispatcherViews(targets []Target, states []PodState, excluded []string) []dispatcherView {
	byUID := make(map[types.UID]PodState, len(states))
	for _, s := range states {
		byUID[s.UID] = s
	}
	var views []dispatcherView
	for i, t := range targets {
		s := byUID[t.UID]
		v := dispatcherView{Name: t.Name, Ready: t.Ready, Acked: s.AckedVersion, State: s, NoSlot: t.Policy.Slots == 0}
		if i < len(excluded) {
			v.Excluded = excluded[i]
		}
		views = append(views, v)
	}
	return views
}

// assessDispatchers decides which dispatcher pods are failing and hold no
// share of the slots (Local mode only: in Redis mode every dispatcher holds
// the pool-wide numbers), records an event for each newly excluded one and
// notes when a decision is next due.
func (r *PoolReconciler) assessDispatchers(pool *v1alpha1.ModelPool, obs *observed, mem *poolMemory, now time.Time) {
	if pool.Spec.SharedState == v1alpha1.SharedStateRedis {
		mem.health, mem.healthNext = healthMemory{}, time.Time{}
		return
	}
	tune := r.health
	if tune == (healthTuning{}) {
		tune = defaultHealthTuning
	}
	var newly []string
	obs.excluded, newly, mem.healthNext = mem.health.assess(obs.dispatcherFacts(), now, tune)
	if r.Recorder == nil {
		return
	}
	for _, n := range newly {
		r.Recorder.Eventf(pool, nil, corev1.EventTypeWarning, "DispatcherExcluded", "SplitSlots",
			"%s is failing: it holds no slot and its share goes to the other dispatchers", n)
	}
}

// poolMemory is what the reconciler remembers of a pool between reconciles.
// It is lost on restart; the stored status.policyVersionReserved then
// makes the next version larger than any pushed before.
type poolMemory struct {
	contentHash string
	version     int64
	lastResync  time.Time
	// maxWaitTiers are the tiers whose tiergate_tier_max_wait_seconds
	// series this pool exports.
	maxWaitTiers map[string]bool
	autoscaler   autoscalerMemory
	// health remembers the dispatcher pods; healthNext is when one of its
	// decisions is next due (zero: none).
	health     healthMemory
	healthNext time.Time
	// status is the pool's last status write (statuswrite.go).
	status statusMemory
	// dirtySince is when the status that waits for its write (no new
	// reserved ceiling in it) first differed from the stored one; zero when none
	// waits.
	dirtySince time.Time
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

// nextVersion is the version of policies whose content hashes to hash. It
// stays while the content stays and no dispatcher reports holding it or a
// later one; otherwise it goes one above the persisted version, the
// remembered one and any a dispatcher holds. A memory that holds no
// version (a restart, a new leader) also starts above the stored reserved
// ceiling, which covers every version pushed before.
func (m *poolMemory) nextVersion(hash string, stored v1alpha1.ModelPoolStatus, states []PodState) int64 {
	var held int64
	for _, s := range states {
		held = max(held, s.HeldVersion)
	}
	if m.contentHash == hash && m.version != 0 && held < m.version {
		return m.version
	}
	floor := max(stored.PolicyVersion, m.version, held)
	if m.version == 0 {
		floor = max(floor, stored.PolicyVersionReserved)
	}
	return floor + 1
}

// statusWait is how much longer a status that differs from the one
// stored may wait to be written; 0 when it must be written now (no delay,
// or it has waited delay) or there is nothing to write.
func (m *poolMemory) statusWait(differs bool, now time.Time, delay time.Duration) time.Duration {
	if !differs || delay <= 0 {
		m.dirtySince = time.Time{}
		return 0
	}
	if m.dirtySince.IsZero() {
		m.dirtySince = now
	}
	wait := m.dirtySince.Add(delay).Sub(now)
	if wait <= 0 {
		m.dirtySince = time.Time{}
		return 0
	}
	return wait
}

// resyncDue reports whether period has passed since the last resync (or
// the last new version, which every pod is pushed) and, if so, starts a
// new one at now.
func (m *poolMemory) resyncDue(now time.Time, period time.Duration) bool {
	if period <= 0 || now.Sub(m.lastResync) < period {
		return false
	}
	m.lastResync = now
	return true
}

// requeue brings the pool back at its next resync, or sooner when a
// dispatcher health decision is due.
func (m *poolMemory) requeue(now time.Time, period time.Duration) ctrl.Result {
	var after time.Duration
	if period > 0 {
		after = period - now.Sub(m.lastResync)
	}
	if !m.healthNext.IsZero() && (after == 0 || m.healthNext.Sub(now) < after) {
		after = max(m.healthNext.Sub(now), time.Millisecond)
	}
	return ctrl.Result{RequeueAfter: after}
}
