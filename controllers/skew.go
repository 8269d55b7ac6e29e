package controllers

import (
	"fmt"
	"sort"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/api/v1alpha1"
)

// PodSchema is what the skew rule knows of one dispatcher pod: the policy
// schema revision it declared and what its policy lost to that revision.
type PodSchema struct {
	Name string
	// Known is false until the pod has answered a push: its revision is
	// then not known, and it is left out of the condition.
	Known bool
	// Revision is the revision of the pod's policy.SchemaHeader (0 when
	// the answer had none).
	Revision int
	// Dropped are the fields in use that policy.At(Revision) cleared: the
	// features the pod cannot enforce.
	Dropped []string
}

// maxSkewPods bounds the pods a DispatcherSkew message names.
const maxSkewPods = 10

// skewCondition is the pool's DispatcherSkew condition over its
// dispatcher pods: True while any known pod reads an older schema than
// this controller, with reason FeaturesNotEnforced when some of them
// lose a feature in use (warning then says so, for a Warning event) and
// OlderDispatchers when none does; False (DispatchersCurrent) otherwise.
func skewCondition(pods []PodSchema, gen int64, now metav1.Time) (cond metav1.Condition, warning string) {
	var olderPods, losing []string
	features := map[string]bool{}
	for _, p := range pods {
		if !p.Known || p.Revision >= policy.SchemaVersion {
			continue
		}
		olderPods = append(olderPods, fmt.Sprintf("%s (revision %d)", p.Name, p.Revision))
		if len(p.Dropped) > 0 {
			losing = append(losing, fmt.Sprintf("%s: %s", p.Name, strings.Join(p.Dropped, ", ")))
			for _, f := range p.Dropped {
				features[f] = true
			}
		}
	}
	cond = metav1.Condition{Type: v1alpha1.ModelPoolDispatcherSkew, ObservedGeneration: gen, LastTransitionTime: now}
	older := fmt.Sprintf("%d dispatcher pod(s) read an older policy schema than this controller's (revision %d): %s",
		len(olderPods), policy.SchemaVersion, skewNames(olderPods))
	switch {
	case len(olderPods) == 0:
		cond.Status, cond.Reason = metav1.ConditionFalse, string(v1alpha1.ReasonDispatchersCurrent)
		cond.Message = fmt.Sprintf("every dispatcher pod that has answered reads policy schema revision %d or newer", policy.SchemaVersion)
	case len(losing) == 0:
		cond.Status, cond.Reason = metav1.ConditionTrue, string(v1alpha1.ReasonOlderDispatchers)
		cond.Message = older + "; each is sent the policy at its revision, and no feature in use is left out"
	default:
		cond.Status, cond.Reason = metav1.ConditionTrue, string(v1alpha1.ReasonFeaturesNotEnforced)
		cond.Message = older + "; their policy leaves out features in use, which they cannot enforce: " + skewNames(losing)
		warning = fmt.Sprintf("%d dispatcher pod(s) cannot enforce %s (they read an older policy schema; upgrade them): %s",
			len(losing), strings.Join(skewFeatures(features), ", "), skewNames(losing))
	}
	return cond, warning
}

// skewNames joins sorted items, at most maxSkewPods of them.
func skewNames(items []string) string {
	sort.Strings(items)
	if len(items) > maxSkewPods {
		return strings.Join(items[:maxSkewPods], "; ") + fmt.Sprintf("; and %d more", len(items)-maxSkewPods)
	}
	return strings.Join(items, "; ")
}

func skewFeatures(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
