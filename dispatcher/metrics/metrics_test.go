package metrics

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type fakeState struct {
	mu sync.Mutex
	s  Snapshot
}

func (f *fakeState) get() Snapshot { f.mu.Lock(); defer f.mu.Unlock(); return f.s }

func TestLevels(t *testing.T) {
	tests := map[string]struct {
		snap Snapshot
		want string
	}{
		"no policy reports nothing": {snap: Snapshot{}, want: ""},
		"levels": {
			snap: Snapshot{
				Pool: "default/llm", Slots: 4, InFlight: 3, PolicyVersion: 7,
				Tiers: map[string]TierLevel{
					"premium": {Queued: 2, Bound: 20, OldestAge: 1500 * time.Millisecond,
						QueuedTokens: 5200, TokenBound: 90000, Fair: true, FairnessGap: 812.5, FairnessGapBound: 8400},
					"free": {Queued: 0, Bound: 240},
				},
				Backends:      map[string]int64{"10.0.0.7:8000": 2, "10.0.0.8:8000": 1},
				BackendHealth: map[string]BackendHealth{"10.0.0.7:8000": {Ejections: 2}, "10.0.0.8:8000": {Ejected: true, Ejections: 3}},
				BodyBytes:     12288, BodyBudget: 128 << 20,
				BytesPerToken: 3.25,
			},
			want: `
# HELP tiergate_backend_ejected 1 while passive health checking keeps the backend out of service (ejected, or waiting for its probe), else 0.
# TYPE tiergate_backend_ejected gauge
tiergate_backend_ejected{backend="10.0.0.7:8000",pool="default/llm"} 0
tiergate_backend_ejected{backend="10.0.0.8:8000",pool="default/llm"} 1
# HELP tiergate_backend_ejections_total Times the backend was ejected for failing requests in a row.
# TYPE tiergate_backend_ejections_total counter
tiergate_backend_ejections_total{backend="10.0.0.7:8000",pool="default/llm"} 2
tiergate_backend_ejections_total{backend="10.0.0.8:8000",pool="default/llm"} 3
# HELP tiergate_backend_inflight Requests outstanding at each backend (queued requests excluded).
# TYPE tiergate_backend_inflight gauge
tiergate_backend_inflight{backend="10.0.0.7:8000",pool="default/llm"} 2
tiergate_backend_inflight{backend="10.0.0.8:8000",pool="default/llm"} 1
# HELP tiergate_bytes_per_token Prompt bytes per token the pool's estimate uses, learned from the answers' usage.prompt_tokens.
# TYPE tiergate_bytes_per_token gauge
tiergate_bytes_per_token{pool="default/llm"} 3.25
# HELP tiergate_fairness_gap_bound_tokens The most tiergate_fairness_gap_tokens can be while the tenants stay backlogged, as Tokens fairness promises.
# TYPE tiergate_fairness_gap_bound_tokens gauge
tiergate_fairness_gap_bound_tokens{pool="default/llm",tier="premium"} 8400
# HELP tiergate_fairness_gap_tokens Largest difference in virtual token counters between the tier's backlogged tenants (weighted tokens / weight), in Tokens fairness.
# TYPE tiergate_fairness_gap_tokens gauge
tiergate_fairness_gap_tokens{pool="default/llm",tier="premium"} 812.5
# HELP tiergate_inflight Requests holding a slot now.
# TYPE tiergate_inflight gauge
tiergate_inflight{pool="default/llm"} 3
# HELP tiergate_oldest_queued_age_seconds Age of the oldest queued request, by tier; 0 when none.
# TYPE tiergate_oldest_queued_age_seconds gauge
tiergate_oldest_queued_age_seconds{pool="default/llm",tier="free"} 0
tiergate_oldest_queued_age_seconds{pool="default/llm",tier="premium"} 1.5
# HELP tiergate_policy_version Version of the applied policy.
# TYPE tiergate_policy_version gauge
tiergate_policy_version{pool="default/llm"} 7
# HELP tiergate_queue_bound Queue bound of the tier (this dispatcher's share).
# TYPE tiergate_queue_bound gauge
tiergate_queue_bound{pool="default/llm",tier="free"} 240
tiergate_queue_bound{pool="default/llm",tier="premium"} 20
# HELP tiergate_queue_length Requests queued now, by tier.
# TYPE tiergate_queue_length gauge
tiergate_queue_length{pool="default/llm",tier="free"} 0
tiergate_queue_length{pool="default/llm",tier="premium"} 2
# HELP tiergate_queue_token_bound Queue bound of the tier in weighted tokens (this dispatcher's share), when it is bounded in tokens.
# TYPE tiergate_queue_token_bound gauge
tiergate_queue_token_bound{pool="default/llm",tier="premium"} 90000
# HELP tiergate_queue_tokens Weighted tokens the tier's queued requests reserve, when the tier is bounded in tokens.
# TYPE tiergate_queue_tokens gauge
tiergate_queue_tokens{pool="default/llm",tier="premium"} 5200
# HELP tiergate_queued_body_budget_bytes The budget of queued request bodies (--max-queued-bytes); past it requests get 503 overloaded.
# TYPE tiergate_queued_body_budget_bytes gauge
tiergate_queued_body_budget_bytes{pool="default/llm"} 1.34217728e+08
# HELP tiergate_queued_body_bytes Bytes of the request bodies being read or queued, charged to --max-queued-bytes.
# TYPE tiergate_queued_body_bytes gauge
tiergate_queued_body_bytes{pool="default/llm"} 12288
# HELP tiergate_slots Slots of this dispatcher (its share of the pool's concurrency).
# TYPE tiergate_slots gauge
tiergate_slots{pool="default/llm"} 4
# HELP tiergate_utilisation inflight / slots; 0 with no slots.
# TYPE tiergate_utilisation gauge
tiergate_utilisation{pool="default/llm"} 0.75
`,
		},
	}
	names := []string{"tiergate_queue_length", "tiergate_queue_bound", "tiergate_oldest_queued_age_seconds", "tiergate_inflight",
		"tiergate_slots", "tiergate_utilisation", "tiergate_backend_inflight", "tiergate_policy_version",
		"tiergate_backend_ejected", "tiergate_backend_ejections_total",
		"tiergate_queued_body_bytes", "tiergate_queued_body_budget_bytes", "tiergate_bytes_per_token"}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			reg := prometheus.NewPedanticRegistry()
			st := &fakeState{s: tc.snap}
			if _, err := New(reg, st.get); err != nil {
				t.Fatal(err)
			}
			if err := testutil.GatherAndCompare(reg, strings.NewReader(tc.want), names...); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestEventsAndTierDeletion(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	st := &fakeState{}
	m, err := New(reg, st.get)
	if err != nil {
		t.Fatal(err)
	}
	m.SetTiers("p", []string{"premium", "free"})
	m.Reject("p", "premium", "capacity")
	m.Reject("p", "premium", "capacity")
	m.Reject("p", "free", "tenant_limit")
	m.Reject("p", "", "unauthenticated")
	m.Abandon("p", "free", StageQueued)
	m.Abandon("p", "premium", StageInflight)
	m.Request("p", "premium", 200)
	m.Request("p", "free", 429)
	m.ObserveWait("p", "premium", 30*time.Millisecond)
	m.ObserveService("p", "premium", 2*time.Second)

	want := `
# HELP tiergate_abandoned_total Requests whose client went away, by stage (queued, dispatch, inflight).
# TYPE tiergate_abandoned_total counter
tiergate_abandoned_total{pool="p",stage="inflight",tier="premium"} 1
tiergate_abandoned_total{pool="p",stage="queued",tier="free"} 1
# HELP tiergate_rejections_total Refused requests by cause (capacity, tenant_limit, unauthenticated, unknown_tenant, unavailable, draining, queue_timeout, body_too_large, bad_request, request_timeout, backend_error, method_not_allowed, overloaded, backend_timeout, rate_limited).
# TYPE tiergate_rejections_total counter
tiergate_rejections_total{cause="capacity",pool="p",tier="premium"} 2
tiergate_rejections_total{cause="tenant_limit",pool="p",tier="free"} 1
tiergate_rejections_total{cause="unauthenticated",pool="p",tier=""} 1
# HELP tiergate_requests_total Finished requests by HTTP status sent (499: the client went away first).
# TYPE tiergate_requests_total counter
tiergate_requests_total{code="200",pool="p",tier="premium"} 1
tiergate_requests_total{code="429",pool="p",tier="free"} 1
`
	names := []string{"tiergate_abandoned_total", "tiergate_rejections_total", "tiergate_requests_total"}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(m.queueWait); n != 1 {
		t.Errorf("queue_wait series %d, want 1", n)
	}

	// The free tier goes away: its series go, premium's and the tier-less stay.
	m.SetTiers("p", []string{"premium"})
	want = `
# HELP tiergate_abandoned_total Requests whose client went away, by stage (queued, dispatch, inflight).
# TYPE tiergate_abandoned_total counter
tiergate_abandoned_total{pool="p",stage="inflight",tier="premium"} 1
# HELP tiergate_rejections_total Refused requests by cause (capacity, tenant_limit, unauthenticated, unknown_tenant, unavailable, draining, queue_timeout, body_too_large, bad_request, request_timeout, backend_error, method_not_allowed, overloaded, backend_timeout, rate_limited).
# TYPE tiergate_rejections_total counter
tiergate_rejections_total{cause="capacity",pool="p",tier="premium"} 2
tiergate_rejections_total{cause="unauthenticated",pool="p",tier=""} 1
# HELP tiergate_requests_total Finished requests by HTTP status sent (499: the client went away first).
# TYPE tiergate_requests_total counter
tiergate_requests_total{code="200",pool="p",tier="premium"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}

	// A new pool name drops every series of the old one.
	m.SetTiers("q", []string{"premium"})
	for _, c := range []prometheus.Collector{m.queueWait, m.service, m.rejections, m.abandoned, m.requests} {
		if n := testutil.CollectAndCount(c); n != 0 {
			t.Errorf("%d series left after the pool changed", n)
		}
	}
}
