package integration

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// cause is one entry of an Invalid status's details, as the API server
// reports it.
type cause struct {
	Type    metav1.CauseType
	Field   string
	Message string
}

func invalid(field, message string) cause {
	return cause{metav1.CauseTypeFieldValueInvalid, field, message}
}

// causeTypeInvalid is what the API server reports for a value of the wrong
// JSON type; apimachinery has no constant for it.
const causeTypeInvalid metav1.CauseType = "FieldValueTypeInvalid"

// Sent along with schema errors that stop the CEL rules from running.
var notChecked = invalid("<nil>", "Invalid value: null: some validation rules were not checked because the object was invalid; correct the existing errors to complete validation")

// quantityPattern is the OpenAPI pattern of a resource.Quantity.
const quantityPattern = `'^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$'`

// refusal returns the causes of an Invalid error, and fails the test for
// any other outcome.
func refusal(t *testing.T, err error) []cause {
	t.Helper()
	if err == nil {
		t.Fatal("the API server accepted the object")
	}
	if !apierrors.IsInvalid(err) {
		t.Fatalf("error is %v (reason %q), want reason Invalid", err, apierrors.ReasonForError(err))
	}
	var status apierrors.APIStatus
	if !errors.As(err, &status) || status.Status().Details == nil {
		t.Fatalf("error %v carries no details", err)
	}
	var got []cause
	for _, c := range status.Status().Details.Causes {
		got = append(got, cause{c.Type, c.Field, c.Message})
	}
	return got
}

var objectSeq atomic.Int64

// fromSample returns a sample object renamed into ns with muts applied.
func fromSample(t *testing.T, ns, kind, name string, muts ...mutation) *unstructured.Unstructured {
	t.Helper()
	u := sample(t, kind, name)
	u.SetNamespace(ns)
	u.SetName(fmt.Sprintf("%s-%d", strings.ToLower(kind), objectSeq.Add(1)))
	for _, m := range muts {
		m(t, u)
	}
	return u
}

