package main

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestReplicasOwnersAndWriters(t *testing.T) {
	entry := func(manager, subresource, fields string) metav1.ManagedFieldsEntry {
		return metav1.ManagedFieldsEntry{Manager: manager, Subresource: subresource, FieldsV1: metav1.NewFieldsV1(fields)}
	}
	mf := []metav1.ManagedFieldsEntry{
		entry("kubectl-client-side-apply", "", `{"f:metadata":{},"f:spec":{"f:selector":{},"f:template":{}}}`),
		entry("kubectl", "scale", `{"f:spec":{"f:replicas":{}}}`),
		entry("kube-controller-manager", "status", `{"f:status":{"f:readyReplicas":{}}}`),
		entry("kube-controller-manager", "status", `{"f:status":{"f:replicas":{}}}`),
		entry("broken", "", `not json`),
		{Manager: "no-fields"},
	}
	if diff := cmp.Diff([]string{"kubectl/scale"}, replicasOwners(mf)); diff != "" {
		t.Errorf("replicasOwners (-want +got):\n%s", diff)
	}
	tests := map[string]struct {
		subresource string
		want        []string
	}{
		"status":   {"status", []string{"kube-controller-manager"}},
		"scale":    {"scale", []string{"kubectl"}},
		"the rest": {"", []string{"broken", "kubectl-client-side-apply", "no-fields"}},
		"none":     {"binding", []string{}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := writers(mf, func(s string) bool { return s == tc.subresource })
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// A deleted pod stays listed for its preStop sleep and the longest
// generation, but never past its grace period.
func TestTerminationDelay(t *testing.T) {
	tests := map[string]struct {
		pool poolInfo
		want time.Duration
	}{
		"the sample":            {poolInfo{PreStop: 5 * time.Second, ClientTimeout: 30 * time.Second, GracePeriod: 45 * time.Second}, 35 * time.Second},
		"capped by the grace":   {poolInfo{PreStop: 5 * time.Second, ClientTimeout: 30 * time.Second, GracePeriod: 10 * time.Second}, 10 * time.Second},
		"no grace period given": {poolInfo{ClientTimeout: 30 * time.Second}, 30 * time.Second},
		"at least a second":     {poolInfo{}, time.Second},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := terminationDelay(&tc.pool); got != tc.want {
				t.Errorf("terminationDelay = %s, want %s", got, tc.want)
			}
		})
	}
}
