package baseline

import "time"

// FCFS is one unbounded FIFO in front of the model server's slots: the
// oldest job runs first, whatever its tier or tenant. It refuses nothing,
// expires nothing and cannot withdraw a job whose client left.
type FCFS[T any] struct {
	counts
	q fifo[T]
}

// NewFCFS returns an empty FCFS for jobs of tiers tiers, with no slots.
func NewFCFS[T any](tiers int) *FCFS[T] {
	return &FCFS[T]{counts: newCounts(tiers)}
}

// SetSlots sets how many jobs may run at once. After a decrease, running
// jobs finish; Next waits until fewer than n run.
func (s *FCFS[T]) SetSlots(n int) { s.slots = n }

// Enqueue appends j; it never refuses.
func (s *FCFS[T]) Enqueue(j *Job[T], now time.Duration) error {
	j.Enqueued, j.queued = now, true
	s.q.push(j)
	s.queued[j.Tier]++
	return nil
}

// Next starts the oldest job if a slot is free; nil otherwise.
func (s *FCFS[T]) Next(time.Duration) *Job[T] {
	j := s.q.head
	if j == nil || s.inFlight >= s.slots {
		return nil
	}
	s.q.remove(j)
	j.queued = false
	s.start(j.Tenant, j.Tier)
	return j
}

// Done frees the slot of a job Next returned.
func (s *FCFS[T]) Done(j *Job[T], _ time.Duration) { s.done(j.Tenant) }