// Each bad object is a sample with one mistake; the API server must refuse
// it with exactly these causes, each naming the field.
func TestBadObjectsAreRefused(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	const (
		share        = "tenantShare must be greater than 0 and at most 1"
		waitMsg      = "tolerableWait must be a duration greater than 0, such as 5s"
		timeoutMsg   = "clientTimeout must be a duration of at least 1s, such as 30s"
		exactlyOne   = "Invalid value: ageing must set exactly one of rate and starvationBound"
		headerNeeded = "Invalid value: authentication.headerName is required when authentication.mode is TrustedHeader"
	)
	tests := map[string]struct {
		kind, sample string
		mutate       mutation
		want         []cause
	}{
		// ServiceTier
		"negative share": {"ServiceTier", "premium", set("spec.tenantShare", "-0.5"),
			[]cause{invalid("spec.tenantShare", `Invalid value: "-0.5": `+share)}},
		"share above 1": {"ServiceTier", "premium", set("spec.tenantShare", "1.5"),
			[]cause{invalid("spec.tenantShare", `Invalid value: "1.5": `+share)}},
		"share above 1 in millis": {"ServiceTier", "premium", set("spec.tenantShare", "1001m"),
			[]cause{invalid("spec.tenantShare", `Invalid value: "1001m": `+share)}},
		"share integer 2": {"ServiceTier", "premium", set("spec.tenantShare", int64(2)),
			[]cause{invalid("spec.tenantShare", `Invalid value: 2: `+share)}},
		"zero share": {"ServiceTier", "premium", set("spec.tenantShare", "0"),
			[]cause{invalid("spec.tenantShare", `Invalid value: "0": `+share)}},
		"zero share as integer": {"ServiceTier", "premium", set("spec.tenantShare", int64(0)),
			[]cause{invalid("spec.tenantShare", `Invalid value: 0: `+share)}},
		"malformed share": {"ServiceTier", "premium", set("spec.tenantShare", "a quarter"),
			[]cause{invalid("spec.tenantShare", `Invalid value: "a quarter": spec.tenantShare in body should match `+quantityPattern)}},
		"unquoted decimal share": {"ServiceTier", "premium", set("spec.tenantShare", 0.25),
			[]cause{
				{causeTypeInvalid, "spec.tenantShare", `Invalid value: "number": spec.tenantShare in body must be of type integer,string: "number"`},
				invalid("<nil>", `Invalid value: "": "spec.tenantShare" must validate at least one schema (anyOf)`),
				{causeTypeInvalid, "spec.tenantShare", `Invalid value: "number": spec.tenantShare in body must be of type integer: "number"`},
				invalid("<nil>", `Invalid value: "": Checked value must be of type integer (default format) in spec.tenantShare`),
				notChecked,
			}},
		"missing share": {"ServiceTier", "premium", del("spec.tenantShare"),
			[]cause{{metav1.CauseTypeFieldValueRequired, "spec.tenantShare", "Required value"}, notChecked}},
		"tolerableWait 0s": {"ServiceTier", "premium", set("spec.tolerableWait", "0s"),
			[]cause{invalid("spec.tolerableWait", `Invalid value: "0s": `+waitMsg)}},
		"negative tolerableWait": {"ServiceTier", "premium", set("spec.tolerableWait", "-5s"),
			[]cause{invalid("spec.tolerableWait", `Invalid value: "-5s": `+waitMsg)}},
		"tolerableWait without unit": {"ServiceTier", "premium", set("spec.tolerableWait", "5"),
			[]cause{invalid("spec.tolerableWait", `Invalid value: "5": `+waitMsg)}},
		"tolerableWait in days": {"ServiceTier", "premium", set("spec.tolerableWait", "1d"),
			[]cause{invalid("spec.tolerableWait", `Invalid value: "1d": `+waitMsg)}},
		"negative basePriority": {"ServiceTier", "premium", set("spec.basePriority", int64(-1)),
			[]cause{invalid("spec.basePriority", "Invalid value: -1: spec.basePriority in body should be greater than or equal to 0")}},
		"basePriority above its maximum": {"ServiceTier", "premium", set("spec.basePriority", int64(1000001)),
			[]cause{invalid("spec.basePriority", "Invalid value: 1000001: spec.basePriority in body should be less than or equal to 1000000")}},
		"missing poolRef": {"ServiceTier", "premium", del("spec.poolRef"),
			[]cause{{metav1.CauseTypeFieldValueRequired, "spec.poolRef", "Required value"}, notChecked}},
		"empty poolRef name": {"ServiceTier", "premium", set("spec.poolRef.name", ""),
			[]cause{invalid("spec.poolRef.name", `Invalid value: "": spec.poolRef.name in body should be at least 1 chars long`)}},

		// ModelPool
		"zero concurrency": {"ModelPool", "llm", set("spec.concurrencyPerReplica", int64(0)),
			[]cause{invalid("spec.concurrencyPerReplica", "Invalid value: 0: spec.concurrencyPerReplica in body should be greater than or equal to 1")}},
		"both ageing fields": {"ModelPool", "llm", set("spec.ageing.rate", "6s"),
			[]cause{invalid("spec.ageing", exactlyOne)}},
		"neither ageing field": {"ModelPool", "llm", set("spec.ageing", map[string]any{}),
			[]cause{invalid("spec.ageing", exactlyOne)}},
		"zero ageing rate": {"ModelPool", "llm", set("spec.ageing", map[string]any{"rate": "0s"}),
			[]cause{invalid("spec.ageing.rate", `Invalid value: "0s": ageing.rate must be a duration greater than 0, such as 6s`)}},
		"zero starvationBound": {"ModelPool", "llm", set("spec.ageing.starvationBound", "0"),
			[]cause{invalid("spec.ageing.starvationBound", `Invalid value: "0": ageing.starvationBound must be a duration greater than 0, such as 120s`)}},
		"zero serviceTime": {"ModelPool", "llm", set("spec.serviceTime.mean", "0s"),
			[]cause{invalid("spec.serviceTime.mean", `Invalid value: "0s": serviceTime.mean must be a duration greater than 0, such as 6s`)}},
		"unknown serviceTime source": {"ModelPool", "llm", set("spec.serviceTime.source", "Guessed"),
			[]cause{{metav1.CauseTypeFieldValueNotSupported, "spec.serviceTime.source", `Unsupported value: "Guessed": supported values: "Declared", "Measured"`}, notChecked}},
		"clientTimeout 500ms": {"ModelPool", "llm", set("spec.clientTimeout", "500ms"),
			[]cause{invalid("spec.clientTimeout", `Invalid value: "500ms": `+timeoutMsg)}},
		"clientTimeout not a duration": {"ModelPool", "llm", set("spec.clientTimeout", "half a minute"),
			[]cause{invalid("spec.clientTimeout", `Invalid value: "half a minute": `+timeoutMsg)}},
		"unknown auth mode": {"ModelPool", "llm", set("spec.authentication.mode", "Basic"),
			[]cause{{metav1.CauseTypeFieldValueNotSupported, "spec.authentication.mode", `Unsupported value: "Basic": supported values: "TrustedHeader", "APIKey", "JWT"`}, notChecked}},
		"TrustedHeader with empty header": {"ModelPool", "llm", set("spec.authentication.headerName", ""),
			[]cause{invalid("spec.authentication.headerName", headerNeeded)}},
		"header name with a space": {"ModelPool", "llm", set("spec.authentication.headerName", "X Tenant"),
			[]cause{invalid("spec.authentication.headerName", `Invalid value: "X Tenant": spec.authentication.headerName in body should match '^[A-Za-z0-9-]*$'`)}},
		"port 0": {"ModelPool", "llm", set("spec.backend.port", int64(0)),
			[]cause{invalid("spec.backend.port", "Invalid value: 0: spec.backend.port in body should be greater than or equal to 1")}},
		"port 65536": {"ModelPool", "llm", set("spec.backend.port", int64(65536)),
			[]cause{invalid("spec.backend.port", "Invalid value: 65536: spec.backend.port in body should be less than or equal to 65535")}},
		"bad scheme": {"ModelPool", "llm", set("spec.backend.scheme", "ftp"),
			[]cause{{metav1.CauseTypeFieldValueNotSupported, "spec.backend.scheme", `Unsupported value: "ftp": supported values: "http", "https"`}, notChecked}},
		"adminPort 0": {"ModelPool", "llm", set("spec.dispatchers.adminPort", int64(0)),
			[]cause{invalid("spec.dispatchers.adminPort", "Invalid value: 0: spec.dispatchers.adminPort in body should be greater than or equal to 1")}},
		"unknown sharedState": {"ModelPool", "llm", set("spec.sharedState", "Etcd"),
			[]cause{{metav1.CauseTypeFieldValueNotSupported, "spec.sharedState", `Unsupported value: "Etcd": supported values: "Local", "Redis"`}, notChecked}},
		"exempt path without a slash": {"ModelPool", "llm", set("spec.exemptPaths", []any{"/health", "metrics"}),
			[]cause{invalid("spec.exemptPaths[1]", `Invalid value: "metrics": spec.exemptPaths[1] in body should match '^/'`)}},
		"missing deploymentRef": {"ModelPool", "llm", del("spec.deploymentRef"),
			[]cause{{metav1.CauseTypeFieldValueRequired, "spec.deploymentRef", "Required value"}, notChecked}},

		// TenantQuota
		"maxConcurrency 0": {"TenantQuota", "acme", set("spec.maxConcurrency", int64(0)),
			[]cause{invalid("spec.maxConcurrency", "Invalid value: 0: spec.maxConcurrency in body should be greater than or equal to 1")}},
		"empty tenant": {"TenantQuota", "acme", set("spec.tenant", ""),
			[]cause{invalid("spec.tenant", `Invalid value: "": spec.tenant in body should be at least 1 chars long`)}},
		"tenant with a space": {"TenantQuota", "acme", set("spec.tenant", "acme corp"),
			[]cause{invalid("spec.tenant", `Invalid value: "acme corp": spec.tenant in body should match '^[A-Za-z0-9][A-Za-z0-9._:@-]*$'`)}},
		"missing tierRef": {"TenantQuota", "acme", del("spec.tierRef"),
			[]cause{{metav1.CauseTypeFieldValueRequired, "spec.tierRef", "Required value"}, notChecked}},
		"apiKeySecretRef without a name": {"TenantQuota", "acme", set("spec.apiKeySecretRef", map[string]any{"keys": []any{"key1"}}),
			[]cause{{metav1.CauseTypeFieldValueRequired, "spec.apiKeySecretRef.name", "Required value"}, notChecked}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			obj := fromSample(t, ns, tc.kind, tc.sample, tc.mutate)
			got := refusal(t, k8sClient.Create(context.Background(), obj))
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("causes (-want +got):\n%s", diff)
			}
		})
	}
}

