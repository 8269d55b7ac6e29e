package queue

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/tiergate/tiergate/dispatcher/queue/gate"
)

// Admit enqueues a request of tenant, or refuses it. Refusals:
// ErrDraining, ErrNoPolicy, ErrUnknownTier, ErrNoCapacity, and *Refusal
// wrapping ErrQueueFull or ErrTenantLimit, checked in that order.
//
// The policy in force decides the tier, not the caller: the request joins
// the tier where its tenant's queued work is (UpdatePolicy keeps that
// where the policy puts the tenant), else the tenant's listed tier, else
// the default tier. Only for a tenant that the policy neither lists nor
// gives a default tier is callerTier, the tier the caller identified the
// tenant in, used. A caller that identified the tenant under an older
// policy therefore gets the current tier, and no queued work moves. The
// handle's Tier says which tier it joined.
//
// A policy with 0 slots refuses every request with ErrNoCapacity, unless
// it holds for a cold start (policy.HoldsForColdStart): then requests are
// held within the bounds, with no slot, until a policy with slots
// dispatches them, and a tier whose bound is 0 is refused with
// *ColdStartRefusal (which wraps ErrNoCapacity).
//
// In local mode, if a slot is free and nothing outranks the job, it is
// dispatched before Admit returns (Wait then returns nil at once). In fleet
// mode Admit asks the Gate for a queued place, without holding the queue's
// lock, and a Gate error other than a refusal is returned wrapped; the job
// is then dispatched once the Gate grants it a slot.
func (q *Queue) Admit(tenantID, callerTier string) (*Handle, error) {
	return q.AdmitCost(tenantID, callerTier, Cost{})
}

