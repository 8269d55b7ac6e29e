package cluster

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tiergate/tiergate/internal/testutil"
	"github.com/tiergate/tiergate/internal/testutil/cluster"
)

// chartValues point the image at a registry that does not exist (kwok
// pulls and runs nothing: the test runs the binary, see podProcess), give
// the containers ports free on every pod address (the processes share this
// machine's loopback) and give the pods kwok's delays: the dispatchers'
// cold start is long enough to evict one and see the PDB hold the other
// before the replacement is Ready.
func chartValues(p chartPorts) string {
	return fmt.Sprintf(`image:
  repository: registry.invalid/tiergate-kwok
  tag: never-pulled
controller:
  metricsPort: %d
  healthPort: %d
  podAnnotations:
    %s: 500ms
    %s: 500ms
dispatcher:
  dataPort: %d
  adminPort: %d
  podAnnotations:
    %s: 2s
    %s: 500ms
`, p.metrics, p.health, cluster.ColdStartAnnotation, cluster.TerminationDelayAnnotation,
		p.data, p.admin, cluster.ColdStartAnnotation, cluster.TerminationDelayAnnotation)
}

// TestHelmChartOnKwok installs charts/tiergate with bin/helm on this
// cluster and checks what its objects do there: the Deployments' pods are
// scheduled on kwok Nodes and Ready with the chart's ServiceAccounts,
// probes and resources; the disruption controller computes the PDB's
// status, which lets one dispatcher be evicted and refuses the second
// (429); the Service selects the dispatcher pods, and its EndpointSlice
// stays empty (loopback pod IPs, see checkEndpointSliceRefusesLoopback);
// then the chart's pods run as real tiergate processes (runChartSystem):
// the controller, as its ServiceAccount and leading through the chart's
// Lease, pushes config/samples' pool to the chart's dispatchers, which
// serve a completion, and the pool is Ready; the processes stop cleanly;
// `helm uninstall` leaves the namespace clean but for the push token
// Secret the controller created, which the chart's README says it leaves.
func TestHelmChartOnKwok(t *testing.T) {
	ns := newNamespace(t)
	release := fmt.Sprintf("tg%04x", rand.IntN(1<<16))
	full := release + "-tiergate"
	ports := newChartPorts(t)
	values := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(values, []byte(chartValues(ports)), 0o600); err != nil {
		t.Fatal(err)
	}
	helm := testutil.Helm(filepath.Join(repoRoot, "bin", "helm"), t.TempDir()).With("--kubeconfig", kc.Kubeconfig)
	helm.Dir, helm.Timeout = repoRoot, 2*time.Minute

	installed := startStep(t)
	// The suite's control plane has the CRDs already (config/crd/bases),
	// shared by every test: the release leaves them alone.
	helm.Must(t, "install", release, filepath.Join(repoRoot, "charts", "tiergate"), "--namespace", ns,
		"-f", values, "--skip-crds", "--wait", "--timeout", "60s")
	installed.done("helm install --wait returned (Deployments available)")

	sel := map[string]string{"app.kubernetes.io/instance": release}
	ctl := chartPods(t, ns, sel, "tiergate-controller")
	disp := chartPods(t, ns, sel, "tiergate-dispatcher")
	if len(ctl) != 1 || len(disp) != 2 {
		t.Fatalf("%d controller and %d dispatcher pods, want 1 and 2: %s %s", len(ctl), len(disp), describePods(ctl), describePods(disp))
	}
	checkChartPod(t, &ctl[0], full+"-controller", chartContainer{
		Name: "controller", Image: "registry.invalid/tiergate-kwok:never-pulled",
		Readiness: "GET /readyz health", Liveness: "GET /healthz health",
		Requests: "cpu=50m memory=64Mi", Limits: "memory=256Mi",
	})
	for i := range disp {
		checkChartPod(t, &disp[i], full+"-dispatcher", chartContainer{
			Name: "dispatcher", Image: "registry.invalid/tiergate-kwok:never-pulled",
			Readiness: "GET /readyz admin", Liveness: "GET /healthz admin",
			Requests: "cpu=250m memory=128Mi", Limits: "memory=512Mi", PreStopSleep: 5,
		})
		if a := disp[i].Spec.AutomountServiceAccountToken; a == nil || *a {
			t.Errorf("dispatcher pod %s mounts its ServiceAccount token (automount %v)", disp[i].Name, a)
		}
	}

	pdbName := full + "-dispatcher"
	awaitPDB(t, ns, pdbName, pdbCounts{Expected: 2, CurrentHealthy: 2, DesiredHealthy: 1, DisruptionsAllowed: 1})
	installed.done("PDB: 2 expected, 2 healthy, 1 disruption allowed")
	checkPDBEvictions(t, ns, pdbName, disp)
	installed.done("PDB let one eviction through, refused the next, recovered")

	checkChartService(t, ns, full+"-dispatcher", release)
	installed.done("Service selects the 2 dispatcher pods; EndpointSlice empty")

	sys := runChartSystem(t, ns, release, full, ports)
	stopped := startStep(t)
	sys.stop(t, ns)
	stopped.done("processes stopped (SIGTERM, exit 0); Lease released")
	kubectl.MustInput(t, samples(t, ports.admin), "delete", "-n", ns, "-f", "-")
	stopped.done("pool deleted")

	uninstalled := startStep(t)
	helm.Must(t, "uninstall", release, "--namespace", ns, "--wait", "--timeout", "60s")
	uninstalled.done("helm uninstall --wait returned")
	checkNamespaceClean(t, ns, release, "secret/"+full+"-push-token")
	uninstalled.done("namespace clean: no pod or object of the release left")
}

