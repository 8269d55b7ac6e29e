package queue

import (
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func TestStatsSnapshot(t *testing.T) {
	q, clk := newTestQueue(t, seedPolicy(2))
	if s := q.Stats(); s.ServiceTime != 0 || s.Completed != 0 {
		t.Fatalf("fresh stats %+v", s)
	}
	a := mustAdmit(t, q, "a", "premium")
	b := mustAdmit(t, q, "b", "standard")
	c := mustAdmit(t, q, "c", "free")
	clk.Step(3 * time.Second)
	d := mustAdmit(t, q, "d", "free")
	clk.Step(2 * time.Second)
	if _, err := q.Admit("d", "free"); err != nil { // d is under free's queue limit of 4
		t.Fatal(err)
	}

	s := q.Stats()
	if got := q.Queued(); got != s.Queued {
		t.Errorf("Queued() = %d, Stats().Queued = %d", got, s.Queued)
	}
	// One dispatch each from premium and standard, 5s ago: about 1 per
	// 5s observed so far (1·e^-0.5 / (10s·(1-e^-0.5)) = 0.154/s).
	for _, tier := range []string{"premium", "standard"} {
		if r := s.Tiers[tier].DrainRate; r < 0.15 || r > 0.16 {
			t.Errorf("%s drain rate %.3f/s, want 0.154", tier, r)
		}
		ts := s.Tiers[tier]
		ts.DrainRate = 0
		s.Tiers[tier] = ts
	}
	// Offered load over the 5s since the policy, with τ = 60s: each
	// arrival weighs e^(−age/τ), over τ(1 − e^(−5s/τ)).
	offered := func(ages ...float64) float64 {
		var c float64
		for _, a := range ages {
			c += math.Exp(-a / 60)
		}
		return c / (60 * (1 - math.Exp(-5.0/60)))
	}
	want := Stats{
		Slots: 2, InFlight: 2, Queued: 3,
		TenantInFlight: map[string]int{"a": 1, "b": 1},
		PolicyVersion:  1,
		Totals:         Totals{Admitted: 5, Dispatched: 2},
		Tiers: map[string]TierStats{
			"premium":  {Bound: 20, InFlight: 1, Dispatched: 1, OfferedLoad: offered(5), Refused: map[string]uint64{"capacity": 0, "tenant_limit": 0}},
			"standard": {Bound: 80, InFlight: 1, Dispatched: 1, OfferedLoad: offered(5), Refused: map[string]uint64{"capacity": 0, "tenant_limit": 0}},
			"free": {Queued: 3, Bound: 120, OldestAge: 5 * time.Second, OfferedLoad: offered(5, 2, 0),
				Refused: map[string]uint64{"capacity": 0, "tenant_limit": 0}},
		},
	}
	if diff := cmp.Diff(want, s, cmpopts.EquateApprox(1e-12, 0)); diff != "" {
		t.Errorf("Stats (-want +got):\n%s", diff)
	}
	clk.Step(time.Second)
	a.ReleaseServed() // c runs: 6s of waiting
	b.ReleaseServed() // d's first runs
	if got := c.Waited(); got != 6*time.Second {
		t.Errorf("c waited %s", got)
	}
	clk.Step(time.Second)
	c.ReleaseServed()
	d.ReleaseServed() // d's second runs
	s = q.Stats()
	if got := q.Queued(); got != 0 {
		t.Errorf("Queued() after the releases = %d, want 0", got)
	}
	if s.Queued != 0 || s.InFlight != 1 || s.Completed != 4 || s.Served != 4 || s.Tiers["free"].Dispatched != 3 {
		t.Fatalf("after releases %+v", s)
	}
	// Service times: a and b 6s, c and d 1s: 6, 6, 5.5, 5.05 in the EWMA.
	if s.ServiceTime != 5050*time.Millisecond {
		t.Errorf("ServiceTime = %s, want 5.05s", s.ServiceTime)
	}
}

func TestMeasuredDrainRate(t *testing.T) {
	q, clk := newTestQueue(t, seedPolicy(2))
	for range 40 { // 10s of premium dispatches at 4/s
		h := mustAdmit(t, q, "p", "premium")
		clk.Step(250 * time.Millisecond)
		h.ReleaseServed()
	}
	m := q.Stats().Measured()
	if r := m.DrainRates["premium"]; r < 3.4 || r > 4.4 {
		t.Errorf("premium drain rate %.2f/s, want about 4", r)
	}
	if _, ok := m.DrainRates["free"]; ok {
		t.Errorf("free has a drain rate without dispatches: %v", m.DrainRates)
	}
	if m.Completed != 40 || m.ServiceTimeSeconds != 0.25 {
		t.Errorf("Measured %+v", m)
	}
}

// Only served jobs are service-time samples: jobs released without
// ReleaseServed (failed, abandoned at dispatch, cancelled) leave the EWMA
// and the Ack's count as they were, however fast they ended.
func TestOnlyServedJobsMeasure(t *testing.T) {
	q, clk := newTestQueue(t, seedPolicy(2))
	for range 3 {
		h := mustAdmit(t, q, "p", "premium")
		clk.Step(2 * time.Second)
		h.ReleaseServed()
	}
	for range 5 {
		h := mustAdmit(t, q, "p", "premium")
		clk.Step(10 * time.Millisecond)
		h.Release()
	}
	s := q.Stats()
	got := struct {
		ServiceTime       time.Duration
		Served, Completed uint64
		Measured          float64
		MeasuredCompleted int64
	}{s.ServiceTime, s.Served, s.Completed, s.Measured().ServiceTimeSeconds, s.Measured().Completed}
	want := got
	want.ServiceTime, want.Served, want.Completed, want.Measured, want.MeasuredCompleted = 2*time.Second, 3, 8, 2, 3
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got)\n%s", diff)
	}
}
