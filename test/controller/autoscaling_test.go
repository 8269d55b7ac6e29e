package controller

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/api/v1alpha1"
	"github.com/tiergate/tiergate/internal/testutil"
)

// promAddress is where the tests' ScaledObjects point; nothing queries it
// here (no KEDA operator runs), promtool checks the query instead.
const promAddress = "http://127.0.0.1:9090"

// withAutoscaling adds spec.autoscaling to the sample pool.
func withAutoscaling(minReplicas, maxReplicas int) func(string) string {
	return func(s string) string {
		return strings.Replace(s, "  sharedState: Local\n", fmt.Sprintf(
			"  sharedState: Local\n  autoscaling:\n    minReplicas: %d\n    maxReplicas: %d\n    prometheus:\n      serverAddress: %s\n", minReplicas, maxReplicas, promAddress), 1)
	}
}

// patchPool applies a JSON patch to the sample pool with kubectl.
func (e *env) patchPool(patch string) {
	e.t.Helper()
	kubectl.Must(e.t, "patch", "modelpool", "llm", "-n", e.ns, "--type=json", "-p", patch)
}

// autoscalerIs waits for the AutoscalerUnavailable condition, with the
// pool's generation observed.
func (e *env) autoscalerIs(status metav1.ConditionStatus, reason string) {
	e.t.Helper()
	testutil.Eventually(e.t, 10*time.Second, "AutoscalerUnavailable "+string(status)+"/"+reason, func() error {
		p := e.pool()
		if err := conditionIs(p.Status.Conditions, v1alpha1.ModelPoolAutoscalerUnavailable, status, reason); err != nil {
			return err
		}
		if c := condition(p.Status.Conditions, v1alpha1.ModelPoolAutoscalerUnavailable); c.ObservedGeneration != p.Generation {
			return fmt.Errorf("observedGeneration %d, want %d", c.ObservedGeneration, p.Generation)
		}
		return nil
	})
}

// wantScaledObject is the ScaledObject of the sample pool in ns, as stored.
func wantScaledObject(ns string, minReplicas, maxReplicas int) map[string]any {
	spec := fmt.Sprintf(`advanced:
  horizontalPodAutoscalerConfig:
    behavior:
      scaleDown: {tolerance: "0"}
      scaleUp: {tolerance: "0"}
maxReplicaCount: %d
minReplicaCount: %d
scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: llm}
triggers:
- type: prometheus
  name: desired-replicas
  metricType: AverageValue
  metadata:
    activationThreshold: "0"
    ignoreNullValues: "false"
    query: max(tiergate_pool_desired_replicas{pool="%s/llm"})
    serverAddress: %s
    threshold: "1"
`, maxReplicas, minReplicas, ns, promAddress)
	var m map[string]any
	if err := yaml.Unmarshal([]byte(spec), &m); err != nil {
		panic(err)
	}
	return m
}

// scaledObjectIs waits until the pool's ScaledObject has the spec of
// min and max, controlled by the pool.
func (e *env) scaledObjectIs(minReplicas, maxReplicas int) *unstructured.Unstructured {
	e.t.Helper()
	var so *unstructured.Unstructured
	testutil.Eventually(e.t, 10*time.Second, fmt.Sprintf("ScaledObject with %d..%d replicas", minReplicas, maxReplicas), func() error {
		var err error
		if so, err = scaledObject(e.t, e.ns, "llm"); err != nil || so == nil {
			return fmt.Errorf("ScaledObject: %v (nil %v)", err, so == nil)
		}
		// Round-trip through JSON so numbers compare as the YAML's do.
		raw, _ := json.Marshal(so.Object["spec"])
		var got map[string]any
		if err := yaml.Unmarshal(raw, &got); err != nil {
			return err
		}
		if diff := cmp.Diff(wantScaledObject(e.ns, minReplicas, maxReplicas), got); diff != "" {
			return fmt.Errorf("spec (-want +got):\n%s", diff)
		}
		return nil
	})
	pool := e.pool()
	refs := so.GetOwnerReferences()
	if len(refs) != 1 || refs[0].UID != pool.UID || refs[0].Kind != "ModelPool" || refs[0].Controller == nil || !*refs[0].Controller {
		e.t.Errorf("owner references %+v, want the pool %s as controller", refs, pool.UID)
	}
	return so
}

