package gatetest

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tiergate/tiergate/dispatcher/queue/gate"
	"github.com/tiergate/tiergate/internal/testutil"
)

// CountKind names one of a fleet's counts.
type CountKind uint8

// The counts a Gate keeps fleet-wide.
const (
	PoolSlots    CountKind = iota // in-flight slots of the pool (Name "")
	TenantSlots                   // one tenant's in-flight slots
	TierQueued                    // one tier's queued places
	TenantQueued                  // one tenant's queued places
)

// Count is one count: a kind and the tenant or tier it is of.
type Count struct {
	Kind CountKind
	Name string
}

func (c Count) String() string {
	return [...]string{"pool slots", "slots of tenant", "queued in tier", "queued of tenant"}[c.Kind] + " " + c.Name
}

// Harness adapts a Gate implementation to the conformance suite.
type Harness struct {
	// NewFleet makes an empty fleet for one case and returns how to reach
	// it: gate(name) is the Gate of dispatcher name (the same Gate for the
	// same name), count reads a live count the way the fleet keeps it.
	NewFleet func(t *testing.T) (gates func(name string) gate.Gate, count func(Count) int)
	// Crash, if set, makes dispatcher name stop renewing what it holds, as
	// if its process died; its leases then expire within LeaseTTL. A store
	// without leases leaves it nil and the expiry case is skipped.
	Crash    func(t *testing.T, name string)
	LeaseTTL time.Duration
}

// The suite's numbers: a pool of 2 slots, tenant limit 1, tier bound 3,
// tenant queue limit 2.
const (
	slots, tenantLimit, tierBound, tenantQLimit = 2, 1, 3, 2
	tier                                        = "standard"
)

// Run runs every conformance case against h.
func Run(t *testing.T, h Harness) {
	cases := []struct {
		name string
		run  func(t *testing.T, s *suite)
	}{
		{"enqueue within bounds, refusals with exact counts", caseBounds},
		{"refusals leave no trace", caseRefusalsLeaveNoTrace},
		{"claims are decided in order against slots", caseClaimsInOrder},
		{"tenant caps", caseTenantCaps},
		{"returns land before the claims of the same exchange", caseReturnsFirst},
		{"caps hold across dispatchers", caseAcrossDispatchers},
		{"every lease is accounted exactly once", caseExactlyOnce},
		{"a waiting dispatcher gets the next freed slot", caseHandOff},
		{"a releaser keeps what is left after one per waiter", caseHandOffShare},
		{"a crashed dispatcher's leases expire", caseExpiry},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			gates, count := h.NewFleet(t)
			c.run(t, &suite{t: t, h: h, gates: gates, count: count})
		})
	}
}

type suite struct {
	t     *testing.T
	h     Harness
	gates func(string) gate.Gate
	count func(Count) int
}

// enqueue asks d for a place for tenant and checks the answer.
func (s *suite) enqueue(d, tenant string, want gate.Result, wantN int) gate.Lease {
	s.t.Helper()
	p, err := s.gates(d).Enqueue(tenant, tier, tierBound, tenantQLimit)
	if err != nil {
		s.t.Fatalf("%s: Enqueue(%s): %v", d, tenant, err)
	}
	if p.Result != want || p.QueuedInTier != wantN || (p.Lease == 0) != (want != gate.OK) {
		s.t.Fatalf("%s: Enqueue(%s) = %+v, want %v with %d queued in the tier", d, tenant, p, want, wantN)
	}
	return p.Lease
}

// exchange returns rets and claims ls on d, and checks the answers.
func (s *suite) exchange(d string, rets []gate.Lease, ls []gate.Lease, want ...gate.Result) {
	s.t.Helper()
	claims := make([]gate.Claim, len(ls))
	for i, l := range ls {
		claims[i] = gate.Claim{Lease: l, TenantLimit: tenantLimit}
	}
	s.gates(d).Exchange(slots, rets, claims)
	got := make([]gate.Result, len(claims))
	for i, c := range claims {
		got[i] = c.Result
	}
	if len(want) == 0 && len(got) == 0 {
		return
	}
	if diff := cmp.Diff(want, got); diff != "" {
		s.t.Fatalf("%s: claims (-want +got):\n%s", d, diff)
	}
}

// counts checks the fleet's counts; a name missing from want is 0.
func (s *suite) counts(want map[Count]int) {
	s.t.Helper()
	got := map[Count]int{}
	for c := range want {
		got[c] = s.count(c)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		s.t.Fatalf("counts (-want +got):\n%s", diff)
	}
}

func all(pool, tq int, tenants map[string][2]int) map[Count]int {
	m := map[Count]int{{PoolSlots, ""}: pool, {TierQueued, tier}: tq}
	for name, n := range tenants {
		m[Count{TenantSlots, name}] = n[0]
		m[Count{TenantQueued, name}] = n[1]
	}
	return m
}

