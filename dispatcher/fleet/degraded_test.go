package fleet

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clocktesting "k8s.io/utils/clock/testing"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/dispatcher/queue/gate"
	"github.com/tiergate/tiergate/internal/redistest"
)

func TestRecheckTimerTakesTheEarlierDeadline(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	g, err := New(Config{URL: "redis://127.0.0.1:1", RecheckInterval: 3 * time.Second}, withClock(clk))
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
		return a.status().FleetSize == 2 && b.status().FleetSize == 2
	})
	// a holds one slot of tenant x in fleet mode, and one queued place.
	l := newLeases(t, a)
	l.enqueue(0, "x1", "x", 16, 4, ok, 1)
	l.enqueue(0, "x2", "x", 16, 4, ok, 2)
	l.claim(4, 2, results(ok), "x1")
	if got := gauge(t, reg, "tiergate_state_degraded"); got != 0 {
		t.Fatalf("degraded before the outage: %v", got)
	}

	s.Kill()
	// The slice of a (rank 0 of 2): 2 slots, tenant limit 1, bound 8 of 16,
	// tenant queue limit 2 of 4.
	start := time.Now()
	l.claim(4, 2, results(tenantFull), "x2") // x over its slice limit of 1
	if d := time.Since(start); d > time.Second {
		t.Errorf("the failing call took %s", d)
	}
	if !a.status().Degraded {
		t.Fatal("not degraded after a failed call")
	}
	if got := gauge(t, reg, "tiergate_state_degraded"); got != 1 {
		t.Errorf("tiergate_state_degraded = %v, want 1", got)
	}
	if got := testutil.ToFloat64(a.m.wakeups.WithLabelValues(wakeTransition)); got != 1 {
		t.Errorf("transition wake-ups %v, want 1", got)
	}
	calls := roundTrips(t, a)
	l.enqueue(0, "y1", "y", 16, 4, ok, 2)
	l.claim(4, 2, results(ok), "y1")
	l.enqueue(0, "y2", "y", 16, 4, ok, 2)
	l.enqueue(0, "z1", "z", 16, 4, ok, 3)
	l.enqueue(0, "z2", "z", 16, 4, ok, 4)
	l.enqueue(0, "z3", "z", 16, 4, gate.TenantQueueFull, 4)
	for i, tn := range []string{"w", "w", "v", "v"} {
		l.enqueue(0, tn+strconv.Itoa(i), tn, 16, 4, ok, 5+i)
	}
	l.enqueue(0, "u", "u", 16, 4, gate.TierFull, 8)
	l.claim(4, 2, results(poolFull), "z1") // x and y hold the slice's 2 slots
	l.give("y1")                           // remembered for Redis
	l.claim(4, 2, results(ok), "z1")
	if n := roundTrips(t, a) - calls; n != 0 {
		t.Errorf("degraded calls made %d round trips: they must not wait on Redis", n)
	}
	if st := a.status(); st.Slots != 2 || st.Queued != 7 || st.Pending == 0 {
		t.Errorf("ledger during the outage: %+v", st)
	}

	s.Restart() // empty: persistence is off
	waitFor(t, 5*time.Second, "fleet mode to resume", func() bool { return !a.status().Degraded })
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
	l.claim(4, 2, results(ok), "x2")
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
			// A Redis failure must fall back, not refuse.
			l := newLeases(t, g)
			l.enqueue(0, "a", "a", 8, 4, ok, 1)
			if got := g.status().Degraded; got != tc.wantDegraded {
				t.Errorf("degraded = %v, want %v", got, tc.wantDegraded)
			}
			l.give("a")
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
	l := newLeases(t, g)
	for i := range 3 {
		name := "a" + strconv.Itoa(i)
		l.enqueue(0, name, "a", 1, 1, ok, 1)
		l.claim(1, 1, results(ok), name)
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
	l.give("a0", "a1", "a2")
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
	l := newLeases(t, g)
	l.enqueue(0, "a", "a", 8, 4, ok, 1)
	if got := testutil.ToFloat64(g.m.errors.WithLabelValues(opEnqueue)); got != 1 {
		t.Errorf("enqueue errors %v", got)
	}
	// Degraded: the next calls do not try Redis at all.
	l.claim(2, 2, results(ok), "a")
	l.give("a")
	if got := testutil.ToFloat64(g.m.errors.WithLabelValues(opExchange)); got != 0 {
		t.Errorf("exchange errors %v: a degraded Gate called Redis", got)
	}
	// Its queued place (granted) and its slot (given back) wait for Redis.
	if st := g.status(); st.Pending != 2 || !st.Degraded {
		t.Errorf("status %+v", st)
	}
}

// roundTrips counts the enqueue and exchange round trips g attempted.
func roundTrips(t *testing.T, g *Redis) uint64 {
	t.Helper()
	return histCount(t, g, opEnqueue) + histCount(t, g, opExchange)
}
