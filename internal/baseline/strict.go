package baseline

import (
	"slices"
	"time"
)

// Strict serves the band of the lowest base priority first and FIFO within
// a band (tiers of equal base priority share one). A tier's queue is
// bounded; a job queued for the client timeout expires; a job whose client
// leaves is withdrawn. Nothing ages and no tenant is capped, so under
// sustained load of the higher bands a lower band is never served.
type Strict[T any] struct {
	counts
	bandOf  []int
	bands   []fifo[T]
	bounds  []int
	timeout time.Duration
}

// NewStrict returns an empty Strict for tiers with the given base
// priorities (indexed by tier), with no slots and every bound 0.
func NewStrict[T any](bases []int) *Strict[T] {
	distinct := slices.Clone(bases)
	slices.Sort(distinct)
	distinct = slices.Compact(distinct)
	s := &Strict[T]{counts: newCounts(len(bases)), bandOf: make([]int, len(bases)),
		bands: make([]fifo[T], len(distinct)), bounds: make([]int, len(bases))}
	for i, b := range bases {
		s.bandOf[i], _ = slices.BinarySearch(distinct, b)
	}
	return s
}

// SetLimits sets the slots, each tier's queue bound (indexed by tier) and
// the client timeout after which a queued job expires (0: never). A
// lowered bound refuses new jobs; it does not drop queued ones.
func (s *Strict[T]) SetLimits(slots int, bounds []int, timeout time.Duration) {
	s.slots, s.timeout = slots, timeout
	copy(s.bounds, bounds)
}

// Enqueue queues j, or refuses it with ErrQueueFull when its tier is at its
// bound.
func (s *Strict[T]) Enqueue(j *Job[T], now time.Duration) error {
	if s.queued[j.Tier] >= s.bounds[j.Tier] {
		return ErrQueueFull
	}
	j.Enqueued, j.queued = now, true
	s.bands[s.bandOf[j.Tier]].push(j)
	s.queued[j.Tier]++
	return nil
}

// Next starts the head of the best non-empty band if a slot is free.
func (s *Strict[T]) Next(time.Duration) *Job[T] {
	if s.inFlight >= s.slots {
		return nil
	}
	for b := range s.bands {
		if j := s.bands[b].head; j != nil {
			s.unlink(j)
			s.start(j.Tenant, j.Tier)
			return j
		}
	}
	return nil
}

// Done frees the slot of a job Next returned.
func (s *Strict[T]) Done(j *Job[T], _ time.Duration) { s.done(j.Tenant) }

// Remove withdraws a queued job (its client left); false if j is not
// queued.
func (s *Strict[T]) Remove(j *Job[T]) bool {
	if !j.queued {
		return false
	}
	s.unlink(j)
	s.queued[j.Tier]--
	return true
}

func (s *Strict[T]) unlink(j *Job[T]) {
	s.bands[s.bandOf[j.Tier]].remove(j)
	j.queued = false
}

// NextDeadline is when the oldest queued job expires; false when none
// will.
func (s *Strict[T]) NextDeadline() (time.Duration, bool) {
	if s.timeout <= 0 {
		return 0, false
	}
	var best time.Duration
	found := false
	for b := range s.bands {
		if j := s.bands[b].head; j != nil && (!found || j.Enqueued < best) {
			best, found = j.Enqueued, true
		}
	}
	return best + s.timeout, found
}

// Expire ends every job queued for the timeout or longer at now and
// appends them to out, band by band.
func (s *Strict[T]) Expire(now time.Duration, out []*Job[T]) []*Job[T] {
	if s.timeout <= 0 {
		return out
	}
	for b := range s.bands {
		for j := s.bands[b].head; j != nil && now-j.Enqueued >= s.timeout; j = s.bands[b].head {
			s.unlink(j)
			s.queued[j.Tier]--
			out = append(out, j)
		}
	}
	return out
}
