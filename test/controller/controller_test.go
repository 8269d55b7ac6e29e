package controller

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/api/v1alpha1"
	"github.com/tiergate/tiergate/internal/testutil"
)

// samplePolicy is what each of n dispatchers must hold for the samples
// with r ready replicas (C=4, S=6s, clientTimeout 30s), worked by hand.
func samplePolicy(ns string, backends []policy.Backend, slots int, tiers []policy.Tier, tenants []policy.Tenant) policy.Policy {
	return policy.Policy{
		Pool: ns + "/llm", Slots: slots, ServiceRate: float64(slots) / 6, AgeingRate: 6, ClientTimeoutSeconds: 30,
		SharedState:    policy.StateLocal,
		Authentication: policy.Authentication{Mode: policy.AuthTrustedHeader, HeaderName: "X-Tenant-ID"},
		DefaultTier:    "free", ExemptPaths: []string{"/health", "/v1/models"},
		Tiers: tiers, Tenants: tenants, Backends: backends,
	}
}

var sampleTenants = []policy.Tenant{{ID: "acme", Tier: "premium"}, {ID: "globex", Tier: "standard"}, {ID: "initech", Tier: "free"}}

// matches compares a held policy with the wanted one, ignoring the version
// and the schema revision (the skew test checks that one).
func matches(want policy.Policy) func(*policy.Policy) error {
	return func(got *policy.Policy) error {
		g := *got
		g.Version, g.SchemaVersion = 0, 0
		if diff := cmp.Diff(want, g, cmpopts.EquateApprox(0, 1e-9), cmpopts.EquateEmpty()); diff != "" {
			return fmt.Errorf("%w (-want +got):\n%s", errMismatch, diff)
		}
		return nil
	}
}

// slots accepts a held policy of n slots.
func slots(n int) func(*policy.Policy) error {
	return func(p *policy.Policy) error {
		if p.Slots != n {
			return fmt.Errorf("slots %d, want %d", p.Slots, n)
		}
		return nil
	}
}

// sampleEnv starts n dispatchers, applies the samples and scales the model
// Deployment to 6 Ready replicas, whose backends it returns.
func sampleEnv(t *testing.T, n int, mutate ...func(string) string) (*env, []policy.Backend) {
	t.Helper()
	return sampleEnvOf(newEnv(t), n, mutate...)
}

// sampleEnvOf is sampleEnv in e (a probed env, say).
func sampleEnvOf(e *env, n int, mutate ...func(string) string) (*env, []policy.Backend) {
	e.t.Helper()
	e.startDispatchers(n)
	e.applySamples(mutate...)
	return e, e.scale(6)
}

// three dispatchers at R=6: 8 slots each. premium L=20 → 20·8/24 = 6,
// limit 6 → 2, queue limit 5 → 1; standard 80 → 26, 2 → 1, 8 → 2;
// free 120 → 40, 1 → 1, 4 → 1.
var tiersR6N3 = []policy.Tier{
	{Name: "premium", BasePriority: 0, TolerableWaitSeconds: 5, QueueBound: 6, TenantConcurrencyLimit: 2, TenantQueueLimit: 1},
	{Name: "standard", BasePriority: 10, TolerableWaitSeconds: 20, QueueBound: 26, TenantConcurrencyLimit: 1, TenantQueueLimit: 2},
	{Name: "free", BasePriority: 20, TolerableWaitSeconds: 60, QueueBound: 40, TenantConcurrencyLimit: 1, TenantQueueLimit: 1},
}

