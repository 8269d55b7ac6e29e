package simulate

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// exactPool is one replica of the given concurrency with a constant 10 s
// service time (μ = concurrency/10 per second) and one tier "t" with the
// given tolerable wait and tenantShare 1: small enough to work out every
// event by hand.
func exactPool(concurrency int, wait string) string {
	return fmt.Sprintf(`apiVersion: tiergate.dev/v1alpha1
kind: ModelPool
metadata: {name: p}
spec:
  deploymentRef: {name: p}
  concurrencyPerReplica: %d
  serviceTime: {mean: 10s}
  backend: {port: 8000}
  dispatchers: {selector: {matchLabels: {app: d}}}
  defaultTier: t
---
apiVersion: tiergate.dev/v1alpha1
kind: ServiceTier
metadata: {name: t}
spec:
  poolRef: {name: p}
  basePriority: 0
  tolerableWait: %s
  tenantShare: "1"
---
`, concurrency, wait)
}

func exactLoad(extra string, tenants ...string) string {
	return `apiVersion: tiergate.dev/v1alpha1
kind: Load
spec:
  replicas: 1
  duration: 40s
  serviceTime: {distribution: constant, mean: 10s}
` + extra + "  tenants:\n  - " + strings.Join(tenants, "\n  - ") + "\n"
}