// On a Deployment at 0, with real dispatchers (which report no load):
// the ScaledObject is created on KEDA's real CRD, follows min and max, and
// goes with spec.autoscaling.
func TestScaledObjectFollowsSpecAutoscaling(t *testing.T) {
	installKEDA(t)
	e := newEnv(t)
	e.startDispatchers(2)
	e.applySamples(withColdStart("12s"), withAutoscaling(0, 4))
	e.scale(0)
	if took, err := allHold(e.disp, 5*time.Second, matches(heldSamplePolicy(e.ns))); err != nil {
		t.Fatalf("after %s the dispatchers do not hold the policy at zero: %v", took, err)
	}
	e.scaledObjectIs(0, 4)
	e.autoscalerIs(metav1.ConditionFalse, string(v1alpha1.ReasonScaledObjectInSync))
	if d := e.pool().Status.DesiredReplicas; d != 0 {
		t.Errorf("desiredReplicas %d with no load reported, want 0", d)
	}

	e.patchPool(`[{"op":"replace","path":"/spec/autoscaling/minReplicas","value":1},{"op":"replace","path":"/spec/autoscaling/maxReplicas","value":6}]`)
	e.scaledObjectIs(1, 6)
	testutil.Eventually(t, 5*time.Second, "desiredReplicas at minReplicas 1", func() error {
		if d := e.pool().Status.DesiredReplicas; d != 1 {
			return fmt.Errorf("desiredReplicas %d, want 1", d)
		}
		return nil
	})
	testutil.Eventually(t, 5*time.Second, "DesiredReplicas event", func() error {
		return hasEvent(e.ns, "llm", "Normal", "DesiredReplicas", "desired replicas 0→1")
	})

	e.patchPool(`[{"op":"remove","path":"/spec/autoscaling"}]`)
	testutil.Eventually(t, 10*time.Second, "ScaledObject deleted", func() error {
		so, err := scaledObject(t, e.ns, "llm")
		if err != nil || so != nil {
			return fmt.Errorf("ScaledObject still there (%v)", err)
		}
		return nil
	})
	e.autoscalerIs(metav1.ConditionFalse, string(v1alpha1.ReasonAutoscalingNotRequested))
}

// Without KEDA's CRD the pool says so and everything else works; once the
// CRD is installed the ScaledObject appears within a resync.
func TestAutoscalerUnavailableUntilKEDAIsInstalled(t *testing.T) {
	uninstallKEDA(t)
	t.Cleanup(func() { installKEDA(t) })
	e, backends := sampleEnv(t, 2, withAutoscaling(0, 4))
	tiersR6N2 := []policy.Tier{
		{Name: "premium", BasePriority: 0, TolerableWaitSeconds: 5, QueueBound: 10, TenantConcurrencyLimit: 3, TenantQueueLimit: 2},
		{Name: "standard", BasePriority: 10, TolerableWaitSeconds: 20, QueueBound: 40, TenantConcurrencyLimit: 1, TenantQueueLimit: 4},
		{Name: "free", BasePriority: 20, TolerableWaitSeconds: 60, QueueBound: 60, TenantConcurrencyLimit: 1, TenantQueueLimit: 2},
	}
	if took, err := allHold(e.disp, 5*time.Second, matches(samplePolicy(e.ns, backends, 12, tiersR6N2, sampleTenants))); err != nil {
		t.Fatalf("after %s the dispatchers do not hold the policy: %v", took, err)
	}
	e.autoscalerIs(metav1.ConditionTrue, string(v1alpha1.ReasonKEDANotInstalled))
	testutil.Eventually(t, 5*time.Second, "Ready, Synced and healthy with KEDA missing", func() error {
		st := e.pool().Status
		for _, want := range []struct {
			typ, reason string
			status      metav1.ConditionStatus
		}{
			{v1alpha1.ConditionReady, "PoolReady", metav1.ConditionTrue},
			{v1alpha1.ModelPoolSynced, "AllDispatchersSynced", metav1.ConditionTrue},
			{v1alpha1.ModelPoolDegraded, "Healthy", metav1.ConditionFalse},
			{v1alpha1.ModelPoolAutoscalerUnavailable, string(v1alpha1.ReasonKEDANotInstalled), metav1.ConditionTrue},
		} {
			if err := conditionIs(st.Conditions, want.typ, want.status, want.reason); err != nil {
				return err
			}
		}
		return nil
	})
	testutil.Eventually(t, 5*time.Second, "Warning event KEDANotInstalled", func() error {
		return hasEvent(e.ns, "llm", "Warning", "KEDANotInstalled", "scaledobjects.keda.sh")
	})

	installKEDA(t)
	e.scaledObjectIs(0, 4)
	e.autoscalerIs(metav1.ConditionFalse, string(v1alpha1.ReasonScaledObjectInSync))
}