func TestSamplesReachEveryDispatcher(t *testing.T) {
	e, backends := sampleEnv(t, 3)
	start := time.Now()
	want := samplePolicy(e.ns, backends, 8, tiersR6N3, sampleTenants)
	took, err := allHold(e.disp, 2*time.Second, matches(want))
	if err != nil {
		t.Fatalf("after %s not every dispatcher holds the sample policy: %v", took, err)
	}
	t.Logf("all 3 dispatchers held the seed policy %s after the Deployment reported 6 ready replicas", took.Round(time.Millisecond))

	// ModelPool status: the seed table, Synced, and the horizon warning.
	testutil.Eventually(t, 2*time.Second-time.Since(start), "ModelPool Synced with the seed values", func() error {
		p := e.pool()
		st := p.Status
		got := fmt.Sprintf("R=%d P=%d rate=%s ageing=%s dispatchers=%+v", st.ReadyReplicas, st.PoolConcurrency, st.ServiceRate, st.AgeingRate.Duration, st.Dispatchers)
		if want := "R=6 P=24 rate=4 ageing=6s dispatchers={Total:3 Ready:3 Synced:3}"; got != want {
			return fmt.Errorf("status %s, want %s", got, want)
		}
		for _, c := range []struct {
			typ, reason string
			status      metav1.ConditionStatus
		}{
			{v1alpha1.ConditionReady, "PoolReady", metav1.ConditionTrue},
			{v1alpha1.ModelPoolSynced, "AllDispatchersSynced", metav1.ConditionTrue},
			{v1alpha1.ModelPoolDegraded, "Healthy", metav1.ConditionFalse},
			{v1alpha1.ModelPoolAgeingHorizonExceedsClientTimeout, "HorizonExceedsClientTimeout", metav1.ConditionTrue},
		} {
			if err := conditionIs(st.Conditions, c.typ, c.status, c.reason); err != nil {
				return err
			}
			if cond := condition(st.Conditions, c.typ); cond.ObservedGeneration != p.Generation {
				return fmt.Errorf("%s observedGeneration %d, want %d", c.typ, cond.ObservedGeneration, p.Generation)
			}
		}
		for _, d := range e.disp {
			pol, err := getPolicy(d)
			if err != nil {
				return err
			}
			if pol.Version != st.PolicyVersion {
				return fmt.Errorf("%s holds version %d, status says %d", d.pod, pol.Version, st.PolicyVersion)
			}
		}
		return nil
	})
	horizon := condition(e.pool().Status.Conditions, v1alpha1.ModelPoolAgeingHorizonExceedsClientTimeout)
	if !strings.Contains(horizon.Message, "ageing horizon 2m0s (6s per point × 20 points) exceeds clientTimeout 30s") {
		t.Errorf("horizon message %q does not state its numbers", horizon.Message)
	}

	// ServiceTier status: the seed table with the 30s client timeout.
	type tierRow struct {
		Bound, Limit, QueueLimit int32
		MaxWait                  time.Duration
		Ready                    metav1.ConditionStatus
	}
	wantTiers := map[string]tierRow{
		"premium":  {20, 6, 5, 61 * time.Second, metav1.ConditionTrue},
		"standard": {80, 2, 8, 121 * time.Second, metav1.ConditionTrue},
		"free":     {120, 1, 4, 181 * time.Second, metav1.ConditionTrue},
	}
	testutil.Eventually(t, 2*time.Second, "ServiceTier status", func() error {
		var tiers v1alpha1.ServiceTierList
		if err := k8s.List(context.Background(), &tiers, client.InNamespace(e.ns)); err != nil {
			return err
		}
		got := map[string]tierRow{}
		for _, tr := range tiers.Items {
			row := tierRow{Bound: tr.Status.QueueBound, Limit: tr.Status.TenantConcurrencyLimit, QueueLimit: tr.Status.TenantQueueLimit}
			if tr.Status.MaxWait != nil {
				row.MaxWait = tr.Status.MaxWait.Duration
			}
			if c := condition(tr.Status.Conditions, v1alpha1.ConditionReady); c != nil {
				row.Ready = c.Status
			}
			got[tr.Name] = row
			if !strings.Contains(tr.Status.Guarantee, "waits at most "+row.MaxWait.String()) {
				return fmt.Errorf("%s guarantee %q does not state maxWait", tr.Name, tr.Status.Guarantee)
			}
		}
		if diff := cmp.Diff(wantTiers, got); diff != "" {
			return fmt.Errorf("tiers (-want +got):\n%s", diff)
		}
		return nil
	})

	// TenantQuota status: effective limits 6/2/1.
	// Quota statuses are written once the pool is quiet: a second, or ten
	// if its last change came while replicas were on their way
	// (controllers/statusbatch.go), then at the shared worker's pace.
	testutil.Eventually(t, 15*time.Second, "TenantQuota status", func() error {
		var quotas v1alpha1.TenantQuotaList
		if err := k8s.List(context.Background(), &quotas, client.InNamespace(e.ns)); err != nil {
			return err
		}
		got := map[string]string{}
		for _, q := range quotas.Items {
			c := condition(q.Status.Conditions, v1alpha1.ConditionReady)
			if c == nil {
				return fmt.Errorf("%s has no Ready condition", q.Name)
			}
			got[q.Name] = fmt.Sprintf("%d %s %s %s", q.Status.EffectiveConcurrencyLimit, q.Status.Pool, c.Status, c.Reason)
		}
		want := map[string]string{"acme": "6 llm True Active", "globex": "2 llm True Active", "initech": "1 llm True Active"}
		if diff := cmp.Diff(want, got); diff != "" {
			return fmt.Errorf("quotas (-want +got):\n%s", diff)
		}
		return nil
	})

	// The seed samples trigger the horizon warning as an event.
	testutil.Eventually(t, 2*time.Second, "Warning event AgeingHorizonExceedsClientTimeout", func() error {
		return hasEvent(e.ns, "llm", corev1.EventTypeWarning, "AgeingHorizonExceedsClientTimeout", "exceeds clientTimeout 30s")
	})
}

// hasEvent finds an events.k8s.io Event about the named object.
func hasEvent(ns, regarding, typ, reason, noteContains string) error {
	var list eventsv1.EventList
	if err := k8s.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		return err
	}
	var seen []string
	for _, ev := range list.Items {
		seen = append(seen, ev.Type+"/"+ev.Reason+": "+ev.Note)
		if ev.Regarding.Name == regarding && ev.Type == typ && ev.Reason == reason && strings.Contains(ev.Note, noteContains) {
			return nil
		}
	}
	return fmt.Errorf("no %s event %s containing %q among %q", typ, reason, noteContains, seen)
}