// AdmitCost is Admit for a request of cost c (negative parts count as 0).
// Its weighted cost (the policy's fairness weights) is what Tokens mode
// charges the tenant's counter at dispatch and what a tier's token bound
// counts while it is queued (see docs/scheduling.md#fairness-within-a-tier).
// A tier with a token bound refuses, with the same *Refusal as its
// request bound, a request that would take its queued tokens past the
// bound, unless nothing is queued in it, and one that would take its
// tenant's queued tokens past TenantQueueTokenLimit, unless the tenant has
// nothing queued: a request larger than a bound is not refused for ever.
func (q *Queue) AdmitCost(tenantID, callerTier string, c Cost) (*Handle, error) {
	c.Prompt, c.Output = max(c.Prompt, 0), max(c.Output, 0)
	if q.gate != nil {
		return q.admitFleet(tenantID, callerTier, c)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.now()
	tr, err := q.admissionLocked(tenantID, callerTier, now)
	if err != nil {
		return nil, err
	}
	w := q.fair.Cost(c.Prompt, c.Output)
	// A free slot means no runnable tenant is waiting, so a tenant under
	// its cap runs now; the bound limits waiting, not running.
	if ts := q.tenants[tenantID]; q.inFlight < q.slots && (ts == nil || ts.inFlight < ts.limit) {
		j := q.newJobLocked(tenantID, tr, c, now)
		j.h.state = stDispatched
		q.startJob(j, now)
		return j.h, nil
	}
	if err := q.boundsLocked(tr, tenantID, w, now); err != nil {
		return nil, err
	}
	h := q.enqueueLocked(tenantID, tr, c, 0, now)
	q.dispatchLocked(now)
	return h, nil
}

// admitFleet is Admit in fleet mode: local checks under the lock, the
// fleet-wide reservation outside it, then the checks again (a policy or a
// drain may have come meanwhile) and the job joins the queue.
func (q *Queue) admitFleet(tenantID, callerTier string, c Cost) (*Handle, error) {
	q.mu.Lock()
	now := q.now()
	w := q.fair.Cost(c.Prompt, c.Output)
	tr, err := q.admissionLocked(tenantID, callerTier, now)
	if err == nil {
		err = q.boundsLocked(tr, tenantID, w, now)
	}
	var bound, qlimit int
	var reserved string
	if err == nil {
		bound, qlimit, reserved = gateBounds(tr)
	}
	q.unlock()
	if err != nil {
		return nil, err
	}

	place, gerr := q.gate.Enqueue(tenantID, reserved, bound, qlimit)

	q.mu.Lock()
	defer q.unlock()
	if gerr != nil {
		return nil, fmt.Errorf("queue: gate enqueue: %w", gerr)
	}
	now = q.now()
	// A policy that came meanwhile may put the tenant in another tier: the
	// job joins that one with its place, as UpdatePolicy moves queued jobs.
	if tr, err = q.admissionLocked(tenantID, callerTier, now); err != nil {
		if place.Result == gate.OK {
			q.fleet.returns = append(q.fleet.returns, place.Lease)
		}
		return nil, err
	}
	switch place.Result {
	case gate.OK:
	case gate.TenantQueueFull:
		return nil, q.refuse(tr, ErrTenantLimit, place.QueuedInTier, now)
	default:
		return nil, q.refuse(tr, ErrQueueFull, place.QueuedInTier, now)
	}
	if tr.tokenBound > 0 {
		w = q.fair.Cost(c.Prompt, c.Output)
		// The Gate counts requests only: token bounds are local, checked
		// again now that others may have been admitted meanwhile.
		if err := q.tokenBoundsLocked(tr, q.tenants[tenantID], w, now); err != nil {
			q.fleet.returns = append(q.fleet.returns, place.Lease)
			return nil, err
		}
	}
	return q.enqueueLocked(tenantID, tr, c, place.Lease, now), nil
}

// gateBounds are the bounds a tier gives the Gate's Enqueue: its request
// bounds, or, under token bounds (which the Gate does not count), none for
// the tier and the tenant's request limit unless it has a token limit.
func gateBounds(tr *tierState) (bound, qlimit int, tier string) {
	if tr.tokenBound == 0 {
		return tr.bound, tr.qlimit, tr.name
	}
	qlimit = tr.qlimit
	if tr.tokenLimit > 0 {
		qlimit = math.MaxInt32
	}
	return math.MaxInt32, qlimit, tr.name
}

// admissionLocked is the checks every admission passes first. It returns
// the tier the job joins (see Admit).
func (q *Queue) admissionLocked(tenantID, callerTier string, now int64) (*tierState, error) {
	if q.draining {
		return nil, ErrDraining
	}
	if q.pol == nil {
		return nil, ErrNoPolicy
	}
	tr := q.tierForLocked(tenantID, callerTier)
	if tr == nil || tr.retired {
		name := callerTier
		if tr != nil {
			name = tr.name
		}
		return nil, fmt.Errorf("%w %q", ErrUnknownTier, name)
	}
	if q.slots <= 0 && !q.pol.HoldsForColdStart() {
		q.noteOffered(tr, now) // demand the pool could not even queue
		return nil, ErrNoCapacity
	}
	return tr, nil
}

// tierForLocked is the tier a new job of tenantID joins (see Admit). A
// tenant with nothing queued that the policy puts elsewhere than its
// running work is simply pointed at the new tier: its running jobs stay
// counted in the tiers they were dispatched from.
func (q *Queue) tierForLocked(tenantID, callerTier string) *tierState {
	ts := q.tenants[tenantID]
	if ts != nil && ts.queued > 0 {
		return ts.tier
	}
	name := callerTier
	if lt, ok := q.listed[tenantID]; ok {
		name = lt.tier
	} else if q.defaultTier != "" {
		name = q.defaultTier
	}
	tr := q.tiers[name]
	if ts != nil && tr != nil && !tr.retired && ts.tier != tr {
		ts.tier = tr
		ts.limit = q.limitFor(ts.id, tr)
		q.fixTenant(ts)
	}
	return tr
}

// boundsLocked refuses a job the tier's bound or the tenant's queue limit
// leaves no room for. In fleet mode these are the local counts, a lower
// bound of the fleet's: a local refusal saves a round trip.
func (q *Queue) boundsLocked(tr *tierState, tenantID string, w, now int64) error {
	if q.slots <= 0 && tr.bound == 0 && tr.tokenBound == 0 {
		// Held for a cold start, and this tier cannot wait it out.
		q.noteOffered(tr, now)
		return &ColdStartRefusal{Tier: tr.name, ColdStart: time.Duration(secondsToNs(q.pol.ColdStartSeconds))}
	}
	if tr.tokenBound > 0 {
		return q.tokenBoundsLocked(tr, q.tenants[tenantID], w, now)
	}
	if tr.queued >= tr.bound {
		return q.refuse(tr, ErrQueueFull, tr.queued, now)
	}
	if ts := q.tenants[tenantID]; ts != nil && ts.queued >= tr.qlimit {
		return q.refuse(tr, ErrTenantLimit, tr.queued, now)
	}
	return nil
}

// newJobLocked makes the record and handle of an admitted job, counted as
// admitted; the caller queues or starts it.
func (q *Queue) newJobLocked(tenantID string, tr *tierState, c Cost, now int64) *job {
	ts := q.getTenant(tenantID, tr)
	j := q.newJob()
	j.h = &Handle{q: q, j: j, tier: tr.name, tenant: tenantID, cost: c}
	j.ts, j.tr, j.enq, j.seq, j.wcost = ts, tr, now, q.seq, q.fair.Cost(c.Prompt, c.Output)
	q.seq++
	q.totals.Admitted++
	q.noteOffered(tr, now)
	return j
}

// enqueueLocked admits a job into the queue: the tail of its tenant's FIFO
// and of its tier's arrival list.
func (q *Queue) enqueueLocked(tenantID string, tr *tierState, c Cost, lease gate.Lease, now int64) *Handle {
	j := q.newJobLocked(tenantID, tr, c, now)
	ts, w := j.ts, j.wcost
	j.key = q.keyFor(tr, now)
	j.lease = lease
	if q.tokens && ts.queued == 0 {
		q.lift(ts) // it becomes backlogged
	}
	ts.fifo.pushBack(j, byTenant)
	tr.arrival.pushBack(j, byTier)
	ts.queued++
	tr.queued++
	ts.queuedTokens += w
	tr.queuedTokens += w
	q.queued++
	q.fixTenant(ts)
	q.armTimer(now)
	return j.h
}

func (q *Queue) refuse(tr *tierState, cause error, queuedInTier int, now int64) error {
	pos := queuedInTier + 1
	return q.refusal(tr, cause, pos, q.retryAfter(tr, pos, now), now)
}

// tokenBoundsLocked refuses a job of weighted cost w that the tier's token
// bound or the tenant's token limit (its request limit when it has none)
// leaves no room for; an empty tier queue, or tenant queue, takes any one
// job.
func (q *Queue) tokenBoundsLocked(tr *tierState, ts *tenant, w, now int64) error {
	if tr.queued > 0 && tr.queuedTokens+w > tr.tokenBound {
		return q.refuseTokens(tr, ErrQueueFull, w, now)
	}
	if ts == nil || ts.queued == 0 {
		return nil
	}
	if tr.tokenLimit > 0 && ts.queuedTokens+w > tr.tokenLimit || tr.tokenLimit == 0 && ts.queued >= tr.qlimit {
		return q.refuseTokens(tr, ErrTenantLimit, w, now)
	}
	return nil
}

func (q *Queue) refuseTokens(tr *tierState, cause error, w, now int64) error {
	pos := tr.queued + 1
	return q.refusal(tr, cause, pos, q.retryAfterTokens(tr, tr.queuedTokens+w, w, pos, now), now)
}

func (q *Queue) refusal(tr *tierState, cause error, pos int, retry time.Duration, now int64) error {
	if errors.Is(cause, ErrTenantLimit) {
		cause = ErrTenantLimit
		tr.refusedTenant++
	} else {
		cause = ErrQueueFull
		tr.refusedCapacity++
		q.noteOffered(tr, now)
	}
	return &Refusal{Cause: cause, Tier: tr.name, Position: pos, RetryAfter: retry}
}
