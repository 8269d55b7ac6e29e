package controller

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"net/http"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	sigsyaml "sigs.k8s.io/yaml"
)

// ProbeLabel on a dispatcher pod is its last readiness probe's result,
// probePass or probeFail; stages/ turn it into the Ready condition.
const (
	ProbeLabel = "probe.tiergate.test/readyz"
	probePass  = "pass"
	probeFail  = "fail"
)

//go:embed stages/*.yaml
var probeStages embed.FS

// applyProbeStages creates the Stages of stages/ (kwok's Stage CRD is
// installed by cluster.Start).
func applyProbeStages(ctx context.Context) error {
	names, err := fs.Glob(probeStages, "stages/*.yaml")
	if err != nil {
		return err
	}
	for _, name := range names {
		b, err := probeStages.ReadFile(name)
		if err != nil {
			return err
		}
		u := &unstructured.Unstructured{}
		if err := sigsyaml.Unmarshal(b, &u.Object); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if err := k8s.Create(ctx, u); err != nil {
			return fmt.Errorf("creating Stage %s: %w", u.GetName(), err)
		}
	}
	return nil
}

// newProbedEnv is newEnv whose dispatcher pods' readiness is the probe
// loop's (see kubelet): for tests about probe-driven readiness only.
func newProbedEnv(t *testing.T) *env {
	t.Helper()
	e := newEnv(t)
	e.kubelet = startKubelet(t)
	return e
}

// probe lets the probe loop play d's readiness probe.
func (e *env) probe(d *dispatcher) { e.kubelet.probe(e.ns, d.pod, d.AdminURL("/readyz")) }

// kubelet plays the readiness probe of dispatcher pods, which kwok does
// not play (its Stages make a pod Ready a cold start after it started,
// whatever its server answers): it polls their /readyz and labels each pod
// with the answer (ProbeLabel pass or fail), and kwok's probe Stages of
// stages/ turn the pod Ready or NotReady at once. Nothing here writes a
// pod's status. It serves the tests whose assertions are about what the
// dispatcher's readiness probe makes of /readyz (a pod Ready only once it
// holds a policy, NotReady while it holds no slot or its push token is
// refused, and the pool counting it so): newProbedEnv. Their dispatcher
// pods carry a cold start of an hour on their template, so kwok's own
// pod-ready Stage leaves a pod the loop has not labelled (or failed)
// unready.
type kubelet struct {
	mu     sync.Mutex
	pods   map[types.NamespacedName]string
	stop   chan struct{}
	done   chan struct{}
	errors []error
}

func startKubelet(t *testing.T) *kubelet {
	k := &kubelet{pods: map[types.NamespacedName]string{}, stop: make(chan struct{}), done: make(chan struct{})}
	go k.run()
	t.Cleanup(func() {
		close(k.stop)
		<-k.done
		k.mu.Lock()
		defer k.mu.Unlock()
		for _, err := range k.errors {
			t.Errorf("kubelet: %v", err)
		}
	})
	return k
}

func (k *kubelet) probe(ns, name, url string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.pods[types.NamespacedName{Namespace: ns, Name: name}] = url
}

func (k *kubelet) forget(ns, name string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.pods, types.NamespacedName{Namespace: ns, Name: name})
}

func (k *kubelet) run() {
	defer close(k.done)
	c := &http.Client{Timeout: 500 * time.Millisecond}
	for {
		select {
		case <-k.stop:
			return
		case <-time.After(25 * time.Millisecond):
		}
		k.mu.Lock()
		pods := make(map[types.NamespacedName]string, len(k.pods))
		for n, u := range k.pods {
			pods[n] = u
		}
		k.mu.Unlock()
		for name, url := range pods {
			ready := false
			if resp, err := c.Get(url); err == nil {
				ready = resp.StatusCode == http.StatusOK
				resp.Body.Close()
			}
			want := probeFail
			if ready {
				want = probePass
			}
			if err := k.label(name, want); err != nil {
				k.fail(err)
			}
		}
	}
}

// label sets the pod's ProbeLabel to v unless it has it already.
func (k *kubelet) label(name types.NamespacedName, v string) error {
	var pod corev1.Pod
	if err := k8s.Get(context.Background(), name, &pod); err != nil {
		return client.IgnoreNotFound(err)
	}
	if pod.Labels[ProbeLabel] == v {
		return nil
	}
	patch := client.MergeFrom(pod.DeepCopy())
	if pod.Labels == nil {
		pod.Labels = map[string]string{}
	}
	pod.Labels[ProbeLabel] = v
	return client.IgnoreNotFound(k8s.Patch(context.Background(), &pod, patch))
}

func (k *kubelet) fail(err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.errors = append(k.errors, err)
}