func TestScalingPropagates(t *testing.T) {
	e, backends := sampleEnv(t, 3)
	if took, err := allHold(e.disp, 2*time.Second, matches(samplePolicy(e.ns, backends, 8, tiersR6N3, sampleTenants))); err != nil {
		t.Fatalf("initial policy not held after %s: %v", took, err)
	}
	// R=3: P=12, μ=2/s. premium L=10 → 10·4/12 = 3, limit 3 → 1, queue
	// limit 2 → 1; standard 40 → 13, 1 → 1, 4 → 1; free 60 → 20, 1 → 1, 2 → 1.
	tiersR3N3 := []policy.Tier{
		{Name: "premium", BasePriority: 0, TolerableWaitSeconds: 5, QueueBound: 3, TenantConcurrencyLimit: 1, TenantQueueLimit: 1},
		{Name: "standard", BasePriority: 10, TolerableWaitSeconds: 20, QueueBound: 13, TenantConcurrencyLimit: 1, TenantQueueLimit: 1},
		{Name: "free", BasePriority: 20, TolerableWaitSeconds: 60, QueueBound: 20, TenantConcurrencyLimit: 1, TenantQueueLimit: 1},
	}
	// The backends are the Ready pods kwok plays after each scale: the
	// ReplicaSet controller picks which go, and new ones get new addresses.
	// The latency counts from when the Deployment's status was first seen
	// reporting the new readyReplicas (polled every 10 ms).
	var lat []time.Duration
	lastVersion := int64(0)
	for i := 0; i < 20; i++ {
		replicas, tiers, perDispatcher := 3, tiersR3N3, 4
		if i%2 == 1 {
			replicas, tiers, perDispatcher = 6, tiersR6N3, 8
		}
		want := samplePolicy(e.ns, e.scale(replicas), perDispatcher, tiers, sampleTenants)
		took, err := allHold(e.disp, 5*time.Second, matches(want))
		if err != nil {
			t.Fatalf("change %d (R=%d): not held after %s: %v", i, replicas, took, err)
		}
		lat = append(lat, time.Since(e.readyAt))
		p, err := getPolicy(e.disp[0])
		if err != nil {
			t.Fatal(err)
		}
		if p.Version <= lastVersion {
			t.Errorf("change %d: version %d did not increase from %d", i, p.Version, lastVersion)
		}
		lastVersion = p.Version
	}
	sort.Slice(lat, func(a, b int) bool { return lat[a] < lat[b] })
	p50 := lat[int(math.Ceil(0.50*float64(len(lat))))-1]
	p99 := lat[int(math.Ceil(0.99*float64(len(lat))))-1]
	if os.Getenv("TIERGATE_E2E_LOG_LEVEL") != "" {
		t.Logf("controller log:\n%s", ctrlProc.tail(400))
	}
	t.Logf("propagation of a readyReplicas change to all 3 dispatchers over %d changes: p50 %s, p99 %s, min %s, max %s",
		len(lat), p50.Round(time.Millisecond), p99.Round(time.Millisecond), lat[0].Round(time.Millisecond), lat[len(lat)-1].Round(time.Millisecond))
	if p99 >= 2*time.Second {
		t.Errorf("p99 propagation %s, want < 2s", p99)
	}
	// The tiers' statuses, and their ScaledBounds events, follow a settled
	// pool: which of 20 quick changes the latest-wins tier writer writes,
	// and through which intermediate bounds (pods go one by one, the
	// Deployment's status lags), is timing. What holds: once the statuses
	// show R=6, one more scale to 3 moves standard's bound from 80 to 40,
	// and an event recorded after that scale began says standard moved.
	tierBounds := func() string {
		return kubectl.Must(t, "get", "servicetiers", "-n", e.ns, "--sort-by=.spec.basePriority",
			"-o", `jsonpath={range .items[*]}{.metadata.name}={.status.queueBound} {end}`)
	}
	// A moving pool's tiers wait up to 10 s of quiet (docs/architecture.md).
	testutil.Eventually(t, 15*time.Second, "the tiers' statuses at R=6", func() error {
		if got := tierBounds(); got != "premium=20 standard=80 free=120 " {
			return fmt.Errorf("bounds %q", got)
		}
		return nil
	})
	lastScale := time.Now().Add(-time.Second) // events carry the API server's clock
	if took, err := allHold(e.disp, 5*time.Second, matches(samplePolicy(e.ns, e.scale(3), 4, tiersR3N3, sampleTenants))); err != nil {
		t.Fatalf("the last scale to 3: not held after %s: %v", took, err)
	}
	testutil.Eventually(t, 15*time.Second, "the tiers' statuses at R=3 and a ScaledBounds event since the scale", func() error {
		if got := tierBounds(); got != "premium=10 standard=40 free=60 " {
			return fmt.Errorf("bounds %q", got)
		}
		return scaledBoundsSince(e.ns, lastScale, "standard ")
	})
}

// scaledBoundsSince finds a ScaledBounds event of the pool llm in ns,
// recorded (or repeated) at or after since, whose note contains part.
func scaledBoundsSince(ns string, since time.Time, part string) error {
	var list eventsv1.EventList
	if err := k8s.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		return err
	}
	var seen []string
	for _, ev := range list.Items {
		if ev.Reason != "ScaledBounds" || ev.Regarding.Name != "llm" {
			continue
		}
		at := ev.EventTime.Time
		if ev.Series != nil && ev.Series.LastObservedTime.After(at) {
			at = ev.Series.LastObservedTime.Time
		}
		seen = append(seen, at.Format("15:04:05.000")+" "+ev.Note)
		if !at.Before(since) && strings.Contains(ev.Note, part) {
			return nil
		}
	}
	return fmt.Errorf("no ScaledBounds event containing %q since %s among %q", part, since.Format("15:04:05.000"), seen)
}