// The boundaries of the same rules, from the accepting side: without these
// a rule that refuses everything would pass the table above.
func TestEdgeObjectsAreAccepted(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	tests := map[string]struct {
		kind, sample string
		mutate       mutation
		field        string // a dotted path read back after the create
		want         any
	}{
		"share exactly 1":           {"ServiceTier", "premium", set("spec.tenantShare", "1"), "spec.tenantShare", "1"},
		"share as integer 1":        {"ServiceTier", "premium", set("spec.tenantShare", int64(1)), "spec.tenantShare", int64(1)},
		"share with a milli suffix": {"ServiceTier", "premium", set("spec.tenantShare", "250m"), "spec.tenantShare", "250m"},
		"tiny share":                {"ServiceTier", "premium", set("spec.tenantShare", "1e-3"), "spec.tenantShare", "1e-3"},
		"tolerableWait 1ms":         {"ServiceTier", "premium", set("spec.tolerableWait", "1ms"), "spec.tolerableWait", "1ms"},
		"tolerableWait 1m30s":       {"ServiceTier", "premium", set("spec.tolerableWait", "1m30s"), "spec.tolerableWait", "1m30s"},
		"fractional tolerableWait":  {"ServiceTier", "premium", set("spec.tolerableWait", "1.5s"), "spec.tolerableWait", "1.5s"},
		"basePriority at maximum":   {"ServiceTier", "premium", set("spec.basePriority", int64(1000000)), "spec.basePriority", int64(1000000)},
		"clientTimeout exactly 1s":  {"ModelPool", "llm", set("spec.clientTimeout", "1s"), "spec.clientTimeout", "1s"},
		"clientTimeout as 1000ms":   {"ModelPool", "llm", set("spec.clientTimeout", "1000ms"), "spec.clientTimeout", "1000ms"},
		"no clientTimeout":          {"ModelPool", "llm", del("spec.clientTimeout"), "spec.clientTimeout", nil},
		"rate instead of bound":     {"ModelPool", "llm", set("spec.ageing", map[string]any{"rate": "2s"}), "spec.ageing.rate", "2s"},
		"ageing defaults to 6s":     {"ModelPool", "llm", del("spec.ageing"), "spec.ageing.rate", "6s"},
		"APIKey without a header":   {"ModelPool", "llm", set("spec.authentication", map[string]any{"mode": "APIKey", "headerName": ""}), "spec.authentication.mode", "APIKey"},
		"authentication defaults":   {"ModelPool", "llm", del("spec.authentication"), "spec.authentication.headerName", "X-Tenant-ID"},
		"header default in a mode":  {"ModelPool", "llm", del("spec.authentication.headerName"), "spec.authentication.headerName", "X-Tenant-ID"},
		"sharedState defaults":      {"ModelPool", "llm", del("spec.sharedState"), "spec.sharedState", "Local"},
		"scheme defaults":           {"ModelPool", "llm", del("spec.backend.scheme"), "spec.backend.scheme", "http"},
		"adminPort defaults":        {"ModelPool", "llm", del("spec.dispatchers.adminPort"), "spec.dispatchers.adminPort", int64(9090)},
		"source defaults":           {"ModelPool", "llm", del("spec.serviceTime.source"), "spec.serviceTime.source", "Declared"},
		"maxConcurrency 1":          {"TenantQuota", "acme", set("spec.maxConcurrency", int64(1)), "spec.maxConcurrency", int64(1)},
		"tenant with punctuation":   {"TenantQuota", "acme", set("spec.tenant", "team-a.eu:prod@acme"), "spec.tenant", "team-a.eu:prod@acme"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			obj := fromSample(t, ns, tc.kind, tc.sample, tc.mutate)
			checkStored(t, obj, tc.field, tc.want)
		})
	}
}

