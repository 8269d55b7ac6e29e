package state

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/tiergate/tiergate/dispatcher/policy"
	"github.com/tiergate/tiergate/dispatcher/queue"
	"github.com/tiergate/tiergate/dispatcher/state/redistest"
)

// step is one Gate call of a scripted sequence and what it must answer.
type step struct {
	gate   int    // which dispatcher
	op     string // enqueue, acquire, release, dequeue
	tenant string
	want   string // "ok", "full", "tenant", or for acquire Granted/PoolFull/TenantFull
	n      int    // enqueue: the queued count it reports
}

func runSteps(t *testing.T, gates []*Redis, steps []step, slots, tenantLimit, bound, qlimit int) {
	t.Helper()
	for i, s := range steps {
		g := gates[s.gate]
		got := "done"
		switch s.op {
		case "enqueue":
			n, err := g.Enqueue(s.tenant, "standard", bound, qlimit)
			switch {
			case err == nil:
				got = "ok"
			case errors.Is(err, queue.ErrQueueFull):
				got = "full"
			case errors.Is(err, queue.ErrTenantLimit):
				got = "tenant"
			default:
				got = err.Error()
			}
			if n != s.n {
				t.Errorf("step %d (%+v): count %d, want %d", i, s, n, s.n)
			}
		case "acquire":
			got = g.Acquire(s.tenant, "standard", slots, tenantLimit).String()
		case "release":
			g.Release(s.tenant, "standard")
		case "dequeue":
			g.Dequeue(s.tenant, "standard")
		}
		if s.want != "" && got != s.want {
			t.Fatalf("step %d (%+v): got %s, want %s", i, s, got, s.want)
		}
	}
}

