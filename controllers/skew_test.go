package controllers

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/api/v1alpha1"
)

func TestSkewCondition(t *testing.T) {
	now := metav1.NewTime(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	cur := policy.SchemaVersion
	older := fmt.Sprintf("dispatcher pod(s) read an older policy schema than this controller's (revision %d): ", cur)
	current := fmt.Sprintf("every dispatcher pod that has answered reads policy schema revision %d or newer", cur)
	many := make([]PodSchema, 12)
	for i := range many {
		many[i] = PodSchema{Name: fmt.Sprintf("d-%02d", i), Known: true}
	}
	tests := map[string]struct {
		pods        []PodSchema
		wantStatus  metav1.ConditionStatus
		wantReason  v1alpha1.ModelPoolReason
		wantMessage string
		wantWarning string
	}{
		"no pods": {wantStatus: metav1.ConditionFalse, wantReason: v1alpha1.ReasonDispatchersCurrent, wantMessage: current},
		"all current or newer": {
			pods:       []PodSchema{{Name: "a", Known: true, Revision: cur}, {Name: "b", Known: true, Revision: cur + 1}},
			wantStatus: metav1.ConditionFalse, wantReason: v1alpha1.ReasonDispatchersCurrent, wantMessage: current},
		"a pod not yet known is left out": {
			pods:       []PodSchema{{Name: "a", Known: true, Revision: cur}, {Name: "b"}},
			wantStatus: metav1.ConditionFalse, wantReason: v1alpha1.ReasonDispatchersCurrent, wantMessage: current},
		"older pods, nothing lost, named sorted": {
			pods:       []PodSchema{{Name: "c", Known: true}, {Name: "a", Known: true, Revision: cur}, {Name: "b", Known: true}},
			wantStatus: metav1.ConditionTrue, wantReason: v1alpha1.ReasonOlderDispatchers,
			wantMessage: "2 " + older + "b (revision 0); c (revision 0); each is sent the policy at its revision, and no feature in use is left out"},
		"older pods that lose features": {
			pods: []PodSchema{
				{Name: "new", Known: true, Revision: cur},
				{Name: "old-1", Known: true, Dropped: []string{"tokens", "fairness"}},
				{Name: "old-0", Known: true, Dropped: []string{"tokens"}},
				{Name: "old-2", Known: true},
			},
			wantStatus: metav1.ConditionTrue, wantReason: v1alpha1.ReasonFeaturesNotEnforced,
			wantMessage: "3 " + older + "old-0 (revision 0); old-1 (revision 0); old-2 (revision 0); " +
				"their policy leaves out features in use, which they cannot enforce: old-0: tokens; old-1: tokens, fairness",
			wantWarning: "2 dispatcher pod(s) cannot enforce fairness, tokens (they read an older policy schema; upgrade them): old-0: tokens; old-1: tokens, fairness"},
		"at most ten pods named": {
			pods:       many,
			wantStatus: metav1.ConditionTrue, wantReason: v1alpha1.ReasonOlderDispatchers,
			wantMessage: "12 " + older + "d-00 (revision 0); d-01 (revision 0); d-02 (revision 0); d-03 (revision 0); d-04 (revision 0); " +
				"d-05 (revision 0); d-06 (revision 0); d-07 (revision 0); d-08 (revision 0); d-09 (revision 0); and 2 more; " +
				"each is sent the policy at its revision, and no feature in use is left out"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, warning := skewCondition(tc.pods, 4, now)
			want := metav1.Condition{Type: v1alpha1.ModelPoolDispatcherSkew, Status: tc.wantStatus, Reason: string(tc.wantReason),
				Message: tc.wantMessage, ObservedGeneration: 4, LastTransitionTime: now}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("condition (-want +got):\n%s", diff)
			}
			if warning != tc.wantWarning {
				t.Errorf("warning %q, want %q", warning, tc.wantWarning)
			}
		})
	}
}
