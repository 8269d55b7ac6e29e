package fleet

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/tiergate/tiergate/internal/redistest"
)

// applied records what Counters handed the queue, by tier.
type applied struct {
	mu   sync.Mutex
	last map[string]map[string]float64
	n    int
}

func (a *applied) apply(tier string, c map[string]float64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.last == nil {
		a.last = map[string]map[string]float64{}
	}
	a.last[tier] = c
	a.n++
}

func (a *applied) get() map[string]map[string]float64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.last
}

// TestCountersShared: two dispatchers' charges add up in Redis, each reads
// the sum back, tiers and pools are apart, a tier only written to is
// written and not read, and the hashes expire an hour after their last
// change.
func TestCountersShared(t *testing.T) {
	s := redistest.Start(t, redistest.Options{})
	ctx := context.Background()
	var a0, a1 applied
	c0 := newGate(t, s, "d0", Config{OpTimeout: 5 * time.Second}).Counters(a0.apply)
	c1 := newGate(t, s, "d1", Config{OpTimeout: 5 * time.Second}).Counters(a1.apply)
	other := newGate(t, s, "d2", Config{OpTimeout: 5 * time.Second})
	var a2 applied
	c2 := other.Counters(a2.apply)
	c0.SetTiers("ns/llm", []string{"standard", "free"})
	c1.SetTiers("ns/llm", []string{"standard"})
	c2.SetTiers("ns/other", []string{"standard"})

	c0.Add("standard", "acme", 1040)
	c0.Add("standard", "acme", -520.5) // a settlement's correction
	c0.Add("free", "globex", 65)
	c0.Add("premium", "initech", 7) // a tier this dispatcher does not order
	c1.Add("standard", "acme", 100)
	c1.Add("standard", "wayne", 0.25)
	c2.Add("standard", "acme", 999)
	for i, c := range []*Counters{c0, c1, c2} {
		if err := c.Sync(ctx); err != nil {
			t.Fatalf("Sync %d: %v", i, err)
		}
	}
	if err := c0.Sync(ctx); err != nil { // reads what c1 added
		t.Fatal(err)
	}
	want0 := map[string]map[string]float64{
		"standard": {"acme": 619.5, "wayne": 0.25},
		"free":     {"globex": 65},
	}
	if diff := cmp.Diff(want0, a0.get()); diff != "" {
		t.Errorf("d0's counters (-want +got):\n%s", diff)
	}
	// d1 synced before d0's second sync but after its first.
	if diff := cmp.Diff(map[string]map[string]float64{"standard": {"acme": 619.5, "wayne": 0.25}}, a1.get()); diff != "" {
		t.Errorf("d1's counters (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]map[string]float64{"standard": {"acme": 999}}, a2.get()); diff != "" {
		t.Errorf("another pool's counters (-want +got):\n%s", diff)
	}
	raw := rawClient(t, s)
	k := keysFor("ns/llm")
	if got, err := raw.HGet(ctx, k.counters("premium"), "initech").Result(); err != nil || got != "7" {
		t.Errorf("a tier only written to: %q, %v; want 7", got, err)
	}
	ttl, err := raw.PTTL(ctx, k.counters("standard")).Result()
	if err != nil || ttl <= counterTTL-time.Minute || ttl > counterTTL {
		t.Errorf("counters hash TTL %v, %v; want about %v", ttl, err, counterTTL)
	}
}

// TestCountersPendingDuringSync: a delta added while a Sync is on the
// network is handed to the queue on top of Redis's counters and sent with
// the next Sync: counted once locally and once in Redis.
func TestCountersPendingDuringSync(t *testing.T) {
	s := redistest.Start(t, redistest.Options{})
	ctx := context.Background()
	var a applied
	c := newGate(t, s, "d0", Config{OpTimeout: 5 * time.Second}).Counters(a.apply)
	c.SetTiers("ns/llm", []string{"standard"})
	c.Add("standard", "acme", 10)
	b := c.take()
	c.Add("standard", "acme", 5) // lands during the round trip
	if err := c.send(ctx, b); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]map[string]float64{"standard": {"acme": 15}}, a.get()); diff != "" {
		t.Errorf("counters applied by the Sync the delta missed (-want +got):\n%s", diff)
	}
	for range 2 {
		if err := c.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(map[string]map[string]float64{"standard": {"acme": 15}}, a.get()); diff != "" {
			t.Errorf("counters after the next Syncs (-want +got):\n%s", diff)
		}
	}
}

