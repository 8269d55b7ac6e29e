package simulate

import (
	"errors"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	structuraldefaulting "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	"sigs.k8s.io/yaml"

	"github.com/tiergate/tiergate/api/v1alpha1"
)

const poolDoc = `apiVersion: tiergate.dev/v1alpha1
kind: ModelPool
metadata: {name: llm}
spec:
  deploymentRef: {name: llm}
  concurrencyPerReplica: 4
  serviceTime: {mean: 6s}
  backend: {port: 8000}
  dispatchers: {selector: {matchLabels: {app: d}}}
  defaultTier: free
`

const tierDoc = `apiVersion: tiergate.dev/v1alpha1
kind: ServiceTier
metadata: {name: free}
spec:
  poolRef: {name: llm}
  basePriority: 0
  tolerableWait: 60s
  tenantShare: "0.5"
`

const loadDoc = `apiVersion: tiergate.dev/v1alpha1
kind: Load
spec:
  replicas: 1
  duration: 1m
  tenants:
  - tenant: a
    arrival: {process: poisson, rate: 1}
`

func src(name, data string) Source { return Source{Name: name, Data: []byte(data)} }

func TestReadErrors(t *testing.T) {
	tests := map[string]struct {
		srcs    []Source
		wantErr error
		wantMsg string
	}{
		"unknown kind": {
			srcs:    []Source{src("x.yaml", poolDoc+"---\napiVersion: tiergate.dev/v1alpha1\nkind: Gadget\nmetadata: {name: g}\n")},
			wantErr: ErrUnknownKind,
			wantMsg: `x.yaml: document 2: unknown kind "Gadget" (want ModelPool, ServiceTier, TenantQuota or Load)`,
		},
		"missing kind": {
			srcs:    []Source{src("x.yaml", "apiVersion: tiergate.dev/v1alpha1\nmetadata: {name: g}\n")},
			wantErr: ErrUnknownKind,
			wantMsg: `x.yaml: document 1: unknown kind "" (want ModelPool, ServiceTier, TenantQuota or Load)`,
		},
		"wrong apiVersion": {
			srcs:    []Source{src("x.yaml", strings.Replace(tierDoc, "tiergate.dev/v1alpha1", "tiergate.dev/v1", 1))},
			wantErr: ErrInvalid,
			wantMsg: `x.yaml: document 1 (ServiceTier): invalid: apiVersion "tiergate.dev/v1" (want "tiergate.dev/v1alpha1")`,
		},
		"unknown field in a CRD kind": {
			srcs:    []Source{src("pool.yaml", strings.Replace(poolDoc, "  concurrencyPerReplica: 4\n", "  concurrencyPerReplica: 4\n  concurrency: 4\n", 1))},
			wantErr: ErrUnknownField,
			wantMsg: `pool.yaml: document 1 (ModelPool "llm"): unknown field "spec.concurrency"`,
		},
		"unknown field in the Load": {
			srcs:    []Source{src("pool.yaml", poolDoc), src("load.yaml", strings.Replace(loadDoc, "  replicas: 1\n", "  replicas: 1\n  replica: 2\n", 1))},
			wantErr: ErrUnknownField,
			wantMsg: `load.yaml: document 1 (Load): unknown field "spec.replica"`,
		},
		"unknown field in a Load tenant": {
			srcs:    []Source{src("load.yaml", strings.Replace(loadDoc, "rate: 1}", "rate: 1, burst: 3}", 1))},
			wantErr: ErrUnknownField,
			wantMsg: `load.yaml: document 1 (Load): unknown field "spec.tenants[0].arrival.burst"`,
		},
		"missing Load": {
			srcs:    []Source{src("pool.yaml", poolDoc+"---\n"+tierDoc)},
			wantErr: ErrMissingLoad,
			wantMsg: `no Load document: pass one with -f (kind: Load)`,
		},
		"missing pool": {
			srcs:    []Source{src("x.yaml", tierDoc+"---\n"+loadDoc)},
			wantErr: ErrMissingPool,
			wantMsg: `no ModelPool document: pass the pool with -f (kind: ModelPool)`,
		},
		"two Loads": {
			srcs:    []Source{src("a.yaml", loadDoc), src("b.yaml", "# the second\n---\n"+loadDoc)},
			wantErr: ErrDuplicate,
			wantMsg: `b.yaml: document 1 (Load): duplicate document: a second Load (the first is a.yaml: document 1 (Load))`,
		},
		"two pools": {
			srcs:    []Source{src("a.yaml", poolDoc+"---\n"+strings.Replace(poolDoc, "name: llm}", "name: other}", 1)+"---\n"+loadDoc)},
			wantErr: ErrDuplicate,
			wantMsg: `duplicate document: 2 ModelPools; simulate one pool at a time`,
		},
		"bad distribution": {
			srcs:    []Source{src("load.yaml", strings.Replace(loadDoc, "  duration: 1m\n", "  duration: 1m\n  serviceTime: {distribution: gamma, mean: 6s}\n", 1))},
			wantErr: ErrInvalid,
			wantMsg: `load.yaml: document 1 (Load): invalid: spec.serviceTime.distribution: unknown distribution "gamma" (want constant, exponential or lognormal)`,
		},
		"lognormal without stddev": {
			srcs:    []Source{src("load.yaml", strings.Replace(loadDoc, "  duration: 1m\n", "  duration: 1m\n  serviceTime: {distribution: lognormal, mean: 6s}\n", 1))},
			wantErr: ErrInvalid,
			wantMsg: `load.yaml: document 1 (Load): invalid: spec.serviceTime.stddev: must be greater than 0 for distribution lognormal`,
		},
		"stddev with exponential": {
			srcs:    []Source{src("load.yaml", strings.Replace(loadDoc, "  duration: 1m\n", "  duration: 1m\n  serviceTime: {distribution: exponential, stddev: 2s}\n", 1))},
			wantErr: ErrInvalid,
			wantMsg: `load.yaml: document 1 (Load): invalid: spec.serviceTime.stddev: is only used by distribution lognormal`,
		},
		"bad process": {
			srcs:    []Source{src("load.yaml", strings.Replace(loadDoc, "process: poisson", "process: weibull", 1))},
			wantErr: ErrInvalid,
			wantMsg: `load.yaml: document 1 (Load): invalid: spec.tenants[0].arrival.process: unknown process "weibull" (want poisson, constant, closed or burst)`,
		},
		"field of another process": {
			srcs:    []Source{src("load.yaml", strings.Replace(loadDoc, "rate: 1}", "rate: 1, clients: 3}", 1))},
			wantErr: ErrInvalid,
			wantMsg: `load.yaml: document 1 (Load): invalid: spec.tenants[0].arrival.clients: is not used by process poisson`,
		},
		"burst without at": {
			srcs:    []Source{src("load.yaml", strings.Replace(loadDoc, "{process: poisson, rate: 1}", "{process: burst, count: 10}", 1))},
			wantErr: ErrInvalid,
			wantMsg: `load.yaml: document 1 (Load): invalid: spec.tenants[0].arrival.at: must be set, at least 0 and before duration`,
		},
		"several spec errors at once": {
			srcs: []Source{src("load.yaml", `apiVersion: tiergate.dev/v1alpha1
kind: Load
spec:
  replicas: 0
  duration: 1m
  warmup: 2m
  replicaChanges: [{at: 2m, replicas: 1}]
  tenants:
  - tenant: a
    arrival: {process: closed}
  - tenant: a
    arrival: {process: constant, rate: -1}
`)},
			wantErr: ErrInvalid,
			wantMsg: `load.yaml: document 1 (Load): invalid: spec.replicas: must be at least 1, got 0; ` +
				`spec.warmup: must be at least 0 and shorter than duration 1m0s; ` +
				`spec.replicaChanges[0].at: must be after the previous change and before duration, got 2m0s; ` +
				`spec.tenants[0].arrival.clients: must be at least 1 for process closed; ` +
				`spec.tenants[1].tenant: duplicate tenant "a"; ` +
				`spec.tenants[1].arrival.rate: must be greater than 0 for process constant`,
		},
		"no tenants": {
			srcs:    []Source{src("load.yaml", "apiVersion: tiergate.dev/v1alpha1\nkind: Load\nspec: {replicas: 1, duration: 1m}\n")},
			wantErr: ErrInvalid,
			wantMsg: `load.yaml: document 1 (Load): invalid: spec.tenants: must list at least one tenant`,
		},
		"no dispatchers": {
			srcs:    []Source{src("load.yaml", strings.Replace(loadDoc, "  duration: 1m\n", "  duration: 1m\n  dispatchers: 0\n", 1))},
			wantErr: ErrInvalid,
			wantMsg: `load.yaml: document 1 (Load): invalid: spec.dispatchers: must be between 1 and 1000, got 0`,
		},
		"negative dispatchers": {
			srcs:    []Source{src("load.yaml", strings.Replace(loadDoc, "  duration: 1m\n", "  duration: 1m\n  dispatchers: -3\n", 1))},
			wantErr: ErrInvalid,
			wantMsg: `load.yaml: document 1 (Load): invalid: spec.dispatchers: must be between 1 and 1000, got -3`,
		},
		"too many dispatchers": {
			srcs:    []Source{src("load.yaml", strings.Replace(loadDoc, "  duration: 1m\n", "  duration: 1m\n  dispatchers: 1001\n", 1))},
			wantErr: ErrInvalid,
			wantMsg: `load.yaml: document 1 (Load): invalid: spec.dispatchers: must be between 1 and 1000, got 1001`,
		},
		"dispatchers not a number": {
			srcs:    []Source{src("load.yaml", strings.Replace(loadDoc, "  duration: 1m\n", "  duration: 1m\n  dispatchers: two\n", 1))},
			wantErr: ErrSyntax,
			wantMsg: `load.yaml: document 1 (Load): malformed document: json: cannot unmarshal string into Go struct field LoadSpec.spec.dispatchers of type int32`,
		},
		"bad duration syntax": {
			srcs:    []Source{src("load.yaml", strings.Replace(loadDoc, "duration: 1m", "duration: soon", 1))},
			wantErr: ErrSyntax,
			wantMsg: `load.yaml: document 1 (Load): malformed document: time: invalid duration "soon"`,
		},
		"ageing sets both": {
			srcs:    []Source{src("pool.yaml", strings.Replace(poolDoc, "  defaultTier: free\n", "  defaultTier: free\n  ageing: {rate: 6s, starvationBound: 120s}\n", 1))},
			wantErr: ErrInvalid,
			wantMsg: `pool.yaml: document 1 (ModelPool "llm"): invalid: spec.ageing: ageing must set exactly one of rate and starvationBound`,
		},
		"ageing present but empty": {
			srcs:    []Source{src("pool.yaml", strings.Replace(poolDoc, "  defaultTier: free\n", "  defaultTier: free\n  ageing: {}\n", 1))},
			wantErr: ErrInvalid,
			wantMsg: `pool.yaml: document 1 (ModelPool "llm"): invalid: spec.ageing: ageing must set exactly one of rate and starvationBound`,
		},
		"client timeout under a second": {
			srcs:    []Source{src("pool.yaml", strings.Replace(poolDoc, "  defaultTier: free\n", "  defaultTier: free\n  clientTimeout: 500ms\n", 1))},
			wantErr: ErrInvalid,
			wantMsg: `pool.yaml: document 1 (ModelPool "llm"): invalid: spec: clientTimeout must be at least 1s`,
		},
		"tenant share above one": {
			srcs:    []Source{src("tiers.yaml", strings.Replace(tierDoc, `"0.5"`, `"1.5"`, 1))},
			wantErr: ErrInvalid,
			wantMsg: `tiers.yaml: document 1 (ServiceTier "free"): invalid: spec.tenantShare: tenantShare must be greater than 0 and at most 1`,
		},
		"pool without tiers": {
			srcs:    []Source{src("x.yaml", poolDoc+"---\n"+strings.Replace(tierDoc, "name: llm}", "name: other}", 1)+"---\n"+loadDoc)},
			wantErr: ErrInvalid,
			wantMsg: `invalid: pool default/llm has no ServiceTier (pass them with -f, kind: ServiceTier, spec.poolRef.name: llm)`,
		},
		"object without a name": {
			srcs:    []Source{src("x.yaml", poolDoc+"---\n"+strings.Replace(tierDoc, "metadata: {name: free}", "metadata: {namespace: default}", 1))},
			wantErr: ErrInvalid,
			wantMsg: `x.yaml: document 2 (ServiceTier ""): invalid: metadata.name is required`,
		},
		"a tier given twice": {
			srcs:    []Source{src("x.yaml", poolDoc+"---\n"+tierDoc+"---\n"+tierDoc+"---\n"+loadDoc)},
			wantErr: ErrDuplicate,
			wantMsg: `duplicate document: ServiceTier default/free given twice`,
		},
		"a field of the wrong type": {
			srcs:    []Source{src("pool.yaml", strings.Replace(poolDoc, "concurrencyPerReplica: 4", "concurrencyPerReplica: four", 1))},
			wantErr: ErrSyntax,
			wantMsg: `pool.yaml: document 1 (ModelPool "llm"): malformed document: json: cannot unmarshal string into Go struct field ModelPoolSpec.spec.concurrencyPerReplica of type int32`,
		},
		"empty and comment-only documents are not counted": {
			srcs:    []Source{src("x.yaml", "---\n# only a comment\n---\n{}\n---\nkind: Gadget\n")},
			wantErr: ErrUnknownKind,
			wantMsg: `x.yaml: document 1: unknown kind "Gadget" (want ModelPool, ServiceTier, TenantQuota or Load)`,
		},
		"not YAML": {
			srcs:    []Source{src("x.yaml", "kind: [\n")},
			wantErr: ErrSyntax,
			wantMsg: `x.yaml: document 1: malformed document: yaml: line 1: did not find expected node content`,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := Read(tc.srcs...)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Read() error = %v, want errors.Is %v", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.wantMsg, err.Error()); diff != "" {
				t.Errorf("message (-want +got):\n%s", diff)
			}
		})
	}
}

