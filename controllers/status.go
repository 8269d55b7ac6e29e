package controllers

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tiergate/tiergate/api/v1alpha1"
	"github.com/tiergate/tiergate/capacity"
)

// Pure status helpers: each takes the object's current status and what was
// observed, and returns the status to write. The caller writes only when the
// result differs. now stamps conditions whose status changes.

// poolView is everything the ModelPool status is computed from.
type poolView struct {
	Generation        int64
	DeploymentFound   bool
	Bounds            capacity.Bounds
	Demand            capacity.Demand
	Autoscaler        autoscalerState
	Backends          int
	HasTiers          bool
	Version           int64
	Reserved          int64         // the reserved version ceiling (reserve.go)
	ObservedService   time.Duration // 0 when nothing measured yet
	ObservedTokenRate float64       // weighted tokens per slot-second; 0 when nothing measured yet
	SharedState       v1alpha1.SharedStateMode
	Dispatchers       []dispatcherView
	UnreachableStrike int // consecutive failures before an unreachable pod degrades the pool
	// TokenSecret is the push token Secret as namespace/name, "" when the
	// controller does not manage it; condition messages name it.
	TokenSecret string
	Auth        authView
}

// dispatcherView is one dispatcher pod as the status sees it.
type dispatcherView struct {
	Name     string
	Ready    bool
	Acked    int64
	State    PodState
	Attempts int
	// NoSlot: its policy gives it no slot. Excluded says why, when that
	// is because it is failing ("" when it is not).
	NoSlot   bool
	Excluded string
}

func setCondition(conds *[]metav1.Condition, now metav1.Time, gen int64, typ string, ok bool, reason, msg string) {
	st := metav1.ConditionFalse
	if ok {
		st = metav1.ConditionTrue
	}
	meta.SetStatusCondition(conds, metav1.Condition{Type: typ, Status: st, Reason: reason, Message: msg, ObservedGeneration: gen, LastTransitionTime: now})
}

// desiredPoolStatus computes a ModelPool's status.
func desiredPoolStatus(cur v1alpha1.ModelPoolStatus, v poolView, now metav1.Time) v1alpha1.ModelPoolStatus {
	st := *cur.DeepCopy()
	b := v.Bounds.Pool
	st.ObservedGeneration = v.Generation
	st.ReadyReplicas = b.ReadyReplicas
	st.PoolConcurrency = b.Concurrency
	st.ServiceRate = b.ServiceRateString
	st.AgeingRate = &metav1.Duration{Duration: b.AgeingRate}
	st.ObservedServiceTime = nil
	if v.ObservedService > 0 {
		st.ObservedServiceTime = &metav1.Duration{Duration: v.ObservedService}
	}
	st.ObservedTokenRate = ""
	if v.ObservedTokenRate > 0 {
		st.ObservedTokenRate = strconv.FormatFloat(v.ObservedTokenRate, 'f', -1, 64)
	}
	st.TokenRate = b.TokenRateString
	st.PolicyVersion = v.Version
	st.PolicyVersionReserved = v.Reserved
	st.DesiredReplicas = v.Demand.Replicas
	st.Dispatchers = dispatcherCounts(v.Dispatchers, v.Version)

	set := func(typ string, ok bool, reason, msg string) {
		setCondition(&st.Conditions, now, v.Generation, typ, ok, reason, msg)
	}
	ok, reason, msg := poolReady(v)
	set(v1alpha1.ConditionReady, ok, reason, msg)
	ok, reason, msg = poolSynced(v, st.Dispatchers)
	set(v1alpha1.ModelPoolSynced, ok, reason, msg)
	// Degraded: a dispatcher refuses or cannot be reached.
	if reason, msg := degradedReason(v.Dispatchers, v.UnreachableStrike); reason != "" {
		set(v1alpha1.ModelPoolDegraded, true, reason, msg)
	} else {
		set(v1alpha1.ModelPoolDegraded, false, string(v1alpha1.ReasonHealthy), "every dispatcher accepts pushes")
	}
	// The ageing horizon against the client timeout (docs/architecture.md#the-bounds).
	set(v1alpha1.ModelPoolAgeingHorizonExceedsClientTimeout, b.HorizonExceedsClientTimeout, horizonReason(b), capacity.HorizonMessage(b))
	set(v1alpha1.ModelPoolAutoscalerUnavailable, v.Autoscaler.unavailable, string(v.Autoscaler.reason), v.Autoscaler.message)
	setAuthConditions(&st.Conditions, now, v.Generation, v.Auth)
	ok, reason, msg = slotlessDispatchers(v)
	set(v1alpha1.ModelPoolFewerSlotsThanDispatchers, ok, reason, msg)
	return st
}

