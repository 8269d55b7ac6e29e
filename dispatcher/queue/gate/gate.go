package gate

// Lease names one job's reservation in the fleet, from Enqueue until the
// queue returns it. The zero Lease is no reservation.
type Lease uint64

// Result is a Gate's answer for one job.
type Result uint8

const (
	// OK means Enqueue reserved a queued place or Exchange granted a slot.
	OK Result = iota
	// TierFull (Enqueue) means the tier's queue is at its bound fleet-wide.
	TierFull
	// TenantQueueFull (Enqueue) means the tenant's queued count is at its
	// limit fleet-wide.
	TenantQueueFull
	// PoolFull (Exchange) means every slot of the pool is taken; this and
	// every later claim of the exchange is refused.
	PoolFull
	// TenantFull (Exchange) means the tenant is at its concurrency limit
	// fleet-wide.
	TenantFull
)

func (r Result) String() string {
	switch r {
	case OK:
		return "OK"
	case TierFull:
		return "TierFull"
	case TenantQueueFull:
		return "TenantQueueFull"
	case PoolFull:
		return "PoolFull"
	case TenantFull:
		return "TenantFull"
	}
	return "Result(?)"
}

// Place is Enqueue's answer.
type Place struct {
	// Lease is the job's reservation; zero unless Result is OK.
	Lease Lease
	// QueuedInTier is the tier's queued places fleet-wide: including this
	// one when admitted, the count that refused it otherwise (the queue
	// reports QueuedInTier+1 as the position).
	QueuedInTier int
	// Result is OK, TierFull or TenantQueueFull.
	Result Result
}

// Claim asks for an in-flight slot for one queued job. Exchange sets
// Result to OK, PoolFull or TenantFull.
type Claim struct {
	Lease       Lease
	TenantLimit int // the tenant's concurrency limit, pool-wide
	Result      Result
}

// Gate shares a queue's counts with the rest of the fleet.
type Gate interface {
	// Enqueue reserves a queued place for one job of tenant in tier, the
	// tier the queue admits the job to, if the tier holds fewer than
	// tierBound and the tenant fewer than tenantQueueLimit queued places
	// fleet-wide. An error means the gate could not decide; the queue then
	// refuses the job.
	Enqueue(tenant, tier string, tierBound, tenantQueueLimit int) (Place, error)
	// Exchange first ends every lease in returns (an in-flight slot or a
	// queued place, whichever the lease holds), then decides claims in
	// order: a claim is granted when the pool holds fewer than slots and
	// its tenant fewer than its TenantLimit slots fleet-wide, and the
	// lease's queued place becomes that slot. Exchange never fails: a gate
	// that cannot reach the fleet answers from its own view of it.
	Exchange(slots int, returns []Lease, claims []Claim)
}
