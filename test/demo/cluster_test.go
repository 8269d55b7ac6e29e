package demo

import (
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// checkCluster checks what ran around the API server: the real
// kube-controller-manager, kube-scheduler and kwok of bin/k8s; every model
// pod made by the Deployment's ReplicaSet, bound to a kwok Node and its
// status written by kwok, never by the demo; the Deployment's status
// written only by the controller manager (its spec.replicas by `kubectl
// scale`, which each scale event checks); and model
// traffic carried by the pod network to the one simserver.
func checkCluster(t *testing.T, c *clusterSummary) {
	t.Helper()
	if c == nil {
		t.Fatal("summary.json has no cluster")
	}
	var names []string
	for _, comp := range c.Components {
		names = append(names, comp.Name)
		want := regexp.MustCompile(`^Kubernetes v1\.\d+\.\d+$`)
		if comp.Name == "kwok" {
			want = regexp.MustCompile(`^kwok version v0\.8\.0 `)
		}
		if !want.MatchString(comp.Version) || comp.Binary != filepath.Join(k8sBin, comp.Name) || comp.Pid <= 1 {
			t.Errorf("component %s: version %q, binary %s, pid %d", comp.Name, comp.Version, comp.Binary, comp.Pid)
		}
	}
	if diff := cmp.Diff([]string{"kube-controller-manager", "kube-scheduler", "kwok"}, names); diff != "" {
		t.Errorf("components (-want +got):\n%s", diff)
	}
	for _, ctl := range []string{"deployment-controller", "replicaset-controller"} {
		if !slices.Contains(c.Controllers, ctl) {
			t.Errorf("controllers %v lack %s", c.Controllers, ctl)
		}
	}
	if diff := cmp.Diff([]string{"kube-controller-manager"}, c.StatusWriters); diff != "" {
		t.Errorf("writers of the Deployment's status (-want +got):\n%s", diff)
	}
	checkModelPods(t, c)
	if c.SimserverConcurrency != 24 || c.ColdStart != 3 || c.Termination != 35 {
		t.Errorf("simserver --concurrency %d, cold start %vs, termination delay %vs; want the pool's 24 slots, 3s and the preStop 5s + clientTimeout 30s",
			c.SimserverConcurrency, c.ColdStart, c.Termination)
	}
}

// checkModelPods checks each model pod the demo saw: 6 at the start, 3
// made by the scale back to 6, 1 and then 5 in the scale from zero.
func checkModelPods(t *testing.T, c *clusterSummary) {
	t.Helper()
	if len(c.ModelPods) != 15 {
		t.Errorf("%d model pods seen, want 6 + 3 + 1 + 5", len(c.ModelPods))
	}
	received := map[string]int64{}
	for _, a := range c.Addresses {
		received[a.IP] = a.Received
	}
	for _, p := range c.ModelPods {
		if !strings.HasPrefix(p.Owner, "ReplicaSet/llm-") || !slices.Contains(c.Nodes, p.Node) || !strings.HasPrefix(p.Name, strings.TrimPrefix(p.Owner, "ReplicaSet/")+"-") {
			t.Errorf("pod %s: owner %q, node %q (kwok's: %v)", p.Name, p.Owner, p.Node, c.Nodes)
		}
		// kube-scheduler writes a pod's status too when it finds no Node
		// for it at first (PodScheduled False, Unschedulable).
		if !slices.Contains(p.StatusWriters, "kwok") || slices.ContainsFunc(p.StatusWriters, func(w string) bool { return w != "kwok" && w != "kube-scheduler" }) ||
			slices.Contains(p.SpecWriters, "demo") {
			t.Errorf("pod %s: status written by %v, the rest by %v; want kwok (and kube-scheduler, for a pod it could not place at once), and never the demo", p.Name, p.StatusWriters, p.SpecWriters)
		}
		if !strings.HasPrefix(p.IP, strings.TrimSuffix(c.PodCIDR, "0/24")) || p.ReadyAt == nil {
			t.Errorf("pod %s: address %q in %s, ready at %v", p.Name, p.IP, c.PodCIDR, p.ReadyAt)
		}
		// Every pod served some of the load through its address.
		if received[p.IP] == 0 {
			t.Errorf("pod %s: no bytes reached its address %s", p.Name, p.IP)
		}
	}
}