func dispatcherCounts(ds []dispatcherView, version int64) v1alpha1.DispatcherCounts {
	c := v1alpha1.DispatcherCounts{Total: int32(len(ds))}
	for _, d := range ds {
		if d.Ready {
			c.Ready++
		}
		if d.Acked == version {
			c.Synced++
		}
	}
	return c
}

// poolReady is the Ready condition: the pool can serve with the bounds in
// force.
func poolReady(v poolView) (bool, string, string) {
	b := v.Bounds.Pool
	switch {
	case !v.DeploymentFound:
		return false, string(v1alpha1.ReasonDeploymentNotFound),
			"the Deployment named in spec.deploymentRef does not exist; the policy has 0 slots"
	case b.ColdStart > 0:
		return false, string(v1alpha1.ReasonHeldForColdStart), heldMessage(v.Bounds)
	case b.ReadyReplicas == 0:
		return false, string(v1alpha1.ReasonNoReadyReplicas),
			"the Deployment has no ready replicas; the policy has 0 slots and dispatchers answer 503"
	case v.Backends == 0:
		return false, string(v1alpha1.ReasonNoReadyReplicas),
			fmt.Sprintf("the Deployment reports %d ready replicas but no Ready pod with an IP matches its selector; the policy has 0 slots", b.ReadyReplicas)
	case !v.HasTiers:
		return false, string(v1alpha1.ReasonNoTiers),
			"no ServiceTier references this pool; no policy is pushed and dispatchers keep their last one"
	}
	msg := fmt.Sprintf("%d slots on %d ready replicas (%d backends), serving %s requests/s with a service time of %s",
		b.Concurrency, b.ReadyReplicas, v.Backends, b.ServiceRateString, b.ServiceTime)
	if b.DefaultTierNotFound {
		msg += "; spec.defaultTier names no ServiceTier of this pool, so tenants without a TenantQuota are refused"
	}
	return true, string(v1alpha1.ReasonPoolReady), msg
}

// heldMessage says what a pool at zero holds for its first replica.
func heldMessage(b capacity.Bounds) string {
	msg := fmt.Sprintf("the Deployment has no ready replicas; dispatchers hold up to %d requests for the first replica, expected within the cold start of %s",
		b.Pool.TotalQueueBound, b.Pool.ColdStart)
	var refused []string
	for _, tb := range b.Tiers {
		if tb.QueueBound == 0 {
			refused = append(refused, tb.Name)
		}
	}
	if len(refused) > 0 {
		msg += fmt.Sprintf(", and refuse tier %s at once (503): it cannot wait out the cold start", listNames(refused))
	}
	return msg
}

