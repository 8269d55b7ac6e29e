package controller

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

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

// kubelet plays the readiness probe of dispatcher pods: it polls their
// /readyz and copies the answer into the Pod's Ready condition. kwok plays
// no probes: its Stages make a pod Ready a cold start after it started,
// whatever its server answers. So this loop is kept, as the one place the
// suite writes a Ready condition, for the tests whose assertions are about
// what the dispatcher's readiness probe makes of /readyz (a pod Ready only
// once it holds a policy, NotReady while it holds no slot or its push token
// is refused, and the pool counting it so): newProbedEnv. Their dispatcher
// pods carry a cold start of an hour on their template, so kwok leaves their
// Ready condition to this loop (its pod-ready Stage matches them but waits;
// it never turns a pod NotReady).
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
			var pod corev1.Pod
			if err := k8s.Get(context.Background(), name, &pod); err != nil {
				if !apierrors.IsNotFound(err) {
					k.fail(err)
				}
				continue
			}
			cur := false
			for _, c := range pod.Status.Conditions {
				if c.Type == corev1.PodReady {
					cur = c.Status == corev1.ConditionTrue
				}
			}
			if cur == ready {
				continue
			}
			setReadyCondition(&pod, ready)
			if err := k8s.Status().Update(context.Background(), &pod); err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
				k.fail(err)
			}
		}
	}
}

func (k *kubelet) fail(err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.errors = append(k.errors, err)
}

func setReadyCondition(pod *corev1.Pod, ready bool) {
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == corev1.PodReady {
			pod.Status.Conditions[i].Status = st
			pod.Status.Conditions[i].LastTransitionTime = metav1.Now()
			return
		}
	}
	pod.Status.Conditions = append(pod.Status.Conditions, corev1.PodCondition{Type: corev1.PodReady, Status: st, LastTransitionTime: metav1.Now()})
}
