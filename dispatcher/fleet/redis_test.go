package fleet

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/tiergate/tiergate/internal/redistest"
)

// TestGateFrozenRedisCostsOneTimeout freezes Redis (no connection error,
// just silence): the call that finds out waits at most the op timeout,
// every later call answers from the slice at once, and when Redis thaws
// fleet mode resumes.
func TestGateFrozenRedisCostsOneTimeout(t *testing.T) {
	s := redistest.Start(t, redistest.Options{})
	const opTimeout = 200 * time.Millisecond
	g := newGate(t, s, "a", Config{LeaseTTL: 3 * time.Second, RenewInterval: 200 * time.Millisecond, OpTimeout: opTimeout})
	g.ObservePolicy(fleetPolicy("ns/llm", 4))
	g.Start(func() {})
	waitFor(t, 5*time.Second, "registered", func() bool { return g.status().FleetSize == 1 })

	s.Pause()
	defer s.Resume()
	l := newLeases(t, g)
	start := time.Now()
	l.enqueue(0, "q", "a", 8, 4, ok, 1)
	first := time.Since(start)
	if first > opTimeout+300*time.Millisecond {
		t.Errorf("the first call took %s, want about the op timeout %s", first, opTimeout)
	}
	if !g.status().Degraded {
		t.Fatal("not degraded")
	}
	calls := roundTrips(t, g)
	for i := range 100 {
		name := "a" + strconv.Itoa(i)
		l.enqueue(0, name, "a", 8, 4, ok, 2)
		l.claim(4, 2, results(ok), name)
		l.give(name)
	}
	if n := roundTrips(t, g) - calls; n != 0 {
		t.Errorf("300 degraded calls made %d round trips: they waited on Redis", n)
	}
	s.Resume()
	waitFor(t, 5*time.Second, "fleet mode to resume", func() bool { return !g.status().Degraded })
	c := rawClient(t, s)
	ks := keysFor("ns/llm")
	waitFor(t, 2*time.Second, "the queued lease in Redis, the released slots gone", func() bool {
		return live(t, c, ks.tierQueued("standard")) == 1 && live(t, c, ks.slots()) == 0
	})
	l.give("q")
}

// TestGateOverTLS runs fleet mode over rediss:// against a TLS-only
// redis-server whose certificate a private CA signed: trusted through
// --redis-ca-file, refused (and so degraded, still serving) without it.
func TestGateOverTLS(t *testing.T) {
	s := redistest.Start(t, redistest.Options{TLS: true})
	c := rawTLSClient(t, s)
	tests := map[string]struct {
		caFile       string
		wantDegraded bool
	}{
		"private CA trusted": {caFile: s.CAFile()},
		"system roots only":  {wantDegraded: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			g := newGate(t, s, "tls", Config{CAFile: tc.caFile})
			g.ObservePolicy(fleetPolicy("ns/tls", 2))
			l := newLeases(t, g)
			l.enqueue(0, "a", "a", 8, 4, ok, 1)
			l.claim(2, 2, results(ok), "a")
			if got := g.status().Degraded; got != tc.wantDegraded {
				t.Errorf("degraded = %v, want %v", got, tc.wantDegraded)
			}
			want := 1
			if tc.wantDegraded {
				want = 0
			}
			if n := live(t, c, keysFor("ns/tls").slots()); n != want {
				t.Errorf("slots in Redis: %d, want %d", n, want)
			}
			l.give("a")
		})
	}
}

