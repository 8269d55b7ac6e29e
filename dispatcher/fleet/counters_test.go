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

// TestCountersShared: two dispatchers' charges add up in Redis, and each
// is handed what the others charged (the total minus its own sent
// deltas); tiers and pools are apart, a tier only written to is written
// and not read, and the hashes expire an hour after their last Sync.
func TestCountersShared(t *testing.T) {
	s := redistest.Start(t, redistest.Options{})
	ctx := context.Background()
	var a0, a1, a2 applied
	c0 := newGate(t, s, "d0", Config{OpTimeout: 5 * time.Second}).Counters(a0.apply)
	c1 := newGate(t, s, "d1", Config{OpTimeout: 5 * time.Second}).Counters(a1.apply)
	c2 := newGate(t, s, "d2", Config{OpTimeout: 5 * time.Second}).Counters(a2.apply)
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
	for i, c := range []*Counters{c0, c1, c2, c0} {
		if err := c.Sync(ctx); err != nil {
			t.Fatalf("Sync %d: %v", i, err)
		}
	}
	want := map[string]map[string]map[string]float64{
		"d0": {"standard": {"acme": 100, "wayne": 0.25}, "free": {"globex": 0}},
		"d1": {"standard": {"acme": 519.5, "wayne": 0}},
		"d2": {"standard": {"acme": 0}},
	}
	got := map[string]map[string]map[string]float64{"d0": a0.get(), "d1": a1.get(), "d2": a2.get()}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("what each was handed of the others' charges (-want +got):\n%s", diff)
	}
	raw := rawClient(t, s)
	k := keysFor("ns/llm")
	if got, err := raw.HGetAll(ctx, k.counters("standard")).Result(); err != nil ||
		!cmp.Equal(got, map[string]string{"acme": "619.5", "wayne": "0.25"}) {
		t.Errorf("the shared totals: %v, %v", got, err)
	}
	if got, err := raw.HGet(ctx, k.counters("premium"), "initech").Result(); err != nil || got != "7" {
		t.Errorf("a tier only written to: %q, %v; want 7", got, err)
	}
	ttl, err := raw.PTTL(ctx, k.counters("standard")).Result()
	if err != nil || ttl <= counterTTL-time.Minute || ttl > counterTTL {
		t.Errorf("counters hash TTL %v, %v; want about %v", ttl, err, counterTTL)
	}

	// The hash lost (expired): a total below what d0 sent counts as all
	// d0's, and later charges of the others show again.
	if err := raw.Del(ctx, k.counters("standard")).Err(); err != nil {
		t.Fatal(err)
	}
	c1.Add("standard", "acme", 30)
	for _, c := range []*Counters{c1, c0} {
		if err := c.Sync(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if diff := cmp.Diff(map[string]float64{"acme": 0}, a0.get()["standard"]); diff != "" {
		t.Errorf("d0 after the hash was lost (-want +got):\n%s", diff)
	}
	c1.Add("standard", "acme", 12)
	for _, c := range []*Counters{c1, c0} {
		if err := c.Sync(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if diff := cmp.Diff(map[string]float64{"acme": 12}, a0.get()["standard"]); diff != "" {
		t.Errorf("d0 after another charge of d1 (-want +got):\n%s", diff)
	}
}

// TestCountersPendingDuringSync: a delta added while a Sync is on the
// network is not in what that Sync hands over (the queue holds it) and is
// sent with the next: counted once locally and once in Redis.
func TestCountersPendingDuringSync(t *testing.T) {
	s := redistest.Start(t, redistest.Options{})
	ctx := context.Background()
	var a0, a1 applied
	c0 := newGate(t, s, "d0", Config{OpTimeout: 5 * time.Second}).Counters(a0.apply)
	c1 := newGate(t, s, "d1", Config{OpTimeout: 5 * time.Second}).Counters(a1.apply)
	c0.SetTiers("ns/llm", []string{"standard"})
	c1.SetTiers("ns/llm", []string{"standard"})
	c0.Add("standard", "acme", 10)
	b := c0.take()
	c0.Add("standard", "acme", 5) // lands during the round trip
	if err := c0.send(ctx, b); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]float64{"acme": 0}, a0.get()["standard"]); diff != "" {
		t.Errorf("d0's view of the others (-want +got):\n%s", diff)
	}
	for _, c := range []*Counters{c0, c1, c0} {
		if err := c.Sync(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if diff := cmp.Diff(map[string]float64{"acme": 15}, a1.get()["standard"]); diff != "" {
		t.Errorf("d1 sees d0's charges, each once (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]float64{"acme": 0}, a0.get()["standard"]); diff != "" {
		t.Errorf("d0 still sees no charge of the others (-want +got):\n%s", diff)
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
	if len(c.own) != 0 {
		t.Errorf("sent totals of the old pool kept: %v", c.own)
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
	if diff := cmp.Diff(map[string]map[string]float64{"standard": {"acme": 0}}, a.get()); diff != "" {
		t.Errorf("counters (-want +got):\n%s", diff)
	}
	cancel()
	<-done
}
