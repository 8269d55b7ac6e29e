package cluster

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

//go:embed stages/*.yaml
var stageFiles embed.FS

// The Stage objects whose delays StageOptions set, and the labels and
// annotations they read.
const (
	PodReadyStage   = "tiergate-pod-ready"
	PodDeleteStage  = "tiergate-pod-delete"
	PodFailStage    = "tiergate-pod-fail"
	PodRestartStage = "tiergate-pod-restart"

	// ColdStartAnnotation on a pod (template) overrides ColdStart for it:
	// a Go duration such as "10s".
	ColdStartAnnotation = "kwok.tiergate.dev/cold-start"
	// TerminationDelayAnnotation on a pod overrides TerminationDelay.
	TerminationDelayAnnotation = "kwok.tiergate.dev/termination-delay"
	// ChaosLabel on a Ready pod (any value) makes it fail: its server is
	// gone at once (a Network refuses its address), its containers crash
	// and it turns NotReady CrashDetection later, until the label is
	// removed, when it is Ready again a cold start later.
	ChaosLabel = "chaos.tiergate.dev/fail"
	// RestartLabel on a Ready pod restarts its containers once, quickly
	// enough that it stays Ready; the Stage then removes the label. Its
	// value must be new to the pod (the last termination's message names
	// it, so that kwok restarts the pod once per labelling).
	RestartLabel = "chaos.tiergate.dev/restart"
	// StageFieldManager is the field manager the Stages are applied with.
	StageFieldManager = "tiergate-test-cluster"
)

// StageOptions are the delays of the pod lifecycle.
type StageOptions struct {
	// ColdStart is how long a started pod takes to become Ready (a model
	// server loading its weights).
	ColdStart time.Duration
	// TerminationDelay is how long a pod stays listed, terminating, after
	// its deletion began.
	TerminationDelay time.Duration
	// CrashDetection is how long a pod failed by ChaosLabel stays Ready:
	// the kubelet notices a crashed container a moment after it died.
	CrashDetection time.Duration
}

// Stages are the Stage objects of stages/, by name, with o's delays.
func Stages(o StageOptions) ([]*unstructured.Unstructured, error) {
	if o.ColdStart < 0 || o.TerminationDelay < 0 || o.CrashDetection < 0 {
		return nil, fmt.Errorf("stage delays must not be negative (cold start %s, termination delay %s, crash detection %s)", o.ColdStart, o.TerminationDelay, o.CrashDetection)
	}
	names, err := fs.Glob(stageFiles, "stages/*.yaml")
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	var out []*unstructured.Unstructured
	for _, name := range names {
		b, err := stageFiles.ReadFile(name)
		if err != nil {
			return nil, err
		}
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(b, &u.Object); err != nil {
			return nil, fmt.Errorf("%s: %w", path.Base(name), err)
		}
		switch u.GetName() {
		case PodReadyStage:
			err = setDelay(u, o.ColdStart)
		case PodDeleteStage:
			err = setDelay(u, o.TerminationDelay)
		case PodFailStage:
			err = setDelay(u, o.CrashDetection)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path.Base(name), err)
		}
		out = append(out, u)
	}
	return out, nil
}

// setDelay sets a Stage's default delay (its annotation's, if any, wins).
func setDelay(u *unstructured.Unstructured, d time.Duration) error {
	return unstructured.SetNestedField(u.Object, d.Milliseconds(), "spec", "delay", "durationMilliseconds")
}

// ApplyStages applies the Stages with o's delays (server-side apply, so
// applying again with other delays changes them in place).
func ApplyStages(ctx context.Context, c client.Client, o StageOptions) error {
	stages, err := Stages(o)
	if err != nil {
		return err
	}
	for _, s := range stages {
		if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(s), client.ForceOwnership, client.FieldOwner(StageFieldManager)); err != nil {
			return fmt.Errorf("applying Stage %s: %w", s.GetName(), err)
		}
	}
	return nil
}
