package queue

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/tiergate/tiergate/dispatcher/queue/gate"
	"github.com/tiergate/tiergate/internal/gatetest"
)

// fleetQueues are queues of one fleet, each behind its own Fake, whose
// pump runs inline: a test driving them from one goroutine sees every
// exchange settled when a call returns.
func fleetQueues(t *testing.T, n int, slots int) (*gatetest.Fleet, []*Queue) {
	t.Helper()
	f := gatetest.NewFleet()
	clk := clocktesting.NewFakeClock(t0)
	p := seedPolicy(slots)
	p.SharedState = "Redis"
	var qs []*Queue
	for i := range n {
		q := New(clk, WithGate(f.Gate(fmt.Sprint("d", i))), withSpawn(inline))
		q.UpdatePolicy(p)
		qs = append(qs, q)
	}
	return f, qs
}

func assertFleetIdle(t *testing.T, f *gatetest.Fleet, qs ...*Queue) {
	t.Helper()
	for _, q := range qs {
		assertEmpty(t, q)
	}
	if err := f.Err(true); err != nil {
		t.Fatal(err)
	}
}

func TestGateCapsAcrossTwoDispatchers(t *testing.T) {
	f, qs := fleetQueues(t, 2, 3)
	a, b := qs[0], qs[1]
	p := seedPolicy(3)
	p.SharedState = "Redis"
	p.Tiers[0].TenantConcurrencyLimit = 2 // premium
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
	if s := b.Stats(); s.InFlight != 1 || s.Queued != 2 || s.Acquiring != 0 {
		t.Fatalf("b: in flight %d queued %d acquiring %d, want 1, 2 and 0", s.InFlight, s.Queued, s.Acquiring)
	}

	a1.Release() // a remote release: b learns of it only through Kick
	if dispatched(b1) {
		t.Fatal("b dispatched without an event")
	}
	b.Kick()
	if !dispatched(b1) || dispatched(v1) {
		t.Fatalf("after Kick: b1 %v v1 %v; want b1 (older) only", dispatched(b1), dispatched(v1))
	}
	u1.Release() // local release: its slot comes back, then v1 claims it
	if !dispatched(v1) {
		t.Fatal("v1 not dispatched after a local release")
	}
	for _, h := range []*Handle{a2, b1, v1} {
		h.Release()
	}
	assertFleetIdle(t, f, a, b)
	if got := f.Peak(gatetest.Count{Kind: gatetest.PoolSlots}); got != 3 {
		t.Errorf("peak slots %d, want 3", got)
	}
	if got := f.Peak(gatetest.Count{Kind: gatetest.TenantSlots, Name: "t"}); got != 2 {
		t.Errorf("peak slots of t %d, want 2", got)
	}
}

func TestGateLocalReleaseUnblocksTenant(t *testing.T) {
	f, qs := fleetQueues(t, 2, 4)
	a, b := qs[0], qs[1]
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
	assertFleetIdle(t, f, a, b)
}

