package main

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	clusterutil "github.com/tiergate/tiergate/internal/testutil/cluster"
)

func sec(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

func TestSummarizeOpenAI(t *testing.T) {
	plan := []streamPlan{{Name: "soylent", Tenants: []string{"soylent"}, Kind: kindOpenAI, Workers: 3},
		{Name: "wayne", Tenants: []string{"wayne"}, Kind: kindOpenAI, Workers: 2, Budget: &budgetPlan{PromptBytes: 40, MaxTokens: 10}}}
	tests := map[string]struct {
		calls []openaiCall
		want  openaiSummary
	}{
		"no calls": {want: openaiSummary{Tenant: "soylent", Workers: 3, MinGapRatio: math.NaN()}},
		"the budget stream's calls are left out": {
			calls: []openaiCall{{Stream: "wayne", Outcome: outcomeServed, Attempts: []attempt{{Start: 0, End: sec(6), Status: 200}}}},
			want:  openaiSummary{Tenant: "soylent", Workers: 3, MinGapRatio: math.NaN()},
		},
		"first try": {
			calls: []openaiCall{{Stream: "soylent", Outcome: outcomeServed, Attempts: []attempt{{Start: 0, End: sec(6), Status: 200}}}},
			want:  openaiSummary{Tenant: "soylent", Workers: 3, Calls: 1, Succeeded: 1, Attempts: 1, MinGapRatio: math.NaN()},
		},
		"retried after Retry-After, honoured": {
			calls: []openaiCall{{Stream: "soylent", Outcome: outcomeServed, Attempts: []attempt{
				{Start: 0, End: sec(0.01), Status: 429, RetryAfter: 2},
				{Start: sec(2.01), End: sec(2.02), Status: 429, RetryAfter: 3},
				{Start: sec(5.52), End: sec(11), Status: 200},
			}}},
			want: openaiSummary{Tenant: "soylent", Workers: 3, Calls: 1, Succeeded: 1, SucceededAfteRetry: 1, Attempts: 3,
				RetriesAfterHeader: 2, Honoured: 2, MinGapRatio: 1, MaxRetryAfter: 3},
		},
		"retried too early": {
			calls: []openaiCall{{Stream: "soylent", Outcome: outcomeRefused, Cause: "tenant_limit", Attempts: []attempt{
				{Start: 0, End: sec(0.01), Status: 429, RetryAfter: 4},
				{Start: sec(1.01), End: sec(1.02), Status: 429, RetryAfter: 4},
			}}},
			want: openaiSummary{Tenant: "soylent", Workers: 3, Calls: 1, Failed: 1, Attempts: 2,
				RetriesAfterHeader: 1, Honoured: 0, MinGapRatio: 0.25, MaxRetryAfter: 4},
		},
		"retry without the header, then cut": {
			calls: []openaiCall{{Stream: "soylent", Outcome: outcomeCut, Attempts: []attempt{
				{Start: 0, End: sec(30), Status: 504},
				{Start: sec(30.5), End: sec(31), Status: 0},
			}}},
			want: openaiSummary{Tenant: "soylent", Workers: 3, Calls: 1, Cut: 1, Attempts: 2, OtherRetries: 1, MinGapRatio: math.NaN()},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := summarizeOpenAI(plan, tc.calls)
			if diff := cmp.Diff(tc.want, got, cmpopts.EquateNaNs(), cmpopts.EquateApprox(0, 1e-9)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestPhases(t *testing.T) {
	events := []scaleEvent{{AtSeconds: 10, From: 6, To: 3}, {AtSeconds: 20, From: 3, To: 6}}
	waits := []waitSample{
		{Tier: "free", Dispatch: sec(1), Wait: sec(1)},
		{Tier: "free", Dispatch: sec(9.9), Wait: sec(3)},
		{Tier: "free", Dispatch: sec(10), Wait: sec(20)},
		{Tier: "free", Dispatch: sec(25), Wait: sec(2)},
		{Tier: "premium", Dispatch: sec(15), Wait: sec(0.5)},
	}
	recs := []record{
		{Tier: "free", Outcome: outcomeRefused, Cause: "queue_timeout", End: sec(15)},
		{Tier: "free", Outcome: outcomeRefused, Cause: "capacity", End: sec(19.99)},
		{Tier: "free", Outcome: outcomeServed, End: sec(16)},
		{Tier: "premium", Outcome: outcomeRefused, Cause: "tenant_limit", End: sec(2)},
	}
	got := phases([]string{"premium", "free"}, events, 6, 30*time.Second, recs, waits)
	want := []phaseSummary{
		{Phase: "before the scale-down", Replicas: 6, FromSeconds: 0, ToSeconds: 10, Tier: "premium", RefusedByCause: map[string]int{"tenant_limit": 1}},
		{Phase: "before the scale-down", Replicas: 6, FromSeconds: 0, ToSeconds: 10, Tier: "free", Dispatched: 2, PerSecond: 0.2, WaitP95: 3, RefusedByCause: map[string]int{}},
		{Phase: "scaled to 3 replicas", Replicas: 3, FromSeconds: 10, ToSeconds: 20, Tier: "premium", Dispatched: 1, PerSecond: 0.1, WaitP95: 0.5, RefusedByCause: map[string]int{}},
		{Phase: "scaled to 3 replicas", Replicas: 3, FromSeconds: 10, ToSeconds: 20, Tier: "free", Dispatched: 1, PerSecond: 0.1, WaitP95: 20,
			RefusedByCause: map[string]int{"queue_timeout": 1, "capacity": 1}},
		{Phase: "back at 6 replicas", Replicas: 6, FromSeconds: 20, ToSeconds: 30, Tier: "premium", RefusedByCause: map[string]int{}},
		{Phase: "back at 6 replicas", Replicas: 6, FromSeconds: 20, ToSeconds: 30, Tier: "free", Dispatched: 1, PerSecond: 0.1, WaitP95: 2, RefusedByCause: map[string]int{}},
	}
	if diff := cmp.Diff(want, got, cmpopts.EquateApprox(0, 1e-9)); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestTierOrderFinding(t *testing.T) {
	steady := func(p95 ...float64) []steadyTier {
		names := []string{"premium", "standard", "free"}
		var out []steadyTier
		for i, v := range p95 {
			out = append(out, steadyTier{Tier: names[i], Streams: []string{names[i] + "-tenant"}, Dispatched: 10, WaitP95: v})
		}
		return out
	}
	tests := map[string]struct {
		s    summary
		want []string
	}{
		"in order": {
			s:    summary{SteadyTiers: steady(0.5, 3, 20)},
			want: []string{"For the tenants that stay under their own caps, p95 queue wait was premium 0.50s (premium-tenant), standard 3.00s (standard-tenant), free 20.00s (free-tenant). It follows the tiers: paying tenants did not wait behind free ones."},
		},
		"out of order": {
			s:    summary{SteadyTiers: steady(0.5, 30, 20)},
			want: []string{"For the tenants that stay under their own caps, p95 queue wait was premium 0.50s (premium-tenant), standard 30.00s (standard-tenant), free 20.00s (free-tenant). **Not in tier order**: free waited less than standard."},
		},
		"capped tenants are listed apart": {
			s: summary{SteadyTiers: steady(0.5, 3), Streams: []streamSummary{
				{Name: "premium-tenant", Tier: "premium", Requests: 5},
				{Name: "umbrella", Tier: "premium", Requests: 9, WaitP95: 8},
			}},
			want: []string{
				"For the tenants that stay under their own caps, p95 queue wait was premium 0.50s (premium-tenant), standard 3.00s (standard-tenant). It follows the tiers: paying tenants did not wait behind free ones.",
				"Tenants that keep more requests outstanding than their caps allow wait for their own earlier requests as well: umbrella (premium) p95 8.00s.",
			},
		},
		"one tier measured says nothing": {s: summary{SteadyTiers: steady(0.5)}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, tierOrderFinding(&tc.s)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// The Markdown carries every section, the charts and the scale events.
func TestMarkdownSections(t *testing.T) {
	s := &summary{
		StartedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), LoadSeconds: 30, GraceSeconds: 10, EndedSeconds: 40,
		ServiceTime: "lognormal:6s,2s", Subnet: "127.0.0.0/24", Pool: "default/llm", Replicas: 6, PerReplica: 4, ClientTimeout: 30,
		Tiers: []tierSummary{{Tier: "premium", Requests: 3, Served: 2, Refused: 1, RefusedByCause: map[string]int{"tenant_limit": 1},
			ServerRefusedByCause: map[string]float64{"tenant_limit": 1}, Dispatched: 2, WaitP50: 0.1, WaitP95: 0.2, ServerWaitP50: math.NaN(), ServerWaitP95: math.NaN()}},
		ScaleEvents: []scaleEvent{{AtSeconds: 10, From: 6, To: 3, Pods: []string{"llm-5d8f-a", "llm-5d8f-b"}, Command: "kubectl -n default scale deployment llm --replicas=3",
			SpecReplicas: 3, ReplicasOwners: []string{"kubectl/scale"}, Ready: true, ReadyAfterSeconds: 0.2, Followed: true, FollowedAfterSeconds: 0.3,
			SlotsBefore: 24, SlotsAfter: 12, BoundsBefore: map[string]int{"premium": 20}, BoundsAfter: map[string]int{"premium": 10}}},
		OpenAI: openaiSummary{MinGapRatio: math.NaN()},
		Cluster: &clusterSummary{
			Components:  []clusterutil.ComponentInfo{{Name: "kwok", Binary: "/r/bin/k8s/kwok", Version: "kwok version v0.8.0", Pid: 42}},
			Controllers: []string{"deployment-controller", "replicaset-controller"}, Nodes: []string{"kwok-node-0"}, PodCIDR: "127.9.9.0/24",
			ColdStart: 3, Termination: 35, Simserver: "127.0.0.1:4000", SimserverConcurrency: 24,
			ReplicasOwners: []string{"kubectl/scale"}, StatusWriters: []string{"kube-controller-manager"},
			ModelPods: []podRecord{{Name: "llm-5d8f-a", Owner: "ReplicaSet/llm-5d8f", Node: "kwok-node-0", IP: "127.9.9.2", Created: -5, StatusWriters: []string{"kwok"}}},
			Addresses: []addrRecord{{IP: "127.9.9.2", Pods: []string{"llm-5d8f-a"}, AddrStats: clusterutil.AddrStats{Accepted: 7, PeakOpen: 4, Received: 900}}},
		},
	}
	md := markdown(s, "NAME …")
	for _, want := range []string{
		"# tiergate demo report", "## What the numbers show", "## Per tier", "| premium | 3 | 2 | 1 | tenant_limit 1 |",
		"## Scale events", "### 00:10.0: 6 → 3 replicas", "| premium | 20 | 10 |", "0.30s after the command both dispatchers held the new policy: slots 24 → 12.",
		"The autoscaler wrote spec.replicas (3 afterwards, owned by kubectl/scale):\n\n```\nkubectl -n default scale deployment llm --replicas=3\n```",
		"The ReplicaSet controller deleted pods llm-5d8f-a, llm-5d8f-b. The Deployment's status counted 3 ready replicas 0.20s after the command.",
		"At 00:10.0 `kubectl scale` took the Deployment from 6 to 3 replicas; its status counted them ready 0.20s later, and 0.30s after the command",
		"## The cluster that ran", "| kwok | kwok version v0.8.0 | `/r/bin/k8s/kwok` | 42 |",
		"kube-controller-manager ran the controllers deployment-controller, replicaset-controller. kwok ran 1 fake Nodes (kwok-node-0), gave pods addresses of 127.9.9.0/24",
		"At the end the model Deployment's spec.replicas belonged to kubectl/scale and its status was written by kube-controller-manager.",
		"| llm-5d8f-a | ReplicaSet/llm-5d8f | kwok-node-0 | 127.9.9.2 | -5.00s | – | – | kwok |", "| 127.9.9.2 | llm-5d8f-a | 7 | 4 | 900 |",
		"![Queue wait per tier over time](queue-wait.png)", "![Refusals by cause over time](refusals.png)", "![Queue length and bound per tier over time](queue-and-bounds.png)",
		"simserver, a stand-in for vLLM", "Client-side and server-side counts of 429 refusals agree for every tier.",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q", want)
		}
	}
}
