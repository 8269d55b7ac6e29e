package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/tiergate/tiergate/api/v1alpha1"
	"github.com/tiergate/tiergate/controllers"
)

// The new ModelPool fields, refused with a message that names the field.
func TestColdStartAndAutoscalingAreValidated(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	const (
		coldMsg  = "coldStart must be a duration greater than 0, such as 90s"
		utilMsg  = "autoscaling.targetUtilization must be greater than 0 and at most 1"
		urlMsg   = "autoscaling.prometheus.serverAddress must be an http or https URL, such as http://prometheus-operated.monitoring.svc:9090"
		minOrder = "Invalid value: autoscaling.minReplicas must not exceed autoscaling.maxReplicas"
	)
	auto := func(fields map[string]any) mutation {
		a := map[string]any{"maxReplicas": int64(4)}
		for k, v := range fields {
			a[k] = v
		}
		return set("spec.autoscaling", a)
	}
	prom := func(addr string) mutation {
		return auto(map[string]any{"prometheus": map[string]any{"serverAddress": addr}})
	}
	tests := map[string]struct {
		mutate mutation
		want   []cause
	}{
		"coldStart 0s":           {set("spec.coldStart", "0s"), []cause{invalid("spec.coldStart", `Invalid value: "0s": `+coldMsg)}},
		"negative coldStart":     {set("spec.coldStart", "-90s"), []cause{invalid("spec.coldStart", `Invalid value: "-90s": `+coldMsg)}},
		"coldStart without unit": {set("spec.coldStart", "90"), []cause{invalid("spec.coldStart", `Invalid value: "90": `+coldMsg)}},
		"coldStart in days":      {set("spec.coldStart", "1d"), []cause{invalid("spec.coldStart", `Invalid value: "1d": `+coldMsg)}},
		"coldStart too long a string": {set("spec.coldStart", strings.Repeat("1", 64)+"s"),
			[]cause{{metav1.CauseTypeTooLong, "spec.coldStart", "Too long: may not be more than 64 bytes"}, notChecked}},
		"autoscaling without maxReplicas": {set("spec.autoscaling", map[string]any{"minReplicas": int64(1)}),
			[]cause{{metav1.CauseTypeFieldValueRequired, "spec.autoscaling.maxReplicas", "Required value"}, notChecked}},
		"maxReplicas 0": {auto(map[string]any{"maxReplicas": int64(0)}),
			[]cause{invalid("spec.autoscaling.maxReplicas", "Invalid value: 0: spec.autoscaling.maxReplicas in body should be greater than or equal to 1")}},
		"negative minReplicas": {auto(map[string]any{"minReplicas": int64(-1)}),
			[]cause{invalid("spec.autoscaling.minReplicas", "Invalid value: -1: spec.autoscaling.minReplicas in body should be greater than or equal to 0")}},
		"minReplicas above maxReplicas": {auto(map[string]any{"minReplicas": int64(5)}),
			[]cause{invalid("spec.autoscaling.minReplicas", minOrder)}},
		"targetUtilization 0":     {auto(map[string]any{"targetUtilization": "0"}), []cause{invalid("spec.autoscaling.targetUtilization", `Invalid value: "0": `+utilMsg)}},
		"targetUtilization 1.5":   {auto(map[string]any{"targetUtilization": "1.5"}), []cause{invalid("spec.autoscaling.targetUtilization", `Invalid value: "1.5": `+utilMsg)}},
		"targetUtilization 1001m": {auto(map[string]any{"targetUtilization": "1001m"}), []cause{invalid("spec.autoscaling.targetUtilization", `Invalid value: "1001m": `+utilMsg)}},
		"targetUtilization 2":     {auto(map[string]any{"targetUtilization": int64(2)}), []cause{invalid("spec.autoscaling.targetUtilization", `Invalid value: 2: `+utilMsg)}},
		"negative targetUtilization": {auto(map[string]any{"targetUtilization": "-0.5"}),
			[]cause{invalid("spec.autoscaling.targetUtilization", `Invalid value: "-0.5": `+utilMsg)}},
		"malformed targetUtilization": {auto(map[string]any{"targetUtilization": "most"}),
			[]cause{invalid("spec.autoscaling.targetUtilization", `Invalid value: "most": spec.autoscaling.targetUtilization in body should match `+quantityPattern)}},
		"server without a scheme": {prom("prometheus:9090"), []cause{invalid("spec.autoscaling.prometheus.serverAddress", `Invalid value: "prometheus:9090": `+urlMsg)}},
		"server over ftp":         {prom("ftp://prometheus:9090"), []cause{invalid("spec.autoscaling.prometheus.serverAddress", `Invalid value: "ftp://prometheus:9090": `+urlMsg)}},
		"server without a host":   {prom("http://:9090"), []cause{invalid("spec.autoscaling.prometheus.serverAddress", `Invalid value: "http://:9090": `+urlMsg)}},
		"server not a URL":        {prom("the usual one"), []cause{invalid("spec.autoscaling.prometheus.serverAddress", `Invalid value: "the usual one": `+urlMsg)}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			obj := fromSample(t, ns, "ModelPool", "llm", tc.mutate)
			got := refusal(t, k8sClient.Create(context.Background(), obj))
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("causes (-want +got):\n%s", diff)
			}
		})
	}
}

