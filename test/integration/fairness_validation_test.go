package integration

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	tiergatev1alpha1 "github.com/tiergate/tiergate/api/v1alpha1"
	"github.com/tiergate/tiergate/capacity"
)

// Messages of the fairness and token-bound rules.
const (
	together     = "Invalid value: tokens.prefillTokensPerSecond and tokens.decodeTokensPerSecond are set together or not at all"
	needsRates   = "Invalid value: tokens.boundBy Tokens needs tokens.prefillTokensPerSecond and tokens.decodeTokensPerSecond, unless serviceTime.source is Measured"
	modesOffered = `supported values: "Requests", "Tokens"`
)

// The schema of ModelPool spec.fairness, spec.tokens' token bounds and
// TenantQuota spec.weight on the real API server: each bad object is a
// sample with one mistake, refused with exactly these causes.
func TestBadFairnessAndTokenBoundsAreRefused(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	atLeast1 := func(field, v string) cause {
		return invalid(field, "Invalid value: "+v+": "+field+" in body should be greater than or equal to 1")
	}
	atMost := func(field, v, limit string) cause {
		return invalid(field, "Invalid value: "+v+": "+field+" in body should be less than or equal to "+limit)
	}
	notSupported := func(field, v string) cause {
		return cause{metav1.CauseTypeFieldValueNotSupported, field, `Unsupported value: "` + v + `": ` + modesOffered}
	}
	tokens := func(kv ...any) map[string]any {
		m := map[string]any{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
	tests := map[string]struct {
		kind, sample string
		mutate       []mutation
		want         []cause
	}{
		// spec.fairness
		"unknown fairness mode": {"ModelPool", "llm", []mutation{set("spec.fairness", tokens("mode", "Bytes"))},
			[]cause{notSupported("spec.fairness.mode", "Bytes"), notChecked}},
		"inputWeight 0": {"ModelPool", "llm", []mutation{set("spec.fairness", tokens("inputWeight", int64(0)))},
			[]cause{atLeast1("spec.fairness.inputWeight", "0")}},
		"negative outputWeight": {"ModelPool", "llm", []mutation{set("spec.fairness", tokens("outputWeight", int64(-2)))},
			[]cause{atLeast1("spec.fairness.outputWeight", "-2")}},
		"weights one above the maximum": {"ModelPool", "llm", []mutation{set("spec.fairness", tokens("inputWeight", int64(1001), "outputWeight", int64(1001)))},
			[]cause{atMost("spec.fairness.inputWeight", "1001", "1000"), atMost("spec.fairness.outputWeight", "1001", "1000")}},
		"fairness as a string": {"ModelPool", "llm", []mutation{set("spec.fairness", "Tokens")},
			[]cause{{causeTypeInvalid, "spec.fairness", `Invalid value: "string": spec.fairness in body must be of type object: "string"`}, notChecked}},

		// spec.tokens
		"unknown boundBy": {"ModelPool", "llm", []mutation{set("spec.tokens", tokens("boundBy", "Bytes"))},
			[]cause{notSupported("spec.tokens.boundBy", "Bytes"), notChecked}},
		"prefill 0": {"ModelPool", "llm", []mutation{set("spec.tokens", tokens("prefillTokensPerSecond", int64(0), "decodeTokensPerSecond", int64(50)))},
			[]cause{atLeast1("spec.tokens.prefillTokensPerSecond", "0")}},
		"decode one above the maximum": {"ModelPool", "llm", []mutation{set("spec.tokens", tokens("prefillTokensPerSecond", int64(2000), "decodeTokensPerSecond", int64(10000001)))},
			[]cause{atMost("spec.tokens.decodeTokensPerSecond", "10000001", "10000000")}},
		"prefill without decode": {"ModelPool", "llm", []mutation{set("spec.tokens", tokens("prefillTokensPerSecond", int64(2000)))},
			[]cause{invalid("spec.tokens", together)}},
		"boundBy Tokens without rates, Declared": {"ModelPool", "llm", []mutation{set("spec.tokens", tokens("boundBy", "Tokens"))},
			[]cause{invalid("spec.tokens", needsRates)}},
		"boundBy Tokens with decode alone": {"ModelPool", "llm", []mutation{set("spec.tokens", tokens("boundBy", "Tokens", "decodeTokensPerSecond", int64(50)))},
			[]cause{invalid("spec.tokens", together), invalid("spec.tokens", needsRates)}},
		"boundBy Tokens, Measured, one rate alone": {"ModelPool", "llm", []mutation{set("spec.serviceTime.source", "Measured"),
			set("spec.tokens", tokens("boundBy", "Tokens", "prefillTokensPerSecond", int64(2000)))},
			[]cause{invalid("spec.tokens", together)}},

		// TenantQuota spec.weight
		"weight 0": {"TenantQuota", "acme", []mutation{set("spec.weight", int64(0))},
			[]cause{atLeast1("spec.weight", "0")}},
		"weight one above the maximum": {"TenantQuota", "acme", []mutation{set("spec.weight", int64(1001))},
			[]cause{atMost("spec.weight", "1001", "1000")}},
		"fractional weight": {"TenantQuota", "acme", []mutation{set("spec.weight", 1.5)},
			[]cause{{causeTypeInvalid, "spec.weight", `Invalid value: "float64": spec.weight in body must be of type int32: "float64"`},
				invalid("<nil>", `Invalid value: "": Checked value must be of type integer with format int32 in spec.weight`), notChecked}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			obj := fromSample(t, ns, tc.kind, tc.sample, tc.mutate...)
			got := refusal(t, k8sClient.Create(context.Background(), obj))
			if diff := cmp.Diff(tc.want, got, sortCauses); diff != "" {
				t.Errorf("causes (-want +got):\n%s", diff)
			}
		})
	}
}

// The accepting side, each read back with the API server's defaults.
func TestGoodFairnessAndTokenBoundsAreAccepted(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	tests := map[string]struct {
		kind, sample string
		mutate       []mutation
		field        string
		want         any
	}{
		"empty fairness: mode Requests, weights 1 and 2": {"ModelPool", "llm", []mutation{set("spec.fairness", map[string]any{})},
			"spec.fairness", map[string]any{"mode": "Requests", "inputWeight": int64(1), "outputWeight": int64(2)}},
		"Tokens mode at the largest weights": {"ModelPool", "llm", []mutation{set("spec.fairness", map[string]any{"mode": "Tokens", "inputWeight": int64(1000), "outputWeight": int64(1000)})},
			"spec.fairness", map[string]any{"mode": "Tokens", "inputWeight": int64(1000), "outputWeight": int64(1000)}},
		"no fairness: none defaulted": {"ModelPool", "llm", []mutation{del("spec.fairness")}, "spec.fairness", nil},
		"empty tokens: boundBy Requests": {"ModelPool", "llm", []mutation{set("spec.tokens", map[string]any{})},
			"spec.tokens", map[string]any{"defaultMaxTokens": int64(1024), "boundBy": "Requests"}},
		"boundBy Tokens with both rates, Declared": {"ModelPool", "llm",
			[]mutation{set("spec.tokens", map[string]any{"boundBy": "Tokens", "prefillTokensPerSecond": int64(2000), "decodeTokensPerSecond": int64(50)})},
			"spec.tokens", map[string]any{"defaultMaxTokens": int64(1024), "boundBy": "Tokens", "prefillTokensPerSecond": int64(2000), "decodeTokensPerSecond": int64(50)}},
		"boundBy Tokens without rates, Measured": {"ModelPool", "llm",
			[]mutation{set("spec.serviceTime.source", "Measured"), set("spec.tokens", map[string]any{"boundBy": "Tokens"})},
			"spec.tokens", map[string]any{"defaultMaxTokens": int64(1024), "boundBy": "Tokens"}},
		"rates at the bounds, by requests": {"ModelPool", "llm",
			[]mutation{set("spec.tokens", map[string]any{"prefillTokensPerSecond": int64(1), "decodeTokensPerSecond": int64(10000000)})},
			"spec.tokens", map[string]any{"defaultMaxTokens": int64(1024), "boundBy": "Requests", "prefillTokensPerSecond": int64(1), "decodeTokensPerSecond": int64(10000000)}},
		"weight defaults to 1": {"TenantQuota", "acme", []mutation{del("spec.weight")}, "spec.weight", int64(1)},
		"weight 1000":          {"TenantQuota", "acme", []mutation{set("spec.weight", int64(1000))}, "spec.weight", int64(1000)},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			obj := fromSample(t, ns, tc.kind, tc.sample, tc.mutate...)
			checkStored(t, obj, tc.field, tc.want)
		})
	}
}

