package state

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/utils/clock"

	"github.com/tiergate/tiergate/dispatcher/policy"
	"github.com/tiergate/tiergate/dispatcher/queue"
	"github.com/tiergate/tiergate/dispatcher/state/redistest"
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
		if gs := n.g.Status(); gs.Slots != 0 || gs.Queued != 0 {
			t.Errorf("node %d: gate still holds %+v", i, gs)
		}
	}
}
