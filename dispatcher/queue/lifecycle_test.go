package queue

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func cancelled() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

func TestCancelWhileQueued(t *testing.T) {
	tests := map[string]struct {
		cancel string // which job to cancel
		want   []string
	}{
		// a1 (t=0) and a2 (t=2) of tenant a, b1 (t=1) of tenant b, all free.
		"the head job: its tenant is re-keyed behind b": {cancel: "a1", want: []string{"b", "a"}},
		"a middle job of a tenant":                      {cancel: "a2", want: []string{"a", "b"}},
		"the other tenant's only job":                   {cancel: "b1", want: []string{"a", "a"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := seedPolicy(1)
			p.Tiers[2].TenantConcurrencyLimit = 2
			q, clk := newTestQueue(t, p)
			blocker := mustAdmit(t, q, "blocker", "premium")
			hs := map[string]*Handle{}
			hs["a1"] = mustAdmit(t, q, "a", "free")
			clk.Step(time.Second)
			hs["b1"] = mustAdmit(t, q, "b", "free")
			clk.Step(time.Second)
			hs["a2"] = mustAdmit(t, q, "a", "free")
			clk.Step(time.Second)

			victim := hs[tc.cancel]
			if err := victim.Wait(cancelled()); !errors.Is(err, context.Canceled) {
				t.Fatalf("Wait = %v, want context.Canceled", err)
			}
			if err := checkStructure(q); err != nil {
				t.Fatal(err)
			}
			// A second Wait reports the same outcome; Release is a no-op.
			if err := victim.Wait(context.Background()); !errors.Is(err, context.Canceled) {
				t.Fatalf("second Wait = %v, want context.Canceled", err)
			}
			victim.Release()
			if got := victim.Waited(); got != 3*time.Second-map[string]time.Duration{"a1": 0, "b1": time.Second, "a2": 2 * time.Second}[tc.cancel] {
				t.Errorf("Waited = %s", got)
			}
			var rest []*Handle
			for n, h := range hs {
				if n != tc.cancel {
					rest = append(rest, h)
				}
			}
			got := drainOrder(t, q, blocker, rest)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("order after cancel (-want +got):\n%s", diff)
			}
			s := q.Stats()
			if s.Tiers["free"].Abandoned != 1 || s.DoubleReleases != 0 {
				t.Errorf("abandoned %d double releases %d, want 1 and 0", s.Tiers["free"].Abandoned, s.DoubleReleases)
			}
			assertEmpty(t, q)
		})
	}
}

func TestWaitBlocksUntilDispatchOrCancel(t *testing.T) {
	q, _ := newTestQueue(t, seedPolicy(1))
	blocker := mustAdmit(t, q, "blocker", "premium")
	a := mustAdmit(t, q, "a", "standard")
	b := mustAdmit(t, q, "b", "standard")

	ctxA, cancelA := context.WithCancel(context.Background())
	defer cancelA()
	errA := make(chan error, 1)
	errB := make(chan error, 1)
	go func() { errA <- a.Wait(ctxA) }()
	ctxB, cancelB := context.WithCancel(context.Background())
	go func() { errB <- b.Wait(ctxB) }()

	cancelB()
	if err := <-errB; !errors.Is(err, context.Canceled) {
		t.Fatalf("b: Wait = %v, want context.Canceled", err)
	}
	blocker.Release()
	if err := <-errA; err != nil {
		t.Fatalf("a: Wait = %v, want nil (dispatched)", err)
	}
	// Dispatch won: a later cancelled Wait still says dispatched.
	if err := a.Wait(cancelled()); err != nil {
		t.Fatalf("a: Wait after dispatch with a done ctx = %v, want nil", err)
	}
	a.Release()
	assertEmpty(t, q)
	if got := q.Stats().Tiers["standard"].Abandoned; got != 1 {
		t.Fatalf("abandoned = %d, want 1", got)
	}
}

func TestManyWaitersOnOneHandle(t *testing.T) {
	q, _ := newTestQueue(t, seedPolicy(1))
	blocker := mustAdmit(t, q, "blocker", "premium")
	h := mustAdmit(t, q, "a", "free")
	errs := make(chan error, 3)
	for range 3 {
		go func() { errs <- h.Wait(context.Background()) }()
	}
	blocker.Release()
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatalf("Wait = %v", err)
		}
	}
	h.Release()
	assertEmpty(t, q)
}

func TestReleaseSemantics(t *testing.T) {
	q, clk := newTestQueue(t, seedPolicy(1))
	a := mustAdmit(t, q, "a", "premium")
	b := mustAdmit(t, q, "b", "premium")
	c := mustAdmit(t, q, "c", "premium")

	c.Release() // still queued: abandoned
	if err := c.Wait(context.Background()); !errors.Is(err, context.Canceled) {
		t.Fatalf("queued then released: Wait = %v, want context.Canceled", err)
	}
	clk.Step(2 * time.Second)
	a.ReleaseServed()
	a.Release()
	a.ReleaseServed()
	if !dispatched(b) {
		t.Fatal("b not dispatched")
	}
	if got := b.Waited(); got != 2*time.Second {
		t.Fatalf("b waited %s, want 2s", got)
	}
	clk.Step(4 * time.Second)
	b.ReleaseServed()
	c.Release() // ended without dispatch: nothing, not a double release
	s := q.Stats()
	if s.DoubleReleases != 2 {
		t.Fatalf("DoubleReleases = %d, want 2", s.DoubleReleases)
	}
	if s.Completed != 2 || s.Served != 2 {
		t.Fatalf("Completed = %d, Served = %d, want 2 and 2", s.Completed, s.Served)
	}
	// EWMA: first sample 2s (a), then 2s + 0.1*(4s - 2s) = 2.2s.
	if s.ServiceTime != 2200*time.Millisecond {
		t.Fatalf("ServiceTime = %s, want 2.2s", s.ServiceTime)
	}
	if got := s.Measured(); got.ServiceTimeSeconds != 2.2 || got.Completed != 2 {
		t.Fatalf("Measured = %+v", got)
	}
	assertEmpty(t, q)
}