func TestObjectChanges(t *testing.T) {
	e, backends := sampleEnv(t, 2)
	ctx := context.Background()
	// Two dispatchers at R=6: 12 slots each; everything halves.
	tiers := []policy.Tier{
		{Name: "premium", BasePriority: 0, TolerableWaitSeconds: 5, QueueBound: 10, TenantConcurrencyLimit: 3, TenantQueueLimit: 2},
		{Name: "standard", BasePriority: 10, TolerableWaitSeconds: 20, QueueBound: 40, TenantConcurrencyLimit: 1, TenantQueueLimit: 4},
		{Name: "free", BasePriority: 20, TolerableWaitSeconds: 60, QueueBound: 60, TenantConcurrencyLimit: 1, TenantQueueLimit: 2},
	}
	if took, err := allHold(e.disp, 2*time.Second, matches(samplePolicy(e.ns, backends, 12, tiers, sampleTenants))); err != nil {
		t.Fatalf("initial policy not held after %s: %v", took, err)
	}

	t.Run("a new TenantQuota appears", func(t *testing.T) {
		kubectl.MustInput(t, `apiVersion: tiergate.dev/v1alpha1
kind: TenantQuota
metadata:
  name: hooli
spec:
  tenant: hooli
  tierRef:
    name: standard
  maxConcurrency: 5
`, "apply", "-n", e.ns, "-f", "-")
		tenants := []policy.Tenant{{ID: "acme", Tier: "premium"}, {ID: "globex", Tier: "standard"},
			{ID: "hooli", Tier: "standard", MaxConcurrency: 2}, {ID: "initech", Tier: "free"}}
		if took, err := allHold(e.disp, 2*time.Second, matches(samplePolicy(e.ns, backends, 12, tiers, tenants))); err != nil {
			t.Fatalf("hooli not in every policy after %s: %v", took, err)
		}
		quotaEventually(t, e.ns, "hooli", "hooli's effective limit", func(q v1alpha1.TenantQuota) error {
			if q.Status.EffectiveConcurrencyLimit != 5 {
				return fmt.Errorf("effective limit %d, want the override 5", q.Status.EffectiveConcurrencyLimit)
			}
			return conditionIs(q.Status.Conditions, v1alpha1.ConditionReady, metav1.ConditionTrue, "Active")
		})
	})

	t.Run("a deleted ServiceTier disappears and its quotas say TierNotFound", func(t *testing.T) {
		kubectl.Must(t, "delete", "-n", e.ns, "servicetier", "standard")
		// Σ L changes nothing per dispatcher; standard and its tenants go.
		want := samplePolicy(e.ns, backends, 12, []policy.Tier{tiers[0], tiers[2]}, []policy.Tenant{{ID: "acme", Tier: "premium"}, {ID: "initech", Tier: "free"}})
		if took, err := allHold(e.disp, 2*time.Second, matches(want)); err != nil {
			t.Fatalf("standard still in a policy after %s: %v", took, err)
		}
		for _, name := range []string{"globex", "hooli"} {
			quotaEventually(t, e.ns, name, name+" TierNotFound", func(q v1alpha1.TenantQuota) error {
				if q.Status.EffectiveConcurrencyLimit != 0 || q.Status.Pool != "" {
					return fmt.Errorf("status %+v, want no limit and no pool", q.Status)
				}
				return conditionIs(q.Status.Conditions, v1alpha1.ConditionReady, metav1.ConditionFalse, "TierNotFound")
			})
		}
	})

	t.Run("rotating the Secret changes the hash", func(t *testing.T) {
		sum := func(s string) string { h := sha256.Sum256([]byte(s)); return hex.EncodeToString(h[:]) }
		secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "acme-keys", Labels: map[string]string{v1alpha1.APIKeysLabel: "true"}}, Data: map[string][]byte{"key": []byte("sk-acme-one\n")}}
		if err := k8s.Create(ctx, secret); err != nil {
			t.Fatal(err)
		}
		kubectl.Must(t, "patch", "-n", e.ns, "tenantquota", "acme", "--type=merge", "-p", `{"spec":{"apiKeySecretRef":{"name":"acme-keys"}}}`)
		withKey := func(key string) policy.Policy {
			return samplePolicy(e.ns, backends, 12, []policy.Tier{tiers[0], tiers[2]},
				[]policy.Tenant{{ID: "acme", Tier: "premium", APIKeySHA256: []string{sum(key)}}, {ID: "initech", Tier: "free"}})
		}
		if took, err := allHold(e.disp, 2*time.Second, matches(withKey("sk-acme-one"))); err != nil {
			t.Fatalf("first key's hash not pushed after %s: %v", took, err)
		}
		secret.Data["key"] = []byte("sk-acme-two")
		if err := k8s.Update(ctx, secret); err != nil {
			t.Fatal(err)
		}
		if took, err := allHold(e.disp, 2*time.Second, matches(withKey("sk-acme-two"))); err != nil {
			t.Fatalf("rotated key's hash not pushed after %s: %v", took, err)
		}
		// The plaintext never reaches a dispatcher or the controller's log.
		for _, d := range e.disp {
			if strings.Contains(d.Output(), "sk-acme") {
				t.Errorf("%s's log contains the API key", d.pod)
			}
		}
		if strings.Contains(ctrlProc.Output(), "sk-acme") {
			t.Error("the controller's log contains the API key")
		}
		quotaEventually(t, e.ns, "acme", "acme apiKeys status", func(q v1alpha1.TenantQuota) error {
			if q.Status.APIKeys != 1 {
				return fmt.Errorf("apiKeys %d, want 1", q.Status.APIKeys)
			}
			return conditionIs(q.Status.Conditions, v1alpha1.ConditionReady, metav1.ConditionTrue, "Active")
		})
	})

	t.Run("a missing Secret is reported", func(t *testing.T) {
		kubectl.Must(t, "patch", "-n", e.ns, "tenantquota", "initech", "--type=merge", "-p", `{"spec":{"apiKeySecretRef":{"name":"no-such-secret"}}}`)
		quotaEventually(t, e.ns, "initech", "initech SecretNotFound", func(q v1alpha1.TenantQuota) error {
			return conditionIs(q.Status.Conditions, v1alpha1.ConditionReady, metav1.ConditionFalse, "SecretNotFound")
		})
	})
}