// Updates run the same rules, plus the transition rules that keep the
// references fixed.
func TestBadUpdatesAreRefused(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	tests := map[string]struct {
		kind, sample string
		mutate       mutation
		want         []cause // nil: the update is accepted
	}{
		"changed poolRef": {"ServiceTier", "premium", set("spec.poolRef.name", "other-pool"),
			[]cause{invalid("spec.poolRef", "Invalid value: poolRef is immutable")}},
		"changed tierRef": {"TenantQuota", "acme", set("spec.tierRef.name", "standard"),
			[]cause{invalid("spec.tierRef", "Invalid value: tierRef is immutable")}},
		"share raised above 1": {"ServiceTier", "premium", set("spec.tenantShare", "2"),
			[]cause{invalid("spec.tenantShare", `Invalid value: "2": tenantShare must be greater than 0 and at most 1`)}},
		"second ageing field added": {"ModelPool", "llm", set("spec.ageing.rate", "3s"),
			[]cause{invalid("spec.ageing", "Invalid value: ageing must set exactly one of rate and starvationBound")}},
		"clientTimeout lowered below 1s": {"ModelPool", "llm", set("spec.clientTimeout", "999ms"),
			[]cause{invalid("spec.clientTimeout", `Invalid value: "999ms": clientTimeout must be a duration of at least 1s, such as 30s`)}},
		"header emptied": {"ModelPool", "llm", set("spec.authentication.headerName", ""),
			[]cause{invalid("spec.authentication.headerName", "Invalid value: authentication.headerName is required when authentication.mode is TrustedHeader")}},
		"poolRef set to the same name": {"ServiceTier", "premium", set("spec.poolRef.name", "llm"), nil},
		"tierRef set to the same name": {"TenantQuota", "acme", set("spec.tierRef.name", "premium"), nil},
		"share and wait changed": {"ServiceTier", "premium", func(t *testing.T, u *unstructured.Unstructured) {
			set("spec.tenantShare", "0.5")(t, u)
			set("spec.tolerableWait", "10s")(t, u)
		}, nil},
		"ageing switched to a rate": {"ModelPool", "llm", set("spec.ageing", map[string]any{"rate": "3s"}), nil},
		"maxConcurrency added":      {"TenantQuota", "acme", set("spec.maxConcurrency", int64(3)), nil},
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

// checkStored creates obj, which the API server must accept, reads it
// back and compares field (a dotted path) with want: what defaulting and
// pruning left of it.
func checkStored(t *testing.T, obj *unstructured.Unstructured, field string, want any) {
	t.Helper()
	if err := k8sClient.Create(context.Background(), obj); err != nil {
		t.Fatalf("create refused: %v", err)
	}
	back := &unstructured.Unstructured{}
	back.SetGroupVersionKind(obj.GroupVersionKind())
	if err := k8sClient.Get(context.Background(), client.ObjectKeyFromObject(obj), back); err != nil {
		t.Fatal(err)
	}
	got, _, err := unstructured.NestedFieldNoCopy(back.Object, strings.Split(field, ".")...)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("%s after create (-want +got):\n%s", field, diff)
	}
}