func TestGateCountsExactlyAcrossDispatchers(t *testing.T) {
	s := redistest.Start(t, redistest.Options{})
	c := rawClient(t, s)
	p := fleetPolicy("ns/llm", 3)
	var gates []*Redis
	for i := range 3 {
		g := newGate(t, s, "d"+strconv.Itoa(i), Config{})
		g.ObservePolicy(p)
		gates = append(gates, g)
	}
	// Pool of 3 slots, tenant limit 2, tier bound 4, tenant queue limit 2.
	steps := []step{
		{gate: 0, op: "enqueue", tenant: "a", want: "ok", n: 1},
		{gate: 1, op: "enqueue", tenant: "a", want: "ok", n: 2},
		{gate: 2, op: "enqueue", tenant: "a", want: "tenant", n: 2},
		{gate: 2, op: "enqueue", tenant: "b", want: "ok", n: 3},
		{gate: 0, op: "enqueue", tenant: "b", want: "ok", n: 4},
		{gate: 1, op: "enqueue", tenant: "c", want: "full", n: 4},
		{gate: 0, op: "acquire", tenant: "a", want: "Granted"},
		{gate: 1, op: "acquire", tenant: "a", want: "Granted"},
		{gate: 1, op: "enqueue", tenant: "c", want: "ok", n: 3}, // two places turned into slots
		{gate: 2, op: "acquire", tenant: "b", want: "Granted"},
		{gate: 0, op: "acquire", tenant: "b", want: "PoolFull"},
		{gate: 1, op: "release", tenant: "a"},
		{gate: 1, op: "acquire", tenant: "c", want: "Granted"},
		{gate: 0, op: "acquire", tenant: "b", want: "PoolFull"},
		{gate: 0, op: "release", tenant: "a"},
		{gate: 0, op: "dequeue", tenant: "b"}, // b left its queue on d0
		{gate: 2, op: "enqueue", tenant: "a", want: "ok", n: 1},
		{gate: 2, op: "enqueue", tenant: "a", want: "ok", n: 2},
		{gate: 2, op: "acquire", tenant: "a", want: "Granted"},
		{gate: 2, op: "acquire", tenant: "a", want: "PoolFull"},
		{gate: 1, op: "release", tenant: "c"},
		{gate: 2, op: "acquire", tenant: "a", want: "Granted"},
		{gate: 2, op: "enqueue", tenant: "a", want: "ok", n: 1},
		{gate: 0, op: "release", tenant: "b"}, // holds none: a no-op
		{gate: 2, op: "release", tenant: "b"},
		{gate: 2, op: "acquire", tenant: "a", want: "TenantFull"},
	}
	runSteps(t, gates, steps, 3, 2, 4, 2)

	ks := keysFor("ns/llm")
	want := map[string]int{
		ks.slots(): 2, ks.tenantSlots("a"): 2, ks.tenantSlots("b"): 0, ks.tenantSlots("c"): 0,
		ks.tierQueued("standard"): 1, ks.tenantQueued("a"): 1, ks.tenantQueued("b"): 0, ks.tenantQueued("c"): 0,
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
		st := g.Status()
		held[0] += st.Slots
		held[1] += st.Queued
	}
	if held != [2]int{2, 1} {
		t.Errorf("ledgers hold %v, want 2 slots and 1 queued", held)
	}
	// Every key the scripts wrote carries the pool's hash tag and an expiry.
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
	steps := []step{
		{gate: 0, op: "enqueue", tenant: "x", want: "ok", n: 1},
		{gate: 1, op: "enqueue", tenant: "y", want: "ok", n: 2},
		{gate: 0, op: "acquire", tenant: "x", want: "Granted"},
		{gate: 1, op: "acquire", tenant: "y", want: "Granted"},
		{gate: 1, op: "enqueue", tenant: "y", want: "ok", n: 1},
		{gate: 1, op: "acquire", tenant: "y", want: "PoolFull"},
		{gate: 0, op: "release", tenant: "x"},
		{gate: 1, op: "acquire", tenant: "y", want: "Granted"},
		{gate: 1, op: "enqueue", tenant: "z", want: "ok", n: 1},
		{gate: 1, op: "dequeue", tenant: "z"},
	}
	runSteps(t, []*Redis{a, b}, steps, 2, 2, 4, 2)
	// Let both renew (a batch over several keys) at least twice.
	waitFor(t, 5*time.Second, "two renewals each", func() bool {
		return histCount(t, a, opRenew) >= 2 && histCount(t, b, opRenew) >= 2
	})
	for _, g := range []*Redis{a, b} {
		if n := testutil.ToFloat64(g.m.errors.WithLabelValues(opRenew)); n != 0 {
			t.Errorf("%s: %v renew errors on the cluster", g.id, n)
		}
		if g.Degraded() {
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
	// crashed never renews: it took both slots and died.
	crashed := newGate(t, s, "crashed", Config{LeaseTTL: ttl, RenewInterval: 100 * time.Millisecond})
	crashed.ObservePolicy(p)
	for _, tenant := range []string{"a", "b"} {
		if _, err := crashed.Enqueue(tenant, "standard", 8, 4); err != nil {
			t.Fatal(err)
		}
		if r := crashed.Acquire(tenant, "standard", 2, 2); r != queue.Granted {
			t.Fatalf("crashed acquire: %v", r)
		}
	}
	taken := time.Now()

	var wakes counter
	alive := newGate(t, s, "alive", Config{LeaseTTL: ttl, RenewInterval: 100 * time.Millisecond, RecheckInterval: time.Hour})
	alive.ObservePolicy(p)
	alive.Start(wakes.wake)
	if _, err := alive.Enqueue("c", "standard", 8, 4); err != nil {
		t.Fatal(err)
	}
	if r := alive.Acquire("c", "standard", 2, 2); r != queue.PoolFull {
		t.Fatalf("alive acquire while crashed holds the pool: %v", r)
	}
	// With a re-check interval of an hour, only the expiry the script
	// reported can wake it: no message comes from a crashed dispatcher.
	before := wakes.get()
	waitFor(t, 3*ttl, "a wake-up at the crashed leases' expiry", func() bool { return wakes.get() > before })
	woke := time.Since(taken)
	if r := alive.Acquire("c", "standard", 2, 2); r != queue.Granted {
		t.Fatalf("alive acquire after the TTL: %v", r)
	}
	t.Logf("capacity back %s after the crash (TTL %s)", woke.Round(time.Millisecond), ttl)
	if woke > ttl+300*time.Millisecond {
		t.Errorf("woke %s after the crash, want within TTL %s (+300ms)", woke, ttl)
	}
}

func TestGateRenewalKeepsLeasesPastTheTTL(t *testing.T) {
	s := redistest.Start(t, redistest.Options{})
	c := rawClient(t, s)
	p := fleetPolicy("ns/llm", 1)
	const ttl = 300 * time.Millisecond
	holder := newGate(t, s, "holder", Config{LeaseTTL: ttl, RenewInterval: 60 * time.Millisecond})
	other := newGate(t, s, "other", Config{LeaseTTL: ttl, RenewInterval: 60 * time.Millisecond})
	holder.ObservePolicy(p)
	other.ObservePolicy(p)
	holder.Start(func() {})
	other.Start(func() {})
	for range 3 { // queued places are leases too
		if _, err := holder.Enqueue("a", "standard", 8, 4); err != nil {
			t.Fatal(err)
		}
	}
	if r := holder.Acquire("a", "standard", 1, 2); r != queue.Granted {
		t.Fatal(r)
	}
	deadline := time.Now().Add(4 * ttl)
	for time.Now().Before(deadline) {
		if r := other.Acquire("b", "standard", 1, 2); r != queue.PoolFull {
			t.Fatalf("other got %v while holder renews its slot", r)
		}
		time.Sleep(ttl / 5)
	}
	ks := keysFor("ns/llm")
	if n := live(t, c, ks.tierQueued("standard")); n != 2 {
		t.Errorf("queued leases alive: %d, want 2", n)
	}
	if n := live(t, c, ks.dispatchers()); n != 2 {
		t.Errorf("registered dispatchers: %d, want 2", n)
	}
	if st := holder.Status(); st.FleetSize != 2 || st.Rank != 0 {
		t.Errorf("holder sees fleet %d rank %d, want 2 and 0", st.FleetSize, st.Rank)
	}
	// Close gives everything back and leaves the fleet.
	_ = holder.Close()
	if r := other.Acquire("b", "standard", 1, 2); r != queue.Granted {
		t.Errorf("after holder closed: %v", r)
	}
	if n := live(t, c, ks.tierQueued("standard")); n != 0 {
		t.Errorf("queued leases after close: %d", n)
	}
	if got := members(t, c, ks.dispatchers()); !cmp.Equal(got, []string{"other"}) {
		t.Errorf("dispatchers after close: %v", got)
	}
}

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
	if _, err := a.Enqueue("x", "standard", 8, 4); err != nil {
		t.Fatal(err)
	}
	if r := a.Acquire("x", "standard", 1, 1); r != queue.Granted {
		t.Fatal(r)
	}
	if _, err := b.Enqueue("y", "standard", 8, 4); err != nil {
		t.Fatal(err)
	}
	if r := b.Acquire("y", "standard", 1, 1); r != queue.PoolFull {
		t.Fatal(r)
	}
	aBefore, bBefore := wa.get(), wb.get()
	a.Release("x", "standard")
	waitFor(t, 2*time.Second, "b woken by a's release", func() bool { return wb.get() > bBefore })
	if n := testutil.ToFloat64(b.m.wakeups.WithLabelValues(wakePubSub)); n != 1 {
		t.Errorf("b pub/sub wake-ups: %v, want 1", n)
	}
	time.Sleep(50 * time.Millisecond)
	if wa.get() != aBefore {
		t.Errorf("a was woken by its own release")
	}
	if r := b.Acquire("y", "standard", 1, 1); r != queue.Granted {
		t.Errorf("b after the wake-up: %v", r)
	}
}

func TestRecheckTimerTakesTheEarlierDeadline(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	g, err := New(Config{URL: "redis://127.0.0.1:1", RecheckInterval: 3 * time.Second}, WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	fired := func() bool {
		select {
		case <-g.wakeCh:
			return true
		default:
			return false
		}
	}
	tests := []struct {
		name   string
		waitMs []int64 // refusals in a row, each with the script's wait
		step   time.Duration
		fire   bool
	}{
		{"lease expiry sooner than the interval", []int64{500}, 500 * time.Millisecond, false},
		{"... fires just after it", nil, 2 * time.Millisecond, true},
		{"no wait known: the interval", []int64{0}, 2999 * time.Millisecond, false},
		{"... then it fires", nil, 2 * time.Millisecond, true},
		{"a later deadline does not postpone", []int64{100, 2000}, 102 * time.Millisecond, true},
		{"an earlier one replaces a later one", []int64{2000, 40}, 42 * time.Millisecond, true},
		{"floor of 10ms", []int64{1}, 9 * time.Millisecond, false},
		{"... then it fires", nil, 2 * time.Millisecond, true},
	}
	for _, tc := range tests {
		g.mu.Lock()
		for _, w := range tc.waitMs {
			g.armRecheckLocked(w)
		}
		g.mu.Unlock()
		clk.Step(tc.step)
		if got := fired(); got != tc.fire {
			t.Errorf("%s: fired %v, want %v", tc.name, got, tc.fire)
		}
	}
}

func TestGateDegradesToItsSliceAndResumes(t *testing.T) {
	s := redistest.Start(t, redistest.Options{})
	c := rawClient(t, s)
	p := fleetPolicy("ns/llm", 4) // pool-wide: 4 slots, tenant limit 2
	reg := prometheus.NewPedanticRegistry()
	cfg := Config{LeaseTTL: time.Second, RenewInterval: 100 * time.Millisecond, OpTimeout: 100 * time.Millisecond}
	var wa counter
	a := newGate(t, s, "a", cfg, WithRegisterer(reg))
	b := newGate(t, s, "b", cfg)
	a.ObservePolicy(p)
	b.ObservePolicy(p)
	a.Start(wa.wake)
	b.Start(func() {})
	waitFor(t, 5*time.Second, "both see a fleet of 2", func() bool {
		return a.Status().FleetSize == 2 && b.Status().FleetSize == 2
	})
	// a holds one slot of tenant x in fleet mode, and one queued place.
	for range 2 {
		if _, err := a.Enqueue("x", "standard", 8, 4); err != nil {
			t.Fatal(err)
		}
	}
	if r := a.Acquire("x", "standard", 4, 2); r != queue.Granted {
		t.Fatal(r)
	}
	if got := gauge(t, reg, "tiergate_state_degraded"); got != 0 {
		t.Fatalf("degraded before the outage: %v", got)
	}

	s.Kill()
	// The slice of a (rank 0 of 2): 2 slots, tenant limit 1, bound 8 of 16,
	// tenant queue limit 2 of 4.
	start := time.Now()
	if r := a.Acquire("x", "standard", 4, 2); r != queue.TenantFull {
		t.Errorf("x over its slice limit of 1: %v", r)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("the failing call took %s", d)
	}
	if !a.Degraded() {
		t.Fatal("not degraded after a failed call")
	}
	if got := gauge(t, reg, "tiergate_state_degraded"); got != 1 {
		t.Errorf("tiergate_state_degraded = %v, want 1", got)
	}
	if got := testutil.ToFloat64(a.m.wakeups.WithLabelValues(wakeTransition)); got != 1 {
		t.Errorf("transition wake-ups %v, want 1", got)
	}
	steps := []step{
		{op: "enqueue", tenant: "y", want: "ok", n: 2},
		{op: "acquire", tenant: "y", want: "Granted"},
		{op: "enqueue", tenant: "y", want: "ok", n: 2},
		{op: "enqueue", tenant: "z", want: "ok", n: 3},
		{op: "enqueue", tenant: "z", want: "ok", n: 4},
		{op: "enqueue", tenant: "z", want: "tenant", n: 4},
		{op: "enqueue", tenant: "w", want: "ok", n: 5},
		{op: "enqueue", tenant: "w", want: "ok", n: 6},
		{op: "enqueue", tenant: "v", want: "ok", n: 7},
		{op: "enqueue", tenant: "v", want: "ok", n: 8},
		{op: "enqueue", tenant: "u", want: "full", n: 8},
		{op: "acquire", tenant: "z", want: "PoolFull"}, // x and y hold the slice's 2 slots
		{op: "release", tenant: "y"},                   // remembered for Redis
		{op: "acquire", tenant: "z", want: "Granted"},
	}
	start = time.Now()
	runSteps(t, []*Redis{a}, steps, 4, 2, 16, 4)
	if d := time.Since(start); d > 50*time.Millisecond {
		t.Errorf("degraded calls took %s: they must not wait on Redis", d)
	}
	if st := a.Status(); st.Slots != 2 || st.Queued != 7 || st.Pending == 0 {
		t.Errorf("ledger during the outage: %+v", st)
	}

	s.Restart() // empty: persistence is off
	waitFor(t, 5*time.Second, "fleet mode to resume", func() bool { return !a.Degraded() })
	if got := gauge(t, reg, "tiergate_state_degraded"); got != 0 {
		t.Errorf("tiergate_state_degraded after recovery = %v", got)
	}
	ks := keysFor("ns/llm")
	// Redis now counts exactly what a holds.
	waitFor(t, 2*time.Second, "a's leases written back", func() bool {
		return live(t, c, ks.slots()) == 2 && live(t, c, ks.tierQueued("standard")) == 7
	})
	want := map[string]int{
		ks.tenantSlots("x"): 1, ks.tenantSlots("y"): 0, ks.tenantSlots("z"): 1,
		ks.tenantQueued("x"): 1, ks.tenantQueued("y"): 1, ks.tenantQueued("z"): 1,
		ks.tenantQueued("w"): 2, ks.tenantQueued("v"): 2,
	}
	got := map[string]int{}
	for k := range want {
		got[k] = live(t, c, k)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Redis after reconciliation (-want +got):\n%s", diff)
	}
	if n := testutil.ToFloat64(a.m.restored); n != 9 {
		t.Errorf("restored leases counted: %v, want 9", n)
	}
	if got := testutil.ToFloat64(a.m.wakeups.WithLabelValues(wakeTransition)); got != 2 {
		t.Errorf("transition wake-ups %v, want 2", got)
	}
	// Fleet-wide numbers apply again: x may have 2 slots.
	if r := a.Acquire("x", "standard", 4, 2); r != queue.Granted {
		t.Errorf("x after recovery: %v", r)
	}
	if wa.get() == 0 {
		t.Errorf("the queue was never woken")
	}
}

// gauge reads a gauge through the registry, as a scrape would.
func gauge(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("metric %s not registered", name)
	return 0
}

func TestGatePasswordFromFile(t *testing.T) {
	s := redistest.Start(t, redistest.Options{Password: "hunter2"})
	dir := t.TempDir()
	good, bad := filepath.Join(dir, "good"), filepath.Join(dir, "bad")
	if err := os.WriteFile(good, []byte("hunter2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte("wrong"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		file         string
		wantDegraded bool
	}{
		"right password": {good, false},
		"wrong password": {bad, true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			g := newGate(t, s, "d", Config{PasswordFile: tc.file})
			g.ObservePolicy(fleetPolicy("ns/llm", 2))
			_, err := g.Enqueue("a", "standard", 8, 4)
			if err != nil {
				t.Fatalf("enqueue: %v (a Redis failure must fall back, not refuse)", err)
			}
			if got := g.Degraded(); got != tc.wantDegraded {
				t.Errorf("degraded = %v, want %v", got, tc.wantDegraded)
			}
			g.Dequeue("a", "standard")
		})
	}
}

func TestGateInLocalPolicyOnlyKeepsItsLedger(t *testing.T) {
	s := redistest.Start(t, redistest.Options{})
	c := rawClient(t, s)
	g := newGate(t, s, "d", Config{})
	p := fleetPolicy("ns/llm", 1)
	p.SharedState = policy.StateLocal
	g.ObservePolicy(p)
	g.Start(func() {})
	// The queue's own counts enforce a Local policy; the Gate grants.
	for i := range 3 {
		if n, err := g.Enqueue("a", "standard", 1, 1); err != nil || n != 1 {
			t.Fatalf("enqueue %d: %d, %v", i, n, err)
		}
		if r := g.Acquire("a", "standard", 1, 1); r != queue.Granted {
			t.Fatalf("acquire %d: %v", i, r)
		}
	}
	if keys := c.Keys(context.Background(), "*").Val(); len(keys) != 0 {
		t.Errorf("Local mode wrote to Redis: %v", keys)
	}
	// Switching the pool to Redis writes back what is held.
	p.SharedState = policy.StateRedis
	g.ObservePolicy(p)
	waitFor(t, 5*time.Second, "the held slots in Redis", func() bool {
		return live(t, c, keysFor("ns/llm").slots()) == 3
	})
	for range 3 {
		g.Release("a", "standard")
	}
	if n := live(t, c, keysFor("ns/llm").slots()); n != 0 {
		t.Errorf("slots after release: %d", n)
	}
}

// TestGateErrorsAreCountedByOp makes sure a broken Redis shows in metrics.
func TestGateErrorsAreCountedByOp(t *testing.T) {
	g, err := New(Config{URL: "redis://127.0.0.1:" + strconv.Itoa(redistest.FreePort(t)), OpTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	g.ObservePolicy(fleetPolicy("ns/llm", 2))
	n, err := g.Enqueue("a", "standard", 8, 4)
	if err != nil || n != 1 {
		t.Fatalf("enqueue with Redis down: %d, %v", n, err)
	}
	if got := testutil.ToFloat64(g.m.errors.WithLabelValues(opEnqueue)); got != 1 {
		t.Errorf("enqueue errors %v", got)
	}
	// Degraded: the next calls do not try Redis at all.
	g.Acquire("a", "standard", 2, 2)
	g.Release("a", "standard")
	for _, op := range []string{opAcquire, opRelease} {
		if got := testutil.ToFloat64(g.m.errors.WithLabelValues(op)); got != 0 {
			t.Errorf("%s errors %v: a degraded Gate called Redis", op, got)
		}
	}
	if st := g.Status(); st.Pending != 2 || !st.Degraded {
		t.Errorf("status %+v", st)
	}
}

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
	waitFor(t, 5*time.Second, "registered", func() bool { return g.Status().FleetSize == 1 })

	s.Pause()
	defer s.Resume()
	start := time.Now()
	if _, err := g.Enqueue("a", "standard", 8, 4); err != nil {
		t.Fatalf("enqueue against a frozen Redis: %v", err)
	}
	first := time.Since(start)
	if first > opTimeout+300*time.Millisecond {
		t.Errorf("the first call took %s, want about the op timeout %s", first, opTimeout)
	}
	if !g.Degraded() {
		t.Fatal("not degraded")
	}
	start = time.Now()
	for range 100 {
		if r := g.Acquire("a", "standard", 4, 2); r != queue.Granted {
			t.Fatalf("acquire: %v", r)
		}
		g.Release("a", "standard")
		if _, err := g.Enqueue("a", "standard", 8, 4); err != nil {
			t.Fatal(err)
		}
	}
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Errorf("300 degraded calls took %s: they waited on Redis", d)
	}
	s.Resume()
	waitFor(t, 5*time.Second, "fleet mode to resume", func() bool { return !g.Degraded() })
	c := rawClient(t, s)
	ks := keysFor("ns/llm")
	waitFor(t, 2*time.Second, "the queued lease in Redis, the released slots gone", func() bool {
		return live(t, c, ks.tierQueued("standard")) == 1 && live(t, c, ks.slots()) == 0
	})
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
			if _, err := g.Enqueue("a", "standard", 8, 4); err != nil {
				t.Fatal(err)
			}
			if r := g.Acquire("a", "standard", 2, 2); r != queue.Granted {
				t.Fatal(r)
			}
			if g.Degraded() != tc.wantDegraded {
				t.Errorf("degraded = %v, want %v", g.Degraded(), tc.wantDegraded)
			}
			want := 1
			if tc.wantDegraded {
				want = 0
			}
			if n := live(t, c, keysFor("ns/tls").slots()); n != want {
				t.Errorf("slots in Redis: %d, want %d", n, want)
			}
			g.Release("a", "standard")
		})
	}
}