// TestCountersUnavailable: a Sync Redis cannot answer is an error wrapping
// ErrCountersUnavailable and its cause, keeps its deltas for the next one,
// and applies nothing.
func TestCountersUnavailable(t *testing.T) {
	port := redistest.FreePort(t)
	g, err := New(Config{URL: "redis://127.0.0.1:" + strconv.Itoa(port), OpTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	var a applied
	c := g.Counters(a.apply)
	c.SetTiers("ns/llm", []string{"standard"})
	c.Add("standard", "acme", 10)
	err = c.Sync(context.Background())
	if !errors.Is(err, ErrCountersUnavailable) || !errors.Is(err, syscall.ECONNREFUSED) ||
		!strings.HasPrefix(err.Error(), "fleet: the token counters in Redis are unavailable: dial tcp 127.0.0.1:") {
		t.Errorf("Sync: %v, want ErrCountersUnavailable wrapping connection refused", err)
	}
	if a.n != 0 {
		t.Errorf("applied %d times after a failed Sync, want 0", a.n)
	}
	if diff := cmp.Diff(map[string]map[string]float64{"standard": {"acme": 10}}, c.pending); diff != "" {
		t.Errorf("pending after the failure (-want +got):\n%s", diff)
	}
}

// TestCountersPoolChangeForgetsPending: deltas of the old pool are not
// sent to the new one's counters.
func TestCountersPoolChangeForgetsPending(t *testing.T) {
	s := redistest.Start(t, redistest.Options{})
	var a applied
	c := newGate(t, s, "d0", Config{OpTimeout: 5 * time.Second}).Counters(a.apply)
	c.SetTiers("ns/a", []string{"standard"})
	c.Add("standard", "acme", 10)
	c.SetTiers("ns/b", []string{"standard"})
	if err := c.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]map[string]float64{"standard": {}}, a.get()); diff != "" {
		t.Errorf("the new pool's counters (-want +got):\n%s", diff)
	}
}

// TestCountersRun: the loop syncs at its interval only while deltas are
// pending or the queue has work in a Tokens tier, and stops with ctx.
func TestCountersRun(t *testing.T) {
	s := redistest.Start(t, redistest.Options{})
	clk := clocktesting.NewFakeClock(time.Now())
	var a applied
	c := newGate(t, s, "d0", Config{OpTimeout: 5 * time.Second}, withClock(clk)).Counters(a.apply)
	c.SetTiers("ns/llm", []string{"standard"})
	var active atomic.Bool
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx, 50*time.Millisecond, active.Load) }()
	count := func() int { a.mu.Lock(); defer a.mu.Unlock(); return a.n }
	tick := func() {
		waitFor(t, 5*time.Second, "the ticker armed", clk.HasWaiters)
		clk.Step(50 * time.Millisecond)
	}

	tick()
	time.Sleep(50 * time.Millisecond) // give an unwanted Sync the chance to happen
	if n := count(); n != 0 {
		t.Fatalf("idle: %d syncs, want 0", n)
	}
	c.Add("standard", "acme", 3)
	tick()
	waitFor(t, 5*time.Second, "a sync of the pending delta", func() bool { return count() == 1 })
	active.Store(true)
	tick()
	waitFor(t, 5*time.Second, "a sync while the queue is active", func() bool { return count() == 2 })
	if diff := cmp.Diff(map[string]map[string]float64{"standard": {"acme": 3}}, a.get()); diff != "" {
		t.Errorf("counters (-want +got):\n%s", diff)
	}
	cancel()
	<-done
}
