package fleet

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/dispatcher/queue"
	"github.com/tiergate/tiergate/internal/redistest"
)

// peak tracks a current and a peak count.
type peak struct{ cur, max atomic.Int64 }

func (p *peak) inc() {
	n := p.cur.Add(1)
	for {
		m := p.max.Load()
		if n <= m || p.max.CompareAndSwap(m, n) {
			return
		}
	}
}
func (p *peak) dec() { p.cur.Add(-1) }

// TestQueuesShareCapsThroughRedis floods two real queues, each behind its
// own Gate on one Redis, and checks the caps hold across both: the pool
// never runs more than its slots, tenant "a" never more than its limit,
// every admitted request ends exactly once and nothing waits forever (a
// queue blocked by the other dispatcher's slots is woken by pub/sub).
func TestQueuesShareCapsThroughRedis(t *testing.T) {
	s := redistest.Start(t, redistest.Options{})
	c := rawClient(t, s)
	p := fleetPolicy("ns/llm", 4)
	p.Tiers[0].QueueBound = 40
	p.Tiers[0].TenantQueueLimit = 20
	p.Tiers[0].TenantConcurrencyLimit = 3
	p.Tenants = []policy.Tenant{{ID: "a", Tier: "standard", MaxConcurrency: 2}}

	type node struct {
		g *Redis
		q *queue.Queue
	}
	var nodes []node
	for _, id := range []string{"d1", "d2"} {
		g := newGate(t, s, id, Config{LeaseTTL: 2 * time.Second, RenewInterval: 200 * time.Millisecond})
		q := queue.New(clock.RealClock{}, queue.WithGate(g))
		g.ObservePolicy(p)
		q.UpdatePolicy(p)
		g.Start(q.Kick)
		nodes = append(nodes, node{g, q})
	}

	var pool, tenantA, tenantB peak
	var served, refused, failed atomic.Int64
	const workers, perWorker = 12, 25
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for i, n := range nodes {
		for w := range workers {
			tenant := "a"
			if w%2 == 1 {
				tenant = "b"
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range perWorker {
					h, err := n.q.Admit(tenant, "standard")
					if err != nil {
						var r *queue.Refusal
						if !errors.As(err, &r) {
							t.Errorf("node %d: admit: %v", i, err)
							failed.Add(1)
							return
						}
						refused.Add(1)
						time.Sleep(time.Millisecond)
						continue
					}
					wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
					err = h.Wait(wctx)
					wcancel()
					if err != nil {
						t.Errorf("node %d: wait: %v", i, err)
						failed.Add(1)
						return
					}
					pool.inc()
					tp := &tenantB
					if tenant == "a" {
						tp = &tenantA
					}
					tp.inc()
					time.Sleep(2 * time.Millisecond)
					tp.dec()
					pool.dec()
					h.Release()
					served.Add(1)
				}
			}()
		}
	}
	wg.Wait()
	t.Logf("served %d, refused %d; peaks: pool %d, a %d, b %d",
		served.Load(), refused.Load(), pool.max.Load(), tenantA.max.Load(), tenantB.max.Load())
	if failed.Load() > 0 {
		t.Fatalf("%d workers failed", failed.Load())
	}
	if got := pool.max.Load(); got > 4 {
		t.Errorf("pool peak %d > 4 slots", got)
	}
	if got := tenantA.max.Load(); got > 2 {
		t.Errorf("tenant a peak %d > its cap 2", got)
	}
	if got := tenantB.max.Load(); got > 3 {
		t.Errorf("tenant b peak %d > its cap 3", got)
	}
	if pool.max.Load() < 4 {
		t.Errorf("pool peak %d: the fleet never used its 4 slots (the test proves nothing)", pool.max.Load())
	}
	if served.Load()+refused.Load() != 2*workers*perWorker {
		t.Errorf("served %d + refused %d != %d", served.Load(), refused.Load(), 2*workers*perWorker)
	}
	ks := keysFor("ns/llm")
	for _, k := range []string{ks.slots(), ks.tierQueued("standard"), ks.tenantSlots("a"), ks.tenantQueued("a")} {
		if n := live(t, c, k); n != 0 {
			t.Errorf("%s: %d leases left", k, n)
		}
	}
	for i, n := range nodes {
		st := n.q.Stats()
		if st.InFlight != 0 || st.Queued != 0 {
			t.Errorf("node %d: in flight %d, queued %d", i, st.InFlight, st.Queued)
		}
		if gs := n.g.status(); gs.Slots != 0 || gs.Queued != 0 {
			t.Errorf("node %d: gate still holds %+v", i, gs)
		}
	}
}

