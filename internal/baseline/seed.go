package baseline

import (
	"container/heap"
	"time"
)

// The seed's run-loop constants.
const (
	// SeedRescoreEvery is how long after a rescore the next may run.
	SeedRescoreEvery = time.Second
	// SeedRescoreAbove is how many jobs must be queued for a rescore.
	SeedRescoreAbove = 16
	// seedTimer is how long the loop sleeps at capacity before it wakes
	// without an event.
	seedTimer = time.Second
	// seedPoll is how often the loop polls while every queued job is
	// capped (its busy wait).
	seedPoll = 10 * time.Millisecond
)

// SeedTier is a tier as the seed scheduler holds it.
type SeedTier struct {
	Base  int
	Bound int
	// Cap is the in-flight limit of each tenant of the tier.
	Cap int
}

// SeedLimits is the seed's own formulas, in floating point as it computes
// them: with μ = slots / serviceTime, a tier's bound is max(1, ⌊μ × W⌋)
// and its tenant cap max(1, ⌊slots × share⌋). Unlike tiergate's bound it
// does not take the client timeout into account.
func SeedLimits(slots int, serviceTime time.Duration, waits []time.Duration, shares []float64) (bounds, caps []int) {
	mu := float64(slots) / serviceTime.Seconds()
	for i, w := range waits {
		bounds = append(bounds, max(1, int(mu*w.Seconds())))
		caps = append(caps, max(1, int(float64(slots)*shares[i])))
	}
	return bounds, caps
}

// loopWait is how the seed's run loop waits after a pass that started
// nothing.
type loopWait uint8

const (
	// waitEvent: nothing is queued; the loop sleeps until a job arrives.
	waitEvent loopWait = iota
	// waitTimer: every slot is busy; the loop wakes on an event or after
	// seedTimer.
	waitTimer
	// waitPoll: slots are free but every queued job is capped; the loop
	// polls every seedPoll.
	waitPoll
)

func (w loopWait) step() time.Duration {
	switch w {
	case waitTimer:
		return seedTimer
	case waitPoll:
		return seedPoll
	}
	return 0
}

// Seed is the seed document's scheduler. Jobs sit in one heap ordered by
// (key, arrival); a job enters with its tier's base priority as its key.
// Its run loop makes a pass whenever a job arrives or a slot frees, every
// second while all slots are busy, and every 10 ms while every queued job
// is capped; a pass first rescores every key to base − waited/rate when a
// second or more has passed since the last rescore and more than 16 jobs
// are queued, then pops jobs until one's tenant is under its tier's cap,
// starts it and pushes the capped ones back. Between rescores the heap
// mixes fresh and stale keys, as the seed's does. There is no tenant queue
// limit, no expiry, and no check that a client is still there.
//
// Enqueue and Done wake the loop: call Next until it returns nil, as the
// loop's passes would. Passes without an event are accounted for lazily at
// the next call, which is exact because a rescore depends only on its time
// and the jobs queued.
type Seed[T any] struct {
	counts
	tiers []SeedTier
	// rate is seconds of waiting per priority point.
	rate float64
	heap seedHeap[T]
	seq  uint64
	held []*Job[T]

	rescored    bool
	lastRescore time.Duration
	lastPass    time.Duration
	wait        loopWait
	rescores    int
}

// NewSeed returns an empty Seed with the given ageing rate and tiers, with
// no slots.
func NewSeed[T any](rate time.Duration, tiers []SeedTier) *Seed[T] {
	s := &Seed[T]{counts: newCounts(len(tiers)), rate: rate.Seconds()}
	s.tiers = append(s.tiers, tiers...)
	return s
}

// SetLimits sets the slots and each tier's bound and cap (indexed by
// tier). Queued jobs stay, and keep their keys.
func (s *Seed[T]) SetLimits(slots int, bounds, caps []int) {
	s.slots = slots
	for i := range s.tiers {
		s.tiers[i].Bound, s.tiers[i].Cap = bounds[i], caps[i]
	}
}

// Len is how many jobs are queued.
func (s *Seed[T]) Len() int { return len(s.heap) }

// Rescores counts the rescores so far.
func (s *Seed[T]) Rescores() int { return s.rescores }

