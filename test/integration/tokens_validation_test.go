package integration

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	tiergatev1alpha1 "github.com/tiergate/tiergate/api/v1alpha1"
	"github.com/tiergate/tiergate/capacity"
)

// The budgets' schema on the real API server: TenantQuota spec.limits
// and ServiceTier spec.tenantLimits (one type, one CEL rule), and
// ModelPool spec.tokens.
func TestBadBudgetsAreRefused(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	const (
		oneOf    = "Invalid value: must set requestsPerMinute, tokensPerMinute or both (leave the field out for no budget)"
		maxLimit = "1000000000"
	)
	atLeast1 := func(field string, v string) cause {
		return invalid(field, "Invalid value: "+v+": "+field+" in body should be greater than or equal to 1")
	}
	atMost := func(field, v, limit string) cause {
		return invalid(field, "Invalid value: "+v+": "+field+" in body should be less than or equal to "+limit)
	}
	// A JSON number that is not an int64 fails the type and the format.
	notInt64 := func(field string, more ...cause) []cause {
		out := []cause{{causeTypeInvalid, field, `Invalid value: "float64": ` + field + ` in body must be of type int64: "float64"`},
			invalid("<nil>", `Invalid value: "": Checked value must be of type integer with format int64 in `+field)}
		return append(append(out, more...), notChecked)
	}
	limits := func(kv ...any) map[string]any {
		m := map[string]any{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
	tests := map[string]struct {
		kind, sample string
		mutate       mutation
		want         []cause
	}{
		// TenantQuota spec.limits
		"requestsPerMinute 0": {"TenantQuota", "acme", set("spec.limits", limits("requestsPerMinute", int64(0))),
			[]cause{atLeast1("spec.limits.requestsPerMinute", "0")}},
		"tokensPerMinute 0": {"TenantQuota", "acme", set("spec.limits", limits("tokensPerMinute", int64(0))),
			[]cause{atLeast1("spec.limits.tokensPerMinute", "0")}},
		"negative requestsPerMinute": {"TenantQuota", "acme", set("spec.limits", limits("requestsPerMinute", int64(-1), "tokensPerMinute", int64(5))),
			[]cause{atLeast1("spec.limits.requestsPerMinute", "-1")}},
		"both negative": {"TenantQuota", "acme", set("spec.limits", limits("requestsPerMinute", int64(-5), "tokensPerMinute", int64(-60000))),
			[]cause{atLeast1("spec.limits.requestsPerMinute", "-5"), atLeast1("spec.limits.tokensPerMinute", "-60000")}},
		"empty limits": {"TenantQuota", "acme", set("spec.limits", limits()),
			[]cause{invalid("spec.limits", oneOf)}},
		"tokensPerMinute one above the maximum": {"TenantQuota", "acme", set("spec.limits", limits("tokensPerMinute", int64(1000000001))),
			[]cause{atMost("spec.limits.tokensPerMinute", "1000000001", maxLimit)}},
		"requestsPerMinute the largest int64": {"TenantQuota", "acme", set("spec.limits", limits("requestsPerMinute", int64(1<<63-1))),
			[]cause{atMost("spec.limits.requestsPerMinute", "9223372036854775807", maxLimit)}},
		"tokensPerMinute beyond int64": {"TenantQuota", "acme", set("spec.limits", limits("tokensPerMinute", 1e19)),
			notInt64("spec.limits.tokensPerMinute",
				invalid("spec.limits.tokensPerMinute", "Invalid value: 1e+19: spec.limits.tokensPerMinute in body should be less than or equal to 1e+09"))},
		"fractional tokensPerMinute": {"TenantQuota", "acme", set("spec.limits", limits("tokensPerMinute", 1.5)),
			notInt64("spec.limits.tokensPerMinute")},
		"tokensPerMinute as a string": {"TenantQuota", "acme", set("spec.limits", limits("tokensPerMinute", "60000")),
			[]cause{{causeTypeInvalid, "spec.limits.tokensPerMinute", `Invalid value: "string": spec.limits.tokensPerMinute in body must be of type integer: "string"`}, notChecked}},
		"an unknown budget": {"TenantQuota", "acme", set("spec.limits", limits("tokensPerHour", int64(5))),
			[]cause{invalid("spec.limits", oneOf)}},

		// ServiceTier spec.tenantLimits
		"tier requestsPerMinute 0": {"ServiceTier", "premium", set("spec.tenantLimits", limits("requestsPerMinute", int64(0))),
			[]cause{atLeast1("spec.tenantLimits.requestsPerMinute", "0")}},
		"tier negative tokensPerMinute": {"ServiceTier", "premium", set("spec.tenantLimits", limits("tokensPerMinute", int64(-1))),
			[]cause{atLeast1("spec.tenantLimits.tokensPerMinute", "-1")}},
		"empty tenantLimits": {"ServiceTier", "premium", set("spec.tenantLimits", limits()),
			[]cause{invalid("spec.tenantLimits", oneOf)}},
		"tier budget above the maximum": {"ServiceTier", "premium", set("spec.tenantLimits", limits("requestsPerMinute", int64(2000000000000))),
			[]cause{atMost("spec.tenantLimits.requestsPerMinute", "2000000000000", maxLimit)}},

		// ModelPool spec.tokens
		"defaultMaxTokens 0": {"ModelPool", "llm", set("spec.tokens", limits("defaultMaxTokens", int64(0))),
			[]cause{atLeast1("spec.tokens.defaultMaxTokens", "0")}},
		"negative defaultMaxTokens": {"ModelPool", "llm", set("spec.tokens", limits("defaultMaxTokens", int64(-1024))),
			[]cause{atLeast1("spec.tokens.defaultMaxTokens", "-1024")}},
		// The format alone names no field; the maximum does.
		"defaultMaxTokens beyond int32": {"ModelPool", "llm", set("spec.tokens", limits("defaultMaxTokens", int64(1<<31))),
			[]cause{invalid("<nil>", `Invalid value: "": Checked value must be of type integer with format int32 in spec.tokens.defaultMaxTokens`),
				atMost("spec.tokens.defaultMaxTokens", "2147483648", "2147483647")}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			obj := fromSample(t, ns, tc.kind, tc.sample, tc.mutate)
			got := refusal(t, k8sClient.Create(context.Background(), obj))
			// The API server lists the causes of one object in no fixed
			// order (both of "both negative" came either way round).
			if diff := cmp.Diff(tc.want, got, sortCauses); diff != "" {
				t.Errorf("causes (-want +got):\n%s", diff)
			}
		})
	}
}

// The accepting side of the same rules, each read back.
func TestGoodBudgetsAreAccepted(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	tests := map[string]struct {
		kind, sample string
		mutate       mutation
		field        string
		want         any
	}{
		"requestsPerMinute 1 alone": {"TenantQuota", "acme", set("spec.limits", map[string]any{"requestsPerMinute": int64(1)}),
			"spec.limits", map[string]any{"requestsPerMinute": int64(1)}},
		"tokensPerMinute at the maximum alone": {"TenantQuota", "acme", set("spec.limits", map[string]any{"tokensPerMinute": int64(1000000000)}),
			"spec.limits", map[string]any{"tokensPerMinute": int64(1000000000)}},
		"both budgets": {"TenantQuota", "acme", set("spec.limits", map[string]any{"requestsPerMinute": int64(600), "tokensPerMinute": int64(60000)}),
			"spec.limits", map[string]any{"requestsPerMinute": int64(600), "tokensPerMinute": int64(60000)}},
		"no limits": {"TenantQuota", "acme", del("spec.limits"), "spec.limits", nil},
		"tier tokensPerMinute 1": {"ServiceTier", "premium", set("spec.tenantLimits", map[string]any{"tokensPerMinute": int64(1)}),
			"spec.tenantLimits", map[string]any{"tokensPerMinute": int64(1)}},
		"tier budgets at the maximum": {"ServiceTier", "premium", set("spec.tenantLimits", map[string]any{"requestsPerMinute": int64(1000000000), "tokensPerMinute": int64(1000000000)}),
			"spec.tenantLimits", map[string]any{"requestsPerMinute": int64(1000000000), "tokensPerMinute": int64(1000000000)}},
		"empty tokens defaults defaultMaxTokens to 1024 and boundBy to Requests": {"ModelPool", "llm", set("spec.tokens", map[string]any{}),
			"spec.tokens", map[string]any{"defaultMaxTokens": int64(1024), "boundBy": "Requests"}},
		"defaultMaxTokens 1": {"ModelPool", "llm", set("spec.tokens", map[string]any{"defaultMaxTokens": int64(1)}),
			"spec.tokens.defaultMaxTokens", int64(1)},
		"defaultMaxTokens at the int32 maximum": {"ModelPool", "llm", set("spec.tokens", map[string]any{"defaultMaxTokens": int64(1<<31 - 1)}),
			"spec.tokens.defaultMaxTokens", int64(1<<31 - 1)},
		"no tokens: none defaulted": {"ModelPool", "llm", del("spec.tokens"), "spec.tokens", nil},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			obj := fromSample(t, ns, tc.kind, tc.sample, tc.mutate)
			checkStored(t, obj, tc.field, tc.want)
		})
	}
}