// poolSynced is the Synced condition: every dispatcher pod acknowledged the
// current version.
func poolSynced(v poolView, c v1alpha1.DispatcherCounts) (bool, string, string) {
	switch {
	case c.Total == 0:
		return false, string(v1alpha1.ReasonNoDispatchers), "no pod with an IP matches spec.dispatchers.selector"
	case !v.HasTiers:
		return false, string(v1alpha1.ReasonNoTiers), "no policy to push: the pool has no ServiceTier"
	}
	if held := heldByOtherPools(v.Dispatchers); held != "" {
		return false, string(v1alpha1.ReasonDispatcherHeldByOtherPool), held
	}
	var behind, refused []string
	for _, d := range v.Dispatchers {
		if d.Acked != v.Version {
			behind = append(behind, d.Name)
		}
		// A pod that refused the token holds what it has and will take
		// no new policy, even if it holds the current one.
		if d.State.Result == PushUnauthorized {
			refused = append(refused, d.Name)
		}
	}
	held := fmt.Sprintf("%d/%d dispatchers hold policy version %d", c.Synced, c.Total, v.Version)
	if len(refused) > 0 {
		return false, string(v1alpha1.ReasonPushUnauthorized),
			fmt.Sprintf("%s refused the push token (401) and will take no new policy; %s; %s", listNames(refused), held, tokenAdvice(v.TokenSecret))
	}
	if c.Synced == c.Total {
		return true, string(v1alpha1.ReasonAllSynced), held
	}
	return false, string(v1alpha1.ReasonSyncPending), fmt.Sprintf("%s; waiting for %s", held, listNames(behind))
}

// tokenAdvice says what to check when dispatchers refuse the push token.
func tokenAdvice(secret string) string {
	what := "the push token Secret"
	if secret != "" {
		what += " " + secret
	}
	return "check " + what + ": the controller's --push-token-file and every dispatcher's --admin-token-file must hold its token " +
		"(after a rotation both follow their file within seconds, and the replaced token is accepted for up to 60s)"
}

func horizonReason(b capacity.PoolBounds) string {
	if b.HorizonExceedsClientTimeout {
		return string(v1alpha1.ReasonHorizonExceedsTimeout)
	}
	return string(v1alpha1.ReasonHorizonWithinTimeout)
}

// degradedReason picks the most telling failure: a refused token first,
// then a refused policy, then other answers, then pods unreachable for
// strike consecutive attempts (a fresh pod may not listen yet).
func degradedReason(ds []dispatcherView, strike int) (string, string) {
	by := map[PushResult][]string{}
	var first = map[PushResult]error{}
	for _, d := range ds {
		r := d.State.Result
		if r == "" || r == PushOK || r == PushConflict {
			continue
		}
		if r == PushUnreachable && d.State.Failures < strike {
			continue
		}
		by[r] = append(by[r], d.Name)
		if first[r] == nil {
			first[r] = d.State.Err
		}
	}
	switch {
	case len(by[PushUnauthorized]) > 0:
		return string(v1alpha1.ReasonPushUnauthorized), fmt.Sprintf("%s refused the push token (check --push-token-file against the dispatchers' --admin-token-file): %v",
			listNames(by[PushUnauthorized]), first[PushUnauthorized])
	case len(by[PushPoolMismatch]) > 0:
		return string(v1alpha1.ReasonDispatcherHeldByOtherPool), heldByOtherPools(ds)
	case len(by[PushRejected]) > 0:
		return string(v1alpha1.ReasonPushRejected), fmt.Sprintf("%s rejected the policy: %v", listNames(by[PushRejected]), first[PushRejected])
	case len(by[PushFailed]) > 0:
		return string(v1alpha1.ReasonPushRejected), fmt.Sprintf("%s did not accept the policy: %v", listNames(by[PushFailed]), first[PushFailed])
	case len(by[PushUnreachable]) > 0:
		return string(v1alpha1.ReasonDispatcherUnreachable), fmt.Sprintf("%s unreachable, retrying with backoff: %v", listNames(by[PushUnreachable]), first[PushUnreachable])
	}
	return "", ""
}

// heldByOtherPools names the dispatcher pods that refused this pool's
// policy because they hold another pool's; "" when none did.
func heldByOtherPools(ds []dispatcherView) string {
	var names, pools []string
	for _, d := range ds {
		if d.State.Result == PushPoolMismatch {
			names = append(names, d.Name)
			pools = append(pools, d.State.HeldPool)
		}
	}
	if len(names) == 0 {
		return ""
	}
	sort.Strings(pools)
	who := "dispatcher " + listNames(names) + " holds"
	if len(names) > 1 {
		who = "dispatchers " + listNames(names) + " hold"
	}
	return fmt.Sprintf("%s the policy of ModelPool %s and refuse(s) this pool's: the two pools' spec.dispatchers.selector overlap. Make them disjoint; a dispatcher changes pool only when it restarts",
		who, strings.Join(slices.Compact(pools), ", "))
}

