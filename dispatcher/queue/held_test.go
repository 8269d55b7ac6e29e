package queue

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

// heldPolicy is the seed's pool at zero replicas, holding for a first
// replica 12s away: premium cannot wait that long (bound 0), standard
// holds 3 and free 4, each tenant 2. No client timeout unless set.
func heldPolicy(version int64) *policy.Policy {
	p := seedPolicy(0)
	p.Version = version
	p.ColdStartSeconds = 12
	p.ServiceRate = 2.0 / 3
	p.Backends = nil
	p.Tiers[0].QueueBound, p.Tiers[0].TenantConcurrencyLimit, p.Tiers[0].TenantQueueLimit = 0, 1, 1
	p.Tiers[1].QueueBound, p.Tiers[1].TenantConcurrencyLimit, p.Tiers[1].TenantQueueLimit = 3, 1, 2
	p.Tiers[2].QueueBound, p.Tiers[2].TenantConcurrencyLimit, p.Tiers[2].TenantQueueLimit = 4, 1, 2
	return p
}

// firstReplica is the policy of the first Ready replica: slots slots,
// one backend.
func firstReplica(version int64, slots int) *policy.Policy {
	p := seedPolicy(slots)
	p.Version = version
	return p
}

func mustValid(t *testing.T, p *policy.Policy) *policy.Policy {
	t.Helper()
	if err := p.Validate(); err != nil {
		t.Fatalf("test policy invalid: %v", err)
	}
	return p
}

func TestHeldAtZeroRefusals(t *testing.T) {
	q, _ := newTestQueue(t, mustValid(t, heldPolicy(1)))
	_, err := q.Admit("p", "premium")
	var cold *ColdStartRefusal
	if !errors.As(err, &cold) || !errors.Is(err, ErrNoCapacity) {
		t.Fatalf("premium at zero: %v, want a *ColdStartRefusal wrapping ErrNoCapacity", err)
	}
	if diff := cmp.Diff(ColdStartRefusal{Tier: "premium", ColdStart: 12 * time.Second}, *cold); diff != "" {
		t.Errorf("refusal (-want +got):\n%s", diff)
	}
	var held []*Handle
	for _, tenant := range []string{"a", "a", "b"} {
		held = append(held, mustAdmit(t, q, tenant, "standard"))
	}
	_, err = q.Admit("c", "standard")
	var ref *Refusal
	if !errors.As(err, &ref) || !errors.Is(err, ErrQueueFull) || ref.Position != 4 || ref.Tier != "standard" {
		t.Fatalf("standard past its bound of 3: %v, want ErrQueueFull at position 4", err)
	}
	// The cold start, then 4 at the first replica's 2/3 per second: 18s,
	// within standard's W of 20s.
	if ref.RetryAfter != 18*time.Second {
		t.Errorf("Retry-After at zero %s, want 12s + ⌈4 × 1.5s⌉ = 18s", ref.RetryAfter)
	}
	mustAdmit(t, q, "d", "free")
	mustAdmit(t, q, "d", "free")
	if _, err := q.Admit("d", "free"); !errors.Is(err, ErrTenantLimit) {
		t.Fatalf("a third free request of d: %v, want ErrTenantLimit", err)
	}
	for i, h := range held {
		if state(h) != stQueued {
			t.Errorf("held request %d: state %d, want queued", i, state(h))
		}
	}
	s := q.Stats()
	got := [4]int{s.Slots, s.InFlight, s.Queued, s.Tiers["standard"].Queued}
	if got != [4]int{0, 0, 5, 3} {
		t.Errorf("slots, in flight, queued, standard queued = %v, want [0 0 5 3]", got)
	}
	if r := s.Tiers["standard"].Refused[CauseCapacity]; r != 1 {
		t.Errorf("standard capacity refusals %d, want 1", r)
	}
}

// Without a cold start a policy with 0 slots refuses every tier with the
// plain ErrNoCapacity, whatever its bounds.
func TestZeroWithoutColdStartRefusesEveryTier(t *testing.T) {
	p := heldPolicy(1)
	p.ColdStartSeconds = 0
	for i := range p.Tiers {
		p.Tiers[i].QueueBound = 0
	}
	q, _ := newTestQueue(t, mustValid(t, p))
	for _, tier := range []string{"premium", "standard", "free"} {
		_, err := q.Admit("a", tier)
		var cold *ColdStartRefusal
		if !errors.Is(err, ErrNoCapacity) || errors.As(err, &cold) {
			t.Errorf("%s: %v, want the plain ErrNoCapacity", tier, err)
		}
	}
	if s := q.Stats(); s.Queued != 0 || s.Totals.Admitted != 0 {
		t.Errorf("queued %d admitted %d, want nothing", s.Queued, s.Totals.Admitted)
	}
}

