package queue

import (
	"context"
	"fmt"
	"runtime"
	"syscall"
	"testing"
	"time"

	"k8s.io/utils/clock"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/internal/baseline"
)

// Benchmarks compare the queue with the seed scheduler's algorithm
// (internal/baseline's Seed, which the simulator also runs), on the same
// workload: one cycle = admit one job,
// release the oldest in-flight job, dispatch the next, advance the clock
// 1ms (a pool completing 1000 requests/s). Reproduce with the command in
// docs/benchmarks.md.

const (
	benchTenants = 1000
	benchSlots   = 64
	benchStep    = time.Millisecond
)

var benchTiers = []string{"premium", "standard", "free"}

// benchClock is a minimal manual clock: benchmarks measure the queue, not a
// fake clock's locking. Expiry is off in these policies, so it never
// schedules anything.
type benchClock struct{ now time.Time }

var _ clock.WithDelayedExecution = (*benchClock)(nil)

func (c *benchClock) Now() time.Time                  { return c.now }
func (c *benchClock) Since(t time.Time) time.Duration { return c.now.Sub(t) }
func (c *benchClock) Step(d time.Duration)            { c.now = c.now.Add(d) }
func (c *benchClock) After(time.Duration) <-chan time.Time {
	panic("benchClock: After")
}
func (c *benchClock) NewTimer(time.Duration) clock.Timer { panic("benchClock: NewTimer") }
func (c *benchClock) Sleep(time.Duration)                { panic("benchClock: Sleep") }
func (c *benchClock) Tick(time.Duration) <-chan time.Time {
	panic("benchClock: Tick")
}
func (c *benchClock) AfterFunc(time.Duration, func()) clock.Timer {
	panic("benchClock: AfterFunc")
}

type stepper interface{ Step(time.Duration) }

// processCPU is the CPU time this process has used (user + system, all
// threads, so GC work counts too).
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU adds cpu-ns/op: unlike ns/op (wall time) it does not count the
// time the benchmark waited for a core on a shared machine.
func reportCPU(b *testing.B, since time.Duration) {
	b.ReportMetric(float64(processCPU()-since)/float64(b.N), "cpu-ns/op")
}

// benchPolicy: the seed's three tiers with bounds large enough for the
// benchmark's steady queue and no expiry.
func benchPolicy(slots, queued int) *policy.Policy {
	bound := queued + 1
	return &policy.Policy{
		Version: 1, Slots: slots, ServiceRate: 1000, AgeingRate: 6,
		Authentication: policy.Authentication{Mode: policy.AuthAPIKey},
		Tiers: []policy.Tier{
			{Name: "premium", BasePriority: 0, TolerableWaitSeconds: 5, QueueBound: bound, TenantConcurrencyLimit: 4, TenantQueueLimit: bound},
			{Name: "standard", BasePriority: 10, TolerableWaitSeconds: 20, QueueBound: bound, TenantConcurrencyLimit: 4, TenantQueueLimit: bound},
			{Name: "free", BasePriority: 20, TolerableWaitSeconds: 60, QueueBound: bound, TenantConcurrencyLimit: 4, TenantQueueLimit: bound},
		},
		Backends: []policy.Backend{{Address: "127.0.0.1:8000"}},
	}
}

// ring is a FIFO of in-flight jobs.
type ring[T any] struct {
	buf        []T
	head, size int
}

func (r *ring[T]) push(v T) {
	if r.size == len(r.buf) {
		nb := make([]T, max(16, 2*len(r.buf)))
		for i := range r.size {
			nb[i] = r.buf[(r.head+i)%len(r.buf)]
		}
		r.buf, r.head = nb, 0
	}
	r.buf[(r.head+r.size)%len(r.buf)] = v
	r.size++
}

func (r *ring[T]) pop() T {
	v := r.buf[r.head]
	var zero T
	r.buf[r.head] = zero
	r.head = (r.head + 1) % len(r.buf)
	r.size--
	return v
}

// benchWorkload drives the tiergate queue.
type benchWorkload struct {
	q        *Queue
	names    []string
	tiers    []string
	next     int
	inFlight ring[*Handle]
	fresh    ring[*Handle] // dispatched in this cycle, Wait not yet called
	costs    []Cost        // when set, admissions cycle through these sizes
}

func tenantNamesN(n int, prefix string) []string {
	s := make([]string, n)
	for i := range s {
		s[i] = fmt.Sprint(prefix, i)
	}
	return s
}

// newBenchWorkload fills q to a steady state: every slot busy and queued
// jobs waiting, spread round-robin over tenants and tiers.
func newBenchWorkload(q *Queue, tenants, queued int) *benchWorkload {
	w := &benchWorkload{q: q, names: tenantNamesN(tenants, "t"), tiers: make([]string, tenants)}
	for i := range w.tiers {
		w.tiers[i] = benchTiers[i%3]
	}
	q.setOnDispatch(func(h *Handle) { w.fresh.push(h) })
	for range q.slots + queued {
		w.admit()
	}
	w.collect(context.Background())
	return w
}

