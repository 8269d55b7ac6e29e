package cluster

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tiergate/tiergate/internal/testutil"
	"github.com/tiergate/tiergate/internal/testutil/cluster"
)

// TestDeploymentOnKwok: a model Deployment of 3 replicas becomes 3 Ready
// pods with loopback addresses through the real Deployment and ReplicaSet
// controllers, the scheduler and kwok; each address reaches simserver;
// `kubectl scale --replicas=1` leaves one, and the two others terminate
// and go. The EndpointSlice cannot follow: the API refuses loopback
// endpoint addresses (see checkEndpointSliceRefusesLoopback).
func TestDeploymentOnKwok(t *testing.T) {
	ns := newNamespace(t)
	applied := startStep(t)
	kubectl.MustInput(t, modelManifest(3), "apply", "-n", ns, "-f", "-")
	applied.done("kubectl apply returned")

	awaitPods(t, ns, "3 pods created by the ReplicaSet", func(pods []corev1.Pod) bool { return len(pods) == 3 })
	applied.done("3 pods created (ReplicaSet controller)")
	awaitPods(t, ns, "3 pods bound", func(pods []corev1.Pod) bool {
		return countPods(pods, func(p *corev1.Pod) bool { return p.Spec.NodeName != "" }) == 3
	})
	applied.done("3 pods bound to kwok Nodes (scheduler)")
	awaitPods(t, ns, "3 pods started", func(pods []corev1.Pod) bool {
		return countPods(pods, func(p *corev1.Pod) bool { return p.Status.PodIP != "" }) == 3
	})
	applied.done("3 pods started with an address (kwok)")
	awaitPods(t, ns, "3 pods Ready", func(pods []corev1.Pod) bool { return len(readyServing(pods)) == 3 })
	ready := applied.done(fmt.Sprintf("3 pods Ready (kwok, cold start %s)", coldStart))
	if ready < coldStart {
		t.Errorf("3 pods Ready %s after the apply, before their %s cold start", ready, coldStart)
	}
	await(t, 10*time.Second, "the Deployment's readyReplicas", func() (bool, string) {
		s := deployment(t, ns).Status
		return s.ReadyReplicas == 3 && s.AvailableReplicas == 3, fmt.Sprintf("status %+v", s)
	})
	applied.done("Deployment status.readyReplicas 3 (Deployment controller)")

	pods := modelPods(t, ns)
	checkPodsMadeByTheCluster(t, pods)
	ips := readyServing(pods)
	checkEndpointSliceRefusesLoopback(t, ns)
	applied.done("EndpointSlice controller refused the loopback addresses")
	checkServed(t, ips)

	scaled := startStep(t)
	kubectl.Must(t, "scale", "-n", ns, "deployment/llm", "--replicas=1")
	scaled.done("kubectl scale returned")
	var kept []string
	awaitPods(t, ns, "1 Ready pod not terminating", func(pods []corev1.Pod) bool {
		kept = readyServing(pods)
		return len(kept) == 1
	})
	scaled.done("scale 3->1: 2 pods terminating")
	if !slices.Contains(ips, kept[0]) {
		t.Fatalf("the pod left, %s, is not one of the 3 (%v)", kept[0], ips)
	}
	await(t, 10*time.Second, "the Deployment's readyReplicas after the scale", func() (bool, string) {
		s := deployment(t, ns).Status
		return s.ReadyReplicas == 1 && s.Replicas == 1, fmt.Sprintf("status %+v", s)
	})
	scaled.done("Deployment status.readyReplicas 1, replicas 1")
	awaitPods(t, ns, "the 2 removed pods gone", func(pods []corev1.Pod) bool { return len(pods) == 1 })
	gone := scaled.done(fmt.Sprintf("2 removed pods gone (termination delay %s)", terminationDelay))
	if gone < terminationDelay {
		t.Errorf("the removed pods were gone %s after the scale, before their %s termination delay", gone, terminationDelay)
	}
	// The network follows the pods through its own informer, which may
	// see the deletion a moment after the test's list did.
	for _, ip := range ips {
		want := cluster.Closed
		if ip == kept[0] {
			want = cluster.Serving
		}
		testutil.EventuallyTrue(t, 5*time.Second, fmt.Sprintf("pod address %s %s", ip, want), func() bool { return podNet.State(ip) == want })
	}
	checkServed(t, kept)
}

// awaitPods waits up to 30 s for cond over the llm pods of ns.
func awaitPods(t *testing.T, ns, what string, cond func([]corev1.Pod) bool) {
	t.Helper()
	await(t, 30*time.Second, what, func() (bool, string) {
		pods := modelPods(t, ns)
		return cond(pods), describePods(pods)
	})
}

func countPods(pods []corev1.Pod, f func(*corev1.Pod) bool) int {
	n := 0
	for i := range pods {
		if f(&pods[i]) {
			n++
		}
	}
	return n
}