func TestRunRefusesTenantWithoutTier(t *testing.T) {
	in, err := Read(src("x.yaml", strings.Replace(poolDoc, "  defaultTier: free\n", "", 1)+"---\n"+tierDoc+"---\n"+loadDoc))
	if err != nil {
		t.Fatal(err)
	}
	_, err = Run(in, Options{})
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("Run() error = %v, want ErrInvalid", err)
	}
	want := `invalid: Load spec.tenants[0]: tenant "a" has no TenantQuota in pool default/llm and the pool has no defaultTier, so every request would be refused`
	if diff := cmp.Diff(want, err.Error()); diff != "" {
		t.Errorf("message (-want +got):\n%s", diff)
	}
}

func TestReadKeepsThePoolsObjects(t *testing.T) {
	other := strings.Replace(tierDoc, "name: llm}", "name: other}", 1)
	other = strings.Replace(other, "metadata: {name: free}", "metadata: {name: elsewhere}", 1)
	quota := "apiVersion: tiergate.dev/v1alpha1\nkind: TenantQuota\nmetadata: {name: a, namespace: prod}\nspec: {tenant: a, tierRef: {name: free}}\n"
	in, err := Read(src("x.yaml", "# leading comment\n---\n"+poolDoc+"---\n---\n"+tierDoc+"---\n"+other+"---\n"+quota+"---\n"+loadDoc))
	if err != nil {
		t.Fatal(err)
	}
	if len(in.Tiers) != 1 || in.Tiers[0].Name != "free" {
		t.Errorf("tiers = %v, want only free", in.Tiers)
	}
	if len(in.Quotas) != 0 {
		t.Errorf("quotas = %v, want none", in.Quotas)
	}
	want := []string{
		"ServiceTier default/elsewhere belongs to pool default/other, not default/llm: ignored",
		"TenantQuota prod/a is not in namespace default: ignored",
	}
	if diff := cmp.Diff(want, in.Warnings); diff != "" {
		t.Errorf("warnings (-want +got):\n%s", diff)
	}
}

