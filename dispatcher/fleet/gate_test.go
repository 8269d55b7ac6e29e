package fleet

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tiergate/tiergate/dispatcher/queue/gate"
	"github.com/tiergate/tiergate/internal/redistest"
)

const (
	ok         = gate.OK
	poolFull   = gate.PoolFull
	tenantFull = gate.TenantFull
)

// TestKeysCarryThePoolTagAndExpire: every key the scripts write carries
// the pool's hash tag and an expiry, and Redis counts exactly what the
// ledgers hold.
func TestKeysCarryThePoolTagAndExpire(t *testing.T) {
	s := redistest.Start(t, redistest.Options{})
	c := rawClient(t, s)
	p := fleetPolicy("ns/llm", 3)
	var gates []*Redis
	for i := range 2 {
		g := newGate(t, s, "d"+strconv.Itoa(i), Config{})
		g.ObservePolicy(p)
		gates = append(gates, g)
	}
	l := newLeases(t, gates...)
	l.enqueue(0, "a1", "a", 4, 2, ok, 1)
	l.enqueue(1, "a2", "a", 4, 2, ok, 2)
	l.enqueue(1, "b1", "b", 4, 2, ok, 3)
	l.claim(3, 2, results(ok), "a1")
	l.claim(3, 2, results(ok, ok), "a2", "b1")
	l.enqueue(0, "a3", "a", 4, 2, ok, 1)
	l.give("b1")

	ks := keysFor("ns/llm")
	want := map[string]int{
		ks.slots(): 2, ks.tenantSlots("a"): 2, ks.tenantSlots("b"): 0,
		ks.tierQueued("standard"): 1, ks.tenantQueued("a"): 1, ks.tenantQueued("b"): 0,
	}
	got := map[string]int{}
	for k := range want {
		got[k] = live(t, c, k)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Redis counts (-want +got):\n%s", diff)
	}
	var held [2]int
	for _, g := range gates {
		st := g.status()
		held[0] += st.Slots
		held[1] += st.Queued
	}
	if held != [2]int{2, 1} {
		t.Errorf("ledgers hold %v, want 2 slots and 1 queued", held)
	}
	keysInRedis, err := c.Keys(context.Background(), "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keysInRedis {
		if hashTag(k) != "ns/llm" {
			t.Errorf("key %q has hash tag %q", k, hashTag(k))
		}
		if ttl := c.PTTL(context.Background(), k).Val(); ttl <= 0 {
			t.Errorf("key %q has no expiry (%s)", k, ttl)
		}
	}
}

