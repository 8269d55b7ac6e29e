package baseline

import (
	"errors"
	"time"
)

// ErrQueueFull is Enqueue's refusal: the job's tier queue is at its bound.
var ErrQueueFull = errors.New("baseline: tier queue is full")

// Job is one request. The caller fills the exported fields before Enqueue
// and must not change them while the scheduler holds the job (from Enqueue
// until Next returns it, Remove takes it out or Expire ends it).
type Job[T any] struct {
	// Value is the caller's own, never read here.
	Value  T
	Tenant string
	// Tier indexes the tiers the scheduler was built with.
	Tier int
	// Enqueued is set by Enqueue.
	Enqueued time.Duration

	seq uint64
	// key is Seed's sort key, in priority points; smaller runs sooner.
	key float64
	// prev and next link the job into a FIFO (FCFS, Strict).
	prev, next *Job[T]
	queued     bool
}

// fifo is an intrusive doubly linked queue of jobs in arrival order.
type fifo[T any] struct {
	head, tail *Job[T]
}

func (f *fifo[T]) push(j *Job[T]) {
	j.prev, j.next = f.tail, nil
	if f.tail != nil {
		f.tail.next = j
	} else {
		f.head = j
	}
	f.tail = j
}

func (f *fifo[T]) remove(j *Job[T]) {
	if j.prev != nil {
		j.prev.next = j.next
	} else {
		f.head = j.next
	}
	if j.next != nil {
		j.next.prev = j.prev
	} else {
		f.tail = j.prev
	}
	j.prev, j.next = nil, nil
}

// counts is what every scheduler keeps: in flight, per tenant and pool,
// and queued per tier.
type counts struct {
	slots    int
	inFlight int
	tenantIn map[string]int
	queued   []int
}

func newCounts(tiers int) counts {
	return counts{tenantIn: map[string]int{}, queued: make([]int, tiers)}
}

// start counts a dispatched job of tenant from tier.
func (c *counts) start(tenant string, tier int) {
	c.queued[tier]--
	c.inFlight++
	c.tenantIn[tenant]++
}

// done counts a finished job of tenant.
func (c *counts) done(tenant string) {
	c.inFlight--
	if n := c.tenantIn[tenant] - 1; n > 0 {
		c.tenantIn[tenant] = n
	} else {
		delete(c.tenantIn, tenant)
	}
}

// Queued is how many jobs of tier are queued.
func (c *counts) Queued(tier int) int { return c.queued[tier] }

// InFlight is how many jobs are running.
func (c *counts) InFlight() int { return c.inFlight }

// TenantInFlight is how many of tenant's jobs are running.
func (c *counts) TenantInFlight(tenant string) int { return c.tenantIn[tenant] }

// Slots is how many jobs may run at once.
func (c *counts) Slots() int { return c.slots }