// The accepting side of the same rules, and the defaults.
func TestColdStartAndAutoscalingEdgesAreAccepted(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	tests := map[string]struct {
		mutate mutation
		field  string
		want   any
	}{
		"coldStart 1ms":          {set("spec.coldStart", "1ms"), "spec.coldStart", "1ms"},
		"coldStart 2m30s":        {set("spec.coldStart", "2m30s"), "spec.coldStart", "2m30s"},
		"no coldStart":           {del("spec.coldStart"), "spec.coldStart", nil},
		"minReplicas default 0":  {set("spec.autoscaling", map[string]any{"maxReplicas": int64(1)}), "spec.autoscaling.minReplicas", int64(0)},
		"utilization default":    {set("spec.autoscaling", map[string]any{"maxReplicas": int64(1)}), "spec.autoscaling.targetUtilization", "0.8"},
		"min equals max":         {set("spec.autoscaling", map[string]any{"minReplicas": int64(3), "maxReplicas": int64(3)}), "spec.autoscaling.minReplicas", int64(3)},
		"utilization exactly 1":  {set("spec.autoscaling", map[string]any{"maxReplicas": int64(2), "targetUtilization": "1"}), "spec.autoscaling.targetUtilization", "1"},
		"utilization integer 1":  {set("spec.autoscaling", map[string]any{"maxReplicas": int64(2), "targetUtilization": int64(1)}), "spec.autoscaling.targetUtilization", int64(1)},
		"utilization in millis":  {set("spec.autoscaling", map[string]any{"maxReplicas": int64(2), "targetUtilization": "750m"}), "spec.autoscaling.targetUtilization", "750m"},
		"https server with path": {set("spec.autoscaling", map[string]any{"maxReplicas": int64(2), "prometheus": map[string]any{"serverAddress": "https://prom.example:9091/thanos"}}), "spec.autoscaling.prometheus.serverAddress", "https://prom.example:9091/thanos"},
		"no server: the flag's":  {set("spec.autoscaling", map[string]any{"maxReplicas": int64(2)}), "spec.autoscaling.prometheus", nil},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			obj := fromSample(t, ns, "ModelPool", "llm", tc.mutate)
			checkStored(t, obj, tc.field, tc.want)
		})
	}
}

