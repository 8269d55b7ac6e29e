package cluster

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func TestStages(t *testing.T) {
	stages, err := Stages(StageOptions{ColdStart: 10 * time.Second, TerminationDelay: 250 * time.Millisecond, CrashDetection: 400 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	type stage struct {
		Kind, Resource string
		DelayMillis    int64
		HasDelay       bool
	}
	got := map[string]stage{}
	for _, s := range stages {
		kind, _, _ := unstructured.NestedString(s.Object, "spec", "resourceRef", "kind")
		d, ok, _ := unstructured.NestedInt64(s.Object, "spec", "delay", "durationMilliseconds")
		if s.GetAPIVersion() != "kwok.x-k8s.io/v1alpha1" {
			t.Errorf("%s: apiVersion %s", s.GetName(), s.GetAPIVersion())
		}
		got[s.GetName()] = stage{Kind: s.GetKind(), Resource: kind, DelayMillis: d, HasDelay: ok}
	}
	want := map[string]stage{
		"tiergate-node-ready":  {Kind: "Stage", Resource: "Node"},
		"tiergate-pod-start":   {Kind: "Stage", Resource: "Pod"},
		"tiergate-pod-ready":   {Kind: "Stage", Resource: "Pod", DelayMillis: 10000, HasDelay: true},
		"tiergate-pod-fail":    {Kind: "Stage", Resource: "Pod", DelayMillis: 400, HasDelay: true},
		"tiergate-pod-restart": {Kind: "Stage", Resource: "Pod"},
		"tiergate-pod-delete":  {Kind: "Stage", Resource: "Pod", DelayMillis: 250, HasDelay: true},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("stages (-want +got):\n%s", diff)
	}
	// The annotations override the delays per pod.
	for name, ann := range map[string]string{PodReadyStage: ColdStartAnnotation, PodDeleteStage: TerminationDelayAnnotation} {
		for _, s := range stages {
			if s.GetName() != name {
				continue
			}
			expr, _, _ := unstructured.NestedString(s.Object, "spec", "delay", "durationFrom", "jq", "expression")
			if want := `.metadata.annotations["` + ann + `"]`; expr != want {
				t.Errorf("%s's delay comes from %q, want %q", name, expr, want)
			}
		}
	}
}

func TestStagesRefuseNegativeDelays(t *testing.T) {
	_, err := Stages(StageOptions{ColdStart: -time.Second})
	if want := "stage delays must not be negative (cold start -1s, termination delay 0s, crash detection 0s)"; err == nil || err.Error() != want {
		t.Errorf("error %v, want %q", err, want)
	}
	_, err = Stages(StageOptions{CrashDetection: -time.Millisecond})
	if want := "stage delays must not be negative (cold start 0s, termination delay 0s, crash detection -1ms)"; err == nil || err.Error() != want {
		t.Errorf("error %v, want %q", err, want)
	}
}
