package queue

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

func countDispatched(hs []*Handle) int {
	n := 0
	for _, h := range hs {
		if dispatched(h) {
			n++
		}
	}
	return n
}

func TestSlotsShrinkAndGrowWhileInFlight(t *testing.T) {
	p := seedPolicy(4)
	q, _ := newTestQueue(t, p)
	var run, wait []*Handle
	for i := range 4 {
		run = append(run, mustAdmit(t, q, string(rune('a'+i)), "premium"))
	}
	for i := range 3 {
		wait = append(wait, mustAdmit(t, q, string(rune('p'+i)), "premium"))
	}

	shrink := seedPolicy(2)
	shrink.Version = 2
	q.UpdatePolicy(shrink)
	if got := countDispatched(run); got != 4 {
		t.Fatalf("shrinking slots cancelled in-flight work: %d of 4 still running", got)
	}
	s := q.Stats()
	if s.Slots != 2 || s.InFlight != 4 || s.PolicyVersion != 2 {
		t.Fatalf("stats after shrink: slots %d in flight %d version %d", s.Slots, s.InFlight, s.PolicyVersion)
	}
	run[0].Release()
	run[1].Release()
	if got := countDispatched(wait); got != 0 {
		t.Fatalf("dispatched %d with in-flight 2 of 2 slots", got)
	}
	run[2].Release() // 1 in flight < 2 slots: one queued job runs
	if got := countDispatched(wait); got != 1 || !dispatched(wait[0]) {
		t.Fatalf("after falling below the new slots: %d dispatched, want wait[0] only", got)
	}
	if err := checkStructure(q); err != nil {
		t.Fatal(err)
	}

	grow := seedPolicy(8)
	grow.Version = 3
	q.UpdatePolicy(grow) // the rest run at once, without another event
	if got := countDispatched(wait); got != 3 {
		t.Fatalf("after growing: %d of 3 dispatched", got)
	}
	run[3].Release()
	for _, h := range wait {
		h.Release()
	}
	assertEmpty(t, q)
}

func TestBoundsShrinkAndGrowWhileQueued(t *testing.T) {
	q, _ := newTestQueue(t, seedPolicy(1))
	blocker := mustAdmit(t, q, "blocker", "premium")
	hs := fill(t, q, "standard", []string{"a", "b"}, 5)

	small := seedPolicy(1)
	small.Tiers[1].QueueBound = 4
	small.Tiers[1].TenantQueueLimit = 2
	q.UpdatePolicy(small)
	if got := q.Stats().Tiers["standard"]; got.Queued != 10 || got.Bound != 4 {
		t.Fatalf("after shrink queued %d bound %d, want 10 kept and bound 4", got.Queued, got.Bound)
	}
	_, err := q.Admit("c", "standard")
	var r *Refusal
	if !errors.As(err, &r) || !errors.Is(r.Cause, ErrQueueFull) || r.Position != 11 {
		t.Fatalf("Admit after shrink = %v, want ErrQueueFull at 11", err)
	}
	for _, h := range hs[:7] { // 3 left: under the bound again
		h.Release()
	}
	mustAdmit(t, q, "c", "standard") // 4 queued: at the bound
	if _, err := q.Admit("d", "standard"); !errors.As(err, &r) || !errors.Is(r.Cause, ErrQueueFull) || r.Position != 5 {
		t.Fatalf("at the new bound: %v, want ErrQueueFull at 5", err)
	}

	q.UpdatePolicy(seedPolicy(1)) // grow back: bound 80, tenant limit 8
	for range 7 {
		if _, err := q.Admit("c", "standard"); err != nil {
			t.Fatalf("after growing: %v", err)
		}
	}
	if _, err := q.Admit("c", "standard"); !errors.As(err, &r) || !errors.Is(r.Cause, ErrTenantLimit) || r.Position != 12 {
		t.Fatalf("c's 9th = %v, want ErrTenantLimit at 12", err)
	}
	q.FlushQueued()
	blocker.Release()
	assertEmpty(t, q)
}

