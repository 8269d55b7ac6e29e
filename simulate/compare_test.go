package simulate

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestSameTrafficForEveryScheduler: with the same seed every scheduler sees
// the same requests. An open-loop tenant's arrivals and service times are
// identical request for request. A closed-loop client sends its next
// request when its last one ends, which depends on the scheduler, but its
// k-th request needs the same service time under every scheduler.
func TestSameTrafficForEveryScheduler(t *testing.T) {
	type draw struct{ at, service time.Duration }
	type input struct {
		in      *Input
		compare []string
	}
	inputs := map[string]input{
		"small (every arrival process)":   {read(t, "../examples/simulate/small.yaml"), Baselines},
		"seed overload (closed-loop too)": {seedInput(t, "pool.yaml", "load-overload.yaml"), Baselines},
		"service times from tokens":       {read(t, tokensDir+"heavy-tail-pool.yaml", tokensDir+"heavy-tail.yaml"), append(append([]string{}, Baselines...), Variants...)},
	}
	for name, tc := range inputs {
		in := tc.in
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			draws := map[string]map[string][]draw{} // scheduler, tenant
			opts := Options{Compare: tc.compare, checkInvariants: true, onRequest: func(sched, tenant string, at, service time.Duration) {
				if draws[sched] == nil {
					draws[sched] = map[string][]draw{}
				}
				draws[sched][tenant] = append(draws[sched][tenant], draw{at, service})
			}}
			if _, err := Run(in, opts); err != nil {
				t.Fatal(err)
			}
			if len(draws) != 1+len(tc.compare) {
				t.Fatalf("requests seen from %d schedulers, want %d", len(draws), 1+len(tc.compare))
			}
			for _, tl := range in.Load.Spec.Tenants {
				want := draws[SchedTiergate][tl.Tenant]
				if len(want) < 3 {
					t.Fatalf("tenant %s sent %d requests: too few to compare", tl.Tenant, len(want))
				}
				for _, sched := range tc.compare {
					got := draws[sched][tl.Tenant]
					if tl.Arrival.Process != ProcClosed {
						if diff := cmp.Diff(want, got, cmp.AllowUnexported(draw{})); diff != "" {
							t.Errorf("tenant %s under %s: requests differ from tiergate's (-tiergate +%s):\n%s", tl.Tenant, sched, sched, diff)
						}
						continue
					}
					n := min(len(want), len(got))
					ws, gs := make([]time.Duration, n), make([]time.Duration, n)
					for i := range n {
						ws[i], gs[i] = want[i].service, got[i].service
					}
					if n < 3 || !slices.Equal(ws, gs) {
						t.Errorf("closed-loop tenant %s under %s: service times of its first %d requests differ from tiergate's:\n%v\n%v", tl.Tenant, sched, n, ws, gs)
					}
				}
			}
		})
	}
}

// compareFigures are the figures TestCompareExact derives by hand.
type compareFigures struct {
	Served, Abandoned, AbandonedInFlight int64
	Wasted, Goodput, Utilisation, SLO    float64
	Jain                                 float64
	Waits                                int64
}