func describePods(pods []corev1.Pod) string {
	var parts []string
	for i := range pods {
		p := &pods[i]
		parts = append(parts, fmt.Sprintf("%s node=%q ip=%q phase=%s ready=%t deleting=%t", p.Name, p.Spec.NodeName, p.Status.PodIP, p.Status.Phase, isReady(p), p.DeletionTimestamp != nil))
	}
	return fmt.Sprintf("%d pods: %s", len(pods), strings.Join(parts, "; "))
}

// checkPodsMadeByTheCluster: every pod was written only by the controller
// manager (which created it) and kwok (which played its status; a write by
// this test would show as a manager of its own), was bound by the
// scheduler (whose Binding leaves no managed-fields entry), belongs to a
// ReplicaSet of the Deployment, runs on a kwok Node and has a distinct
// address of the pod CIDR.
func checkPodsMadeByTheCluster(t *testing.T, pods []corev1.Pod) {
	t.Helper()
	seen := map[string]bool{}
	for i := range pods {
		p := &pods[i]
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
		if len(p.OwnerReferences) != 1 || p.OwnerReferences[0].Kind != "ReplicaSet" || !strings.HasPrefix(p.OwnerReferences[0].Name, "llm-") {
			t.Errorf("pod %s is owned by %+v, want one ReplicaSet llm-...", p.Name, p.OwnerReferences)
		}
		if !strings.HasPrefix(p.Spec.NodeName, "kwok-node-") || !hasCondition(p, corev1.PodScheduled) {
			t.Errorf("pod %s is on node %q, conditions %+v: not bound by the scheduler", p.Name, p.Spec.NodeName, p.Status.Conditions)
		}
		if p.Spec.ServiceAccountName != "default" {
			t.Errorf("pod %s has ServiceAccount %q, want the namespace's default (the admission plugin's)", p.Name, p.Spec.ServiceAccountName)
		}
		ip := p.Status.PodIP
		if !podNet.Contains(ip) || seen[ip] {
			t.Errorf("pod %s has address %q: outside %s or taken twice", p.Name, ip, kc.PodCIDR)
		}
		seen[ip] = true
	}
}

func hasCondition(p *corev1.Pod, typ corev1.PodConditionType) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == typ {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// checkEndpointSliceRefusesLoopback: the EndpointSlice controller tries
// to list the pods and the API server refuses every loopback address
// (endpoint addresses may not be loopback, link-local or unspecified), so
// the Service's EndpointSlice stays empty and the controller says why in
// an Event. Whatever on this cluster needs EndpointSlices (a Service's
// traffic, the chart's checks) cannot use pod IPs on 127.0.0.0/8.
func checkEndpointSliceRefusesLoopback(t *testing.T, ns string) {
	t.Helper()
	const refusal = "may not be in the loopback range (127.0.0.0/8, ::1/128)"
	await(t, 10*time.Second, "the EndpointSlice controller's refusal", func() (bool, string) {
		var events corev1.EventList
		if err := k8s.List(context.Background(), &events, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		var seen []string
		for _, e := range events.Items {
			if e.InvolvedObject.Kind == "Service" && e.InvolvedObject.Name == "llm" {
				if e.Type == corev1.EventTypeWarning && e.Reason == "FailedToUpdateEndpointSlices" && strings.Contains(e.Message, refusal) {
					return true, ""
				}
				seen = append(seen, e.Reason+": "+e.Message)
			}
		}
		return false, fmt.Sprintf("events of Service llm: %q", seen)
	})
	if ready, terminating, _ := sliceEndpoints(t, ns); len(ready)+len(terminating) != 0 {
		t.Errorf("the EndpointSlice lists %v and %v: loopback addresses were accepted after all", ready, terminating)
	}
}

// checkServed sends a completion to each address with openai-go and
// checks that simserver answered it through that address.
func checkServed(t *testing.T, ips []string) {
	t.Helper()
	before := simStats(t)
	for _, ip := range ips {
		accepted := podNet.Stats(ip).Accepted
		c := openai.NewClient(option.WithBaseURL("http://"+net.JoinHostPort(ip, strconv.Itoa(podNet.Port()))+"/v1"),
			option.WithAPIKey("unused"), option.WithMaxRetries(0), option.WithRequestTimeout(10*time.Second))
		resp, err := c.Completions.New(context.Background(), openai.CompletionNewParams{
			Model: "sim-model", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("hi")}, MaxTokens: openai.Int(2),
		})
		if err != nil {
			t.Errorf("completion through pod address %s: %v", ip, err)
			continue
		}
		if len(resp.Choices) != 1 || resp.Model != "sim-model" {
			t.Errorf("completion through %s: %+v", ip, resp)
		}
		if got := podNet.Stats(ip).Accepted; got <= accepted {
			t.Errorf("pod address %s relayed no new connection (%d before, %d after)", ip, accepted, got)
		}
	}
	if got, want := simStats(t).Completed-before.Completed, int64(len(ips)); got != want {
		t.Errorf("simserver completed %d requests, want %d", got, want)
	}
}

func simStats(t *testing.T) testutil.SimStats {
	t.Helper()
	var st testutil.SimStats
	testutil.GetJSON(t, "http://"+simAddr+"/debug/stats", "", &st)
	return st
}
