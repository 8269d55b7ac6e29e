package queue

// AcquireResult is a Gate's answer to a request for a slot.
type AcquireResult int

const (
	// Granted means the slot is taken fleet-wide; the job is dispatched.
	Granted AcquireResult = iota
	// PoolFull means every slot of the pool is taken; dispatch stops until
	// a local release or Kick.
	PoolFull
	// TenantFull means the tenant is at its limit fleet-wide; the tenant waits
	// until one of its local slots frees or Kick is called.
	TenantFull
)

func (r AcquireResult) String() string {
	switch r {
	case Granted:
		return "Granted"
	case PoolFull:
		return "PoolFull"
	case TenantFull:
		return "TenantFull"
	}
	return "AcquireResult(?)"
}

// Gate shares counts across a fleet of dispatchers (fleet mode). The queue
// consults it in addition to its local counts; queue order stays local. The
// queue calls a Gate while holding its own lock, so a Gate must not call
// back into the Queue. Every call for a job names the tier the job was
// admitted to (Enqueue's tier), even if a policy change has since moved
// its tenant to another tier, so the gate's per-tier counts balance.
type Gate interface {
	// Enqueue reserves a queued place fleet-wide, or refuses with
	// ErrQueueFull/ErrTenantLimit and the fleet-wide queued count of the tier
	// (for Position). Any other error refuses the admission as is.
	Enqueue(tenant, tier string, tierBound, tenantQueueLimit int) (queuedInTier int, err error)
	// Dequeue gives back a queued place: the job left without dispatch.
	Dequeue(tenant, tier string)
	// Acquire turns a queued place into an in-flight slot when the pool and
	// the tenant are under slots and tenantLimit fleet-wide.
	Acquire(tenant, tier string, slots, tenantLimit int) AcquireResult
	// Release gives back an in-flight slot.
	Release(tenant, tier string)
}