func listNames(names []string) string {
	sort.Strings(names)
	if len(names) > 5 {
		return strings.Join(names[:5], ", ") + fmt.Sprintf(" and %d more", len(names)-5)
	}
	return strings.Join(names, ", ")
}

// desiredTierStatus computes a ServiceTier's status from its bounds.
func desiredTierStatus(cur v1alpha1.ServiceTierStatus, gen int64, tb capacity.TierBounds, pool capacity.PoolBounds, now metav1.Time) v1alpha1.ServiceTierStatus {
	st := *cur.DeepCopy()
	st.ObservedGeneration = gen
	st.QueueBound = tb.QueueBound
	st.TenantConcurrencyLimit = tb.TenantConcurrencyLimit
	st.TenantQueueLimit = tb.TenantQueueLimit
	st.QueueTokenBound, st.TenantQueueTokenLimit = tb.QueueTokenBound, tb.TenantQueueTokenLimit
	st.MaxWait = nil
	if !tb.Unbounded {
		st.MaxWait = &metav1.Duration{Duration: tb.MaxWait}
	}
	st.Guarantee = tb.Guarantee
	ready, reason, msg := tierReady(tb, pool)
	setCondition(&st.Conditions, now, gen, v1alpha1.ConditionReady, ready, reason, msg)
	return st
}

// tierReady is a tier's Ready condition: whether its bounds serve now.
func tierReady(tb capacity.TierBounds, pool capacity.PoolBounds) (bool, string, string) {
	switch {
	case pool.ColdStart > 0 && tb.QueueBound == 0:
		return false, string(v1alpha1.ReasonPoolNotReady), fmt.Sprintf(
			"the pool is at zero replicas and this tier cannot wait out the cold start of %s: its requests are refused (503) until a replica is Ready", pool.ColdStart)
	case pool.ColdStart > 0 && tb.QueueTokenBound > 0:
		return false, string(v1alpha1.ReasonTierHeldForColdStart), fmt.Sprintf(
			"the pool is at zero replicas: up to %d weighted tokens of requests are held for the first replica, expected within the cold start of %s", tb.QueueTokenBound, pool.ColdStart)
	case pool.ColdStart > 0:
		return false, string(v1alpha1.ReasonTierHeldForColdStart), fmt.Sprintf(
			"the pool is at zero replicas: up to %d requests are held for the first replica, expected within the cold start of %s", tb.QueueBound, pool.ColdStart)
	case pool.NoReadyReplicas:
		return false, string(v1alpha1.ReasonPoolNotReady), "the pool has no ready replicas and no coldStart: its bound is 0, every request is refused (503) and nothing is served"
	}
	if tb.QueueTokenBound > 0 {
		return true, string(v1alpha1.ReasonBoundsComputed), fmt.Sprintf(
			"queue bound %d weighted tokens (%s per slot-second, %s), tenant limits %d in flight and %d weighted tokens queued, for %d pool slots",
			tb.QueueTokenBound, pool.TokenRateString, strings.ToLower(string(pool.TokenRateSource)), tb.TenantConcurrencyLimit, tb.TenantQueueTokenLimit, pool.Concurrency)
	}
	return true, string(v1alpha1.ReasonBoundsComputed),
		fmt.Sprintf("queue bound %d, tenant limits %d in flight and %d queued, for %d pool slots", tb.QueueBound, tb.TenantConcurrencyLimit, tb.TenantQueueLimit, pool.Concurrency)
}