func caseBounds(t *testing.T, s *suite) {
	s.enqueue("d1", "a", gate.OK, 1)
	s.enqueue("d2", "a", gate.OK, 2)
	s.enqueue("d1", "a", gate.TenantQueueFull, 2) // a holds its 2 places fleet-wide
	s.enqueue("d2", "b", gate.OK, 3)
	s.enqueue("d1", "c", gate.TierFull, 3) // the tier holds its bound of 3
	s.enqueue("d2", "c", gate.TierFull, 3)
	s.counts(all(0, 3, map[string][2]int{"a": {0, 2}, "b": {0, 1}, "c": {0, 0}}))
}

func caseRefusalsLeaveNoTrace(t *testing.T, s *suite) {
	a := s.enqueue("d1", "a", gate.OK, 1)
	b := s.enqueue("d1", "b", gate.OK, 2)
	c := s.enqueue("d1", "c", gate.OK, 3)
	for range 3 {
		s.enqueue("d1", "d", gate.TierFull, 3)
	}
	// Pool of 2: a and b run, c is refused and keeps its place.
	s.exchange("d1", nil, []gate.Lease{a, b, c}, gate.OK, gate.OK, gate.PoolFull)
	s.exchange("d1", nil, []gate.Lease{c}, gate.PoolFull)
	s.counts(all(2, 1, map[string][2]int{"a": {1, 0}, "b": {1, 0}, "c": {0, 1}, "d": {0, 0}}))
}

func caseClaimsInOrder(t *testing.T, s *suite) {
	ls := []gate.Lease{s.enqueue("d1", "a", gate.OK, 1), s.enqueue("d1", "b", gate.OK, 2), s.enqueue("d1", "c", gate.OK, 3)}
	// Once the pool is full every later claim is refused, even one whose
	// tenant holds nothing: order decides, not luck.
	s.exchange("d1", nil, ls, gate.OK, gate.OK, gate.PoolFull)
	s.exchange("d1", []gate.Lease{ls[0]}, []gate.Lease{ls[2]}, gate.OK)
	s.counts(all(2, 0, map[string][2]int{"a": {0, 0}, "b": {1, 0}, "c": {1, 0}}))
}

func caseTenantCaps(t *testing.T, s *suite) {
	a1 := s.enqueue("d1", "a", gate.OK, 1)
	a2 := s.enqueue("d1", "a", gate.OK, 2)
	b1 := s.enqueue("d1", "b", gate.OK, 3)
	// a's limit is 1: its second claim is refused, b's still granted.
	s.exchange("d1", nil, []gate.Lease{a1, a2, b1}, gate.OK, gate.TenantFull, gate.OK)
	s.counts(all(2, 1, map[string][2]int{"a": {1, 1}, "b": {1, 0}}))
	s.exchange("d1", []gate.Lease{a1, b1}, []gate.Lease{a2}, gate.OK)
	s.counts(all(1, 0, map[string][2]int{"a": {1, 0}, "b": {0, 0}}))
}

func caseReturnsFirst(t *testing.T, s *suite) {
	a := s.enqueue("d1", "a", gate.OK, 1)
	b := s.enqueue("d1", "b", gate.OK, 2)
	s.exchange("d1", nil, []gate.Lease{a, b}, gate.OK, gate.OK)
	c := s.enqueue("d1", "c", gate.OK, 1)
	// The pool is full, but a's slot comes back in the same exchange.
	s.exchange("d1", []gate.Lease{a}, []gate.Lease{c}, gate.OK)
	s.counts(all(2, 0, map[string][2]int{"a": {0, 0}, "b": {1, 0}, "c": {1, 0}}))
}

func caseAcrossDispatchers(t *testing.T, s *suite) {
	a := s.enqueue("d1", "a", gate.OK, 1)
	b := s.enqueue("d2", "b", gate.OK, 2)
	s.exchange("d1", nil, []gate.Lease{a}, gate.OK)
	s.exchange("d2", nil, []gate.Lease{b}, gate.OK)
	a2 := s.enqueue("d2", "a", gate.OK, 1)
	c := s.enqueue("d1", "c", gate.OK, 2)
	s.exchange("d2", nil, []gate.Lease{a2}, gate.PoolFull)
	s.exchange("d1", []gate.Lease{a}, nil)
	// d1 gave a's slot back: d2 may run a again, which makes the pool full
	// for c on d1.
	s.exchange("d2", nil, []gate.Lease{a2}, gate.OK)
	s.exchange("d1", nil, []gate.Lease{c}, gate.PoolFull)
	s.counts(all(2, 1, map[string][2]int{"a": {1, 0}, "b": {1, 0}, "c": {0, 1}}))
}

func caseExactlyOnce(t *testing.T, s *suite) {
	var ls []gate.Lease
	for i, tenant := range []string{"a", "b", "c"} {
		ls = append(ls, s.enqueue("d1", tenant, gate.OK, i+1))
	}
	s.exchange("d1", nil, ls[:2], gate.OK, gate.OK)
	// Return everything: two slots and one queued place.
	s.exchange("d1", ls, nil)
	s.counts(all(0, 0, map[string][2]int{"a": {0, 0}, "b": {0, 0}, "c": {0, 0}}))
	// A lease returned again changes nothing, whatever the fleet holds
	// since.
	d := s.enqueue("d2", "d", gate.OK, 1)
	s.exchange("d2", nil, []gate.Lease{d}, gate.OK)
	s.exchange("d1", []gate.Lease{ls[0], ls[2]}, nil)
	s.counts(all(1, 0, map[string][2]int{"a": {0, 0}, "d": {1, 0}}))
	s.exchange("d2", []gate.Lease{d}, nil)
	s.counts(all(0, 0, map[string][2]int{"d": {0, 0}}))
}