// TestDefaultsMatchTheCRD applies the API server's own structural
// defaulting, from the generated CRD, to a minimal ModelPool and compares
// it with what Read produces: the simulator must see the object the
// controller would see. Read's defaults are capacity.ApplyDefaults and
// capacity.DefaultAgeingRate, the ones ComputeBounds applies for the
// controller, so this pins that single source to the CRD.
func TestDefaultsMatchTheCRD(t *testing.T) {
	raw, err := os.ReadFile("../config/crd/bases/tiergate.dev_modelpools.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(raw, &crd); err != nil {
		t.Fatal(err)
	}
	var internal apiextensions.JSONSchemaProps
	if err := apiextensionsv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(crd.Spec.Versions[0].Schema.OpenAPIV3Schema, &internal, nil); err != nil {
		t.Fatal(err)
	}
	ss, err := structuralschema.NewStructural(&internal)
	if err != nil {
		t.Fatal(err)
	}
	for name, doc := range map[string]string{
		"minimal":              poolDoc,
		"empty authentication": poolDoc + "  authentication: {}\n",
		"apiKey mode":          poolDoc + "  authentication: {mode: APIKey}\n",
		"starvationBound":      poolDoc + "  ageing: {starvationBound: 2m}\n",
	} {
		t.Run(name, func(t *testing.T) {
			var obj map[string]any
			if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
				t.Fatal(err)
			}
			structuraldefaulting.Default(obj, ss)
			js, err := yaml.Marshal(obj)
			if err != nil {
				t.Fatal(err)
			}
			var want v1alpha1.ModelPool
			if err := yaml.UnmarshalStrict(js, &want); err != nil {
				t.Fatal(err)
			}
			want.Namespace = "default" // kubectl's namespace, not a schema default

			in, err := Read(src("pool.yaml", doc+"---\n"+tierDoc+"---\n"+loadDoc))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, *in.Pool); diff != "" {
				t.Errorf("pool (-API server defaulting +simulate):\n%s", diff)
			}
		})
	}
}