// TestExactScenarios checks outcomes derived by hand, event by event.
func TestExactScenarios(t *testing.T) {
	tests := map[string]struct {
		doc      string
		wantTier Figures
		wantUtil float64
		check    func(t *testing.T, res *Result)
	}{
		// P = 4, L = floor(0.4/s × 10 s) = 4. Twenty requests at t=1: four
		// run at once, four queue, twelve are refused; the queued four start
		// at t=11 after exactly 10 s.
		"burst beyond slots and bound": {
			doc: exactPool(4, "10s") + exactLoad("", "{tenant: x, arrival: {process: burst, at: 1s, count: 20}}"),
			wantTier: Figures{Offered: 20, Admitted: 8, Served: 8, Refused: Refused{Capacity: 12},
				Wait: WaitStats{Count: 8, Mean: 5, P50: 0, P95: 10, P99: 10, Max: 10}},
			wantUtil: (4*10 + 4*10) / (4 * 40.0),
		},
		// P = 1. p1 runs 0–10; p2 (t=0) and h1 (t=1, gives up after 5 s)
		// queue; h1 leaves at 6 while queued; p2 runs 10–20; i1 arrives at
		// 15, runs from 20 and its client gives up at 27, in flight.
		"client timeouts, queued and in flight": {
			doc: exactPool(1, "100s") + exactLoad("",
				"{tenant: p, arrival: {process: burst, at: 0s, count: 2}}",
				"{tenant: h, arrival: {process: burst, at: 1s, count: 1}, timeout: 5s}",
				"{tenant: i, arrival: {process: burst, at: 15s, count: 1}, timeout: 12s}"),
			wantTier: Figures{Offered: 4, Admitted: 4, Served: 2, Abandoned: 2, AbandonedInFlight: 1,
				Wait: WaitStats{Count: 3, Mean: 5, P50: 5, P95: 10, P99: 10, Max: 10}},
			wantUtil: 27 / 40.0,
			check: func(t *testing.T, res *Result) {
				if got := res.Tenants["h"]; got.Abandoned != 1 || got.AbandonedInFlight != 0 {
					t.Errorf("h: abandoned %d (in flight %d), want 1 (0)", got.Abandoned, got.AbandonedInFlight)
				}
				if q := res.Tiers["t"].Queue; q.MeanTimeInQueue != 5 {
					// p1 0 s (dispatched on admission), p2 10 s, h1 5 s, i1 5 s.
					t.Errorf("mean time in queue %g, want 20/4", q.MeanTimeInQueue)
				}
			},
		},
		// P = 1, L = 1. a1 runs 0–10, a2 queues, a3 is refused with
		// Retry-After 10 s (position 2 at μ = 0.1/s, clamped to W = 10 s)
		// and retries at 10, when a1 completes first and a2 starts: a3 then
		// queues and runs 20–30. At 25 s the pool scales to zero: b1 at 26
		// gets 503 unavailable, and a3 still completes. Without a cold
		// start nothing is held at zero, so the bound there is 0.
		"retry after Retry-After, then scaled to zero": {
			doc: exactPool(1, "10s") + exactLoad("  replicaChanges: [{at: 25s, replicas: 0}]\n",
				"{tenant: a, arrival: {process: burst, at: 0s, count: 3}, retryOn429: true, maxRetries: 1}",
				"{tenant: b, arrival: {process: burst, at: 26s, count: 1}}"),
			wantTier: Figures{Offered: 4, Retries: 1, Admitted: 3, Served: 3, Refused: Refused{Capacity: 1, Unavailable: 1},
				Wait: WaitStats{Count: 3, Mean: 6.666667, P50: 10, P95: 10, P99: 10, Max: 10}},
			// The slot is busy 0–30; from 25 on it is a draining slot.
			wantUtil: 1,
			check: func(t *testing.T, res *Result) {
				want := []PolicyChange{{AtSeconds: 25, Replicas: 0, Slots: 0, Bounds: map[string]int{"t": 0}}}
				if diff := cmp.Diff(want, res.PolicyChanges); diff != "" {
					t.Errorf("policy changes (-want +got):\n%s", diff)
				}
				w := "replicaChanges[0]: the pool scales to 0 at 25s: requests are refused with 503 unavailable until it scales up"
				if diff := cmp.Diff([]string{w}, res.Warnings); diff != "" {
					t.Errorf("warnings (-want +got):\n%s", diff)
				}
			},
		},
		// P = 1, two closed-loop clients without think time: one runs while
		// the other waits its full 10 s. Dispatches at 0, 10, 20, 30;
		// completions at 10, 20, 30 (40 is the end).
		"closed loop": {
			doc:      exactPool(1, "100s") + exactLoad("", "{tenant: c, arrival: {process: closed, clients: 2}}"),
			wantTier: Figures{Offered: 5, Admitted: 5, Served: 3, Wait: WaitStats{Count: 4, Mean: 7.5, P50: 10, P95: 10, P99: 10, Max: 10}},
			wantUtil: 1,
		},
		// Constant arrivals every 20 s from a random phase in [0, 20 s):
		// two requests, each served at once.
		"constant rate": {
			doc:      exactPool(1, "100s") + exactLoad("", "{tenant: k, arrival: {process: constant, rate: 0.05}}"),
			wantTier: Figures{Offered: 2, Admitted: 2, Wait: WaitStats{Count: 2}},
			check: func(t *testing.T, res *Result) {
				if s := res.Tiers["t"].Served; s < 1 || s > 2 {
					t.Errorf("served %d, want 1 or 2 (depends on the phase)", s)
				}
			},
			wantUtil: -1, // depends on the phase
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			in, err := Read(src("exact.yaml", tc.doc))
			if err != nil {
				t.Fatal(err)
			}
			res := run(t, in)
			got := res.Tiers["t"].Figures
			// Rates follow from counts; compare the counts and waits.
			got.OfferedRate, got.Throughput, got.ThroughputShare, got.waits = 0, 0, 0, nil
			if tc.check != nil {
				tc.check(t, res)
				if name == "constant rate" {
					got.Served = 0
				}
			}
			if diff := cmp.Diff(tc.wantTier, got, cmp.AllowUnexported(Figures{})); diff != "" {
				t.Errorf("tier figures (-want +got):\n%s", diff)
			}
			if tc.wantUtil >= 0 && res.Utilisation != round6(tc.wantUtil) {
				t.Errorf("utilisation %g, want %g", res.Utilisation, round6(tc.wantUtil))
			}
		})
	}
}