func TestGateOnRedisCluster(t *testing.T) {
	s := redistest.Start(t, redistest.Options{Cluster: true})
	c := rawClient(t, s)
	p := fleetPolicy("prod/llama", 2)
	a := newGate(t, s, "a", Config{LeaseTTL: 2 * time.Second, RenewInterval: 200 * time.Millisecond})
	b := newGate(t, s, "b", Config{LeaseTTL: 2 * time.Second, RenewInterval: 200 * time.Millisecond})
	a.ObservePolicy(p)
	b.ObservePolicy(p)
	a.Start(func() {})
	b.Start(func() {})
	l := newLeases(t, a, b)
	l.enqueue(0, "x1", "x", 4, 2, ok, 1)
	l.enqueue(1, "y1", "y", 4, 2, ok, 2)
	l.claim(2, 2, results(ok), "x1")
	l.claim(2, 2, results(ok), "y1")
	l.enqueue(1, "y2", "y", 4, 2, ok, 1)
	l.claim(2, 2, results(poolFull), "y2")
	l.give("x1")
	l.claim(2, 2, results(ok), "y2")
	l.enqueue(1, "z1", "z", 4, 2, ok, 1)
	l.give("z1")
	// Let both renew (a batch over several keys) at least twice.
	waitFor(t, 5*time.Second, "two renewals each", func() bool {
		return histCount(t, a, opRenew) >= 2 && histCount(t, b, opRenew) >= 2
	})
	for _, g := range []*Redis{a, b} {
		if n := testutil.ToFloat64(g.m.errors.WithLabelValues(opRenew)); n != 0 {
			t.Errorf("%s: %v renew errors on the cluster", g.id, n)
		}
		if g.status().Degraded {
			t.Errorf("%s degraded on the cluster", g.id)
		}
	}
	keysInRedis, err := c.Keys(context.Background(), "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keysInRedis) < 3 {
		t.Fatalf("keys: %v", keysInRedis)
	}
	var slot int64 = -1
	for _, k := range keysInRedis {
		n, err := c.ClusterKeySlot(context.Background(), k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if slot >= 0 && n != slot {
			t.Errorf("key %q in slot %d, others in %d", k, n, slot)
		}
		slot = n
	}
}

// histCount is how many round trips of op a Gate made.
func histCount(t *testing.T, g *Redis, op string) uint64 {
	t.Helper()
	mfs, err := gatherer(g).Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "tiergate_state_op_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "op" && l.GetValue() == op {
					return m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return 0
}

func gatherer(g *Redis) prometheus.Gatherer {
	r := prometheus.NewPedanticRegistry()
	if err := g.m.register(r); err != nil {
		panic(err)
	}
	return r
}

func TestGateCrashedDispatcherCapacityReturnsWithinTTL(t *testing.T) {
	s := redistest.Start(t, redistest.Options{})
	p := fleetPolicy("ns/llm", 2)
	const ttl = 600 * time.Millisecond
	// crashed took both slots and died: it never renews.
	crashed := newGate(t, s, "crashed", Config{LeaseTTL: ttl, RenewInterval: 100 * time.Millisecond})
	crashed.ObservePolicy(p)
	var wakes counter
	alive := newGate(t, s, "alive", Config{LeaseTTL: ttl, RenewInterval: 100 * time.Millisecond, RecheckInterval: time.Hour})
	alive.ObservePolicy(p)
	l := newLeases(t, crashed, alive)
	l.enqueue(0, "a", "a", 8, 4, ok, 1)
	l.enqueue(0, "b", "b", 8, 4, ok, 2)
	l.claim(2, 2, results(ok, ok), "a", "b")
	taken := time.Now()

	alive.Start(wakes.wake)
	l.enqueue(1, "c", "c", 8, 4, ok, 1)
	l.claim(2, 2, results(poolFull), "c")
	// With a re-check interval of an hour, only the expiry the script
	// reported can set off the timer: no message comes from a crashed
	// dispatcher. (The subscription's confirmation wakes the queue too,
	// at some point after Start, so the wake-ups are told by source.)
	timer := func() float64 { return testutil.ToFloat64(alive.m.wakeups.WithLabelValues(wakeTimer)) }
	waitFor(t, 3*ttl, "a timer wake-up at the crashed leases' expiry", func() bool { return timer() >= 1 && wakes.get() >= 1 })
	woke := time.Since(taken)
	l.claim(2, 2, results(ok), "c")
	t.Logf("capacity back %s after the crash (TTL %s)", woke.Round(time.Millisecond), ttl)
	if woke > ttl+300*time.Millisecond {
		t.Errorf("woke %s after the crash, want within TTL %s (+300ms)", woke, ttl)
	}
}

func TestGateRenewalKeepsLeasesPastTheTTL(t *testing.T) {
	s := redistest.Start(t, redistest.Options{})
	c := rawClient(t, s)
	p := fleetPolicy("ns/llm", 1)
	const ttl, renew = 300 * time.Millisecond, 60 * time.Millisecond
	holder := newGate(t, s, "holder", Config{LeaseTTL: ttl, RenewInterval: renew})
	other := newGate(t, s, "other", Config{LeaseTTL: ttl, RenewInterval: renew})
	holder.ObservePolicy(p)
	other.ObservePolicy(p)
	holder.Start(func() {})
	other.Start(func() {})
	l := newLeases(t, holder, other)
	for i := range 3 { // queued places are leases too
		l.enqueue(0, "a"+strconv.Itoa(i), "a", 8, 4, ok, i+1)
	}
	l.claim(1, 2, results(ok), "a0")
	start := time.Now()
	// Three TTLs' worth of the holder's renewals later its slot still
	// counts.
	renewals := histCount(t, holder, opRenew)
	waitFor(t, 10*time.Second, "the holder's renewals over three TTLs", func() bool {
		return histCount(t, holder, opRenew) >= renewals+uint64(3*ttl/renew) && time.Since(start) > 3*ttl
	})
	l.enqueue(1, "b", "b", 8, 4, ok, 3)
	l.claim(1, 2, results(poolFull), "b")
	ks := keysFor("ns/llm")
	if n := live(t, c, ks.tierQueued("standard")); n != 3 {
		t.Errorf("queued leases alive: %d, want 3", n)
	}
	if n := live(t, c, ks.dispatchers()); n != 2 {
		t.Errorf("registered dispatchers: %d, want 2", n)
	}
	if st := holder.status(); st.FleetSize != 2 || st.Rank != 0 {
		t.Errorf("holder sees fleet %d rank %d, want 2 and 0", st.FleetSize, st.Rank)
	}
	// Close gives everything back and leaves the fleet.
	_ = holder.Close()
	l.claim(1, 2, results(ok), "b")
	if n := live(t, c, ks.tierQueued("standard")); n != 0 {
		t.Errorf("queued leases after close: %d", n)
	}
	if got := members(t, c, ks.dispatchers()); !cmp.Equal(got, []string{"other"}) {
		t.Errorf("dispatchers after close: %v", got)
	}
}

// TestGateWakesOthersOnRelease: a slot given back wakes the dispatchers
// the fleet refused, and never the one that gave it back.
func TestGateWakesOthersOnRelease(t *testing.T) {
	s := redistest.Start(t, redistest.Options{})
	p := fleetPolicy("ns/llm", 1)
	var wa, wb counter
	a := newGate(t, s, "a", Config{RecheckInterval: time.Hour})
	b := newGate(t, s, "b", Config{RecheckInterval: time.Hour})
	for _, x := range []struct {
		g *Redis
		c *counter
	}{{a, &wa}, {b, &wb}} {
		x.g.ObservePolicy(p)
		x.g.Start(x.c.wake)
	}
	// Wait for both subscriptions (each reports itself with one wake-up).
	waitFor(t, 5*time.Second, "subscriptions", func() bool {
		return testutil.ToFloat64(a.m.wakeups.WithLabelValues(wakeResub)) >= 1 &&
			testutil.ToFloat64(b.m.wakeups.WithLabelValues(wakeResub)) >= 1
	})
	pubsub := func(g *Redis) float64 { return testutil.ToFloat64(g.m.wakeups.WithLabelValues(wakePubSub)) }
	l := newLeases(t, a, b)
	l.enqueue(0, "x", "x", 8, 4, ok, 1)
	l.claim(1, 1, results(ok), "x")
	l.enqueue(0, "x2", "x", 8, 4, ok, 1)
	l.claim(1, 1, results(poolFull), "x2") // a waits too
	l.enqueue(1, "y", "y", 8, 4, ok, 2)
	l.claim(1, 1, results(poolFull), "y")
	l.give("x")
	waitFor(t, 2*time.Second, "b woken by a's release", func() bool { return pubsub(b) == 1 })
	l.claim(1, 1, results(ok), "y")
	l.give("y")
	// b's release reaches a; a's own, published before it on the same
	// channel, would have arrived first.
	waitFor(t, 2*time.Second, "a woken by b's release", func() bool { return pubsub(a) >= 1 })
	if n := pubsub(a); n != 1 {
		t.Errorf("a had %v pub/sub wake-ups, want 1 (b's): it was woken by its own release", n)
	}
	l.give("x2")
}