// TestGateOnThreeNodeCluster runs two pools whose hash tags live on
// different nodes of a real 3-node Redis Cluster: with ?cluster=true the
// Gate follows the slots, every script runs where its pool's keys are, and
// a release on one dispatcher wakes the other through the cluster bus.
func TestGateOnThreeNodeCluster(t *testing.T) {
	nodes := redistest.StartCluster(t, 3)
	slotOf := func(pool string) int64 {
		n, err := rawClient(t, nodes[0]).ClusterKeySlot(context.Background(), keysFor(pool).slots()).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	// StartCluster gives node i the slots [i*16384/3, (i+1)*16384/3).
	owner := func(slot int64) int {
		for i := 2; i > 0; i-- {
			if slot >= int64(i*16384/3) {
				return i
			}
		}
		return 0
	}
	pools := []string{"ns/a"}
	for i := 0; len(pools) < 2; i++ {
		p := "ns/b" + strconv.Itoa(i)
		if owner(slotOf(p)) != owner(slotOf(pools[0])) {
			pools = append(pools, p)
		}
	}
	url := "redis://" + nodes[0].Addr() + "?cluster=true&addr=" + nodes[1].Addr()
	for _, pool := range pools {
		t.Run(pool, func(t *testing.T) {
			var wakes counter
			mk := func(id string) *Redis {
				g, err := New(Config{URL: url, DispatcherID: id, LeaseTTL: 2 * time.Second, RenewInterval: 200 * time.Millisecond})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = g.Close() })
				g.ObservePolicy(fleetPolicy(pool, 1))
				return g
			}
			a, b := mk("a"), mk("b")
			a.Start(func() {})
			b.Start(wakes.wake)
			waitFor(t, 5*time.Second, "both registered", func() bool {
				return a.status().FleetSize == 2 && b.status().FleetSize == 2
			})
			l := newLeases(t, a, b)
			l.enqueue(0, "x", "x", 4, 2, ok, 1)
			l.claim(1, 1, results(ok), "x")
			l.enqueue(1, "y", "y", 4, 2, ok, 1)
			l.claim(1, 1, results(poolFull), "y")
			// Told by source: the subscription's own wake-up may come late.
			pubsub := func() float64 { return testutil.ToFloat64(b.m.wakeups.WithLabelValues(wakePubSub)) }
			before := pubsub()
			l.give("x")
			waitFor(t, 5*time.Second, "b woken through the cluster", func() bool { return pubsub() > before && wakes.get() > 0 })
			l.claim(1, 1, results(ok), "y")
			if a.status().Degraded || b.status().Degraded {
				t.Errorf("degraded on the cluster: a %v b %v", a.status().Degraded, b.status().Degraded)
			}
			// The pool's keys are on its slot's node only.
			home := nodes[owner(slotOf(pool))]
			if n := live(t, rawClient(t, home), keysFor(pool).slots()); n != 1 {
				t.Errorf("slots on the owning node: %d, want 1", n)
			}
			l.give("y")
		})
	}
}

// TestRenewalFollowsTheClock drives the renewal loop with a fake clock: a
// batch on each tick of the renew interval, and a lease Redis lost is
// written back by it.
func TestRenewalFollowsTheClock(t *testing.T) {
	s := redistest.Start(t, redistest.Options{})
	c := rawClient(t, s)
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	g := newGate(t, s, "a", Config{LeaseTTL: 30 * time.Second, RenewInterval: 10 * time.Second}, withClock(clk))
	g.ObservePolicy(fleetPolicy("ns/llm", 2)) // asks for a first renewal at once
	g.Start(func() {})
	waitFor(t, 5*time.Second, "the first renewal", func() bool { return histCount(t, g, opRenew) == 1 })
	l := newLeases(t, g)
	l.enqueue(0, "a", "a", 8, 4, ok, 1)
	ks := keysFor("ns/llm")
	c.Del(context.Background(), ks.tierQueued("standard")) // Redis loses a lease

	// Short of the interval nothing ticks: a renewal asked for now is the
	// only one, and it writes the lost lease back.
	clk.Step(9 * time.Second)
	g.renewSoon()
	waitFor(t, 5*time.Second, "the renewal asked for", func() bool { return histCount(t, g, opRenew) >= 3 })
	if n := histCount(t, g, opRenew); n != 3 {
		t.Fatalf("%d renewals, want 3 (the first, the one asked for, its write-back)", n)
	}
	if n := live(t, c, ks.tierQueued("standard")); n != 1 {
		t.Errorf("queued leases after the renewal: %d, want 1", n)
	}
	clk.Step(time.Second)
	waitFor(t, 5*time.Second, "the tick's renewal", func() bool { return histCount(t, g, opRenew) == 4 })
	if n := testutil.ToFloat64(g.m.restored); n != 1 {
		t.Errorf("restored %v, want 1", n)
	}
	l.give("a")
}