// The dispatcher pods' readiness here is the probe loop's (newProbedEnv):
// the test is about a pod that is Ready only once it holds a policy.
func TestDispatcherPodsComeAndGo(t *testing.T) {
	e, backends := sampleEnvOf(newProbedEnv(t), 2)
	tiersN2 := []policy.Tier{
		{Name: "premium", BasePriority: 0, TolerableWaitSeconds: 5, QueueBound: 10, TenantConcurrencyLimit: 3, TenantQueueLimit: 2},
		{Name: "standard", BasePriority: 10, TolerableWaitSeconds: 20, QueueBound: 40, TenantConcurrencyLimit: 1, TenantQueueLimit: 4},
		{Name: "free", BasePriority: 20, TolerableWaitSeconds: 60, QueueBound: 60, TenantConcurrencyLimit: 1, TenantQueueLimit: 2},
	}
	if took, err := allHold(e.disp, 2*time.Second, matches(samplePolicy(e.ns, backends, 12, tiersN2, sampleTenants))); err != nil {
		t.Fatalf("initial policy not held after %s: %v", took, err)
	}

	// A third pod (the Deployment scaled to 3), not probed yet: it stays
	// unready, and it must get its policy anyway (in a real cluster it
	// becomes Ready only because of it).
	fresh := e.adopt(e.scaleDispatchers(3)[0], bins.Tiergate, pushToken)
	if took, err := allHold(e.disp, 2*time.Second, matches(samplePolicy(e.ns, backends, 8, tiersR6N3, sampleTenants))); err != nil {
		t.Fatalf("three dispatchers do not hold 8-slot policies after %s: %v", took, err)
	}
	if ready, err := podIsReady(e.ns, fresh.pod); err != nil || ready {
		t.Fatalf("the new pod is Ready=%v (%v); the test needs it unready", ready, err)
	}
	testutil.Eventually(t, 2*time.Second, "status counts the unready pod as synced", func() error {
		if got := e.pool().Status.Dispatchers; got != (v1alpha1.DispatcherCounts{Total: 3, Ready: 2, Synced: 3}) {
			return fmt.Errorf("dispatchers %+v, want 3 total, 2 ready, 3 synced", got)
		}
		return nil
	})
	// Now let its readiness probe run: it is Ready because it has a policy.
	e.probe(fresh)
	testutil.Eventually(t, 2*time.Second, "the new pod becomes Ready", func() error {
		if ready, err := podIsReady(e.ns, fresh.pod); err != nil || !ready {
			return fmt.Errorf("ready=%v err=%v", ready, err)
		}
		return nil
	})

	// Remove the first dispatcher's Pod (scaled down to 2, with that pod
	// the one to go); its process keeps running.
	gone := e.disp[0]
	e.kubelet.forget(e.ns, gone.pod)
	e.removeDispatcherPod(gone, 2)
	remaining := e.disp[1:]
	if took, err := allHold(remaining, 2*time.Second, matches(samplePolicy(e.ns, backends, 12, tiersN2, sampleTenants))); err != nil {
		t.Fatalf("the two remaining dispatchers do not hold 12-slot policies after %s: %v", took, err)
	}
	before, err := getPolicy(gone)
	if err != nil {
		t.Fatal(err)
	}
	gonePushes := gone.pushes()
	// Another change, and three resyncs after it (each re-pushes to every
	// pod the controller targets), the removed pod still holds what it
	// had: nothing was pushed to it.
	e.scale(3)
	if _, err := allHold(remaining, 2*time.Second, slots(6)); err != nil {
		t.Fatal(err)
	}
	for _, d := range remaining {
		d.waitPushes(t, d.pushes(), 3)
	}
	if n := gone.pushes() - gonePushes; n != 0 {
		t.Errorf("the removed pod applied %d pushes after its removal", n)
	}
	after, err := getPolicy(gone)
	if err != nil {
		t.Fatal(err)
	}
	if after.Version != before.Version || after.Slots != 8 {
		t.Errorf("the removed pod went from version %d to %d (slots %d): it was pushed to", before.Version, after.Version, after.Slots)
	}
}