// Held requests dispatch in key order, not in arrival or tier order, on
// the first policy with slots: free's f0 came 70s before standard's s2,
// more than the 60s (10 points × 6s) standard is worth, so it goes first.
func TestHeldDispatchInKeyOrderOnTheFirstPolicyWithSlots(t *testing.T) {
	q, clk := newTestQueue(t, mustValid(t, heldPolicy(1)))
	var order []string
	names := map[*Handle]string{}
	hold := func(name, tenant, tier string) *Handle {
		h := mustAdmit(t, q, tenant, tier)
		names[h] = name
		return h
	}
	f0 := hold("f0", "f", "free")     // key 120 + 0
	s0 := hold("s0", "a", "standard") // 60 + 0
	clk.Step(5 * time.Second)
	s1 := hold("s1", "b", "standard") // 60 + 5
	clk.Step(65 * time.Second)
	s2 := hold("s2", "c", "standard") // 60 + 70
	f1 := hold("f1", "g", "free")     // 120 + 70
	q.setOnDispatch(func(h *Handle) { order = append(order, names[h]) })

	// A second held policy changes nothing.
	q.UpdatePolicy(mustValid(t, heldPolicy(2)))
	if len(order) != 0 {
		t.Fatalf("a held policy dispatched %v", order)
	}
	clk.Step(12 * time.Second) // the cold start
	q.UpdatePolicy(mustValid(t, firstReplica(3, 2)))
	if diff := cmp.Diff([]string{"s0", "s1"}, order); diff != "" {
		t.Fatalf("dispatched on the first policy (-want +got):\n%s", diff)
	}
	if s0.Waited() != 82*time.Second || s1.Waited() != 77*time.Second {
		t.Errorf("waits %s and %s, want 82s and 77s: the whole time held", s0.Waited(), s1.Waited())
	}
	for _, h := range []*Handle{s0, s1, f0, s2, f1} {
		if err := h.Wait(context.Background()); err != nil {
			t.Fatalf("%s: %v", names[h], err)
		}
		h.Release()
	}
	if diff := cmp.Diff([]string{"s0", "s1", "f0", "s2", "f1"}, order); diff != "" {
		t.Errorf("dispatch order (-want +got):\n%s", diff)
	}
	assertEmpty(t, q)
}

// Held requests end like queued ones: expired after the client timeout,
// abandoned by their client, drained on shutdown; each exactly once.
func TestHeldRequestsExpireAbandonAndDrain(t *testing.T) {
	p := heldPolicy(1)
	p.ClientTimeoutSeconds = 30
	q, clk := newTestQueue(t, mustValid(t, p))
	old := mustAdmit(t, q, "a", "standard")
	clk.Step(10 * time.Second)
	gone := mustAdmit(t, q, "b", "standard")
	left := mustAdmit(t, q, "c", "free")
	if s := q.Stats(); s.Tiers["standard"].OldestAge != 10*time.Second {
		t.Errorf("oldest held age %s, want 10s", s.Tiers["standard"].OldestAge)
	}
	if dl, ok := q.NextDeadline(); !ok || !dl.Equal(t0.Add(30*time.Second)) {
		t.Errorf("next deadline %v %v, want t0+30s", dl, ok)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := gone.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("abandoned held request: %v", err)
	}
	clk.Step(20 * time.Second)
	q.ExpireDue()
	if err := old.Wait(context.Background()); !errors.Is(err, ErrExpired) {
		t.Fatalf("held for the client timeout: %v, want ErrExpired", err)
	}
	q.Drain()
	if _, err := q.Admit("d", "free"); !errors.Is(err, ErrDraining) {
		t.Fatalf("admission while draining: %v", err)
	}
	q.FlushQueued()
	if err := left.Wait(context.Background()); !errors.Is(err, ErrDrained) {
		t.Fatalf("held at shutdown: %v, want ErrDrained", err)
	}
	for _, h := range []*Handle{old, gone, left} {
		h.Release() // a no-op on ended jobs
	}
	want := Totals{Admitted: 3, Abandoned: 1, Expired: 1, Drained: 1}
	if diff := cmp.Diff(want, q.Stats().Totals); diff != "" {
		t.Errorf("totals (-want +got):\n%s", diff)
	}
	assertEmpty(t, q)
}

// In fleet mode the pump claims nothing while held: no exchange runs at
// slots 0. The first policy with slots starts it, and the held requests
// get their slots from the Gate in key order.
func TestHeldFleetClaimsNothingUntilSlots(t *testing.T) {
	f, qs := fleetQueues(t, 1, 1)
	q := qs[0]
	held := heldPolicy(2)
	held.SharedState = "Redis"
	q.UpdatePolicy(mustValid(t, held))
	before := f.Calls("Exchange")
	a := mustAdmit(t, q, "a", "standard")
	b := mustAdmit(t, q, "b", "standard")
	q.Kick()
	if n := f.Calls("Exchange") - before; n != 0 {
		t.Fatalf("%d exchanges while held, want none", n)
	}
	if _, err := q.Admit("p", "premium"); !errors.As(err, new(*ColdStartRefusal)) {
		t.Fatalf("premium at zero in fleet mode: %v", err)
	}
	first := firstReplica(3, 1)
	first.SharedState = "Redis"
	q.UpdatePolicy(mustValid(t, first))
	if !dispatched(a) || dispatched(b) {
		t.Fatalf("after the first policy: a %v b %v, want a only", dispatched(a), dispatched(b))
	}
	a.Release()
	if !dispatched(b) {
		t.Fatal("b not dispatched after a's release")
	}
	b.Release()
	assertFleetIdle(t, f, q)
}

// At zero the measured drain rate is that of replicas that are gone:
// Retry-After is the cold start plus the position at the first replica's
// rate, however fast the tier drained before.
func TestHeldRetryAfterIgnoresTheOldDrainRate(t *testing.T) {
	q, clk := newTestQueue(t, seedPolicy(4))
	for range 40 { // 10s of standard at 4/s
		h := mustAdmit(t, q, "s", "standard")
		clk.Step(250 * time.Millisecond)
		h.Release()
	}
	if r := q.Stats().Tiers["standard"].DrainRate; r < 3 {
		t.Fatalf("standard drained at %.2f/s before zero, want about 4", r)
	}
	q.UpdatePolicy(mustValid(t, heldPolicy(2)))
	for _, tenant := range []string{"a", "b", "c"} {
		mustAdmit(t, q, tenant, "standard")
	}
	_, err := q.Admit("d", "standard")
	var ref *Refusal
	if !errors.As(err, &ref) || ref.RetryAfter != 18*time.Second {
		t.Fatalf("full at zero: %v, want Retry-After 18s (12s + ⌈4 × 1.5s⌉)", err)
	}
}
