package queue

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	clocktesting "k8s.io/utils/clock/testing"
)

// fakeGate is an in-memory stand-in for the fleet-wide store: it enforces
// the pool and tenant counts exactly, as the Redis gate must.
type fakeGate struct {
	mu            sync.Mutex
	inFlight      int
	tenantIn      map[string]int
	tierQueued    map[string]int
	tenantQueued  map[string]int
	maxInFlight   int
	maxTenantIn   map[string]int
	enqueueErr    error
	violations    []string
	acquireCalls  int
	poolFullCount int
}

func newFakeGate() *fakeGate {
	return &fakeGate{tenantIn: map[string]int{}, tierQueued: map[string]int{}, tenantQueued: map[string]int{}, maxTenantIn: map[string]int{}}
}

func (g *fakeGate) Enqueue(tenant, tier string, bound, qlimit int) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.enqueueErr != nil {
		return 0, g.enqueueErr
	}
	if g.tierQueued[tier] >= bound {
		return g.tierQueued[tier], ErrQueueFull
	}
	if g.tenantQueued[tenant] >= qlimit {
		return g.tierQueued[tier], ErrTenantLimit
	}
	g.tierQueued[tier]++
	g.tenantQueued[tenant]++
	return g.tierQueued[tier], nil
}

func (g *fakeGate) Dequeue(tenant, tier string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.tierQueued[tier]--
	g.tenantQueued[tenant]--
	g.check()
}

func (g *fakeGate) Acquire(tenant, tier string, slots, limit int) AcquireResult {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.acquireCalls++
	if g.inFlight >= slots {
		g.poolFullCount++
		return PoolFull
	}
	if g.tenantIn[tenant] >= limit {
		return TenantFull
	}
	g.tierQueued[tier]--
	g.tenantQueued[tenant]--
	g.inFlight++
	g.tenantIn[tenant]++
	g.maxInFlight = max(g.maxInFlight, g.inFlight)
	g.maxTenantIn[tenant] = max(g.maxTenantIn[tenant], g.tenantIn[tenant])
	g.check()
	return Granted
}

func (g *fakeGate) Release(tenant, tier string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.inFlight--
	g.tenantIn[tenant]--
	g.check()
}

func (g *fakeGate) check() {
	if g.inFlight < 0 {
		g.violations = append(g.violations, "negative in-flight")
	}
	for k, v := range g.tierQueued {
		if v < 0 {
			g.violations = append(g.violations, "negative queued in tier "+k)
		}
	}
	for k, v := range g.tenantQueued {
		if v < 0 {
			g.violations = append(g.violations, "negative queued for tenant "+k)
		}
	}
}

func (g *fakeGate) assertZero(t *testing.T) {
	t.Helper()
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.violations) > 0 {
		t.Fatalf("gate violations: %v", g.violations)
	}
	if g.inFlight != 0 {
		t.Fatalf("gate in flight %d", g.inFlight)
	}
	for _, m := range []map[string]int{g.tenantIn, g.tierQueued, g.tenantQueued} {
		for k, v := range m {
			if v != 0 {
				t.Fatalf("gate count %s = %d", k, v)
			}
		}
	}
}

func TestGateCapsAcrossTwoDispatchers(t *testing.T) {
	g := newFakeGate()
	clk := clocktesting.NewFakeClock(t0)
	p := seedPolicy(3)
	p.SharedState = "Redis"
	p.Tiers[0].TenantConcurrencyLimit = 2 // premium
	a, b := New(clk, WithGate(g)), New(clk, WithGate(g))
	a.UpdatePolicy(p)
	b.UpdatePolicy(p)

	a1 := mustAdmit(t, a, "t", "premium")
	a2 := mustAdmit(t, a, "t", "premium")
	b1 := mustAdmit(t, b, "t", "premium") // t holds 2 fleet-wide: waits
	if !dispatched(a1) || !dispatched(a2) || dispatched(b1) {
		t.Fatalf("a1 %v a2 %v b1 %v; want a1, a2 only", dispatched(a1), dispatched(a2), dispatched(b1))
	}
	u1 := mustAdmit(t, b, "u", "premium") // another tenant takes the 3rd slot
	if !dispatched(u1) {
		t.Fatal("u1 not dispatched past the gate-blocked tenant")
	}
	v1 := mustAdmit(t, b, "v", "premium") // pool full fleet-wide
	if dispatched(v1) {
		t.Fatal("v1 dispatched beyond the pool's 3 slots")
	}
	if s := b.Stats(); s.InFlight != 1 || s.Queued != 2 {
		t.Fatalf("b: in flight %d queued %d, want 1 and 2", s.InFlight, s.Queued)
	}

	a1.Release() // a remote release: b learns of it only through Kick
	if dispatched(b1) {
		t.Fatal("b dispatched without an event")
	}
	b.Kick()
	if !dispatched(b1) || dispatched(v1) {
		t.Fatalf("after Kick: b1 %v v1 %v; want b1 (older) only", dispatched(b1), dispatched(v1))
	}
	u1.Release() // local release: dispatches v1 directly
	if !dispatched(v1) {
		t.Fatal("v1 not dispatched after a local release")
	}
	for _, h := range []*Handle{a2, b1, v1} {
		h.Release()
	}
	for _, q := range []*Queue{a, b} {
		assertEmpty(t, q)
	}
	g.assertZero(t)
	if g.maxInFlight != 3 || g.maxTenantIn["t"] != 2 {
		t.Fatalf("max in flight %d, max t %d; want 3 and 2", g.maxInFlight, g.maxTenantIn["t"])
	}
}