func TestExpiryTimerWithoutArrivals(t *testing.T) {
	p := seedPolicy(1)
	p.ClientTimeoutSeconds = 30
	q, clk := newTestQueue(t, p)
	blocker := mustAdmit(t, q, "blocker", "premium")
	if _, ok := q.NextDeadline(); ok {
		t.Fatal("NextDeadline with nothing queued")
	}
	a := mustAdmit(t, q, "a", "free")
	clk.Step(10 * time.Second)
	b := mustAdmit(t, q, "b", "standard")
	if d, ok := q.NextDeadline(); !ok || !d.Equal(t0.Add(30*time.Second)) {
		t.Fatalf("NextDeadline = %v %v, want t0+30s", d, ok)
	}
	errA := make(chan error, 1)
	go func() { errA <- a.Wait(context.Background()) }()
	errB := make(chan error, 1)
	go func() { errB <- b.Wait(context.Background()) }()

	clk.Step(19 * time.Second) // t=29s: nothing due
	clk.Step(time.Second)      // t=30s: a is due; the timer alone must end it
	if err := <-errA; !errors.Is(err, ErrExpired) {
		t.Fatalf("a: Wait = %v, want ErrExpired", err)
	}
	if got := a.Waited(); got != 30*time.Second {
		t.Fatalf("a waited %s, want 30s", got)
	}
	select {
	case err := <-errB:
		t.Fatalf("b ended early: %v", err)
	default:
	}
	if d, ok := q.NextDeadline(); !ok || !d.Equal(t0.Add(40*time.Second)) {
		t.Fatalf("NextDeadline = %v %v, want t0+40s", d, ok)
	}
	clk.Step(10 * time.Second) // the timer re-armed itself for b
	if err := <-errB; !errors.Is(err, ErrExpired) {
		t.Fatalf("b: Wait = %v, want ErrExpired", err)
	}
	s := q.Stats()
	if s.Tiers["free"].Expired != 1 || s.Tiers["standard"].Expired != 1 {
		t.Fatalf("expired counts %+v", s.Tiers)
	}
	blocker.Release()
	assertEmpty(t, q)
}

func TestExpireDueIsSynchronous(t *testing.T) {
	p := seedPolicy(1)
	p.ClientTimeoutSeconds = 5
	q, clk := newTestQueue(t, p)
	blocker := mustAdmit(t, q, "blocker", "premium")
	var hs []*Handle
	for i := range 3 {
		hs = append(hs, mustAdmit(t, q, string(rune('a'+i)), "standard"))
		clk.Step(time.Second)
	}
	// t=3s; deadlines 5s, 6s, 7s. Step to 6s and expire synchronously.
	q.mu.Lock() // hold the lock so the timer goroutine cannot run first
	clk.Step(3 * time.Second)
	q.mu.Unlock()
	q.ExpireDue()
	want := []uint8{stExpired, stExpired, stQueued}
	for i, h := range hs {
		if got := state(h); got != want[i] {
			t.Fatalf("job %d state %d, want %d", i, got, want[i])
		}
	}
	if d, ok := q.NextDeadline(); !ok || !d.Equal(t0.Add(7*time.Second)) {
		t.Fatalf("NextDeadline = %v, want t0+7s", d)
	}
	blocker.Release()
	if !dispatched(hs[2]) {
		t.Fatal("the survivor was not dispatched")
	}
	hs[2].Release()
	assertEmpty(t, q)
}

func TestDispatchedJobsDoNotExpire(t *testing.T) {
	p := seedPolicy(1)
	p.ClientTimeoutSeconds = 5
	q, clk := newTestQueue(t, p)
	h := mustAdmit(t, q, "a", "premium")
	clk.Step(time.Minute)
	q.ExpireDue()
	if !dispatched(h) {
		t.Fatal("an in-flight job was touched by expiry")
	}
	h.Release()
	assertEmpty(t, q)
}

func TestDrainAndFlush(t *testing.T) {
	q, _ := newTestQueue(t, seedPolicy(1))
	select {
	case <-q.Idle():
	default:
		t.Fatal("Idle of an empty queue not closed")
	}
	a := mustAdmit(t, q, "a", "premium")
	b := mustAdmit(t, q, "b", "premium")
	c := mustAdmit(t, q, "c", "standard")
	idle := q.Idle()

	q.Drain()
	if _, err := q.Admit("d", "premium"); !errors.Is(err, ErrDraining) {
		t.Fatalf("Admit while draining = %v, want ErrDraining", err)
	}
	a.Release() // queued jobs still dispatch while draining
	if !dispatched(b) {
		t.Fatal("b not dispatched during drain")
	}
	select {
	case <-idle:
		t.Fatal("Idle closed with c still queued")
	default:
	}
	errC := make(chan error, 1)
	go func() { errC <- c.Wait(context.Background()) }()
	q.FlushQueued()
	if err := <-errC; !errors.Is(err, ErrDrained) {
		t.Fatalf("c: Wait = %v, want ErrDrained", err)
	}
	<-idle
	if !q.Stats().Draining || q.Stats().Tiers["standard"].Drained != 1 {
		t.Fatalf("stats %+v", q.Stats())
	}
	b.Release() // in-flight work finishes normally
	assertEmpty(t, q)
}