// TestCompareExact derives goodput, waste, SLO attainment and Jain's index
// by hand for every scheduler. One slot, constant 10 s service, 40 s:
// p arrives at 0 and runs 0–10; h arrives at 1 and its client gives up at
// 6; i arrives at 2 and its client gives up at 17.
//
//   - tiergate and strict watch their clients: h is withdrawn at 6; i runs
//     from 10 and is cancelled at 17, 7 slot-seconds for nobody.
//   - fcfs and seed do not: h runs 10–20 and i 20–30 for clients that had
//     left, 20 slot-seconds wasted.
//
// Only p is served, within its tolerableWait: goodput 1/40, SLO 1/3 of the
// offered, and Jain's index over p, h and i's throughput (1/40, 0, 0) is
// 1/3.
func TestCompareExact(t *testing.T) {
	load := exactLoad("",
		"{tenant: p, arrival: {process: burst, at: 0s, count: 1}}",
		"{tenant: h, arrival: {process: burst, at: 1s, count: 1}, timeout: 5s}",
		"{tenant: i, arrival: {process: burst, at: 2s, count: 1}, timeout: 15s}")
	watching := compareFigures{Served: 1, Abandoned: 2, AbandonedInFlight: 1, Wasted: 7, Goodput: 0.025, Utilisation: 17.0 / 40, SLO: 0.333333, Jain: 0.333333, Waits: 2}
	blind := compareFigures{Served: 1, Abandoned: 2, Wasted: 20, Goodput: 0.025, Utilisation: 30.0 / 40, SLO: 0.333333, Jain: 0.333333, Waits: 1}
	want := map[string]compareFigures{SchedTiergate: watching, SchedStrict: watching, SchedFCFS: blind, SchedSeed: blind}

	in, err := Read(src("exact.yaml", exactPool(1, "100s")+load))
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(in, Options{Compare: Baselines, checkInvariants: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, sched := range res.Schedulers() {
		r := res.Of(sched)
		tr := r.Tiers["t"]
		got := compareFigures{Served: tr.Served, Abandoned: tr.Abandoned, AbandonedInFlight: tr.AbandonedInFlight,
			Wasted: r.WastedServiceSeconds, Goodput: r.Goodput, Utilisation: r.Utilisation, SLO: tr.SLOAttainment, Jain: tr.Jain,
			Waits: tr.Wait.Count}
		w := want[sched]
		w.Utilisation = round6(w.Utilisation)
		if diff := cmp.Diff(w, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", sched, diff)
		}
	}
}

// TestCompareWindowAndSLO: waste counts only slot-seconds after the
// warm-up, and a request served later than its tolerableWait misses the
// SLO. One slot, 10 s service; a and b arrive at 0 (b waits 10 s, over
// W = 5 s), c at 1 with a 5 s timeout.
func TestCompareWindowAndSLO(t *testing.T) {
	tests := map[string]struct {
		warmup string
		sched  string
		want   compareFigures
	}{
		// fcfs: c is computed 20–30 for nobody; from 15 s on, 10 of its
		// slot-seconds count. a and b arrived in the warm-up: no SLO.
		"fcfs, warm-up 15s": {warmup: "15s", sched: SchedFCFS, want: compareFigures{Served: 1, Wasted: 10, Goodput: 0.04, Utilisation: 15.0 / 25, Jain: 0.5}},
		// Without warm-up: a within W, b not; c is lost. SLO 1/3.
		"fcfs": {sched: SchedFCFS, want: compareFigures{Served: 2, Abandoned: 1, Wasted: 10, Goodput: 0.05, Utilisation: 30.0 / 40, SLO: 0.333333, Jain: 0.5, Waits: 2}},
		// tiergate: W = 5 s gives a bound of 1, so c is refused on arrival
		// (b is queued); nothing is wasted.
		"tiergate": {sched: SchedTiergate, want: compareFigures{Served: 2, Goodput: 0.05, Utilisation: 20.0 / 40, SLO: 0.333333, Jain: 0.5, Waits: 2}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			extra := ""
			if tc.warmup != "" {
				extra = "  warmup: " + tc.warmup + "\n"
			}
			in, err := Read(src("exact.yaml", exactPool(1, "5s")+exactLoad(extra,
				"{tenant: a, arrival: {process: burst, at: 0s, count: 2}}",
				"{tenant: c, arrival: {process: burst, at: 1s, count: 1}, timeout: 5s}")))
			if err != nil {
				t.Fatal(err)
			}
			r := runKind(t, in, tc.sched, Options{})
			tr := r.Tiers["t"]
			got := compareFigures{Served: tr.Served, Abandoned: tr.Abandoned, AbandonedInFlight: tr.AbandonedInFlight,
				Wasted: r.WastedServiceSeconds, Goodput: r.Goodput, Utilisation: r.Utilisation, SLO: tr.SLOAttainment, Jain: tr.Jain,
				Waits: tr.Wait.Count}
			tc.want.Utilisation = round6(tc.want.Utilisation)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestCompareNames(t *testing.T) {
	tests := map[string]struct {
		value string
		want  []string
		err   string
	}{
		"all":        {value: "fcfs,strict,seed", want: []string{"fcfs", "strict", "seed"}},
		"spaces":     {value: " seed , fcfs", want: []string{"seed", "fcfs"}},
		"empty":      {value: "", err: "no scheduler named (want fcfs, strict, seed, vtc or vtc-tokenbound)"},
		"unknown":    {value: "fcfs,lifo", err: `scheduler "lifo" is unknown (want fcfs, strict, seed, vtc or vtc-tokenbound)`},
		"empty item": {value: "fcfs,", err: `scheduler "" is unknown (want fcfs, strict, seed, vtc or vtc-tokenbound)`},
		"twice":      {value: "seed,seed", err: `scheduler "seed" is named twice`},
		"tiergate":   {value: "tiergate", err: `scheduler "tiergate" always runs; name the ones to run next to it (fcfs, strict, seed, vtc or vtc-tokenbound)`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := ParseCompare(tc.value)
			if tc.err != "" {
				if err == nil || err.Error() != tc.err || !errors.Is(err, ErrScheduler) {
					t.Fatalf("error %v, want ErrScheduler %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
	// Run refuses the same lists.
	_, err := Run(read(t, "../examples/simulate/small.yaml"), Options{Compare: []string{"fifo"}})
	if !errors.Is(err, ErrScheduler) || err.Error() != `scheduler "fifo" is unknown (want fcfs, strict, seed, vtc or vtc-tokenbound)` {
		t.Errorf("Run: %v", err)
	}
}