func caseHandOff(t *testing.T, s *suite) {
	a := s.enqueue("d1", "a", gate.OK, 1)
	b := s.enqueue("d1", "b", gate.OK, 2)
	s.exchange("d1", nil, []gate.Lease{a, b}, gate.OK, gate.OK)
	c := s.enqueue("d2", "c", gate.OK, 1)
	s.exchange("d2", nil, []gate.Lease{c}, gate.PoolFull) // d2 now waits for the pool
	e := s.enqueue("d1", "e", gate.OK, 2)
	// d1 frees a slot and claims again in the same exchange: the slot is
	// d2's, and stays d2's on d1's next try.
	s.exchange("d1", []gate.Lease{a}, []gate.Lease{e}, gate.PoolFull)
	s.exchange("d1", nil, []gate.Lease{e}, gate.PoolFull)
	s.counts(all(1, 2, map[string][2]int{"a": {0, 0}, "b": {1, 0}, "c": {0, 1}, "e": {0, 1}}))
	s.exchange("d2", nil, []gate.Lease{c}, gate.OK)
	// d2 got every slot it claimed: it waits no more, so the slot d1 frees
	// next is d1's own, even though d1 waits too.
	s.exchange("d1", []gate.Lease{b}, []gate.Lease{e}, gate.OK)
	s.counts(all(2, 0, map[string][2]int{"b": {0, 0}, "c": {1, 0}, "e": {1, 0}}))
	s.exchange("d1", []gate.Lease{e}, nil)
	s.exchange("d2", []gate.Lease{c}, nil)
	s.counts(all(0, 0, map[string][2]int{"c": {0, 0}, "e": {0, 0}}))
}

func caseHandOffShare(t *testing.T, s *suite) {
	a := s.enqueue("d1", "a", gate.OK, 1)
	b := s.enqueue("d1", "b", gate.OK, 2)
	s.exchange("d1", nil, []gate.Lease{a, b}, gate.OK, gate.OK)
	c := s.enqueue("d2", "c", gate.OK, 1)
	s.exchange("d2", nil, []gate.Lease{c}, gate.PoolFull)
	e := s.enqueue("d1", "e", gate.OK, 2)
	f := s.enqueue("d1", "f", gate.OK, 3)
	// Two slots freed, one dispatcher waiting: d1 keeps one of them.
	s.exchange("d1", []gate.Lease{a, b}, []gate.Lease{e, f}, gate.OK, gate.PoolFull)
	// A refusal for a tenant's cap holds nothing back: d2 claims for e's
	// tenant, spends its hold on it, and the slot is free for anyone.
	g := s.enqueue("d2", "e", gate.OK, 3)
	s.exchange("d2", nil, []gate.Lease{g}, gate.TenantFull)
	s.exchange("d1", nil, []gate.Lease{f}, gate.OK)
	s.exchange("d2", nil, []gate.Lease{c}, gate.PoolFull)
	s.counts(all(2, 2, map[string][2]int{"c": {0, 1}, "e": {1, 1}, "f": {1, 0}}))
	s.exchange("d1", []gate.Lease{e, f}, nil)
	s.exchange("d2", []gate.Lease{c, g}, nil)
	s.counts(all(0, 0, map[string][2]int{"c": {0, 0}, "e": {0, 0}, "f": {0, 0}}))
}

func caseExpiry(t *testing.T, s *suite) {
	if s.h.Crash == nil {
		t.Skip("this store has no leases to expire")
	}
	a := s.enqueue("crashed", "a", gate.OK, 1)
	b := s.enqueue("crashed", "b", gate.OK, 2)
	s.exchange("crashed", nil, []gate.Lease{a, b}, gate.OK, gate.OK)
	s.enqueue("crashed", "c", gate.OK, 1)
	s.h.Crash(t, "crashed")
	start := time.Now()
	d := s.enqueue("alive", "d", gate.OK, 2)
	s.exchange("alive", nil, []gate.Lease{d}, gate.PoolFull)
	// Expiry runs on the store's own clock: poll it, within the TTL and a
	// margin.
	testutil.EventuallyTrue(t, s.h.LeaseTTL+2*time.Second, "the crashed dispatcher's slots to expire", func() bool {
		return s.count(Count{PoolSlots, ""}) == 0
	})
	t.Logf("capacity back %s after the crash (TTL %s)", time.Since(start).Round(time.Millisecond), s.h.LeaseTTL)
	s.exchange("alive", nil, []gate.Lease{d}, gate.OK)
	s.counts(all(1, 0, map[string][2]int{"a": {0, 0}, "c": {0, 0}, "d": {1, 0}}))
	s.exchange("alive", []gate.Lease{d}, nil)
}