func (w *benchWorkload) admit() {
	i := w.next % len(w.names)
	w.next++
	var c Cost
	if len(w.costs) > 0 {
		c = w.costs[w.next%len(w.costs)]
	}
	if _, err := w.q.AdmitCost(w.names[i], w.tiers[i], c); err != nil {
		panic(err)
	}
}

// collect does what a dispatcher's request goroutine does on dispatch:
// Wait returns, and the job starts running.
func (w *benchWorkload) collect(ctx context.Context) {
	for w.fresh.size > 0 {
		h := w.fresh.pop()
		if err := h.Wait(ctx); err != nil {
			panic(err)
		}
		w.inFlight.push(h)
	}
}

func (w *benchWorkload) cycle(ctx context.Context, clk stepper) {
	w.admit()
	w.inFlight.pop().Release()
	w.collect(ctx)
	clk.Step(benchStep)
}

// newSeedBaseline is the seed scheduler's algorithm (internal/baseline's
// Seed: one heap of jobs, rescored on its loop's one-second timer once more
// than 16 are queued, capped jobs popped and pushed back) with p's slots,
// bounds and caps.
func newSeedBaseline(p *policy.Policy) *baseline.Seed[struct{}] {
	tiers := make([]baseline.SeedTier, len(p.Tiers))
	bounds, caps := make([]int, len(p.Tiers)), make([]int, len(p.Tiers))
	for i, t := range p.Tiers {
		tiers[i].Base = t.BasePriority
		bounds[i], caps[i] = t.QueueBound, t.TenantConcurrencyLimit
	}
	s := baseline.NewSeed[struct{}](time.Duration(p.AgeingRate*float64(time.Second)), tiers)
	s.SetLimits(p.Slots, bounds, caps)
	return s
}

type seedJob = baseline.Job[struct{}]

// seedWorkload drives the seed baseline through the same cycle.
type seedWorkload struct {
	s        *baseline.Seed[struct{}]
	clk      *benchClock
	names    []string
	next     int
	inFlight ring[*seedJob]
}

func newSeedWorkload(clk *benchClock, s *baseline.Seed[struct{}], tenants, queued int) *seedWorkload {
	w := &seedWorkload{s: s, clk: clk, names: tenantNamesN(tenants, "t")}
	for range s.Slots() + queued {
		w.submit()
	}
	return w
}

func (w *seedWorkload) now() time.Duration { return w.clk.now.Sub(t0) }

func (w *seedWorkload) submit() {
	i := w.next % len(w.names)
	w.next++
	w.submitJob(w.names[i], i%3)
}

func (w *seedWorkload) submitJob(tenant string, tier int) {
	if err := w.s.Enqueue(&seedJob{Tenant: tenant, Tier: tier}, w.now()); err != nil {
		panic(err)
	}
	w.drainLoop() // submit wakes the run loop
}

func (w *seedWorkload) drainLoop() {
	now := w.now()
	for j := w.s.Next(now); j != nil; j = w.s.Next(now) {
		w.inFlight.push(j)
	}
}

func (w *seedWorkload) release() {
	w.s.Done(w.inFlight.pop(), w.now())
}

func (w *seedWorkload) cycle() {
	w.submit()
	w.release()
	w.drainLoop() // completion wakes the run loop
	w.clk.Step(benchStep)
}

func BenchmarkDispatch(b *testing.B) {
	// Sizes outside, implementations inside: the two run close together in
	// time, which matters on a shared, noisy machine.
	for _, queued := range []int{1000, 100000, 1000000} {
		for _, impl := range []string{"tiergate", "seed"} {
			b.Run(fmt.Sprintf("impl=%s/queued=%d", impl, queued), func(b *testing.B) {
				clk := &benchClock{now: t0}
				p := benchPolicy(benchSlots, queued)
				var cycle func()
				if impl == "tiergate" {
					q := New(clk)
					q.UpdatePolicy(p)
					w := newBenchWorkload(q, benchTenants, queued)
					ctx := context.Background()
					cycle = func() { w.cycle(ctx, clk) }
				} else {
					w := newSeedWorkload(clk, newSeedBaseline(p), benchTenants, queued)
					cycle = w.cycle
				}
				b.ReportAllocs()
				runtime.GC() // the setup's garbage is not the cycle's
				cpu0 := processCPU()
				b.ResetTimer()
				for range b.N {
					cycle()
				}
				b.StopTimer()
				reportCPU(b, cpu0)
			})
		}
	}
}