// The dispatcher pods' readiness is the probe loop's (newProbedEnv): the
// test asserts that the refused dispatcher's pod does not become Ready.
func TestWrongTokenDegrades(t *testing.T) {
	e := newProbedEnv(t)
	pods := e.dispatcherPods(2)
	good := e.adopt(pods[0], bins.Tiergate, pushToken)
	wrongToken := t.TempDir() + "/wrong"
	if err := writeFile(wrongToken, "not-the-push-token"); err != nil {
		t.Fatal(err)
	}
	bad := e.adopt(pods[1], bins.Tiergate, wrongToken)
	e.probe(good)
	e.probe(bad)
	e.applySamples()
	e.scale(2)

	testutil.Eventually(t, 3*time.Second, "Degraded PushUnauthorized", func() error {
		st := e.pool().Status
		if err := conditionIs(st.Conditions, v1alpha1.ModelPoolDegraded, metav1.ConditionTrue, "PushUnauthorized"); err != nil {
			return err
		}
		if c := condition(st.Conditions, v1alpha1.ModelPoolDegraded); !strings.Contains(c.Message, bad.pod) || strings.Contains(c.Message, good.pod) {
			return fmt.Errorf("message %q should name %s only", c.Message, bad.pod)
		}
		if err := conditionIs(st.Conditions, v1alpha1.ModelPoolSynced, metav1.ConditionFalse, "PushUnauthorized"); err != nil {
			return err
		}
		want := bad.pod + " refused the push token (401) and will take no new policy; 1/2 dispatchers hold policy version "
		if c := condition(st.Conditions, v1alpha1.ModelPoolSynced); !strings.HasPrefix(c.Message, want) || !strings.Contains(c.Message, "check the push token Secret") {
			return fmt.Errorf("Synced message %q, want it to start %q and say to check the token Secret", c.Message, want)
		}
		return nil
	})
	// Events are sent by the recorder's own goroutine, after the status
	// write that records them.
	testutil.Eventually(t, 3*time.Second, "the PushUnauthorized event", func() error {
		return hasEvent(e.ns, "llm", corev1.EventTypeWarning, "PushUnauthorized", bad.pod)
	})
	if _, err := getPolicy(good); err != nil {
		t.Errorf("the dispatcher with the right token has no policy: %v", err)
	}
	if _, err := getPolicy(bad); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("the dispatcher with the wrong token answers %v, want 404 (no policy)", err)
	}
	if ready, _ := podIsReady(e.ns, bad.pod); ready {
		t.Error("the refused dispatcher became Ready without a policy")
	}
	if text := scrape(t); !regexp.MustCompile(`(?m)^tiergate_push_total\{result="unauthorized"\} [1-9]`).MatchString(text) {
		t.Errorf("no unauthorized pushes counted:\n%s", grepLines(text, "tiergate_push_total"))
	}
}

func scrape(t *testing.T) string {
	t.Helper()
	resp, err := http.Get("http://" + ctrlProc.metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestMeasuredServiceTime(t *testing.T) {
	e := newEnv(t)
	d := e.startDispatchers(1)[0]
	// Six Ready model pods, each at most 4 at once: one simserver of 24
	// behind all their addresses.
	e.serveModels("--concurrency", "24", "--service-time", "const:300ms")
	e.applySamples(func(s string) string { return replaceOnce(t, s, "source: Declared", "source: Measured") })
	backends := e.scale(6)
	if took, err := allHold(e.disp, 2*time.Second, matches(samplePolicy(e.ns, backends, 24, []policy.Tier{
		{Name: "premium", BasePriority: 0, TolerableWaitSeconds: 5, QueueBound: 20, TenantConcurrencyLimit: 6, TenantQueueLimit: 5},
		{Name: "standard", BasePriority: 10, TolerableWaitSeconds: 20, QueueBound: 80, TenantConcurrencyLimit: 2, TenantQueueLimit: 8},
		{Name: "free", BasePriority: 20, TolerableWaitSeconds: 60, QueueBound: 120, TenantConcurrencyLimit: 1, TenantQueueLimit: 4},
	}, sampleTenants))); err != nil {
		t.Fatalf("declared-mean policy not held after %s: %v", took, err)
	}

	// 48 real completions through the dispatcher (6 at a time, within the
	// simserver's concurrency, so the service time is the simservers' own).
	oc := openai.NewClient(option.WithBaseURL(d.DataURL("/v1/")), option.WithAPIKey("unused"),
		option.WithHeader("X-Tenant-ID", "acme"), option.WithMaxRetries(0), option.WithRequestTimeout(10*time.Second))
	var wg sync.WaitGroup
	errs := make(chan error, 48)
	sem := make(chan struct{}, 6) // acme's premium limit is 6
	for i := 0; i < 48; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			_, err := oc.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
				Model: "sim-model", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")},
			})
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("completion through the dispatcher: %v", err)
		}
	}

	// The next resync's acks carry the measured time; the controller folds
	// it into S, the bounds follow, and the dispatcher gets them.
	var observed time.Duration
	testutil.Eventually(t, 5*time.Second, "observedServiceTime near 300ms", func() error {
		st := e.pool().Status
		if st.ObservedServiceTime == nil {
			return fmt.Errorf("no observedServiceTime yet")
		}
		observed = st.ObservedServiceTime.Duration
		if observed < 250*time.Millisecond || observed > 450*time.Millisecond {
			return fmt.Errorf("observedServiceTime %s, want about 300ms", observed)
		}
		return nil
	})
	// premium L = floor(24 × 5s / S), free L = floor(24 × 30s / S), with
	// S read again each time in case a later resync moved it once more.
	var wantPremium, wantFree int
	testutil.Eventually(t, 3*time.Second, "the dispatcher holds the measured bounds", func() error {
		st := e.pool().Status
		observed = st.ObservedServiceTime.Duration
		wantPremium = int(24 * 5 * time.Second / observed)
		wantFree = int(24 * 30 * time.Second / observed)
		p, err := getPolicy(d)
		if err != nil {
			return err
		}
		if p.Tiers[0].QueueBound != wantPremium || p.Tiers[2].QueueBound != wantFree || p.Version != st.PolicyVersion {
			return fmt.Errorf("v%d bounds premium %d free %d, want v%d with %d and %d for S=%s",
				p.Version, p.Tiers[0].QueueBound, p.Tiers[2].QueueBound, st.PolicyVersion, wantPremium, wantFree, observed)
		}
		return nil
	})
	t.Logf("measured S=%s moved the premium bound 20→%d and free 120→%d", observed, wantPremium, wantFree)
	if rate := e.pool().Status.ServiceRate; rate == "4" {
		t.Errorf("serviceRate still %s", rate)
	}
}

