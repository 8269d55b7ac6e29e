package simulate

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tiergate/tiergate/api/v1alpha1"
	"github.com/tiergate/tiergate/capacity"
)

// fleetInput is the seed pool (24 slots) with one premium tenant, acme,
// running 12 closed-loop clients without think time on a constant 6 s
// service: it always has work, so its throughput is its cap in flight / 6 s.
func fleetInput(t testing.TB, dispatchers int, shared v1alpha1.SharedStateMode) *Input {
	load := fmt.Sprintf(`apiVersion: tiergate.dev/v1alpha1
kind: Load
spec:
  replicas: 6
  dispatchers: %d
  duration: 5m
  warmup: 1m
  serviceTime: {distribution: constant, mean: 6s}
  tenants:
  - {tenant: acme, arrival: {process: closed, clients: 12}}
`, dispatchers)
	srcs := []Source{src("load.yaml", load)}
	for _, f := range []string{"pool-4m.yaml", "tiers.yaml", "quotas.yaml"} {
		data, err := os.ReadFile(filepath.Join(seedDir, f))
		if err != nil {
			t.Fatal(err)
		}
		srcs = append(srcs, Source{Name: f, Data: data})
	}
	in, err := Read(srcs...)
	if err != nil {
		t.Fatal(err)
	}
	in.Pool.Spec.SharedState = shared
	return in
}

// TestDispatchersSplit: in Local mode each of N dispatchers gets its slice
// as the controller computes it. acme's premium cap is 6 pool-wide; split
// over 4 dispatchers of 6 slots it is ⌊6 × 6/24⌋ = 1 each, so acme runs at
// most 4 at once: what Local mode's per-slice rounding costs. With 5
// dispatchers (slots 5, 5, 5, 5, 4) it is 1 each, 5 in all. In Redis mode
// the counts are exact fleet-wide: 6 again.
func TestDispatchersSplit(t *testing.T) {
	tests := map[string]struct {
		n          int
		shared     v1alpha1.SharedStateMode
		wantSlots  []int
		wantInFlit int // acme's cap in flight over the fleet
	}{
		"one dispatcher":            {n: 1, shared: v1alpha1.SharedStateLocal, wantSlots: []int{24}, wantInFlit: 6},
		"four, Local":               {n: 4, shared: v1alpha1.SharedStateLocal, wantSlots: []int{6, 6, 6, 6}, wantInFlit: 4},
		"five, Local":               {n: 5, shared: v1alpha1.SharedStateLocal, wantSlots: []int{5, 5, 5, 5, 4}, wantInFlit: 5},
		"four, Redis: exact counts": {n: 4, shared: v1alpha1.SharedStateRedis, wantSlots: []int{24}, wantInFlit: 6},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			in := fleetInput(t, tc.n, tc.shared)
			e := newEngine(in, Options{PlotBuckets: 1}, kinds[SchedTiergate])
			if err := e.setup(); err != nil {
				t.Fatal(err)
			}
			var slots []int
			for _, d := range e.disp {
				slots = append(slots, d.slots)
			}
			if diff := cmp.Diff(tc.wantSlots, slots); diff != "" {
				t.Errorf("slots per dispatcher (-want +got):\n%s", diff)
			}
			// The controller's own split, for the same objects.
			b, err := capacity.ComputeBounds(capacity.BoundsInput{Pool: in.Pool, ReadyReplicas: 6, Tiers: in.Tiers, Quotas: in.Quotas, Dispatchers: tc.n, Backends: e.first.Policies[0].Backends})
			if err != nil {
				t.Fatal(err)
			}
			for i := range e.disp {
				if got, want := e.tenants[0].at[i].limit, b.PolicyFor(i).Tiers[0].TenantConcurrencyLimit; got != want {
					t.Errorf("dispatcher %d: acme's cap %d, the controller's policy says %d", i, got, want)
				}
			}

			res := runKind(t, in, SchedTiergate, Options{})
			acme := res.Tenants["acme"]
			want := float64(tc.wantInFlit) / 6
			t.Logf("acme: %.3f req/s served, %d tenant_limit refusals", acme.Throughput, acme.Refused.TenantLimit)
			if acme.Throughput < 0.97*want || acme.Throughput > want+0.01 {
				t.Errorf("acme served %.3f req/s, want %d in flight / 6 s = %.3f", acme.Throughput, tc.wantInFlit, want)
			}
		})
	}
}

// TestDispatchersRoundRobin: attempts go to the dispatchers in turn, and
// every scheduler runs one per dispatcher with the invariants checked.
func TestDispatchersRoundRobin(t *testing.T) {
	in := seedInput(t, "pool.yaml", "load-2x.yaml")
	n := int32(3)
	in.Load.Spec.Dispatchers = &n
	in.Load.Spec.Duration.Duration /= 6
	res, err := Run(in, Options{Compare: Baselines, checkInvariants: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, sched := range res.Schedulers() {
		r := res.Of(sched)
		if r.Goodput <= 0 || r.Utilisation < 0.99 {
			t.Errorf("%s: goodput %g, utilisation %g under 2x overload", sched, r.Goodput, r.Utilisation)
		}
	}
	e := newEngine(in, Options{PlotBuckets: 1}, kinds[SchedFCFS])
	if err := e.setup(); err != nil {
		t.Fatal(err)
	}
	var got []int
	for range 7 {
		got = append(got, e.pick())
	}
	if diff := cmp.Diff([]int{0, 1, 2, 0, 1, 2, 0}, got); diff != "" {
		t.Errorf("dispatchers picked (-want +got):\n%s", diff)
	}
}

func TestDispatchersBeyondSlots(t *testing.T) {
	in := fleetInput(t, 30, v1alpha1.SharedStateLocal)
	res := runKind(t, in, SchedTiergate, Options{})
	want := "Load spec.dispatchers 30 exceeds the pool's 24 slots: 6 of the dispatchers get no slot and refuse every request sent to them with 503 unavailable"
	if !slices.Contains(res.Warnings, want) {
		t.Errorf("warnings %q lack %q", res.Warnings, want)
	}
	if u := res.Tenants["acme"].Refused.Unavailable; u == 0 {
		t.Error("no 503 from the dispatchers without a slot")
	}
	if strings.Contains(strings.Join(runKind(t, fleetInput(t, 24, v1alpha1.SharedStateLocal), SchedTiergate, Options{}).Warnings, "\n"), "dispatchers") {
		t.Error("24 dispatchers of a 24-slot pool: no dispatcher is idle, yet a warning")
	}
}