// chartPods are the pods of ns with the labels sel and the given
// app.kubernetes.io/name.
func chartPods(t *testing.T, ns string, sel map[string]string, name string) []corev1.Pod {
	t.Helper()
	labels := client.MatchingLabels{"app.kubernetes.io/name": name}
	for k, v := range sel {
		labels[k] = v
	}
	var pods corev1.PodList
	if err := k8s.List(context.Background(), &pods, client.InNamespace(ns), labels); err != nil {
		t.Fatal(err)
	}
	return pods.Items
}

// chartContainer is what the chart sets on a container, as the admitted
// pod holds it.
type chartContainer struct {
	Name, Image         string
	Readiness, Liveness string
	Requests, Limits    string
	PreStopSleep        int64
}

func summarize(c *corev1.Container) chartContainer {
	probe := func(p *corev1.Probe) string {
		if p == nil || p.HTTPGet == nil {
			return fmt.Sprintf("%+v", p)
		}
		return "GET " + p.HTTPGet.Path + " " + p.HTTPGet.Port.String()
	}
	list := func(l corev1.ResourceList) string {
		var parts []string
		for k, v := range l {
			parts = append(parts, string(k)+"="+v.String())
		}
		slices.Sort(parts)
		return strings.Join(parts, " ")
	}
	s := chartContainer{Name: c.Name, Image: c.Image, Readiness: probe(c.ReadinessProbe), Liveness: probe(c.LivenessProbe),
		Requests: list(c.Resources.Requests), Limits: list(c.Resources.Limits)}
	if c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Sleep != nil {
		s.PreStopSleep = c.Lifecycle.PreStop.Sleep.Seconds
	}
	return s
}

// checkChartPod: the pod is Ready, bound by the scheduler to a kwok Node,
// has an address of the pod CIDR, runs as sa, was written only by the
// controller manager and kwok, and its one container is want.
func checkChartPod(t *testing.T, p *corev1.Pod, sa string, want chartContainer) {
	t.Helper()
	if !isReady(p) || p.DeletionTimestamp != nil {
		t.Errorf("pod %s: ready %t, deleting %t after helm install --wait", p.Name, isReady(p), p.DeletionTimestamp != nil)
	}
	if !strings.HasPrefix(p.Spec.NodeName, "kwok-node-") || !hasCondition(p, corev1.PodScheduled) {
		t.Errorf("pod %s is on node %q: not bound to a kwok Node by the scheduler", p.Name, p.Spec.NodeName)
	}
	if !podNet.Contains(p.Status.PodIP) {
		t.Errorf("pod %s has address %q, outside %s", p.Name, p.Status.PodIP, kc.PodCIDR)
	}
	if p.Spec.ServiceAccountName != sa {
		t.Errorf("pod %s runs as ServiceAccount %q, want %q", p.Name, p.Spec.ServiceAccountName, sa)
	}
	var managers []string
	for _, mf := range p.ManagedFields {
		if !slices.Contains(managers, mf.Manager) {
			managers = append(managers, mf.Manager)
		}
	}
	slices.Sort(managers)
	if diff := cmp.Diff([]string{"kube-controller-manager", "kwok"}, managers); diff != "" {
		t.Errorf("pod %s was written by (-want +got):\n%s", p.Name, diff)
	}
	if len(p.Spec.Containers) != 1 {
		t.Fatalf("pod %s has %d containers, want 1", p.Name, len(p.Spec.Containers))
	}
	if diff := cmp.Diff(want, summarize(&p.Spec.Containers[0])); diff != "" {
		t.Errorf("pod %s's container (-want +got):\n%s", p.Name, diff)
	}
}