func TestRekeyOnRateOrBaseChange(t *testing.T) {
	tests := map[string]struct {
		change func(p *policy.Policy)
		want   []string
	}{
		// free at t=0 (key 120s), standard at t=30s (key 90s)
		"unchanged": {change: func(*policy.Policy) {}, want: []string{"s", "f"}},
		"faster ageing: rate 1s/pt": {
			change: func(p *policy.Policy) { p.AgeingRate = 1 }, // f 20, s 40
			want:   []string{"f", "s"},
		},
		"slower ageing: rate 60s/pt": {
			change: func(p *policy.Policy) { p.AgeingRate = 60 }, // f 1200, s 630
			want:   []string{"s", "f"},
		},
		"bases swapped": {
			change: func(p *policy.Policy) { p.Tiers[1].BasePriority, p.Tiers[2].BasePriority = 20, 10 },
			want:   []string{"f", "s"},
		},
		"only the standard base drops to free's": {
			change: func(p *policy.Policy) { p.Tiers[1].BasePriority = 20 }, // f 120, s 150
			want:   []string{"f", "s"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			q, clk := newTestQueue(t, seedPolicy(1))
			blocker := mustAdmit(t, q, "blocker", "premium")
			f := mustAdmit(t, q, "f", "free")
			clk.Step(30 * time.Second)
			s := mustAdmit(t, q, "s", "standard")
			p := seedPolicy(1)
			tc.change(p)
			q.UpdatePolicy(p)
			if err := checkStructure(q); err != nil {
				t.Fatal(err)
			}
			got := drainOrder(t, q, blocker, []*Handle{f, s})
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("order (-want +got):\n%s", diff)
			}
			assertEmpty(t, q)
		})
	}
}

func TestTenantLimitChangeWhileCapped(t *testing.T) {
	q, _ := newTestQueue(t, seedPolicy(4))
	a1 := mustAdmit(t, q, "a", "free")
	a2 := mustAdmit(t, q, "a", "free")
	if dispatched(a2) {
		t.Fatal("a2 ran past a's cap of 1")
	}
	p := seedPolicy(4)
	p.Tenants = []policy.Tenant{{ID: "a", Tier: "free", MaxConcurrency: 2}}
	q.UpdatePolicy(p)
	if !dispatched(a2) {
		t.Fatal("raising a's limit did not dispatch a2")
	}
	a3 := mustAdmit(t, q, "a", "free")
	q.UpdatePolicy(seedPolicy(4)) // back to 1: in-flight work is kept
	if s := q.Stats(); s.TenantInFlight["a"] != 2 {
		t.Fatalf("a in flight %d, want 2 kept", s.TenantInFlight["a"])
	}
	a1.Release()
	if dispatched(a3) {
		t.Fatal("a3 dispatched while a is at its lowered cap")
	}
	a2.Release()
	if !dispatched(a3) {
		t.Fatal("a3 not dispatched once a fell below its cap")
	}
	a3.Release()
	assertEmpty(t, q)
}

func TestTierRemovedAndTenantMoved(t *testing.T) {
	q, clk := newTestQueue(t, seedPolicy(1))
	blocker := mustAdmit(t, q, "blocker", "premium")
	s1 := mustAdmit(t, q, "s", "standard")
	clk.Step(time.Second)
	m1 := mustAdmit(t, q, "mover", "free")
	clk.Step(time.Second)
	m2 := mustAdmit(t, q, "mover", "free")
	clk.Step(time.Second)
	f1 := mustAdmit(t, q, "f", "free")

	// standard disappears; mover is now listed in premium.
	p := seedPolicy(1)
	p.Tiers = []policy.Tier{p.Tiers[0], p.Tiers[2]}
	p.Tenants = []policy.Tenant{{ID: "mover", Tier: "premium"}}
	q.UpdatePolicy(p)
	if err := checkStructure(q); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Admit("s", "standard"); !errors.Is(err, ErrUnknownTier) {
		t.Fatalf("Admit to a removed tier = %v, want ErrUnknownTier", err)
	}
	st := q.Stats()
	if got := st.Tiers["standard"]; !got.Retired || got.Queued != 1 {
		t.Fatalf("removed tier %+v, want retired with its 1 job", got)
	}
	if st.Tiers["premium"].Queued != 2 || st.Tiers["free"].Queued != 1 {
		t.Fatalf("mover's jobs did not move: %+v", st.Tiers)
	}
	// Premium keys: m1 1s, m2 2s; standard s1 keeps 60s; free f1 123s.
	got := drainOrder(t, q, blocker, []*Handle{s1, m1, m2, f1})
	if diff := cmp.Diff([]string{"mover", "mover", "s", "f"}, got); diff != "" {
		t.Errorf("order (-want +got):\n%s", diff)
	}
	if _, ok := q.Stats().Tiers["standard"]; ok {
		t.Fatal("an empty removed tier is still reported")
	}
	assertEmpty(t, q)
}