// within fails the test unless f returns within d: a liveness check for
// calls that must not wait on a stalled Redis (whose calls would wait for
// the op timeout, far longer).
func within(t *testing.T, d time.Duration, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s did not return within %s: it waits on Redis", what, d)
	}
}

// TestStalledRedisStallsNoOneElse freezes a real redis-server (SIGSTOP)
// under a queue in fleet mode. A release returns at once and its exchange
// hangs in the pump; an admission's enqueue hangs too, concurrently (two
// round trips in flight prove nothing serialises them); meanwhile Stats,
// the metrics, local refusals and other admissions' local checks answer at
// once. When Redis thaws, everything completes and the counts balance.
func TestStalledRedisStallsNoOneElse(t *testing.T) {
	s := redistest.Start(t, redistest.Options{})
	c := rawClient(t, s)
	reg := prometheus.NewPedanticRegistry()
	// An op timeout far beyond the test: Redis stalls, it does not fail.
	g := newGate(t, s, "d1", Config{LeaseTTL: time.Minute, RenewInterval: 20 * time.Second, OpTimeout: time.Minute}, WithRegisterer(reg))
	q := queue.New(clock.RealClock{}, queue.WithGate(g))
	p := fleetPolicy("ns/stall", 2)
	g.ObservePolicy(p)
	q.UpdatePolicy(p)
	g.Start(q.Kick)
	waitFor(t, 5*time.Second, "the first renewal", func() bool { return histCount(t, g, opRenew) == 1 })
	a := admitted(t, q, "a")
	inFlight := func() float64 { return gauge(t, reg, "tiergate_state_ops_in_flight") }

	s.Pause()
	defer s.Resume()
	within(t, 2*time.Second, "Release", a.Release)
	waitFor(t, 5*time.Second, "the pump's exchange stuck in Redis", func() bool { return inFlight() == 1 })
	var b *queue.Handle
	admittedB := make(chan error, 1)
	go func() {
		var err error
		b, err = q.Admit("b", "standard")
		if err == nil {
			err = b.Wait(context.Background())
		}
		admittedB <- err
	}()
	waitFor(t, 5*time.Second, "b's enqueue in Redis beside the exchange", func() bool { return inFlight() == 2 })
	within(t, 2*time.Second, "Stats", func() {
		if st := q.Stats(); st.InFlight != 0 || st.Queued != 0 {
			t.Errorf("stats while Redis stalls: %+v", st)
		}
	})
	within(t, 2*time.Second, "a metrics scrape", func() { _, _ = reg.Gather() })
	within(t, 2*time.Second, "a refusal for an unknown tier", func() {
		if _, err := q.Admit("c", "nope"); !errors.Is(err, queue.ErrUnknownTier) {
			t.Errorf("Admit(nope) = %v", err)
		}
	})

	s.Resume()
	select {
	case err := <-admittedB:
		if err != nil {
			t.Fatalf("b after Redis thawed: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("b not dispatched after Redis thawed")
	}
	ks := keysFor("ns/stall")
	if n := live(t, c, ks.tenantSlots("a")); n != 0 {
		t.Errorf("a's slot still counts: %d", n)
	}
	if n := live(t, c, ks.tenantSlots("b")); n != 1 {
		t.Errorf("b's slots: %d, want 1", n)
	}
	b.Release()
	waitFor(t, 5*time.Second, "b's slot back in Redis", func() bool { return live(t, c, ks.slots()) == 0 })
}

// admitted admits one request of tenant and waits for its slot.
func admitted(t *testing.T, q *queue.Queue, tenant string) *queue.Handle {
	t.Helper()
	h, err := q.Admit(tenant, "standard")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	return h
}
