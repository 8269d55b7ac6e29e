package queue

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

func TestMeterRate(t *testing.T) {
	sec := int64(time.Second)
	tau := offeredWindow.Seconds()
	// every is events at 0, step, 2×step, … before end, in ns.
	every := func(step, end int64) []int64 {
		var out []int64
		for at := int64(0); at < end; at += step {
			out = append(out, at)
		}
		return out
	}
	tests := map[string]struct {
		events []int64
		now    int64
		want   float64
		tol    float64 // relative
	}{
		"nothing offered": {now: 30 * sec, want: 0},
		// 2/s for 10 minutes: the steady state.
		"steady 2/s, many windows": {events: every(sec/2, 600*sec), now: 600 * sec, want: 2, tol: 0.01},
		// The normalisation by the span observed makes the first seconds
		// read the same rate.
		"steady 2/s, five seconds in": {events: every(sec/2, 5*sec), now: 5 * sec, want: 2, tol: 0.05},
		// One request read at once: the span is floored at 1s.
		"one request at the start": {events: []int64{0}, now: 0, want: 1 / (tau * -math.Expm1(-1/tau)), tol: 1e-12},
		// After the load stops the rate decays by e^(−t/τ): one window later
		// to 1/e of the steady 2/s.
		"a window after 2/s stopped": {events: every(sec/2, 600*sec), now: 660 * sec, want: 2 / math.E, tol: 0.01},
		// Ten requests at one instant, read 30s later over 30s observed.
		"a burst, read later": {events: make([]int64, 10), now: 30 * sec,
			want: 10 * math.Exp(-30/tau) / (tau * -math.Expm1(-30/tau)), tol: 1e-12},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var m meter
			for _, at := range tc.events {
				m.add(at)
			}
			got := m.rate(tc.now, 0)
			if diff := cmp.Diff(tc.want, got, cmpopts.EquateApprox(tc.tol, 0)); diff != "" {
				t.Errorf("rate (-want +got):\n%s", diff)
			}
		})
	}
}

// Offered load counts what reached the queue for want of room or was
// admitted: admissions, capacity refusals, and refusals because the pool
// had no slots (plain or for a cold start). A tenant over its own queue
// limit and a tier the policy does not know are not offered load.
func TestOfferedLoadCountsDemandNotTenantLimits(t *testing.T) {
	p := seedPolicy(1)
	p.Tiers[1].QueueBound, p.Tiers[1].TenantQueueLimit = 3, 1 // standard
	q, clk := newTestQueue(t, mustValid(t, p))
	clk.Step(10 * time.Second)
	var hs []*Handle
	for _, tenant := range []string{"a", "b", "c"} { // a runs, b and c queue
		hs = append(hs, mustAdmit(t, q, tenant, "standard"))
	}
	if _, err := q.Admit("b", "standard"); !errors.Is(err, ErrTenantLimit) {
		t.Fatalf("b's second: %v, want ErrTenantLimit", err)
	}
	hs = append(hs, mustAdmit(t, q, "d", "standard"))
	if _, err := q.Admit("e", "standard"); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("e: %v, want ErrQueueFull", err)
	}
	if _, err := q.Admit("e", "nosuch"); !errors.Is(err, ErrUnknownTier) {
		t.Fatalf("an unknown tier: %v", err)
	}
	zero := seedPolicy(0)
	zero.Version, zero.Backends = 2, nil
	q.UpdatePolicy(mustValid(t, zero))
	if _, err := q.Admit("e", "free"); !errors.Is(err, ErrNoCapacity) {
		t.Fatalf("at zero: %v, want ErrNoCapacity", err)
	}
	q.UpdatePolicy(mustValid(t, heldPolicy(3)))
	if _, err := q.Admit("f", "premium"); !errors.As(err, new(*ColdStartRefusal)) {
		t.Fatalf("premium held at zero: %v, want a *ColdStartRefusal", err)
	}

	// Every request came at t0+10s and is read there, over the 10s since
	// the first policy.
	per := 1 / (offeredWindow.Seconds() * -math.Expm1(-10/offeredWindow.Seconds()))
	m := q.Stats().Measured()
	want := policy.Measured{
		Queued:      3,
		OfferedLoad: map[string]float64{"standard": 5 * per, "free": per, "premium": per},
	}
	if diff := cmp.Diff(want, m, cmpopts.EquateApprox(1e-12, 0)); diff != "" {
		t.Errorf("Measured (-want +got):\n%s", diff)
	}
	for _, h := range hs {
		h.Release()
	}
}
