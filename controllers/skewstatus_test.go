package controllers

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/api/v1alpha1"
)

// The pool's DispatcherSkew comes from what the Pusher learned: a pod
// that answered without the header is older, one not yet answered is left
// out, and the condition keeps its transition time while it holds.
func TestSetSkewFromPodStates(t *testing.T) {
	t0 := metav1.NewTime(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	t1 := metav1.NewTime(t0.Add(time.Minute))
	states := []PodState{
		{Name: "d-0", SchemaKnown: true, SchemaVersion: policy.SchemaVersion},
		{Name: "d-1", SchemaKnown: true, SchemaVersion: 0},
		{Name: "d-2"},
	}
	if diff := cmp.Diff([]PodSchema{{Name: "d-0", Known: true, Revision: policy.SchemaVersion}, {Name: "d-1", Known: true}, {Name: "d-2"}},
		podSchemas(states)); diff != "" {
		t.Errorf("pod schemas (-want +got):\n%s", diff)
	}
	var st v1alpha1.ModelPoolStatus
	setSkew(&st, states, 3, t0)
	setSkew(&st, states, 3, t1)
	want, _ := skewCondition(podSchemas(states), 3, t0)
	got := meta.FindStatusCondition(st.Conditions, v1alpha1.ModelPoolDispatcherSkew)
	if got == nil || cmp.Diff(want, *got) != "" || got.Reason != string(v1alpha1.ReasonOlderDispatchers) {
		t.Fatalf("condition %+v, want %+v (reason OlderDispatchers)", got, want)
	}
	states[1].SchemaVersion = policy.SchemaVersion
	setSkew(&st, states, 3, t1)
	got = meta.FindStatusCondition(st.Conditions, v1alpha1.ModelPoolDispatcherSkew)
	if got.Status != metav1.ConditionFalse || got.Reason != string(v1alpha1.ReasonDispatchersCurrent) || !got.LastTransitionTime.Equal(&t1) {
		t.Errorf("after the upgrade: %+v, want False DispatchersCurrent since t1", got)
	}
}