func TestUnlistedTenantFollowsDefaultTierWhenItsTierGoes(t *testing.T) {
	p := seedPolicy(1)
	p.DefaultTier = "free"
	q, _ := newTestQueue(t, p)
	blocker := mustAdmit(t, q, "blocker", "premium")
	h := mustAdmit(t, q, "u", "standard")
	p2 := seedPolicy(1)
	p2.DefaultTier = "free"
	p2.Tiers = []policy.Tier{p2.Tiers[0], p2.Tiers[2]}
	q.UpdatePolicy(p2)
	st := q.Stats()
	if _, ok := st.Tiers["standard"]; ok || st.Tiers["free"].Queued != 1 {
		t.Fatalf("u's job should have moved to the default tier: %+v", st.Tiers)
	}
	blocker.Release()
	if err := h.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	h.Release()
	assertEmpty(t, q)
}

func TestClientTimeoutChange(t *testing.T) {
	q, clk := newTestQueue(t, seedPolicy(1))
	blocker := mustAdmit(t, q, "blocker", "premium")
	old := mustAdmit(t, q, "a", "free")
	clk.Step(20 * time.Second)
	young := mustAdmit(t, q, "b", "free")
	clk.Step(5 * time.Second)
	// No timeout so far. A timeout of 10s expires the old job at once.
	p := seedPolicy(1)
	p.ClientTimeoutSeconds = 10
	q.UpdatePolicy(p)
	if err := waitNow(old); !errors.Is(err, ErrExpired) {
		t.Fatalf("old: %v, want ErrExpired", err)
	}
	if state(young) != stQueued {
		t.Fatal("young expired early")
	}
	if d, ok := q.NextDeadline(); !ok || !d.Equal(t0.Add(30*time.Second)) {
		t.Fatalf("NextDeadline %v %v, want t0+30s", d, ok)
	}
	// Longer timeout: the young job's deadline moves out.
	p.ClientTimeoutSeconds = 60
	q.UpdatePolicy(p)
	clk.Step(10 * time.Second)
	q.ExpireDue()
	if state(young) != stQueued {
		t.Fatal("young expired under the old, shorter timeout")
	}
	p.ClientTimeoutSeconds = 0
	q.UpdatePolicy(p)
	if _, ok := q.NextDeadline(); ok {
		t.Fatal("NextDeadline with expiry disabled")
	}
	blocker.Release()
	young.Release()
	assertEmpty(t, q)
}

func TestScaleToZeroKeepsQueuedWork(t *testing.T) {
	q, _ := newTestQueue(t, seedPolicy(1))
	a := mustAdmit(t, q, "a", "premium")
	b := mustAdmit(t, q, "b", "premium")
	zero := seedPolicy(0)
	zero.Backends = nil
	q.UpdatePolicy(zero)
	if _, err := q.Admit("c", "premium"); !errors.Is(err, ErrNoCapacity) {
		t.Fatalf("Admit at 0 slots = %v, want ErrNoCapacity", err)
	}
	a.Release()
	if dispatched(b) {
		t.Fatal("dispatched with 0 slots")
	}
	q.UpdatePolicy(seedPolicy(1))
	if !dispatched(b) {
		t.Fatal("b not dispatched when slots came back")
	}
	b.Release()
	assertEmpty(t, q)
}