// pdbCounts is a PDB's status as the disruption controller computes it.
type pdbCounts struct {
	Expected, CurrentHealthy, DesiredHealthy, DisruptionsAllowed int32
}

// awaitPDB waits until the PDB's status (for its current generation) is want.
func awaitPDB(t *testing.T, ns, name string, want pdbCounts) *policyv1.PodDisruptionBudget {
	t.Helper()
	var pdb policyv1.PodDisruptionBudget
	await(t, 20*time.Second, "PDB status "+fmt.Sprintf("%+v", want), func() (bool, string) {
		if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &pdb); err != nil {
			return false, err.Error()
		}
		s := pdb.Status
		got := pdbCounts{s.ExpectedPods, s.CurrentHealthy, s.DesiredHealthy, s.DisruptionsAllowed}
		return got == want && s.ObservedGeneration == pdb.Generation, fmt.Sprintf("%+v (observed generation %d of %d)", got, s.ObservedGeneration, pdb.Generation)
	})
	return &pdb
}

// checkPDBEvictions evicts one dispatcher pod (allowed), waits for the
// PDB to count one healthy pod while the replacement cold-starts, and
// evicts the other: refused with 429 and the budget's reason. The
// replacement then makes the PDB whole again.
func checkPDBEvictions(t *testing.T, ns, pdbName string, disp []corev1.Pod) {
	t.Helper()
	cs, err := kc.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	evict := func(name string) error {
		return cs.PolicyV1().Evictions(ns).Evict(context.Background(), &policyv1.Eviction{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		})
	}
	if err := evict(disp[0].Name); err != nil {
		t.Fatalf("evicting %s with 1 disruption allowed: %v", disp[0].Name, err)
	}
	awaitPDB(t, ns, pdbName, pdbCounts{Expected: 2, CurrentHealthy: 1, DesiredHealthy: 1, DisruptionsAllowed: 0})
	err = evict(disp[1].Name)
	var status apierrors.APIStatus
	if !apierrors.IsTooManyRequests(err) || !errors.As(err, &status) {
		t.Fatalf("evicting %s with none allowed: %v, want 429 TooManyRequests", disp[1].Name, err)
	}
	st := status.Status()
	if got, want := st.Message, "Cannot evict pod as it would violate the pod's disruption budget."; got != want {
		t.Errorf("refusal message %q, want %q", got, want)
	}
	wantCause := []metav1.StatusCause{{Type: policyv1.DisruptionBudgetCause,
		Message: fmt.Sprintf("The disruption budget %s needs 1 healthy pods and has 1 currently", pdbName)}}
	var got []metav1.StatusCause
	if st.Details != nil {
		got = st.Details.Causes
	}
	if diff := cmp.Diff(wantCause, got); diff != "" {
		t.Errorf("refusal causes (-want +got):\n%s", diff)
	}
	awaitPDB(t, ns, pdbName, pdbCounts{Expected: 2, CurrentHealthy: 2, DesiredHealthy: 1, DisruptionsAllowed: 1})
	var names []string
	for _, p := range chartPods(t, ns, nil, "tiergate-dispatcher") {
		if p.DeletionTimestamp == nil {
			names = append(names, p.Name)
		}
	}
	if len(names) != 2 || slices.Contains(names, disp[0].Name) || !slices.Contains(names, disp[1].Name) {
		t.Errorf("dispatcher pods after the evictions %v: want %s and a replacement for %s", names, disp[1].Name, disp[0].Name)
	}
}