func TestGateLocalReleaseUnblocksTenant(t *testing.T) {
	g := newFakeGate()
	clk := clocktesting.NewFakeClock(t0)
	p := seedPolicy(4)
	a, b := New(clk, WithGate(g)), New(clk, WithGate(g))
	a.UpdatePolicy(p)
	b.UpdatePolicy(p)
	// free: tenant limit 1 fleet-wide
	b1 := mustAdmit(t, b, "t", "free")
	a1 := mustAdmit(t, a, "t", "free")
	b2 := mustAdmit(t, b, "t", "free")
	if !dispatched(b1) || dispatched(a1) || dispatched(b2) {
		t.Fatal("want b1 only")
	}
	b1.Release() // b's own slot of t freed: b asks the gate again for b2
	if !dispatched(b2) || dispatched(a1) {
		t.Fatalf("after b1: b2 %v a1 %v", dispatched(b2), dispatched(a1))
	}
	b2.Release()
	a.Kick()
	if !dispatched(a1) {
		t.Fatal("a1 not dispatched after Kick")
	}
	a1.Release()
	assertEmpty(t, a)
	assertEmpty(t, b)
	g.assertZero(t)
}

func TestGateRefusals(t *testing.T) {
	g := newFakeGate()
	clk := clocktesting.NewFakeClock(t0)
	p := seedPolicy(1)
	a, b := New(clk, WithGate(g)), New(clk, WithGate(g))
	a.UpdatePolicy(p)
	b.UpdatePolicy(p)
	blocker := mustAdmit(t, a, "blocker", "free")
	var hs []*Handle
	for i := range 4 { // premium bound 20 fleet-wide: 10 on each
		for range 5 {
			q := a
			if i%2 == 1 {
				q = b
			}
			hs = append(hs, mustAdmit(t, q, fmt.Sprint("t", i), "premium"))
		}
	}
	_, err := b.Admit("x", "premium")
	var r *Refusal
	if !errors.As(err, &r) || !errors.Is(r.Cause, ErrQueueFull) || r.Position != 21 || r.Tier != "premium" {
		t.Fatalf("fleet-wide bound: %v, want ErrQueueFull at 21", err)
	}
	if got := b.Stats().Tiers["premium"].Refused[CauseCapacity]; got != 1 {
		t.Fatalf("refused count %d", got)
	}
	hs[0].Release()
	hs = hs[1:]
	hs = append(hs, mustAdmit(t, b, "s1", "standard"))
	for range 4 {
		hs = append(hs, mustAdmit(t, b, "s1", "standard"))
	}
	for range 3 {
		hs = append(hs, mustAdmit(t, a, "s1", "standard"))
	}
	if _, err := a.Admit("s1", "standard"); !errors.As(err, &r) || !errors.Is(r.Cause, ErrTenantLimit) || r.Position != 9 {
		t.Fatalf("fleet-wide tenant limit: %v, want ErrTenantLimit at 9", err)
	}

	boom := errors.New("redis: connection refused")
	g.mu.Lock()
	g.enqueueErr = boom
	g.mu.Unlock()
	if _, err := a.Admit("y", "premium"); !errors.Is(err, boom) || err.Error() != "queue: gate enqueue: redis: connection refused" {
		t.Fatalf("gate failure: %v", err)
	}
	g.mu.Lock()
	g.enqueueErr = nil
	g.mu.Unlock()
	a.FlushQueued()
	b.FlushQueued()
	blocker.Release()
	assertEmpty(t, a)
	assertEmpty(t, b)
	g.assertZero(t)
}