func TestControllerRestartNeverRegressesVersions(t *testing.T) {
	e, backends := sampleEnv(t, 1)
	if took, err := allHold(e.disp, 2*time.Second, slots(24)); err != nil {
		t.Fatalf("not held after %s: %v", took, err)
	}
	_ = backends
	before, err := getPolicy(e.disp[0])
	if err != nil {
		t.Fatal(err)
	}
	ceiling := e.pool().Status.PolicyVersionReserved
	if ceiling < before.Version {
		t.Fatalf("the dispatcher holds version %d above the reserved ceiling %d", before.Version, ceiling)
	}
	ctrlProc.stop()
	restarted, err := startController()
	if err != nil {
		t.Fatal(err)
	}
	ctrlProc = restarted
	// The new process has no memory: it must go above the stored ceiling
	// of reserved versions (a dispatcher would answer 409 to anything
	// older, and the old process may have pushed any version up to it).
	e.scale(3)
	if took, err := allHold(e.disp, 5*time.Second, slots(12)); err != nil {
		t.Fatalf("the restarted controller's policy not held after %s: %v", took, err)
	}
	after, err := getPolicy(e.disp[0])
	if err != nil {
		t.Fatal(err)
	}
	if after.Version <= ceiling {
		t.Errorf("version went from %d to %d across the restart, not above the reserved ceiling %d", before.Version, after.Version, ceiling)
	}
	testutil.Eventually(t, 2*time.Second, "Synced after restart", func() error {
		st := e.pool().Status
		if st.PolicyVersion != after.Version {
			return fmt.Errorf("status policyVersion %d, dispatcher holds %d", st.PolicyVersion, after.Version)
		}
		return conditionIs(st.Conditions, v1alpha1.ModelPoolSynced, metav1.ConditionTrue, "AllDispatchersSynced")
	})
	if strings.Contains(ctrlProc.Output(), "holds a newer policy version") {
		t.Error("a dispatcher answered 409 to the restarted controller")
	}
}

func TestUnreachableDispatcherIsRetried(t *testing.T) {
	e := newEnv(t)
	pods := e.dispatcherPods(2)
	e.adopt(pods[0], bins.Tiergate, pushToken)
	// A pod whose IP has nothing listening yet.
	late := pods[1]
	e.applySamples()
	e.scale(6)

	testutil.Eventually(t, 5*time.Second, "Degraded DispatcherUnreachable", func() error {
		st := e.pool().Status
		if err := conditionIs(st.Conditions, v1alpha1.ModelPoolDegraded, metav1.ConditionTrue, "DispatcherUnreachable"); err != nil {
			return err
		}
		if c := condition(st.Conditions, v1alpha1.ModelPoolDegraded); !strings.Contains(c.Message, late.pod) {
			return fmt.Errorf("message %q does not name %s", c.Message, late.pod)
		}
		return nil
	})
	// The reachable one is served meanwhile (12 of the 24 slots).
	if _, err := allHold(e.disp, time.Second, slots(12)); err != nil {
		t.Fatal(err)
	}
	// Now the dispatcher starts on that address: the backoff retry (at most
	// 5s apart by default) delivers the policy without any change.
	started := time.Now()
	late.run(e, bins.Tiergate, pushToken)
	took, err := allHold([]*dispatcher{late}, 20*time.Second, slots(12))
	if err != nil {
		t.Fatalf("the late dispatcher has no policy %s after it started: %v", took, err)
	}
	t.Logf("the late dispatcher got its policy %s after it started listening", time.Since(started).Round(time.Millisecond))
	testutil.Eventually(t, 3*time.Second, "Degraded clears and all are synced", func() error {
		st := e.pool().Status
		if err := conditionIs(st.Conditions, v1alpha1.ModelPoolDegraded, metav1.ConditionFalse, "Healthy"); err != nil {
			return err
		}
		return conditionIs(st.Conditions, v1alpha1.ModelPoolSynced, metav1.ConditionTrue, "AllDispatchersSynced")
	})
	if err := hasEvent(e.ns, "llm", corev1.EventTypeWarning, "DispatcherUnreachable", late.pod); err != nil {
		t.Error(err)
	}
}

