package controllers

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tiergate/tiergate/api/v1alpha1"
	"github.com/tiergate/tiergate/capacity"
	seed "github.com/tiergate/tiergate/capacity/capacitytest"
)

var (
	t0 = metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	t1 = metav1.NewTime(t0.Add(time.Minute))
)

// condRow is a condition without its timestamp and generation.
type condRow struct {
	Type, Status, Reason, Message string
}

func condRows(conds []metav1.Condition) map[string]condRow {
	out := map[string]condRow{}
	for _, c := range conds {
		out[c.Type] = condRow{c.Type, string(c.Status), c.Reason, c.Message}
	}
	return out
}

func seedBounds(t *testing.T, replicas int32, dispatchers int) capacity.Bounds {
	t.Helper()
	b, err := capacity.ComputeBounds(capacity.BoundsInput{Pool: seed.Pool(seed.WithClientTimeout(30 * time.Second)), ReadyReplicas: replicas, Tiers: seed.Tiers(), Dispatchers: dispatchers})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// heldBounds is the seed's pool at zero with a cold start of 12s: premium
// 0, standard 5, free 12 (capacity's tests work them out).
func heldBounds(t *testing.T) capacity.Bounds {
	t.Helper()
	b, err := capacity.ComputeBounds(capacity.BoundsInput{Pool: seed.Pool(seed.WithClientTimeout(30*time.Second), seed.WithColdStart(12*time.Second)),
		Tiers: seed.Tiers(), Dispatchers: 1})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// everyDispatcherHoldsSlots is the FewerSlotsThanDispatchers condition of a
// pool whose healthy dispatchers all hold slots.
var everyDispatcherHoldsSlots = condRow{"FewerSlotsThanDispatchers", "False", "DispatchersHoldSlots", "no healthy dispatcher is left without a slot"}

func TestDesiredPoolStatus(t *testing.T) {
	unauthorized := PodState{Result: PushUnauthorized, Failures: 1, Err: fmt.Errorf("%w: 10.0.0.2:9090 answered 401", ErrPushUnauthorized)}
	rejected := PodState{Result: PushRejected, Failures: 1, Err: fmt.Errorf("%w: 10.0.0.3:9090 answered 400: bad", ErrPushRejected)}
	unreachable := func(n int) PodState {
		return PodState{Result: PushUnreachable, Failures: n, Err: fmt.Errorf("%w: 10.0.0.4:9090: connection refused", ErrPushUnreachable)}
	}
	heldByOther := PodState{Result: PushPoolMismatch, Failures: 1, HeldPool: "default/other",
		Err: fmt.Errorf("%w: 10.0.0.5:9090 holds the policy of pool default/other, sent pool default/llm", ErrPushPoolMismatch)}
	heldMsg := "dispatcher d-1 holds the policy of ModelPool default/other and refuse(s) this pool's: the two pools' spec.dispatchers.selector overlap. Make them disjoint; a dispatcher changes pool only when it restarts"
	horizon := condRow{"AgeingHorizonExceedsClientTimeout", "True", "HorizonExceedsClientTimeout",
		"ageing horizon 2m0s (6s per point × 20 points) exceeds clientTimeout 30s: under sustained load of the top tier a request of the lowest tier expires before ageing lifts it, so the starvation guarantee is void"}
	ready := condRow{"Ready", "True", "PoolReady", "24 slots on 6 ready replicas (6 backends), serving 4 requests/s with a service time of 6s"}
	healthy := condRow{"Degraded", "False", "Healthy", "every dispatcher accepts pushes"}
	tests := map[string]struct {
		view   poolView
		counts v1alpha1.DispatcherCounts
		want   map[string]condRow
	}{
		"all synced": {
			view: poolView{DeploymentFound: true, Bounds: seedBounds(t, 6, 2), Backends: 6, HasTiers: true, Version: 7,
				Dispatchers: []dispatcherView{{Name: "d-0", Ready: true, Acked: 7}, {Name: "d-1", Ready: false, Acked: 7}}},
			counts: v1alpha1.DispatcherCounts{Total: 2, Ready: 1, Synced: 2},
			want: map[string]condRow{"Ready": ready, "Degraded": healthy, "AgeingHorizonExceedsClientTimeout": horizon,
				"Synced": {"Synced", "True", "AllDispatchersSynced", "2/2 dispatchers hold policy version 7"}},
		},
		"one behind, a wrong token": {
			view: poolView{DeploymentFound: true, Bounds: seedBounds(t, 6, 2), Backends: 6, HasTiers: true, Version: 7,
				Dispatchers: []dispatcherView{{Name: "d-0", Ready: true, Acked: 7}, {Name: "d-1", Acked: 0, State: unauthorized}}},
			counts: v1alpha1.DispatcherCounts{Total: 2, Ready: 1, Synced: 1},
			want: map[string]condRow{"Ready": ready, "AgeingHorizonExceedsClientTimeout": horizon,
				"Synced": {"Synced", "False", "PushUnauthorized", "d-1 refused the push token (401) and will take no new policy; 1/2 dispatchers hold policy version 7; " +
					"check the push token Secret: the controller's --push-token-file and every dispatcher's --admin-token-file must hold its token " +
					"(after a rotation both follow their file within seconds, and the replaced token is accepted for up to 60s)"},
				"Degraded": {"Degraded", "True", "PushUnauthorized", "d-1 refused the push token (check --push-token-file against the dispatchers' --admin-token-file): dispatcher refused the push token: 10.0.0.2:9090 answered 401"}},
		},
		"a token refusal outranks a rejected policy and an unreachable pod": {
			view: poolView{DeploymentFound: true, Bounds: seedBounds(t, 6, 3), Backends: 6, HasTiers: true, Version: 2, UnreachableStrike: 3,
				Dispatchers: []dispatcherView{{Name: "d-2", State: unreachable(5)}, {Name: "d-1", State: rejected}, {Name: "d-0", State: unauthorized}},
				TokenSecret: "tiergate-system/tiergate-push-token"},
			counts: v1alpha1.DispatcherCounts{Total: 3},
			want: map[string]condRow{"Ready": ready, "AgeingHorizonExceedsClientTimeout": horizon,
				"Synced": {"Synced", "False", "PushUnauthorized", "d-0 refused the push token (401) and will take no new policy; 0/3 dispatchers hold policy version 2; " +
					"check the push token Secret tiergate-system/tiergate-push-token: the controller's --push-token-file and every dispatcher's --admin-token-file must hold its token " +
					"(after a rotation both follow their file within seconds, and the replaced token is accepted for up to 60s)"},
				"Degraded": {"Degraded", "True", "PushUnauthorized", "d-0 refused the push token (check --push-token-file against the dispatchers' --admin-token-file): dispatcher refused the push token: 10.0.0.2:9090 answered 401"}},
		},
		"a resync refused: the pod holds the version but takes no new one": {
			view: poolView{DeploymentFound: true, Bounds: seedBounds(t, 6, 1), Backends: 6, HasTiers: true, Version: 4,
				Dispatchers: []dispatcherView{{Name: "d-0", Ready: true, Acked: 4, State: unauthorized}}},
			counts: v1alpha1.DispatcherCounts{Total: 1, Ready: 1, Synced: 1},
			want: map[string]condRow{"Ready": ready, "AgeingHorizonExceedsClientTimeout": horizon,
				"Synced": {"Synced", "False", "PushUnauthorized", "d-0 refused the push token (401) and will take no new policy; 1/1 dispatchers hold policy version 4; " +
					"check the push token Secret: the controller's --push-token-file and every dispatcher's --admin-token-file must hold its token " +
					"(after a rotation both follow their file within seconds, and the replaced token is accepted for up to 60s)"},
				"Degraded": {"Degraded", "True", "PushUnauthorized", "d-0 refused the push token (check --push-token-file against the dispatchers' --admin-token-file): dispatcher refused the push token: 10.0.0.2:9090 answered 401"}},
		},
		"a rejected policy": {
			view: poolView{DeploymentFound: true, Bounds: seedBounds(t, 6, 1), Backends: 6, HasTiers: true, Version: 2,
				Dispatchers: []dispatcherView{{Name: "d-1", State: rejected}}},
			counts: v1alpha1.DispatcherCounts{Total: 1},
			want: map[string]condRow{"Ready": ready, "AgeingHorizonExceedsClientTimeout": horizon,
				"Synced":   {"Synced", "False", "SyncPending", "0/1 dispatchers hold policy version 2; waiting for d-1"},
				"Degraded": {"Degraded", "True", "PushRejected", "d-1 rejected the policy: dispatcher rejected the policy: 10.0.0.3:9090 answered 400: bad"}},
		},
		"a pod that holds another pool's policy": {
			view: poolView{DeploymentFound: true, Bounds: seedBounds(t, 6, 2), Backends: 6, HasTiers: true, Version: 2,
				Dispatchers: []dispatcherView{{Name: "d-0", Acked: 2}, {Name: "d-1", State: heldByOther}}},
			counts: v1alpha1.DispatcherCounts{Total: 2, Synced: 1},
			want: map[string]condRow{"Ready": ready, "AgeingHorizonExceedsClientTimeout": horizon,
				"Synced":   {"Synced", "False", "DispatcherHeldByOtherPool", heldMsg},
				"Degraded": {"Degraded", "True", "DispatcherHeldByOtherPool", heldMsg}},
		},
		"unreachable degrades only after the strike count": {
			view: poolView{DeploymentFound: true, Bounds: seedBounds(t, 6, 1), Backends: 6, HasTiers: true, Version: 2, UnreachableStrike: 3,
				Dispatchers: []dispatcherView{{Name: "d-0", State: unreachable(2)}}},
			counts: v1alpha1.DispatcherCounts{Total: 1},
			want: map[string]condRow{"Ready": ready, "AgeingHorizonExceedsClientTimeout": horizon, "Degraded": healthy,
				"Synced": {"Synced", "False", "SyncPending", "0/1 dispatchers hold policy version 2; waiting for d-0"}},
		},
		"unreachable at the strike count": {
			view: poolView{DeploymentFound: true, Bounds: seedBounds(t, 6, 1), Backends: 6, HasTiers: true, Version: 2, UnreachableStrike: 3,
				Dispatchers: []dispatcherView{{Name: "d-0", State: unreachable(3)}}},
			counts: v1alpha1.DispatcherCounts{Total: 1},
			want: map[string]condRow{"Ready": ready, "AgeingHorizonExceedsClientTimeout": horizon,
				"Synced":   {"Synced", "False", "SyncPending", "0/1 dispatchers hold policy version 2; waiting for d-0"},
				"Degraded": {"Degraded", "True", "DispatcherUnreachable", "d-0 unreachable, retrying with backoff: dispatcher unreachable: 10.0.0.4:9090: connection refused"}},
		},
		"no deployment, no dispatchers": {
			view:   poolView{DeploymentFound: false, Bounds: seedBounds(t, 0, 0), HasTiers: true, Version: 1},
			counts: v1alpha1.DispatcherCounts{},
			want: map[string]condRow{"AgeingHorizonExceedsClientTimeout": horizon, "Degraded": healthy,
				"Ready":  {"Ready", "False", "DeploymentNotFound", "the Deployment named in spec.deploymentRef does not exist; the policy has 0 slots"},
				"Synced": {"Synced", "False", "NoDispatchers", "no pod with an IP matches spec.dispatchers.selector"}},
		},
		"zero ready replicas": {
			view:   poolView{DeploymentFound: true, Bounds: seedBounds(t, 0, 1), HasTiers: true, Version: 1, Dispatchers: []dispatcherView{{Name: "d-0", Acked: 1}}},
			counts: v1alpha1.DispatcherCounts{Total: 1, Synced: 1},
			want: map[string]condRow{"AgeingHorizonExceedsClientTimeout": horizon, "Degraded": healthy,
				"Ready":  {"Ready", "False", "NoReadyReplicas", "the Deployment has no ready replicas; the policy has 0 slots and dispatchers answer 503"},
				"Synced": {"Synced", "True", "AllDispatchersSynced", "1/1 dispatchers hold policy version 1"}},
		},
		"ready replicas but no Ready pod": {
			view:   poolView{DeploymentFound: true, Bounds: seedBounds(t, 6, 1), Backends: 0, HasTiers: true, Version: 1, Dispatchers: []dispatcherView{{Name: "d-0", Acked: 1}}},
			counts: v1alpha1.DispatcherCounts{Total: 1, Synced: 1},
			want: map[string]condRow{"AgeingHorizonExceedsClientTimeout": horizon, "Degraded": healthy,
				"Ready":  {"Ready", "False", "NoReadyReplicas", "the Deployment reports 6 ready replicas but no Ready pod with an IP matches its selector; the policy has 0 slots"},
				"Synced": {"Synced", "True", "AllDispatchersSynced", "1/1 dispatchers hold policy version 1"}},
		},
		"no tiers": {
			view:   poolView{DeploymentFound: true, Bounds: seedBounds(t, 6, 1), Backends: 6, HasTiers: false, Version: 1, Dispatchers: []dispatcherView{{Name: "d-0"}}},
			counts: v1alpha1.DispatcherCounts{Total: 1},
			want: map[string]condRow{"AgeingHorizonExceedsClientTimeout": horizon, "Degraded": healthy,
				"Ready":  {"Ready", "False", "NoTiers", "no ServiceTier references this pool; no policy is pushed and dispatchers keep their last one"},
				"Synced": {"Synced", "False", "NoTiers", "no policy to push: the pool has no ServiceTier"}},
		},
	}
	tests["zero ready replicas with a cold start: held for the first replica, premium refused"] = struct {
		view   poolView
		counts v1alpha1.DispatcherCounts
		want   map[string]condRow
	}{
		view:   poolView{DeploymentFound: true, Bounds: heldBounds(t), HasTiers: true, Version: 1, Dispatchers: []dispatcherView{{Name: "d-0", Acked: 1}}},
		counts: v1alpha1.DispatcherCounts{Total: 1, Synced: 1},
		want: map[string]condRow{"AgeingHorizonExceedsClientTimeout": horizon, "Degraded": healthy,
			"Ready": {"Ready", "False", "HeldForColdStart", "the Deployment has no ready replicas; dispatchers hold up to 17 requests for the first replica, " +
				"expected within the cold start of 12s, and refuse tier premium at once (503): it cannot wait out the cold start"},
			"Synced": {"Synced", "True", "AllDispatchersSynced", "1/1 dispatchers hold policy version 1"}},
	}
	tests["KEDA missing: AutoscalerUnavailable, and nothing else changes"] = struct {
		view   poolView
		counts v1alpha1.DispatcherCounts
		want   map[string]condRow
	}{
		view: poolView{DeploymentFound: true, Bounds: seedBounds(t, 6, 1), Backends: 6, HasTiers: true, Version: 2,
			Autoscaler: kedaMissing(errors.New("no matches for kind")), Dispatchers: []dispatcherView{{Name: "d-0", Acked: 2}}},
		counts: v1alpha1.DispatcherCounts{Total: 1, Synced: 1},
		want: map[string]condRow{"Ready": ready, "AgeingHorizonExceedsClientTimeout": horizon, "Degraded": healthy,
			"Synced": {"Synced", "True", "AllDispatchersSynced", "1/1 dispatchers hold policy version 2"},
			"AutoscalerUnavailable": {"AutoscalerUnavailable", "True", "KEDANotInstalled", "KEDA's ScaledObject CRD (scaledobjects.keda.sh) is not installed, " +
				"so nothing scales the Deployment; once it is, the ScaledObject is created within a resync period (no matches for kind)"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			tc.view.Generation = 3
			if tc.view.Autoscaler.reason == "" {
				tc.view.Autoscaler = notRequested
			}
			if _, ok := tc.want[v1alpha1.ModelPoolAutoscalerUnavailable]; !ok {
				tc.want[v1alpha1.ModelPoolAutoscalerUnavailable] = condRow{"AutoscalerUnavailable", "False", "AutoscalingNotRequested",
					"spec.autoscaling is not set; the controller keeps no ScaledObject"}
			}
			if _, ok := tc.want[v1alpha1.ModelPoolFewerSlotsThanDispatchers]; !ok {
				tc.want[v1alpha1.ModelPoolFewerSlotsThanDispatchers] = everyDispatcherHoldsSlots
			}
			st := desiredPoolStatus(v1alpha1.ModelPoolStatus{}, tc.view, t0)
			if diff := cmp.Diff(tc.want, condRows(st.Conditions)); diff != "" {
				t.Errorf("conditions (-want +got):\n%s", diff)
			}
			if st.Dispatchers != tc.counts {
				t.Errorf("dispatchers = %+v, want %+v", st.Dispatchers, tc.counts)
			}
			for _, c := range st.Conditions {
				if c.ObservedGeneration != 3 || !c.LastTransitionTime.Equal(&t0) {
					t.Errorf("%s: observedGeneration %d at %s, want 3 at %s", c.Type, c.ObservedGeneration, c.LastTransitionTime, t0)
				}
			}
			if st.PolicyVersion != tc.view.Version || st.ObservedGeneration != 3 {
				t.Errorf("policyVersion %d observedGeneration %d", st.PolicyVersion, st.ObservedGeneration)
			}
		})
	}
}

func TestDesiredPoolStatusValuesAndStableTransitions(t *testing.T) {
	v := poolView{Generation: 1, DeploymentFound: true, Bounds: seedBounds(t, 6, 1), Backends: 6, HasTiers: true, Version: 4,
		Demand: capacity.Demand{Replicas: 3}, Autoscaler: notRequested,
		ObservedService: 5500 * time.Millisecond, Dispatchers: []dispatcherView{{Name: "d-0", Ready: true, Acked: 4}}}
	first := desiredPoolStatus(v1alpha1.ModelPoolStatus{}, v, t0)
	want := v1alpha1.ModelPoolStatus{
		ObservedGeneration: 1, ReadyReplicas: 6, PoolConcurrency: 24, ServiceRate: "4",
		AgeingRate: &metav1.Duration{Duration: 6 * time.Second}, ObservedServiceTime: &metav1.Duration{Duration: 5500 * time.Millisecond},
		Dispatchers: v1alpha1.DispatcherCounts{Total: 1, Ready: 1, Synced: 1}, PolicyVersion: 4, DesiredReplicas: 3, Conditions: first.Conditions,
	}
	if diff := cmp.Diff(want, first); diff != "" {
		t.Errorf("status (-want +got):\n%s", diff)
	}
	// Recomputed later with nothing changed: identical, so nothing is
	// written and no transition time moves.
	again := desiredPoolStatus(first, v, t1)
	if diff := cmp.Diff(first, again); diff != "" {
		t.Errorf("recomputed status differs (-first +again):\n%s", diff)
	}
	// A change moves only the changed condition's time.
	v.Dispatchers[0].Acked = 3
	v.Version = 5
	changed := desiredPoolStatus(first, v, t1)
	for _, c := range changed.Conditions {
		wantT := t0
		if c.Type == v1alpha1.ModelPoolSynced {
			wantT = t1
		}
		if !c.LastTransitionTime.Equal(&wantT) {
			t.Errorf("%s transitioned at %s, want %s", c.Type, c.LastTransitionTime, wantT)
		}
	}
}

func TestHorizonWithoutClientTimeout(t *testing.T) {
	b, err := capacity.ComputeBounds(capacity.BoundsInput{Pool: seed.Pool(), ReadyReplicas: 6, Tiers: seed.Tiers()})
	if err != nil {
		t.Fatal(err)
	}
	st := desiredPoolStatus(v1alpha1.ModelPoolStatus{}, poolView{DeploymentFound: true, Bounds: b, Backends: 1, HasTiers: true, Autoscaler: notRequested}, t0)
	want := condRow{"AgeingHorizonExceedsClientTimeout", "False", "HorizonWithinClientTimeout", "ageing horizon 2m0s (6s per point × 20 points); no clientTimeout is set"}
	if diff := cmp.Diff(want, condRows(st.Conditions)["AgeingHorizonExceedsClientTimeout"]); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestDesiredTierStatus(t *testing.T) {
	b := seedBounds(t, 6, 1)
	st := desiredTierStatus(v1alpha1.ServiceTierStatus{}, 2, b.Tiers[2], b.Pool, t0)
	if st.QueueBound != 120 || st.TenantConcurrencyLimit != 1 || st.TenantQueueLimit != 4 || st.MaxWait.Duration != 181*time.Second || st.Guarantee != b.Tiers[2].Guarantee {
		t.Errorf("free tier status %+v", st)
	}
	want := condRow{"Ready", "True", "BoundsComputed", "queue bound 120, tenant limits 1 in flight and 4 queued, for 24 pool slots"}
	if diff := cmp.Diff(want, condRows(st.Conditions)["Ready"]); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	zero := seedBounds(t, 0, 1)
	st = desiredTierStatus(st, 2, zero.Tiers[2], zero.Pool, t1)
	if st.MaxWait != nil || st.QueueBound != 0 {
		t.Errorf("zero replicas: maxWait %v bound %d, want none and 0", st.MaxWait, st.QueueBound)
	}
	want = condRow{"Ready", "False", "PoolNotReady", "the pool has no ready replicas and no coldStart: its bound is 0, every request is refused (503) and nothing is served"}
	if diff := cmp.Diff(want, condRows(st.Conditions)["Ready"]); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	held := heldBounds(t)
	st = desiredTierStatus(st, 2, held.Tiers[2], held.Pool, t1)
	if st.MaxWait == nil || st.MaxWait.Duration != 163500*time.Millisecond || st.QueueBound != 12 {
		t.Errorf("held: maxWait %v bound %d, want 2m43.5s (with the 12s cold start) and 12", st.MaxWait, st.QueueBound)
	}
	want = condRow{"Ready", "False", "HeldForColdStart", "the pool is at zero replicas: up to 12 requests are held for the first replica, expected within the cold start of 12s"}
	if diff := cmp.Diff(want, condRows(st.Conditions)["Ready"]); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	st = desiredTierStatus(st, 2, held.Tiers[0], held.Pool, t1)
	if st.MaxWait != nil || st.QueueBound != 0 {
		t.Errorf("held premium: maxWait %v bound %d, want none and 0", st.MaxWait, st.QueueBound)
	}
	want = condRow{"Ready", "False", "PoolNotReady", "the pool is at zero replicas and this tier cannot wait out the cold start of 12s: its requests are refused (503) until a replica is Ready"}
	if diff := cmp.Diff(want, condRows(st.Conditions)["Ready"]); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	st = orphanTierStatus(st, 2, "llm", t1)
	want = condRow{"Ready", "False", "PoolNotFound", `ModelPool "llm" does not exist`}
	if diff := cmp.Diff(want, condRows(st.Conditions)["Ready"]); diff != "" || st.QueueBound != 0 || st.Guarantee != "" {
		t.Errorf("orphan: bound %d guarantee %q, condition (-want +got):\n%s", st.QueueBound, st.Guarantee, diff)
	}
}

func TestDesiredQuotaStatus(t *testing.T) {
	acme := capacity.TenantBounds{QuotaName: "acme", Tenant: "acme", Tier: "premium", EffectiveLimit: 6, APIKeys: 2}
	tests := map[string]struct {
		view      quotaView
		wantLimit int32
		wantKeys  int32
		wantPool  string
		want      condRow
	}{
		"active": {quotaView{Pool: "llm", Tenant: acme}, 6, 2, "llm",
			condRow{"Ready", "True", "Active", `tenant "acme" in tier "premium" may hold 6 requests in flight`}},
		"active with a shared key": {quotaView{Pool: "llm", Tenant: func() capacity.TenantBounds { b := acme; b.SharedKeys = 1; return b }()}, 6, 1, "llm",
			condRow{"Ready", "True", "Active", `tenant "acme" in tier "premium" may hold 6 requests in flight; 1 of its API keys also belong to another tenant and are ignored`}},
		"tier missing": {quotaView{TierMissing: true, Tenant: capacity.TenantBounds{Tenant: "acme", Tier: "gold", TierNotFound: true}}, 0, 0, "",
			condRow{"Ready", "False", "TierNotFound", `ServiceTier "gold" does not exist; tenant "acme" is in no policy`}},
		"pool missing": {quotaView{PoolMissing: true, Tenant: capacity.TenantBounds{Tenant: "acme", Tier: "premium"}}, 0, 0, "",
			condRow{"Ready", "False", "PoolNotFound", `the ModelPool of ServiceTier "premium" does not exist; tenant "acme" is in no policy`}},
		"duplicate": {quotaView{Pool: "llm", Tenant: capacity.TenantBounds{Tenant: "acme", Tier: "premium", Duplicate: true, DuplicateOf: "acme-old"}}, 0, 0, "llm",
			condRow{"Ready", "False", "DuplicateTenant", `TenantQuota "acme-old", created earlier, already places tenant "acme"; this one is ignored`}},
		"secret missing": {quotaView{Pool: "llm", Tenant: capacity.TenantBounds{Tenant: "acme", Tier: "premium", EffectiveLimit: 6}, SecretName: "keys", SecretMissing: true}, 6, 0, "llm",
			condRow{"Ready", "False", "SecretNotFound", `Secret "keys" does not exist; tenant "acme" is in the policy with no API keys`}},
		"secret key missing": {quotaView{Pool: "llm", Tenant: acme, SecretName: "keys", KeysMissing: []string{"k3"}}, 6, 2, "llm",
			condRow{"Ready", "False", "SecretKeyMissing", `Secret "keys" has no non-empty key k3; the other 2 keys are in force`}},
		"secret not labelled": {quotaView{Pool: "llm", Namespace: "prod", Tenant: capacity.TenantBounds{Tenant: "acme", Tier: "premium", EffectiveLimit: 6},
			SecretName: "db-creds", SecretUnlabelled: true}, 6, 0, "llm",
			condRow{"Ready", "False", "SecretNotLabelled", `Secret "db-creds" lacks the label tiergate.dev/api-keys: "true", so the controller does not read it and tenant "acme" is in the policy with no API keys; ` +
				`label it with: kubectl label secret db-creds -n prod tiergate.dev/api-keys=true`}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			st := desiredQuotaStatus(v1alpha1.TenantQuotaStatus{}, tc.view, t0)
			if st.EffectiveConcurrencyLimit != tc.wantLimit || st.APIKeys != tc.wantKeys || st.Pool != tc.wantPool {
				t.Errorf("limit %d keys %d pool %q, want %d %d %q", st.EffectiveConcurrencyLimit, st.APIKeys, st.Pool, tc.wantLimit, tc.wantKeys, tc.wantPool)
			}
			if diff := cmp.Diff(tc.want, condRows(st.Conditions)["Ready"]); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestBoundChanges(t *testing.T) {
	after := seedBounds(t, 3, 1).Tiers // 10/40/60
	tests := map[string]struct {
		before map[string]int32
		want   string
	}{
		"scaled down":                {map[string]int32{"premium": 20, "standard": 80, "free": 120}, "premium 20→10, standard 80→40, free 120→60"},
		"only what changed":          {map[string]int32{"premium": 20, "standard": 40, "free": 60}, "premium 20→10"},
		"first computation is quiet": {map[string]int32{"premium": 0, "standard": 0, "free": 0}, ""},
		"unchanged is quiet":         {map[string]int32{"premium": 10, "standard": 40, "free": 60}, ""},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := boundChanges(tc.before, after); got != tc.want {
				t.Errorf("boundChanges = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestReplicasMoving: a pool is moving while its Deployment wants or runs
// more replicas than Ready backends are listed, except at zero backends.
func TestReplicasMoving(t *testing.T) {
	dep := func(spec *int32, running int32) *appsv1.Deployment {
		return &appsv1.Deployment{Spec: appsv1.DeploymentSpec{Replicas: spec}, Status: appsv1.DeploymentStatus{Replicas: running}}
	}
	six, three := ptr.To[int32](6), ptr.To[int32](3)
	tests := map[string]struct {
		dep      *appsv1.Deployment
		backends int
		want     bool
	}{
		"no Deployment":                         {nil, 0, false},
		"settled at 6":                          {dep(six, 6), 6, false},
		"scaling up: 6 wanted, 3 Ready":         {dep(six, 6), 3, true},
		"scaling up before the ReplicaSet acts": {dep(six, 3), 3, true},
		"scaling down: status still counts 6":   {dep(three, 6), 3, true},
		"scaled down, status caught up":         {dep(three, 3), 3, false},
		"more backends listed than wanted":      {dep(three, 3), 4, false},
		"at zero, a replica on its way":         {dep(six, 6), 0, false},
		"no spec.replicas means 1":              {dep(nil, 0), 1, false},
		"no spec.replicas, 2 running, 1 Ready":  {dep(nil, 2), 1, true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := replicasMoving(tc.dep, tc.backends); got != tc.want {
				t.Errorf("replicasMoving = %v, want %v", got, tc.want)
			}
		})
	}
}