// orphanTierStatus is the status of a tier whose pool does not exist.
func orphanTierStatus(cur v1alpha1.ServiceTierStatus, gen int64, pool string, now metav1.Time) v1alpha1.ServiceTierStatus {
	st := *cur.DeepCopy()
	st.ObservedGeneration = gen
	st.QueueBound, st.TenantConcurrencyLimit, st.TenantQueueLimit = 0, 0, 0
	st.QueueTokenBound, st.TenantQueueTokenLimit = 0, 0
	st.MaxWait, st.Guarantee = nil, ""
	setCondition(&st.Conditions, now, gen, v1alpha1.ConditionReady, false, string(v1alpha1.ReasonPoolNotFound),
		fmt.Sprintf("ModelPool %q does not exist", pool))
	return st
}

// quotaView is what a TenantQuota's status is computed from.
type quotaView struct {
	Generation    int64
	Pool          string // "" when the tier or its pool is missing
	Tenant        capacity.TenantBounds
	TierMissing   bool
	PoolMissing   bool
	Namespace     string
	SecretName    string
	SecretMissing bool
	// SecretUnlabelled: the Secret exists without APIKeysLabel, so the
	// controller read none of it.
	SecretUnlabelled bool
	KeysMissing      []string
	Share            string
	// OwnLimits are the quota's spec.limits; SharedState is the pool's.
	// The Ready message says from them where each budget comes from and
	// how it is enforced.
	OwnLimits   *v1alpha1.Limits
	SharedState v1alpha1.SharedStateMode
}

// desiredQuotaStatus computes a TenantQuota's status.
func desiredQuotaStatus(cur v1alpha1.TenantQuotaStatus, v quotaView, now metav1.Time) v1alpha1.TenantQuotaStatus {
	st := *cur.DeepCopy()
	st.ObservedGeneration = v.Generation
	st.Pool = v.Pool
	st.EffectiveConcurrencyLimit = v.Tenant.EffectiveLimit
	st.APIKeys = int32(v.Tenant.APIKeys - v.Tenant.SharedKeys)
	st.Limits = limitsStatus(v.Tenant) // none unless the quota is in force
	cond := func(ok bool, reason, msg string) {
		setCondition(&st.Conditions, now, v.Generation, v1alpha1.ConditionReady, ok, reason, msg)
	}
	switch {
	case v.TierMissing:
		st.EffectiveConcurrencyLimit, st.APIKeys, st.Pool = 0, 0, ""
		cond(false, string(v1alpha1.ReasonTierNotFound), fmt.Sprintf("ServiceTier %q does not exist; tenant %q is in no policy", v.Tenant.Tier, v.Tenant.Tenant))
	case v.PoolMissing:
		st.EffectiveConcurrencyLimit, st.APIKeys = 0, 0
		cond(false, string(v1alpha1.ReasonPoolNotFound), fmt.Sprintf("the ModelPool of ServiceTier %q does not exist; tenant %q is in no policy", v.Tenant.Tier, v.Tenant.Tenant))
	case v.Tenant.Duplicate:
		st.EffectiveConcurrencyLimit = 0
		cond(false, string(v1alpha1.ReasonDuplicateTenant), fmt.Sprintf("TenantQuota %q, created earlier, already places tenant %q; this one is ignored", v.Tenant.DuplicateOf, v.Tenant.Tenant))
	case v.SecretMissing:
		cond(false, string(v1alpha1.ReasonSecretNotFound), fmt.Sprintf("Secret %q does not exist; tenant %q is in the policy with no API keys", v.SecretName, v.Tenant.Tenant))
	case v.SecretUnlabelled:
		cond(false, string(v1alpha1.ReasonSecretNotLabelled), fmt.Sprintf("Secret %q lacks the label %s: \"true\", so the controller does not read it and tenant %q is in the policy with no API keys; "+
			"label it with: kubectl label secret %s -n %s %s=true", v.SecretName, v1alpha1.APIKeysLabel, v.Tenant.Tenant, v.SecretName, v.Namespace, v1alpha1.APIKeysLabel))
	case len(v.KeysMissing) > 0:
		cond(false, string(v1alpha1.ReasonSecretKeyMissing), fmt.Sprintf("Secret %q has no non-empty key %s; the other %d keys are in force", v.SecretName, strings.Join(v.KeysMissing, ", "), st.APIKeys))
	default:
		msg := fmt.Sprintf("tenant %q in tier %q may hold %d requests in flight", v.Tenant.Tenant, v.Tenant.Tier, v.Tenant.EffectiveLimit)
		if v.Tenant.SharedKeys > 0 {
			msg += fmt.Sprintf("; %d of its API keys also belong to another tenant and are ignored", v.Tenant.SharedKeys)
		}
		if budgets := limitsMessage(v.Tenant, v.OwnLimits, v.SharedState); budgets != "" {
			msg += "; " + budgets
		}
		cond(true, string(v1alpha1.ReasonQuotaActive), msg)
	}
	return st
}