// BenchmarkNoisyNeighbour: one premium tenant holds its 4 slots and has
// `blocked` more jobs queued, older than everyone else's; 100 standard
// tenants keep 1000 jobs queued and dispatching through the other slots.
func BenchmarkNoisyNeighbour(b *testing.B) {
	const others, othersQueued = 100, 1000
	for _, blocked := range []int{100, 10000} {
		for _, impl := range []string{"tiergate", "seed"} {
			b.Run(fmt.Sprintf("impl=%s/blocked=%d", impl, blocked), func(b *testing.B) {
				clk := &benchClock{now: t0}
				p := benchPolicy(benchSlots, blocked+othersQueued)
				p.Tiers[1].TenantConcurrencyLimit = 8
				names := tenantNamesN(others, "o")
				var cycle func()
				if impl == "tiergate" {
					q := New(clk)
					q.UpdatePolicy(p)
					w := &benchWorkload{q: q, names: names, tiers: make([]string, others)}
					for i := range w.tiers {
						w.tiers[i] = "standard"
					}
					for range 4 + blocked { // the hog's first 4 run and never finish
						mustAdmit(b, q, "hog", "premium")
					}
					q.setOnDispatch(func(h *Handle) { w.fresh.push(h) })
					clk.Step(time.Second)
					for range benchSlots - 4 + othersQueued {
						w.admit()
					}
					w.collect(context.Background())
					if q.Stats().TenantInFlight["hog"] != 4 || q.Stats().Queued != blocked+othersQueued {
						b.Fatalf("setup: %+v", q.Stats())
					}
					ctx := context.Background()
					cycle = func() { w.cycle(ctx, clk) }
				} else {
					s := newSeedBaseline(p)
					w := &seedWorkload{s: s, clk: clk, names: names}
					for range 4 + blocked {
						w.submitJob("hog", 0)
					}
					w.inFlight = ring[*seedJob]{} // the hog's 4 never finish
					clk.Step(time.Second)
					for range benchSlots - 4 + othersQueued {
						w.submitTo(1)
					}
					if s.TenantInFlight("hog") != 4 || s.Len() != blocked+othersQueued {
						b.Fatalf("setup: hog %d queued %d", s.TenantInFlight("hog"), s.Len())
					}
					cycle = func() {
						w.submitTo(1)
						w.release()
						w.drainLoop()
						clk.Step(benchStep)
					}
				}
				b.ReportAllocs()
				runtime.GC() // the setup's garbage is not the cycle's
				cpu0 := processCPU()
				b.ResetTimer()
				for range b.N {
					cycle()
				}
				b.StopTimer()
				reportCPU(b, cpu0)
			})
		}
	}
}

func (w *seedWorkload) submitTo(tier int) {
	i := w.next % len(w.names)
	w.next++
	w.submitJob(w.names[i], tier)
}

// BenchmarkDispatchFairness: BenchmarkDispatch's cycle in Requests and in
// Tokens fairness, beside each other at each size. Requests sizes vary
// 40-fold (a heavy tail of 1 in 7); Tokens mode charges, lifts and
// chooses by counter within each tier.
func BenchmarkDispatchFairness(b *testing.B) {
	costs := []Cost{{100, 20}, {120, 10}, {4000, 200}, {90, 30}, {200, 50}, {150, 0}, {110, 40}}
	for _, queued := range []int{1000, 1000000} {
		for _, mode := range []string{policy.FairnessRequests, policy.FairnessTokens} {
			b.Run(fmt.Sprintf("mode=%s/queued=%d", mode, queued), func(b *testing.B) {
				clk := &benchClock{now: t0}
				p := benchPolicy(benchSlots, queued)
				p.Fairness = &policy.Fairness{Mode: mode}
				q := New(clk)
				q.UpdatePolicy(p)
				w := &benchWorkload{q: q, names: tenantNamesN(benchTenants, "t"), tiers: make([]string, benchTenants), costs: costs}
				for i := range w.tiers {
					w.tiers[i] = benchTiers[i%3]
				}
				q.setOnDispatch(func(h *Handle) { w.fresh.push(h) })
				for range q.slots + queued {
					w.admit()
				}
				ctx := context.Background()
				w.collect(ctx)
				b.ReportAllocs()
				runtime.GC()
				cpu0 := processCPU()
				b.ResetTimer()
				for range b.N {
					w.cycle(ctx, clk)
				}
				b.StopTimer()
				reportCPU(b, cpu0)
			})
		}
	}
}

// BenchmarkQueuedAccessor: what the fleet's counter sync pays each tick to
// ask whether the queue has work, Queued() against the Stats() snapshot it
// used to take, with 1,000 tenants queued.
func BenchmarkQueuedAccessor(b *testing.B) {
	clk := &benchClock{now: t0}
	q := New(clk)
	q.UpdatePolicy(benchPolicy(benchSlots, 1000))
	newBenchWorkload(q, benchTenants, 1000)
	for _, how := range []string{"Queued", "Stats"} {
		b.Run("via="+how, func(b *testing.B) {
			b.ReportAllocs()
			var n int
			for range b.N {
				if how == "Queued" {
					n += q.Queued()
				} else {
					n += q.Stats().Queued
				}
			}
			if n == 0 {
				b.Fatal("nothing queued")
			}
		})
	}
}