func TestGateRefusals(t *testing.T) {
	f, qs := fleetQueues(t, 2, 1)
	a, b := qs[0], qs[1]
	blocker := mustAdmit(t, a, "blocker", "free")
	var hs []*Handle
	for i := range 4 { // premium bound 20 fleet-wide: 10 on each
		for range 5 {
			hs = append(hs, mustAdmit(t, qs[i%2], fmt.Sprint("t", i), "premium"))
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
	for range 5 {
		hs = append(hs, mustAdmit(t, b, "s1", "standard"))
	}
	for range 3 {
		hs = append(hs, mustAdmit(t, a, "s1", "standard"))
	}
	if _, err := a.Admit("s1", "standard"); !errors.As(err, &r) || !errors.Is(r.Cause, ErrTenantLimit) || r.Position != 9 {
		t.Fatalf("fleet-wide tenant limit: %v, want ErrTenantLimit at 9", err)
	}
	for range 8 {
		hs = append(hs, mustAdmit(t, b, "s2", "standard"))
	}
	// b's own count of s2 is at the limit: b refuses without asking, at
	// its own position (5 of s1 and 8 of s2 before it).
	enq := f.Calls("Enqueue")
	if _, err := b.Admit("s2", "standard"); !errors.As(err, &r) || !errors.Is(r.Cause, ErrTenantLimit) || r.Position != 14 {
		t.Fatalf("local tenant limit: %v, want ErrTenantLimit at 14", err)
	}
	if n := f.Calls("Enqueue") - enq; n != 0 {
		t.Errorf("a refusal its own counts decide asked the fleet %d times", n)
	}

	boom := errors.New("redis: connection refused")
	f.FailEnqueue(boom)
	if _, err := a.Admit("y", "standard"); !errors.Is(err, boom) || err.Error() != "queue: gate enqueue: redis: connection refused" {
		t.Fatalf("gate failure: %v", err)
	}
	f.FailEnqueue(nil)
	a.FlushQueued()
	b.FlushQueued()
	blocker.Release()
	assertFleetIdle(t, f, a, b)
}

// heldFleet is one queue whose pump runs on its own goroutine against a
// fleet that holds exchanges on request; pumped receives after every pump
// run ends.
func heldFleet(t *testing.T, slots int) (*gatetest.Fleet, *Queue, *clocktesting.FakeClock, chan struct{}) {
	t.Helper()
	f := gatetest.NewFleet()
	pumped := make(chan struct{}, 16)
	spawn := func(run func()) {
		go func() { run(); pumped <- struct{}{} }()
	}
	clk := clocktesting.NewFakeClock(t0)
	q := New(clk, WithGate(f.Gate("d")), withSpawn(spawn))
	p := seedPolicy(slots)
	p.SharedState = "Redis"
	p.ClientTimeoutSeconds = 30
	q.UpdatePolicy(p)
	return f, q, clk, pumped
}

// TestJobEndsWhileItsAcquireIsInFlight ends a claimed job every way a
// queued job can end while the fleet holds its exchange: the job ends at
// once, Stats answers meanwhile, and whatever the fleet then answers, the
// lease is returned exactly once.
func TestJobEndsWhileItsAcquireIsInFlight(t *testing.T) {
	ends := map[string]func(q *Queue, clk *clocktesting.FakeClock, h *Handle) error{
		"abandoned": func(_ *Queue, _ *clocktesting.FakeClock, h *Handle) error { return h.Wait(cancelled()) },
		"released":  func(_ *Queue, _ *clocktesting.FakeClock, h *Handle) error { h.Release(); return h.Wait(cancelled()) },
		"drained": func(q *Queue, _ *clocktesting.FakeClock, h *Handle) error {
			q.FlushQueued()
			return h.Wait(cancelled())
		},
		"expired": func(q *Queue, clk *clocktesting.FakeClock, h *Handle) error {
			clk.Step(30 * time.Second)
			q.ExpireDue()
			return h.Wait(cancelled())
		},
	}
	want := map[string]error{"abandoned": context.Canceled, "released": context.Canceled, "drained": ErrDrained, "expired": ErrExpired}
	for name, end := range ends {
		for _, granted := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/granted=%v", name, granted), func(t *testing.T) {
				f, q, clk, pumped := heldFleet(t, 2)
				other := f.Gate("other")
				if !granted { // another dispatcher holds the whole pool
					for _, tn := range []string{"x", "y"} {
						takeSlot(t, other, tn, 2)
					}
				}
				exchanges := f.Calls("Exchange")
				f.Hold(1)
				h := mustAdmit(t, q, "a", "premium")
				held := <-f.Held()
				if held.Claims != 1 {
					t.Fatalf("held exchange has %d claims, want 1", held.Claims)
				}
				if s := q.Stats(); s.Acquiring != 1 || s.Queued != 1 || s.InFlight != 0 {
					t.Fatalf("while acquiring: %+v", s)
				}
				if err := end(q, clk, h); !errors.Is(err, want[name]) {
					t.Fatalf("Wait = %v, want %v", err, want[name])
				}
				if s := q.Stats(); s.Acquiring != 0 || s.Queued != 0 || s.Totals.Admitted != 1 || s.Totals.Dispatched != 0 {
					t.Fatalf("after the end: %+v", s)
				}
				held.Proceed()
				<-pumped
				// The answer was settled, and its lease came back in a
				// second exchange of the same run.
				if n := f.Calls("Exchange") - exchanges; n != 2 {
					t.Errorf("%d exchanges, want 2", n)
				}
				if err := f.Err(false); err != nil {
					t.Fatal(err)
				}
				if n := f.Count(gatetest.Count{Kind: gatetest.TenantSlots, Name: "a"}) + f.Count(gatetest.Count{Kind: gatetest.TenantQueued, Name: "a"}); n != 0 {
					t.Errorf("a still holds %d in the fleet", n)
				}
				if state(h) == stDispatched {
					t.Fatal("an ended job was dispatched")
				}
				assertEmpty(t, q)
			})
		}
	}
}

// takeSlot makes g (another dispatcher) hold one slot of tenant.
func takeSlot(t *testing.T, g *gatetest.Fake, tenant string, slots int) {
	t.Helper()
	p, err := g.Enqueue(tenant, "premium", 100, 100)
	if err != nil {
		t.Fatal(err)
	}
	c := []gate.Claim{{Lease: p.Lease, TenantLimit: 100}}
	g.Exchange(slots, nil, c)
	if c[0].Result != gate.OK {
		t.Fatalf("other dispatcher's claim: %v", c[0].Result)
	}
}

// TestAdmissionChangesWhileItsEnqueueIsInFlight changes the queue while
// an admission's reservation is in flight: the queue's lock is free (Stats,
// Drain and UpdatePolicy go through), the admission then sees the change
// and gives its place back.
func TestAdmissionChangesWhileItsEnqueueIsInFlight(t *testing.T) {
	retired := seedPolicy(2)
	retired.SharedState = "Redis"
	retired.Version = 2
	retired.Tiers = retired.Tiers[1:] // premium goes away
	tests := map[string]struct {
		during func(q *Queue)
		want   error
	}{
		"drain":         {func(q *Queue) { q.Drain() }, ErrDraining},
		"tier retired":  {func(q *Queue) { q.UpdatePolicy(retired) }, ErrUnknownTier},
		"stats, no end": {func(q *Queue) { _ = q.Stats() }, nil},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			f, qs := fleetQueues(t, 1, 2)
			q := qs[0]
			f.OnEnqueue(func() { tc.during(q) })
			h, err := q.Admit("a", "premium")
			f.OnEnqueue(nil)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Admit = %v, want %v", err, tc.want)
			}
			if err == nil {
				if !dispatched(h) {
					t.Fatal("not dispatched")
				}
				h.Release()
			}
			if n := f.Count(gatetest.Count{Kind: gatetest.TierQueued, Name: "premium"}); n != 0 {
				t.Errorf("premium still holds %d places in the fleet", n)
			}
			if got := q.Stats().Totals.Admitted; got != map[bool]uint64{true: 1, false: 0}[err == nil] {
				t.Errorf("admitted %d", got)
			}
			assertFleetIdle(t, f, q)
		})
	}
}