// A fake dispatcher reports offered load in its acks, next to a real one
// that reports none: the controller sums them into desiredReplicas and
// exports it, and the ScaledObject's PromQL reads it back from series in
// exactly the exported format.
func TestDesiredReplicasFromTheAcks(t *testing.T) {
	installKEDA(t)
	e := newEnv(t)
	pods := e.dispatcherPods(2)
	e.adopt(pods[0], bins.Tiergate, pushToken)
	fake := e.startFakeDispatcher(pods[1], pushToken)
	e.applySamples(withColdStart("12s"), withAutoscaling(0, 10))
	e.scale(0)
	pool := e.ns + "/llm"

	steps := []struct {
		stats   policy.Measured
		desired int32
	}{
		// λ = 3/s, S = 6s, C = 4, u = 0.8: ⌈5.625⌉ = 6.
		{policy.Measured{OfferedLoad: map[string]float64{"free": 2, "premium": 1}, Queued: 3}, 6},
		// Nothing offered but one request held: the pool must wake.
		{policy.Measured{Queued: 1}, 1},
		{policy.Measured{}, 0},
	}
	for _, s := range steps {
		fake.report(s.stats)
		testutil.Eventually(t, 10*time.Second, fmt.Sprintf("desiredReplicas %d", s.desired), func() error {
			if d := e.pool().Status.DesiredReplicas; d != s.desired {
				return fmt.Errorf("status.desiredReplicas %d", d)
			}
			want := fmt.Sprintf(`tiergate_pool_desired_replicas{pool="%s"} %d`, pool, s.desired)
			if got := controllerSeries(t, "tiergate_pool_desired_replicas", pool); len(got) != 1 || got[0] != want {
				return fmt.Errorf("exported %q, want %q", got, want)
			}
			return nil
		})
		if p := fake.policy(); p == nil || !p.HoldsForColdStart() {
			t.Errorf("the fake dispatcher holds %+v, want the policy at zero", p)
		}
	}
	testutil.Eventually(t, 5*time.Second, "DesiredReplicas event", func() error {
		return hasEvent(e.ns, "llm", "Normal", "DesiredReplicas", "desired replicas 0→6: 3 requests/s offered, 3 queued or held")
	})

	fake.report(steps[0].stats)
	var line string
	testutil.Eventually(t, 10*time.Second, "desiredReplicas back at 6", func() error {
		got := controllerSeries(t, "tiergate_pool_desired_replicas", pool)
		if len(got) != 1 || !strings.HasSuffix(got[0], " 6") {
			return fmt.Errorf("exported %q", got)
		}
		line = got[0]
		return nil
	})
	so := e.scaledObjectIs(0, 10)
	triggers, _, _ := unstructured.NestedSlice(so.Object, "spec", "triggers")
	query, _, _ := unstructured.NestedString(triggers[0].(map[string]any), "metadata", "query")
	promtoolQueryTest(t, query, line)
}

// promtoolQueryTest checks the trigger's query with `promtool test rules`
// against the exported line as two controller pods' scrapes would store
// it, next to another pool's series: the query must give exactly the
// pool's desired replicas, as one sample.
func promtoolQueryTest(t *testing.T, query, exported string) {
	t.Helper()
	bin, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool not found: install it with `hack/ensure-deb.sh prometheus` (%v)", err)
	}
	i := strings.LastIndex(exported, " ")
	series, value := exported[:i], exported[i+1:]
	withTarget := func(instance string) string {
		return strings.TrimSuffix(series, "}") + `,job="tiergate-controller",instance="` + instance + `"}`
	}
	other := `tiergate_pool_desired_replicas{pool="elsewhere/llm"}`
	tests := fmt.Sprintf(`rule_files: []
evaluation_interval: 15s
tests:
- interval: 15s
  input_series:
  - series: '%s'
    values: '%sx8'
  - series: '%s'
    values: '_ _ _ _ %sx4'
  - series: '%s'
    values: '40x8'
  promql_expr_test:
  - expr: '%s'
    eval_time: 30s
    exp_samples:
    - labels: '{}'
      value: %s
  - expr: '%s'
    eval_time: 90s
    exp_samples:
    - labels: '{}'
      value: %s
`, withTarget("10.0.0.1:8080"), value, withTarget("10.0.0.2:8080"), value, other, query, value, query, value)
	path := filepath.Join(t.TempDir(), "trigger_test.yaml")
	if err := os.WriteFile(path, []byte(tests), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := (testutil.Tool{Bin: bin}).Run("test", "rules", path); r.Err != nil || !strings.Contains(r.Stdout, "SUCCESS") {
		t.Fatalf("%s\n%s", r, tests)
	}
}