// Enqueue queues j with its tier's base priority as its key, or refuses it
// with ErrQueueFull when its tier is at its bound.
func (s *Seed[T]) Enqueue(j *Job[T], now time.Duration) error {
	s.catchUp(now)
	if s.queued[j.Tier] >= s.tiers[j.Tier].Bound {
		return ErrQueueFull
	}
	j.Enqueued, j.queued = now, true
	j.key, j.seq = float64(s.tiers[j.Tier].Base), s.seq
	s.seq++
	heap.Push(&s.heap, j)
	s.queued[j.Tier]++
	return nil
}

// Next is one pass of the run loop at now: the job it starts, or nil when
// it starts none and would wait.
func (s *Seed[T]) Next(now time.Duration) *Job[T] {
	s.catchUp(now)
	s.lastPass = now
	if s.rescoreDue(now) {
		s.rescore(now)
	}
	if s.inFlight >= s.slots || len(s.heap) == 0 {
		s.wait = waitEvent
		if len(s.heap) > 0 {
			s.wait = waitTimer
		}
		return nil
	}
	j := s.nextRunnable()
	if j == nil {
		s.wait = waitPoll
		return nil
	}
	j.queued = false
	s.start(j.Tenant, j.Tier)
	return j
}

// Done frees the slot of a job Next returned.
func (s *Seed[T]) Done(j *Job[T], now time.Duration) {
	s.catchUp(now)
	s.done(j.Tenant)
}

func (s *Seed[T]) rescoreDue(now time.Duration) bool {
	return len(s.heap) > SeedRescoreAbove && (!s.rescored || now-s.lastRescore >= SeedRescoreEvery)
}

// rescore recomputes every key at now and re-heapifies: O(n).
func (s *Seed[T]) rescore(now time.Duration) {
	for _, j := range s.heap {
		j.key = float64(s.tiers[j.Tier].Base) - (now-j.Enqueued).Seconds()/s.rate
	}
	heap.Init(&s.heap)
	s.rescored, s.lastRescore = true, now
	s.rescores++
}

// nextRunnable pops the best job whose tenant is under its cap; the capped
// jobs it popped go back. O(k log n) for k capped jobs ahead of it.
func (s *Seed[T]) nextRunnable() *Job[T] {
	var chosen *Job[T]
	for len(s.heap) > 0 {
		j := heap.Pop(&s.heap).(*Job[T])
		if s.tenantIn[j.Tenant] < s.tiers[j.Tier].Cap {
			chosen = j
			break
		}
		s.held = append(s.held, j)
	}
	for i, j := range s.held {
		heap.Push(&s.heap, j)
		s.held[i] = nil
	}
	s.held = s.held[:0]
	return chosen
}

// catchUp performs the rescores of the passes the loop made without an
// event since the last call: on a grid of step after lastPass, strictly
// before now. Nothing else can happen in them (nothing arrived or freed).
func (s *Seed[T]) catchUp(now time.Duration) {
	step := s.wait.step()
	if step == 0 || now <= s.lastPass {
		return
	}
	// The grid's last point before now: the loop's latest pass.
	latest := s.lastPass + (now-1-s.lastPass)/step*step
	if len(s.heap) > SeedRescoreAbove {
		first := s.lastPass + step
		if s.rescored && s.lastRescore+SeedRescoreEvery > first {
			due := s.lastRescore + SeedRescoreEvery - s.lastPass
			first = s.lastPass + (due+step-1)/step*step
		}
		if first <= latest {
			// After the first, one rescore a second: SeedRescoreEvery is
			// a multiple of step, so each falls on the grid.
			s.rescores += int((latest - first) / SeedRescoreEvery)
			s.rescore(first + (latest-first)/SeedRescoreEvery*SeedRescoreEvery)
		}
	}
	s.lastPass = latest
}

// seedHeap orders jobs by key, then arrival.
type seedHeap[T any] []*Job[T]

func (h seedHeap[T]) Len() int { return len(h) }
func (h seedHeap[T]) Less(i, j int) bool {
	if h[i].key != h[j].key {
		return h[i].key < h[j].key
	}
	return h[i].seq < h[j].seq
}
func (h seedHeap[T]) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *seedHeap[T]) Push(x any)   { *h = append(*h, x.(*Job[T])) }
func (h *seedHeap[T]) Pop() any {
	old := *h
	n := len(old) - 1
	j := old[n]
	old[n] = nil
	*h = old[:n]
	return j
}