// TestGateOnThreeNodeCluster runs two pools whose hash tags live on
// different nodes of a real 3-node Redis Cluster: with ?cluster=true the
// Gate follows the slots, every script runs where its pool's keys are, and
// a release on one dispatcher wakes the other through the cluster bus.
func TestGateOnThreeNodeCluster(t *testing.T) {
	nodes := redistest.StartCluster(t, 3)
	// Pools whose keys land on different nodes.
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
				return a.Status().FleetSize == 2 && b.Status().FleetSize == 2
			})
			runSteps(t, []*Redis{a, b}, []step{
				{gate: 0, op: "enqueue", tenant: "x", want: "ok", n: 1},
				{gate: 0, op: "acquire", tenant: "x", want: "Granted"},
				{gate: 1, op: "enqueue", tenant: "y", want: "ok", n: 1},
				{gate: 1, op: "acquire", tenant: "y", want: "PoolFull"},
			}, 1, 1, 4, 2)
			before := wakes.get()
			a.Release("x", "standard")
			waitFor(t, 5*time.Second, "b woken through the cluster", func() bool { return wakes.get() > before })
			runSteps(t, []*Redis{a, b}, []step{{gate: 1, op: "acquire", tenant: "y", want: "Granted"}}, 1, 1, 4, 2)
			if a.Degraded() || b.Degraded() {
				t.Errorf("degraded on the cluster: a %v b %v", a.Degraded(), b.Degraded())
			}
			// The pool's keys are on its slot's node only.
			home := nodes[owner(slotOf(pool))]
			if n := live(t, rawClient(t, home), keysFor(pool).slots()); n != 1 {
				t.Errorf("slots on the owning node: %d, want 1", n)
			}
			b.Release("y", "standard")
		})
	}
}