func TestLoadDefaults(t *testing.T) {
	in, err := Read(src("x.yaml", poolDoc+"---\n"+tierDoc+"---\n"+loadDoc))
	if err != nil {
		t.Fatal(err)
	}
	if got := in.Pool.Spec.Ageing.Rate; got == nil || got.Duration != 6*time.Second {
		t.Errorf("ageing rate = %v, want the CRD default 6s", got)
	}
	tl := in.Load.Spec.Tenants[0]
	if got := tl.maxRetries(); got != 0 {
		t.Errorf("maxRetries without retryOn429 = %d, want 0", got)
	}
	tl.RetryOn429 = true
	if got := tl.maxRetries(); got != defaultMaxRetries {
		t.Errorf("maxRetries with retryOn429 = %d, want %d", got, defaultMaxRetries)
	}
	n := int32(5)
	tl.MaxRetries = &n
	if got := tl.maxRetries(); got != 5 {
		t.Errorf("maxRetries = %d, want 5", got)
	}
}

func TestOptionsAndPlotErrors(t *testing.T) {
	in, err := Read(src("x.yaml", poolDoc+"---\n"+tierDoc+"---\n"+loadDoc))
	if err != nil {
		t.Fatal(err)
	}
	_, err = Run(in, Options{PlotBuckets: -1})
	if !errors.Is(err, ErrInvalid) || err.Error() != "invalid: PlotBuckets must be at least 1, got -1" {
		t.Errorf("Run(PlotBuckets -1) error = %v", err)
	}
	_, err = Run(&Input{}, Options{})
	if !errors.Is(err, ErrInvalid) || err.Error() != "invalid: input needs a ModelPool and a Load" {
		t.Errorf("Run(empty input) error = %v", err)
	}
	err = WritePlot(io.Discard, &Result{})
	if !errors.Is(err, ErrInvalid) || err.Error() != "invalid: the result has no time series (was it decoded from JSON?)" {
		t.Errorf("WritePlot(decoded result) error = %v", err)
	}
}