func TestPoolDeletion(t *testing.T) {
	e, _ := sampleEnv(t, 1)
	// A second pool the test leaves alone: what the controller does for it
	// shows how far the controller has got.
	control, _ := sampleEnv(t, 1)
	ctx := context.Background()
	if _, err := allHold(append(e.disp, control.disp...), 2*time.Second, slots(24)); err != nil {
		t.Fatal(err)
	}
	kubectl.Must(t, "delete", "-n", e.ns, "modelpool", "llm")
	testutil.Eventually(t, 2*time.Second, "tiers and quotas say PoolNotFound", func() error {
		var tiers v1alpha1.ServiceTierList
		if err := k8s.List(ctx, &tiers, client.InNamespace(e.ns)); err != nil {
			return err
		}
		for _, tr := range tiers.Items {
			if err := conditionIs(tr.Status.Conditions, v1alpha1.ConditionReady, metav1.ConditionFalse, "PoolNotFound"); err != nil {
				return fmt.Errorf("tier %s: %w", tr.Name, err)
			}
			if tr.Status.QueueBound != 0 {
				return fmt.Errorf("tier %s still shows bound %d", tr.Name, tr.Status.QueueBound)
			}
		}
		var quotas v1alpha1.TenantQuotaList
		if err := k8s.List(ctx, &quotas, client.InNamespace(e.ns)); err != nil {
			return err
		}
		for _, q := range quotas.Items {
			if err := conditionIs(q.Status.Conditions, v1alpha1.ConditionReady, metav1.ConditionFalse, "PoolNotFound"); err != nil {
				return fmt.Errorf("quota %s: %w", q.Name, err)
			}
		}
		return nil
	})
	// The dispatcher keeps its last policy (docs/architecture.md#controller-and-dispatcher) and gets
	// no more pushes: not for the Deployment's change, nor for the three
	// resyncs the other pool gets after the same change to its own.
	before, err := getPolicy(e.disp[0])
	if err != nil {
		t.Fatal(err)
	}
	pushed := e.disp[0].pushes()
	e.scale(3)
	control.scale(3)
	if _, err := allHold(control.disp, 2*time.Second, slots(12)); err != nil {
		t.Fatal(err)
	}
	control.disp[0].waitPushes(t, control.disp[0].pushes(), 3)
	if n := e.disp[0].pushes() - pushed; n != 0 {
		t.Errorf("the dispatcher of the deleted pool applied %d pushes", n)
	}
	after, err := getPolicy(e.disp[0])
	if err != nil {
		t.Fatal(err)
	}
	if after.Version != before.Version || after.Slots != 24 {
		t.Errorf("after the pool's deletion the dispatcher went from v%d to v%d (slots %d)", before.Version, after.Version, after.Slots)
	}
}

// TestMetrics scrapes the controller's metrics endpoint.
func TestMetrics(t *testing.T) {
	e, _ := sampleEnv(t, 1)
	if _, err := allHold(e.disp, 2*time.Second, slots(24)); err != nil {
		t.Fatal(err)
	}
	text := scrape(t)
	for _, re := range []string{
		`(?m)^tiergate_push_total\{result="success"\} [1-9]`,
		`(?m)^tiergate_push_latency_seconds_count [1-9]`,
		// The push queue's own series, from controller-runtime's provider.
		`(?m)^workqueue_adds_total\{controller="push",name="push"\} [1-9]`,
		`(?m)^workqueue_depth\{controller="push",name="push",priority=""\} 0$`,
		`(?m)^workqueue_retries_total\{controller="push",name="push"\} \d`,
		`(?m)^tiergate_pool_concurrency\{pool="` + regexp.QuoteMeta(e.ns) + `/llm"\} 24$`,
	} {
		if !regexp.MustCompile(re).MatchString(text) {
			t.Errorf("metrics do not match %s", re)
		}
	}
	if t.Failed() {
		t.Logf("metrics:\n%s\n%s", grepLines(text, "tiergate_"), grepLines(text, `name="push"`))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// quotaEventually waits up to 2s until check passes on the TenantQuota's
// current state.
func quotaEventually(t *testing.T, ns, name, what string, check func(v1alpha1.TenantQuota) error) {
	t.Helper()
	// The controller writes a settled pool's quota statuses once their
	// content has not changed for a second, a moving pool's once it
	// settles or nothing changed for 10 s (docs/architecture.md), then at
	// the worker's pace: 15 s covers the second case.
	testutil.Eventually(t, 15*time.Second, what, func() error {
		var q v1alpha1.TenantQuota
		if err := k8s.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, &q); err != nil {
			return err
		}
		return check(q)
	})
}