// The rule that boundBy Tokens needs declared rates holds on update too,
// and leaving Measured for Declared without rates is refused.
func TestTokenBoundUpdates(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	tests := map[string]struct {
		start, mutate []mutation
		want          []cause // nil: accepted
	}{
		"boundBy Tokens added with rates": {mutate: []mutation{set("spec.tokens", map[string]any{"boundBy": "Tokens", "prefillTokensPerSecond": int64(2000), "decodeTokensPerSecond": int64(50)})}},
		"boundBy Tokens added without rates": {mutate: []mutation{set("spec.tokens", map[string]any{"boundBy": "Tokens"})},
			want: []cause{invalid("spec.tokens", needsRates)}},
		"Measured to Declared without rates": {start: []mutation{set("spec.serviceTime.source", "Measured"), set("spec.tokens", map[string]any{"boundBy": "Tokens"})},
			mutate: []mutation{set("spec.serviceTime.source", "Declared")}, want: []cause{invalid("spec.tokens", needsRates)}},
		"fairness switched to Tokens": {mutate: []mutation{set("spec.fairness", map[string]any{"mode": "Tokens"})}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			obj := fromSample(t, ns, "ModelPool", "llm", tc.start...)
			if err := k8sClient.Create(ctx, obj); err != nil {
				t.Fatalf("create: %v", err)
			}
			for _, m := range tc.mutate {
				m(t, obj)
			}
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

// The API server's defaults for spec.fairness, spec.tokens.boundBy and
// spec.weight are capacity's for objects no API server defaulted, and the
// policy's own.
func TestFairnessDefaultsMatchCapacityAndPolicy(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	ctx := context.Background()
	obj := fromSample(t, ns, "ModelPool", "llm", set("spec.fairness", map[string]any{}), set("spec.tokens", map[string]any{}))
	if err := k8sClient.Create(ctx, obj); err != nil {
		t.Fatal(err)
	}
	var pool tiergatev1alpha1.ModelPool
	if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(obj), &pool); err != nil {
		t.Fatal(err)
	}
	spec := tiergatev1alpha1.ModelPoolSpec{Fairness: &tiergatev1alpha1.Fairness{}, Tokens: &tiergatev1alpha1.Tokens{}}
	capacity.ApplyDefaults(&spec)
	if diff := cmp.Diff(pool.Spec.Fairness, spec.Fairness); diff != "" {
		t.Errorf("fairness from the API server and from capacity.ApplyDefaults (-server +capacity):\n%s", diff)
	}
	if diff := cmp.Diff(pool.Spec.Tokens, spec.Tokens); diff != "" {
		t.Errorf("tokens from the API server and from capacity.ApplyDefaults (-server +capacity):\n%s", diff)
	}
	p := policy.Policy{}
	want := policy.Fairness{Mode: string(pool.Spec.Fairness.Mode), InputWeight: int(pool.Spec.Fairness.InputWeight), OutputWeight: int(pool.Spec.Fairness.OutputWeight)}
	if diff := cmp.Diff(want, p.FairnessOf()); diff != "" {
		t.Errorf("the API server's fairness against the policy's defaults (-server +policy):\n%s", diff)
	}
	q := fromSample(t, ns, "TenantQuota", "acme", del("spec.weight"))
	if err := k8sClient.Create(ctx, q); err != nil {
		t.Fatal(err)
	}
	var quota tiergatev1alpha1.TenantQuota
	if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(q), &quota); err != nil {
		t.Fatal(err)
	}
	if got, want := int(quota.Spec.Weight), (&policy.Tenant{}).WeightOf(); got != want {
		t.Errorf("weight from the API server %d, the policy's default %d", got, want)
	}
}

// The token bounds the controller writes to a ServiceTier's status read
// back as written, and kubectl get -o wide shows them, with the pool's
// fairness, boundBy and token rate and the quota's weight.
func TestGetWideShowsTokenBounds(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	applySamples(t, ns)
	ctx := context.Background()
	var premium tiergatev1alpha1.ServiceTier
	if err := k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "premium"}, &premium); err != nil {
		t.Fatal(err)
	}
	premium.Status.QueueBound, premium.Status.QueueTokenBound, premium.Status.TenantQueueTokenLimit = 20, 17560, 4390
	if err := k8sClient.Status().Update(ctx, &premium); err != nil {
		t.Fatalf("status update: %v", err)
	}
	var back tiergatev1alpha1.ServiceTier
	if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(&premium), &back); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([2]int64{17560, 4390}, [2]int64{back.Status.QueueTokenBound, back.Status.TenantQueueTokenLimit}); diff != "" {
		t.Errorf("status token bounds (-written +read):\n%s", diff)
	}
	var pool tiergatev1alpha1.ModelPool
	if err := k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "llm"}, &pool); err != nil {
		t.Fatal(err)
	}
	pool.Spec.Fairness = &tiergatev1alpha1.Fairness{Mode: tiergatev1alpha1.FairnessTokens}
	pool.Spec.Tokens = &tiergatev1alpha1.Tokens{BoundBy: tiergatev1alpha1.BoundByTokens, PrefillTokensPerSecond: 2000, DecodeTokensPerSecond: 50}
	if err := k8sClient.Update(ctx, &pool); err != nil {
		t.Fatal(err)
	}
	pool.Status.TokenRate = "146.341"
	if err := k8sClient.Status().Update(ctx, &pool); err != nil {
		t.Fatalf("pool status update: %v", err)
	}
	for _, tc := range []struct {
		resource, name string
		want           map[string]string
	}{
		{"servicetiers", "premium", map[string]string{"BOUND": "20", "TOKEN-BOUND": "17560"}},
		{"servicetiers", "free", map[string]string{"TOKEN-BOUND": ""}}, // unset: an empty cell
		{"modelpools", "llm", map[string]string{"FAIRNESS": "Tokens", "BOUND-BY": "Tokens", "TOKEN-RATE": "146.341"}},
		{"tenantquotas", "acme", map[string]string{"WEIGHT": "1"}},
	} {
		stdout, stderr, err := kubectl(t, "get", tc.resource, tc.name, "-n", ns, "-o", "wide")
		if err != nil {
			t.Fatalf("kubectl get %s: %v\n%s", tc.resource, err, stderr)
		}
		rows := table(stdout)
		got := map[string]string{}
		for i, col := range rows[0] {
			if _, ok := tc.want[col]; ok {
				got[col] = rows[1][i]
			}
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("kubectl get %s %s -o wide (-want +got):\n%s\nstdout:\n%s", tc.resource, tc.name, diff, stdout)
		}
	}
	// Without -o wide the columns are those of before.
	stdout, _, err := kubectl(t, "get", "servicetiers", "-n", ns)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(stdout, "TOKEN-BOUND") {
		t.Errorf("kubectl get servicetiers shows TOKEN-BOUND without -o wide:\n%s", stdout)
	}
}