// boundChanges describes tier bound changes for a ScaledBounds event, such
// as "premium 20→10, free 120→60"; "" when nothing that was set changed.
func boundChanges(before map[string]int32, after []capacity.TierBounds) string {
	var parts []string
	for _, tb := range after {
		old, ok := before[tb.Name]
		if ok && old != 0 && old != tb.QueueBound {
			parts = append(parts, fmt.Sprintf("%s %d→%d", tb.Name, old, tb.QueueBound))
		}
	}
	return strings.Join(parts, ", ")
}

// slotlessDispatchers is the FewerSlotsThanDispatchers condition: in Local
// mode, healthy dispatchers that the split left without a slot of a pool
// that can serve. They report NotReady, so the Service routes around them,
// but they are idle capacity. Failing dispatchers excluded from the split
// are named in the message either way.
func slotlessDispatchers(v poolView) (bool, string, string) {
	var idle, failing []string
	healthy := 0
	for _, d := range v.Dispatchers {
		switch {
		case d.Excluded != "":
			failing = append(failing, fmt.Sprintf("%s (%s)", d.Name, d.Excluded))
		case d.NoSlot:
			idle = append(idle, d.Name)
			healthy++
		default:
			healthy++
		}
	}
	p := v.Bounds.Pool.Concurrency
	var excl string
	if len(failing) > 0 {
		excl = fmt.Sprintf("; failing, so holding no slot: %s", listNames(failing))
	}
	if v.SharedState == v1alpha1.SharedStateRedis || v.Backends == 0 || p == 0 || len(idle) == 0 {
		return false, string(v1alpha1.ReasonDispatchersHoldSlots), "no healthy dispatcher is left without a slot" + excl
	}
	verbs := [3]string{"hold", "report", "them"}
	if len(idle) == 1 {
		verbs = [3]string{"holds", "reports", "it"}
	}
	return true, string(v1alpha1.ReasonFewerSlotsThanDispatchers), fmt.Sprintf(
		"%d of %d healthy dispatchers %s no slot: the pool has %d slots and Local mode gives each dispatcher a whole number of them; %s %s NotReady so the Service routes around %s. "+
			"Set spec.sharedState: Redis to share every slot among all dispatchers, or run at most %d dispatcher replicas%s",
		len(idle), healthy, verbs[0], p, listNames(idle), verbs[1], verbs[2], p, excl)
}

// replicasMoving reports whether the model Deployment has pods on their
// way that the backends do not count yet: more replicas wanted or running
// than Ready, serving pods listed (a scale-up, a rollout's surge, a pod
// that does not turn Ready). The bounds then go on moving as pods turn
// Ready, so the statuses for people wait for the change to settle
// (statusBatches). A Deployment whose own status lags its pods' (it still
// counts pods whose deletion began) is moving until its status catches
// up. No Deployment is settled: nothing is coming. A pool at zero is
// settled too: what it holds for its first replica is what people wait
// to see, and the statuses stay put until that replica is Ready.
func replicasMoving(dep *appsv1.Deployment, backends int) bool {
	if dep == nil || backends == 0 {
		return false
	}
	want := int32(1)
	if dep.Spec.Replicas != nil {
		want = *dep.Spec.Replicas
	}
	return int64(max(want, dep.Status.Replicas)) > int64(backends)
}