// TestRenewalFollowsTheClock drives the renewal loop with a fake clock: one
// batch per renew interval, none in between, and a lease Redis lost is
// written back by the next one.
func TestRenewalFollowsTheClock(t *testing.T) {
	s := redistest.Start(t, redistest.Options{})
	c := rawClient(t, s)
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	g := newGate(t, s, "a", Config{LeaseTTL: 30 * time.Second, RenewInterval: 10 * time.Second}, WithClock(clk))
	g.ObservePolicy(fleetPolicy("ns/llm", 2)) // asks for a first renewal at once
	g.Start(func() {})
	waitFor(t, 5*time.Second, "the first renewal", func() bool { return histCount(t, g, opRenew) == 1 })
	if _, err := g.Enqueue("a", "standard", 8, 4); err != nil {
		t.Fatal(err)
	}
	ks := keysFor("ns/llm")
	c.Del(context.Background(), ks.tierQueued("standard")) // Redis loses a lease

	clk.Step(9 * time.Second)
	time.Sleep(50 * time.Millisecond)
	if n := histCount(t, g, opRenew); n != 1 {
		t.Fatalf("%d renewals before the interval passed", n)
	}
	clk.Step(time.Second)
	// The tick renews (1 round trip) and writes the lost lease back (1 more).
	waitFor(t, 5*time.Second, "the tick's renewal", func() bool { return histCount(t, g, opRenew) == 3 })
	if n := live(t, c, ks.tierQueued("standard")); n != 1 {
		t.Errorf("queued leases after the renewal: %d, want 1", n)
	}
	if n := testutil.ToFloat64(g.m.restored); n != 1 {
		t.Errorf("restored %v, want 1", n)
	}
	g.Dequeue("a", "standard")
}
