package controllers

import (
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tiergate/tiergate/api/v1alpha1"
)

// podSchemas is what the Pusher learned of each pod's schema revision,
// for skewCondition.
func podSchemas(states []PodState) []PodSchema {
	out := make([]PodSchema, 0, len(states))
	for _, s := range states {
		out = append(out, PodSchema{Name: s.Name, Known: s.SchemaKnown, Revision: s.SchemaVersion, Dropped: s.Dropped})
	}
	return out
}

// setSkew sets the pool's DispatcherSkew condition from its pods' states;
// the condition keeps its transition time while its status stays. It
// returns the text of the Warning event due when features in use are not
// enforced ("" otherwise).
func setSkew(st *v1alpha1.ModelPoolStatus, states []PodState, gen int64, now metav1.Time) string {
	cond, warning := skewCondition(podSchemas(states), gen, now)
	meta.SetStatusCondition(&st.Conditions, cond)
	return warning
}
