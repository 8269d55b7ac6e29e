package cluster

import (
	"context"
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tiergate/tiergate/internal/testutil"
	"github.com/tiergate/tiergate/internal/testutil/cluster"
)

// newNamespace creates a namespace named after the test, with a random
// suffix (a run of -count=2 would otherwise meet the first run's
// namespace, still terminating), with kubectl and deletes it (the
// namespace controller runs) when the test ends.
func newNamespace(t *testing.T) string {
	t.Helper()
	ns := strings.Trim(regexp.MustCompile(`[^a-z0-9]+`).ReplaceAllString(strings.ToLower(t.Name()), "-"), "-")
	if len(ns) > 50 {
		ns = strings.TrimRight(ns[:50], "-")
	}
	ns = fmt.Sprintf("%s-%04x", ns, rand.IntN(1<<16))
	kubectl.Must(t, "create", "namespace", ns)
	t.Cleanup(func() {
		if r := kubectl.Run("delete", "namespace", ns, "--wait=false"); r.Err != nil {
			t.Errorf("%s", r)
		}
	})
	// The ServiceAccount admission plugin refuses pods until the
	// serviceaccount controller has made the namespace's default one.
	testutil.Eventually(t, 10*time.Second, "the default ServiceAccount", func() error {
		return k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "default"}, &corev1.ServiceAccount{})
	})
	return ns
}

// modelManifest is the model Deployment (after config/samples'
// apps_v1_deployment_llm.yaml) on the pod network's port, with the cold
// start of its pods in their template, and a Service in front of it.
func modelManifest(replicas int) string {
	return fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata:
  name: llm
  labels:
    app.kubernetes.io/name: llm
spec:
  replicas: %[1]d
  selector:
    matchLabels:
      app.kubernetes.io/name: llm
  template:
    metadata:
      labels:
        app.kubernetes.io/name: llm
      annotations:
        %[2]s: %[3]q
    spec:
      containers:
        - name: vllm
          image: vllm/vllm-openai:v0.10.1
          args: [--port=%[4]d, --max-num-seqs=4]
          ports:
            - name: http
              containerPort: %[4]d
          readinessProbe:
            httpGet:
              path: /health
              port: http
          resources:
            limits:
              nvidia.com/gpu: "1"
---
apiVersion: v1
kind: Service
metadata:
  name: llm
spec:
  selector:
    app.kubernetes.io/name: llm
  ports:
    - name: http
      port: 80
      targetPort: http
`, replicas, cluster.ColdStartAnnotation, coldStart.String(), podNet.Port())
}

// modelPods are the pods of the llm Deployment in ns.
func modelPods(t *testing.T, ns string) []corev1.Pod {
	t.Helper()
	var pods corev1.PodList
	if err := k8s.List(context.Background(), &pods, client.InNamespace(ns), client.MatchingLabels{"app.kubernetes.io/name": "llm"}); err != nil {
		t.Fatal(err)
	}
	return pods.Items
}

// readyServing are the names and IPs of the pods that are Ready and not
// terminating, sorted by IP.
func readyServing(pods []corev1.Pod) (ips []string) {
	for i := range pods {
		if pods[i].DeletionTimestamp == nil && isReady(&pods[i]) {
			ips = append(ips, pods[i].Status.PodIP)
		}
	}
	slices.Sort(ips)
	return ips
}

func isReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func deployment(t *testing.T, ns string) *appsv1.Deployment {
	t.Helper()
	var d appsv1.Deployment
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "llm"}, &d); err != nil {
		t.Fatal(err)
	}
	return &d
}

// sliceEndpoints are the llm Service's EndpointSlice endpoints: the
// addresses of those the slice marks ready, and of the terminating ones.
func sliceEndpoints(t *testing.T, ns string) (ready, terminating []string, port int32) {
	t.Helper()
	var slices discoveryv1.EndpointSliceList
	if err := k8s.List(context.Background(), &slices, client.InNamespace(ns), client.MatchingLabels{discoveryv1.LabelServiceName: "llm"}); err != nil {
		t.Fatal(err)
	}
	for _, s := range slices.Items {
		for _, p := range s.Ports {
			if p.Port != nil {
				port = *p.Port
			}
		}
		for _, e := range s.Endpoints {
			switch {
			case e.Conditions.Terminating != nil && *e.Conditions.Terminating:
				terminating = append(terminating, e.Addresses...)
			case e.Conditions.Ready != nil && *e.Conditions.Ready:
				ready = append(ready, e.Addresses...)
			}
		}
	}
	sortStrings(ready)
	sortStrings(terminating)
	return ready, terminating, port
}

func sortStrings(s []string) { slices.Sort(s) }

// step times one step of a test and logs it.
type step struct {
	t     *testing.T
	start time.Time
}

func startStep(t *testing.T) step { return step{t: t, start: time.Now()} }

// done logs how long the step has taken.
func (s step) done(what string) time.Duration {
	s.t.Helper()
	d := time.Since(s.start)
	s.t.Logf("%-62s %8s", what, d.Round(time.Millisecond))
	return d
}

// await polls cond every 10 ms until it holds, failing the test after
// timeout with cond's last explanation.
func await(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	var last string
	err := testutil.Poll(timeout, func() error {
		ok, why := cond()
		last = why
		if !ok {
			return fmt.Errorf("%s", why)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%s: %v (last: %s)", what, err, last)
	}
}