// checkChartService: the Service's selector is the dispatcher pods' (and
// selects exactly the live ones), its port targets the data port, and its
// EndpointSlice lists no endpoint: the API server refuses the loopback
// pod IPs, and the EndpointSlice controller says so in an Event.
func checkChartService(t *testing.T, ns, name, release string) {
	t.Helper()
	var svc corev1.Service
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &svc); err != nil {
		t.Fatal(err)
	}
	wantSel := map[string]string{"app.kubernetes.io/name": "tiergate-dispatcher", "app.kubernetes.io/instance": release}
	if diff := cmp.Diff(wantSel, svc.Spec.Selector); diff != "" {
		t.Errorf("Service %s selector (-want +got):\n%s", name, diff)
	}
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 80 || svc.Spec.Ports[0].TargetPort.String() != "data" {
		t.Errorf("Service %s ports %+v, want 80 -> data", name, svc.Spec.Ports)
	}
	var selected corev1.PodList
	if err := k8s.List(context.Background(), &selected, client.InNamespace(ns), client.MatchingLabels(svc.Spec.Selector)); err != nil {
		t.Fatal(err)
	}
	n := 0
	for i := range selected.Items {
		p := &selected.Items[i]
		if p.DeletionTimestamp != nil {
			continue
		}
		n++
		if p.Labels["app.kubernetes.io/component"] != "dispatcher" || !slices.ContainsFunc(p.Spec.Containers[0].Ports, func(cp corev1.ContainerPort) bool { return cp.Name == "data" }) {
			t.Errorf("Service %s selects pod %s (labels %v), not a dispatcher with a data port", name, p.Name, p.Labels)
		}
	}
	if n != 2 {
		t.Errorf("Service %s selects %d live pods, want the 2 dispatchers", name, n)
	}
	const refusal = "may not be in the loopback range (127.0.0.0/8, ::1/128)"
	await(t, 10*time.Second, "the EndpointSlice controller's refusal", func() (bool, string) {
		var events corev1.EventList
		if err := k8s.List(context.Background(), &events, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		var seen []string
		for _, e := range events.Items {
			if e.InvolvedObject.Kind == "Service" && e.InvolvedObject.Name == name {
				if e.Type == corev1.EventTypeWarning && e.Reason == "FailedToUpdateEndpointSlices" && strings.Contains(e.Message, refusal) {
					return true, ""
				}
				seen = append(seen, e.Reason+": "+e.Message)
			}
		}
		return false, fmt.Sprintf("events of Service %s: %q", name, seen)
	})
	var eps discoveryv1.EndpointSliceList
	if err := k8s.List(context.Background(), &eps, client.InNamespace(ns), client.MatchingLabels{discoveryv1.LabelServiceName: name}); err != nil {
		t.Fatal(err)
	}
	for _, s := range eps.Items {
		if len(s.Endpoints) != 0 {
			t.Errorf("EndpointSlice %s lists %+v: loopback addresses were accepted after all", s.Name, s.Endpoints)
		}
	}
}

// checkNamespaceClean: after the uninstall no pod is left in ns (the
// garbage collector deletes them, kwok ends them), and nothing of the
// release, in ns or cluster-wide, but kept (not the release's objects,
// such as the push token Secret the controller made).
func checkNamespaceClean(t *testing.T, ns, release string, kept ...string) {
	t.Helper()
	await(t, 20*time.Second, "no pod left", func() (bool, string) {
		var pods corev1.PodList
		if err := k8s.List(context.Background(), &pods, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		return len(pods.Items) == 0, describePods(pods.Items)
	})
	left := kubectl.Must(t, "get", "all,endpointslices,poddisruptionbudgets,networkpolicies,serviceaccounts,secrets,roles,rolebindings,configmaps",
		"--namespace", ns, "-o", "name")
	want := append([]string{"configmap/kube-root-ca.crt", "serviceaccount/default"}, kept...)
	slices.Sort(want)
	got := strings.Fields(left)
	slices.Sort(got)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("objects in %s after helm uninstall (-want +got):\n%s", ns, diff)
	}
	if out := kubectl.Must(t, "get", "clusterroles,clusterrolebindings", "-l", "app.kubernetes.io/instance="+release, "-o", "name"); strings.TrimSpace(out) != "" {
		t.Errorf("cluster-wide objects of the release left after helm uninstall:\n%s", out)
	}
}