// Updates run the rules too; removing spec.autoscaling is allowed.
func TestAutoscalingUpdates(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	tests := map[string]struct {
		mutate mutation
		want   []cause // nil: accepted
	}{
		"max lowered below min": {set("spec.autoscaling.maxReplicas", int64(1)),
			[]cause{invalid("spec.autoscaling.minReplicas", "Invalid value: autoscaling.minReplicas must not exceed autoscaling.maxReplicas")}},
		"cold start emptied to 0s": {set("spec.coldStart", "0s"),
			[]cause{invalid("spec.coldStart", `Invalid value: "0s": coldStart must be a duration greater than 0, such as 90s`)}},
		"autoscaling removed":  {del("spec.autoscaling"), nil},
		"cold start removed":   {del("spec.coldStart"), nil},
		"max raised, min kept": {set("spec.autoscaling.maxReplicas", int64(12)), nil},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			obj := fromSample(t, ns, "ModelPool", "llm",
				set("spec.coldStart", "90s"), set("spec.autoscaling", map[string]any{"minReplicas": int64(2), "maxReplicas": int64(6)}))
			if err := k8sClient.Create(ctx, obj); err != nil {
				t.Fatalf("create: %v", err)
			}
			tc.mutate(t, obj)
			err := k8sClient.Update(ctx, obj)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("update refused: %v", err)
				}
				return
			}
			if diff := cmp.Diff(tc.want, refusal(t, err)); diff != "" {
				t.Errorf("causes (-want +got):\n%s", diff)
			}
		})
	}
}

// The controller's ScaledObject against KEDA's own CRD, taken from the
// pinned module by hack/tools.sh: strict field validation accepts it and
// stores it unpruned, and refuses a field the CRD does not know (so the
// check can fail).
func TestScaledObjectFitsKEDAsCRD(t *testing.T) {
	t.Parallel()
	crd := filepath.Join(repoRoot, "bin", "keda", "keda.sh_scaledobjects.yaml")
	if _, err := os.Stat(crd); err != nil {
		t.Fatalf("KEDA's ScaledObject CRD is missing (%v); run `make tools` (or hack/tools.sh keda) first", err)
	}
	if _, err := envtest.InstallCRDs(testEnv.Config, envtest.CRDInstallOptions{Paths: []string{crd}, ErrorIfPathMissing: true}); err != nil {
		t.Fatal(err)
	}
	ns := newNamespace(t)
	ctx := context.Background()
	for _, a := range []*v1alpha1.Autoscaling{{MinReplicas: 0, MaxReplicas: 4}, {MinReplicas: 3, MaxReplicas: 3}} {
		pool := &v1alpha1.ModelPool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("llm-%d-%d", a.MinReplicas, a.MaxReplicas), UID: types.UID("uid-" + ns)},
			Spec: v1alpha1.ModelPoolSpec{DeploymentRef: v1alpha1.LocalObjectReference{Name: "llm"}, Autoscaling: a}}
		so := controllers.ScaledObjectFor(pool, "http://prometheus-operated.monitoring.svc:9090")
		sent := so.DeepCopy()
		if err := k8sClient.Create(ctx, so, client.FieldValidation(metav1.FieldValidationStrict)); err != nil {
			t.Fatalf("KEDA's CRD refuses the controller's ScaledObject for %+v: %v", a, err)
		}
		if diff := cmp.Diff(sent.Object["spec"], so.Object["spec"]); diff != "" {
			t.Errorf("stored spec differs from the one sent (-sent +stored):\n%s", diff)
		}
	}
	bad := controllers.ScaledObjectFor(&v1alpha1.ModelPool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "typo"},
		Spec: v1alpha1.ModelPoolSpec{DeploymentRef: v1alpha1.LocalObjectReference{Name: "llm"}, Autoscaling: &v1alpha1.Autoscaling{MaxReplicas: 2}}}, "http://p:9090")
	if err := unstructured.SetNestedField(bad.Object, int64(2), "spec", "maxReplicas"); err != nil {
		t.Fatal(err)
	}
	err := k8sClient.Create(ctx, bad, client.FieldValidation(metav1.FieldValidationStrict))
	if err == nil || !strings.Contains(err.Error(), `unknown field "spec.maxReplicas"`) {
		t.Errorf("a ScaledObject with spec.maxReplicas: err %v, want a strict decoding error naming it", err)
	}
}