// Budgets can be added, changed and removed on a live object; an update
// to an empty set is refused like a create.
func TestBudgetUpdates(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	tests := map[string]struct {
		kind, sample string
		mutate       mutation
		want         []cause // nil: accepted
	}{
		"limits added":        {"TenantQuota", "acme", set("spec.limits", map[string]any{"tokensPerMinute": int64(60000)}), nil},
		"tenantLimits added":  {"ServiceTier", "premium", set("spec.tenantLimits", map[string]any{"requestsPerMinute": int64(60)}), nil},
		"tokens added":        {"ModelPool", "llm", set("spec.tokens", map[string]any{"defaultMaxTokens": int64(256)}), nil},
		"limits emptied":      {"TenantQuota", "acme", set("spec.limits", map[string]any{}), []cause{invalid("spec.limits", "Invalid value: must set requestsPerMinute, tokensPerMinute or both (leave the field out for no budget)")}},
		"tenantLimits zeroed": {"ServiceTier", "premium", set("spec.tenantLimits", map[string]any{"tokensPerMinute": int64(0)}), []cause{invalid("spec.tenantLimits.tokensPerMinute", "Invalid value: 0: spec.tenantLimits.tokensPerMinute in body should be greater than or equal to 1")}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			obj := fromSample(t, ns, tc.kind, tc.sample)
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

// The API server's default for spec.tokens.defaultMaxTokens is the one
// capacity applies to objects no API server defaulted, and the
// dispatchers' own: the three agree.
func TestDefaultMaxTokensMatchesCapacityAndPolicy(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	ctx := context.Background()
	obj := fromSample(t, ns, "ModelPool", "llm", set("spec.tokens", map[string]any{}))
	if err := k8sClient.Create(ctx, obj); err != nil {
		t.Fatal(err)
	}
	var pool tiergatev1alpha1.ModelPool
	if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(obj), &pool); err != nil {
		t.Fatal(err)
	}
	spec := tiergatev1alpha1.ModelPoolSpec{Tokens: &tiergatev1alpha1.Tokens{}}
	capacity.ApplyDefaults(&spec)
	got := []int32{pool.Spec.Tokens.DefaultMaxTokens, spec.Tokens.DefaultMaxTokens}
	if diff := cmp.Diff([]int32{policy.DefaultMaxTokens, policy.DefaultMaxTokens}, got); diff != "" {
		t.Errorf("defaultMaxTokens from the API server and from capacity.ApplyDefaults (-want +got):\n%s", diff)
	}
}

// kubectl get tenantquotas shows the budgets in force (status.limits) and
// kubectl get servicetiers the tier's tenant tokens per minute.
func TestGetShowsTheBudgets(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	applySamples(t, ns)
	ctx := context.Background()

	// Play the controller for acme: 600 requests from its tier and 60000
	// tokens of its own, split over two dispatchers.
	var acme tiergatev1alpha1.TenantQuota
	if err := k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "acme"}, &acme); err != nil {
		t.Fatal(err)
	}
	acme.Status.EffectiveConcurrencyLimit = 6
	acme.Status.Limits = &tiergatev1alpha1.LimitsStatus{RequestsPerMinute: 600, TokensPerMinute: 60000, Source: tiergatev1alpha1.LimitsFromBoth,
		PerDispatcher: &tiergatev1alpha1.LimitsSplit{Dispatchers: 2,
			RequestsPerMinute: &tiergatev1alpha1.BudgetRange{Min: 300, Max: 300}, TokensPerMinute: &tiergatev1alpha1.BudgetRange{Min: 30000, Max: 30000}}}
	acme.Status.Conditions = []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Active", Message: "m", LastTransitionTime: metav1.Now()}}
	if err := k8sClient.Status().Update(ctx, &acme); err != nil {
		t.Fatalf("status update: %v", err)
	}
	var premium tiergatev1alpha1.ServiceTier
	if err := k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "premium"}, &premium); err != nil {
		t.Fatal(err)
	}
	premium.Spec.TenantLimits = &tiergatev1alpha1.Limits{RequestsPerMinute: 600, TokensPerMinute: 100000}
	if err := k8sClient.Update(ctx, &premium); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		resource string
		want     [][]string
	}{
		{"tenantquotas", [][]string{
			{"NAME", "TENANT", "TIER", "LIMIT", "RPM", "TPM", "READY"},
			{"acme", "acme", "premium", "6", "600", "60000", "True"},
			{"globex", "globex", "standard", "", "", "", ""},
			{"initech", "initech", "free", "", "", "", ""},
		}},
		{"servicetiers", [][]string{
			{"NAME", "POOL", "PRIORITY", "WAIT", "SHARE", "BOUND", "TENANT-LIMIT", "TENANT-TPM"},
			{"free", "llm", "20", "60s", "0.04", "", "", ""},
			{"premium", "llm", "0", "5s", "250m", "", "", "100000"}, // written back by the typed client
			{"standard", "llm", "10", "20s", "0.10", "", "", ""},
		}},
	} {
		stdout, stderr, err := kubectl(t, "get", tc.resource, "-n", ns)
		if err != nil {
			t.Fatalf("kubectl get %s: %v\n%s", tc.resource, err, stderr)
		}
		got := table(stdout)
		for i := range got {
			got[i] = got[i][:len(got[i])-1] // AGE varies
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("kubectl get %s (-want +got):\n%s\nstdout:\n%s", tc.resource, diff, stdout)
		}
	}

	// The status reads back as written, source enum and ranges included.
	var back tiergatev1alpha1.TenantQuota
	if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(&acme), &back); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(acme.Status.Limits, back.Status.Limits); diff != "" {
		t.Errorf("status.limits (-written +read):\n%s", diff)
	}
	// A source outside the enum is refused.
	back.Status.Limits.Source = "Guessed"
	err := k8sClient.Status().Update(ctx, &back)
	want := []cause{{metav1.CauseTypeFieldValueNotSupported, "status.limits.source",
		`Unsupported value: "Guessed": supported values: "TenantQuota", "ServiceTier", "TenantQuotaAndServiceTier"`}, notChecked}
	if diff := cmp.Diff(want, refusal(t, err)); diff != "" {
		t.Errorf("status with an unknown source (-want +got):\n%s", diff)
	}
}

// sortCauses compares lists of causes whatever their order.
var sortCauses = cmpopts.SortSlices(func(a, b cause) bool {
	if a.Field != b.Field {
		return a.Field < b.Field
	}
	if a.Type != b.Type {
		return a.Type < b.Type
	}
	return a.Message < b.Message
})
