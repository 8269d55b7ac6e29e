package queue

import (
	"time"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

// Stats is a snapshot of the queue for metrics, the admin API and the
// policy Ack.
type Stats struct {
	Slots, InFlight, Queued int
	// Acquiring counts the queued jobs (part of Queued) whose slot the
	// fleet-wide Gate is being asked for; 0 in local mode.
	Acquiring int
	Tiers     map[string]TierStats
	// TenantInFlight is for debugging only; never a metric label.
	TenantInFlight map[string]int
	// ServiceTime is the EWMA of dispatch→release over the jobs released
	// with ReleaseServed; 0 until Served > 0.
	ServiceTime time.Duration
	// Served counts those jobs, Completed every released job.
	Served, Completed uint64
	// TokensPerSlotSecond is the settled weighted tokens of served jobs
	// per second of their time in a slot (settle.go); 0 until measured.
	TokensPerSlotSecond float64
	DoubleReleases      uint64
	PolicyVersion       int64
	// Draining is true once Drain was called.
	Draining bool
	// Totals count every job since New, across all tiers ever seen.
	Totals Totals
}

// Totals are the queue's lifetime job counts. Every admitted job ends
// exactly once, so once nothing is queued or in flight:
// Admitted == Dispatched + Abandoned + Expired + Drained, and
// Completed == Dispatched.
type Totals struct {
	Admitted, Dispatched, Abandoned, Expired, Drained uint64
}

// TierStats is one tier's part of Stats. A tier removed from the policy
// stays listed (Retired) until its last queued or in-flight job ends.
type TierStats struct {
	Queued, Bound int
	InFlight      int
	// QueuedTokens is the weighted reserved cost of the tier's queued
	// jobs; TokenBound its QueueTokenBound (0: bounded in requests).
	QueuedTokens, TokenBound int64
	// FairnessGapTokens is the largest minus the smallest counter of the
	// tier's backlogged tenants (weighted tokens ÷ weight); 0 in Requests
	// mode or with fewer than two backlogged.
	FairnessGapTokens float64
	// FairnessGapBoundTokens is what Tokens mode promises of that gap:
	// the largest single charge (cost ÷ weight) dispatched in the tier
	// since the mode began, U in docs/scheduling.md's bound. Settlement
	// corrections and, in fleet mode, the counters' sync lag may move
	// counters past it (docs/scheduling.md#fairness-within-a-tier); 0 in
	// Requests mode.
	FairnessGapBoundTokens float64
	// TokenDrainRate is weighted tokens/s dispatched from this tier (an
	// EWMA beside DrainRate); 0 until measured.
	TokenDrainRate float64
	OldestAge      time.Duration
	// DrainRate is dispatches/s from this tier (EWMA); 0 until measured.
	DrainRate float64
	// OfferedLoad is requests/s that reached this tier, averaged over
	// about a minute: admitted, refused for capacity, or refused because
	// the pool had no slots (offered.go).
	OfferedLoad                             float64
	Dispatched, Abandoned, Expired, Drained uint64
	// Refused counts refusals by cause: "capacity", "tenant_limit".
	Refused map[string]uint64
	Retired bool
}

// Queued is how many requests wait, Stats().Queued without the snapshot:
// the fleet's counter sync asks it every tick.
func (q *Queue) Queued() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.queued
}

// Stats returns a snapshot. O(tiers + tenants in flight).
func (q *Queue) Stats() Stats {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.now()
	s := Stats{
		Slots:          q.slots,
		InFlight:       q.inFlight,
		Queued:         q.queued,
		Acquiring:      q.fleet.claimed,
		Tiers:          make(map[string]TierStats, len(q.tiers)),
		TenantInFlight: map[string]int{},
		Served:         q.served,
		Completed:      q.completed,
		DoubleReleases: q.doubleReleases,
		Draining:       q.draining,
		Totals:         q.totals,

		TokensPerSlotSecond: q.tokensPerSlotSecond(),
	}
	if q.served > 0 {
		s.ServiceTime = time.Duration(q.serviceTime)
	}
	if q.pol != nil {
		s.PolicyVersion = q.pol.Version
	}
	gaps := q.fairnessGaps()
	for name, tr := range q.tiers {
		ts := TierStats{
			Queued:       tr.queued,
			QueuedTokens: tr.queuedTokens,
			TokenBound:   tr.tokenBound,
			Bound:        tr.bound,
			InFlight:     tr.inFlight,
			Dispatched:   tr.dispatched,
			Abandoned:    tr.abandoned,
			Expired:      tr.expired,
			Drained:      tr.drained,
			Refused:      map[string]uint64{CauseCapacity: tr.refusedCapacity, CauseTenantLimit: tr.refusedTenant},
			Retired:      tr.retired,
		}
		if o := tr.arrival.head; o != nil {
			ts.OldestAge = time.Duration(now - o.enq)
		}
		if r, ok := q.drainRate(tr, now); ok {
			ts.DrainRate = r
		}
		if r, ok := q.tokenDrainRate(tr, now); ok {
			ts.TokenDrainRate = r
		}
		ts.FairnessGapTokens = gaps[tr]
		if q.tokens {
			ts.FairnessGapBoundTokens = tr.maxCharge
		}
		ts.OfferedLoad = tr.offered.rate(now, q.offeredSince)
		s.Tiers[name] = ts
	}
	for id, tn := range q.tenants {
		if tn.inFlight > 0 {
			s.TenantInFlight[id] = tn.inFlight
		}
	}
	return s
}

// fairnessGaps is each tier's FairnessGapTokens, O(T).
func (q *Queue) fairnessGaps() map[*tierState]float64 {
	if !q.tokens {
		return nil
	}
	type span struct {
		lo, hi float64
		n      int
	}
	spans := map[*tierState]span{}
	for _, ts := range q.tenants {
		if ts.queued == 0 {
			continue
		}
		s := spans[ts.tier]
		if s.n == 0 || ts.vc < s.lo {
			s.lo = ts.vc
		}
		if s.n == 0 || ts.vc > s.hi {
			s.hi = ts.vc
		}
		s.n++
		spans[ts.tier] = s
	}
	gaps := make(map[*tierState]float64, len(spans))
	for tr, s := range spans {
		if s.n >= 2 {
			gaps[tr] = s.hi - s.lo
		}
	}
	return gaps
}

// Measured converts the snapshot into what the dispatcher reports in its
// policy Ack.
func (s Stats) Measured() policy.Measured {
	m := policy.Measured{
		ServiceTimeSeconds: s.ServiceTime.Seconds(),
		Completed:          int64(s.Served),
		Queued:             int64(s.Queued),

		TokensPerSlotSecond: s.TokensPerSlotSecond,
	}
	for name, t := range s.Tiers {
		if t.DrainRate > 0 {
			if m.DrainRates == nil {
				m.DrainRates = map[string]float64{}
			}
			m.DrainRates[name] = t.DrainRate
		}
		if t.OfferedLoad > 0 {
			if m.OfferedLoad == nil {
				m.OfferedLoad = map[string]float64{}
			}
			m.OfferedLoad[name] = t.OfferedLoad
		}
	}
	return m
}
