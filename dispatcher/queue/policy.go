package queue

import (
	"time"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

// UpdatePolicy applies a new policy: slots, bounds, limits, ageing rate and
// bases. No queued job is lost. Keys are rebuilt (O(n)) only when the rate
// or a base priority changed. Shrinking slots never cancels in-flight work;
// dispatch simply waits until in-flight falls below the new slots. Tiers
// that disappear keep their queued jobs until they end; Admit refuses them.
// A tenant the policy puts in another tier (listed there, or unlisted and
// the default tier changed) takes its queued jobs along, so a policy change
// can leave a tier above its new bound until it drains (admission never
// does). p must already be validated by the caller and
// must not be mutated later.
func (q *Queue) UpdatePolicy(p *policy.Policy) {
	q.mu.Lock()
	defer q.unlock()
	now := q.now()
	if q.pol == nil {
		q.offeredSince = now
	}
	newTimeout := secondsToNs(p.ClientTimeoutSeconds)
	timeoutChanged := newTimeout != q.timeoutNs
	q.rebuilding = true
	rekey := q.applyScalars(p)
	if q.applyTiers(p) {
		rekey = true
	}
	q.applyFairness(p)
	clear(q.listed)
	for _, tn := range p.Tenants {
		q.listed[tn.ID] = listedTenant{tier: tn.Tier, maxConcurrency: tn.MaxConcurrency, weight: tn.WeightOf()}
	}
	q.realignTenants()
	if rekey {
		q.rekey()
	}
	for name, tr := range q.tiers {
		if tr.retired && tr.queued == 0 && tr.inFlight == 0 {
			delete(q.tiers, name)
			q.emptyDroppedTier(tr)
		}
	}
	q.rebuilding = false
	q.rebuildHeap()
	q.liftMoved()
	if timeoutChanged {
		q.expireLocked(now)
		q.timerArmed = false // re-arm below for the new deadline
	}
	q.armTimer(now)
	q.dispatchLocked(now)
}

// applyScalars takes the policy's pool-wide numbers; it reports whether
// the ageing rate changed under queued keys.
func (q *Queue) applyScalars(p *policy.Policy) bool {
	newRate := secondsToNs(p.AgeingRate)
	rekey := q.pol != nil && newRate != q.rateNs
	q.pol = p
	q.policyMark++
	q.slots = p.Slots
	q.rateNs = newRate
	q.timeoutNs = secondsToNs(p.ClientTimeoutSeconds)
	q.serviceRate = p.ServiceRate
	q.defaultTier = p.DefaultTier
	return rekey
}

// applyTiers creates and updates the policy's tiers and retires the others;
// it reports whether a base priority changed under queued keys.
func (q *Queue) applyTiers(p *policy.Policy) bool {
	rekey := false
	for _, pt := range p.Tiers {
		tr := q.tiers[pt.Name]
		if tr == nil {
			tr = newTierState(pt.Name)
			q.tiers[pt.Name] = tr
		}
		tr.tokenBound, tr.tokenLimit = pt.QueueTokenBound, pt.TenantQueueTokenLimit
		if tr.base != pt.BasePriority && tr.queued > 0 {
			rekey = true
		}
		tr.base = pt.BasePriority
		tr.bound = pt.QueueBound
		tr.conc = pt.TenantConcurrencyLimit
		tr.qlimit = pt.TenantQueueLimit
		tr.w = time.Duration(secondsToNs(pt.TolerableWaitSeconds))
		tr.retired = false
		tr.policyMark = q.policyMark
	}
	for _, tr := range q.tiers {
		if tr.policyMark != q.policyMark {
			tr.retired = true
		}
	}
	return rekey
}

// realignTenants moves every tenant to the tier the policy gives it, the
// tier Admit gives its next job: a listed tenant follows its listed tier,
// an unlisted one the default tier; without a default tier an unlisted
// tenant stays where it is. Its queued jobs move with it. Every refusal of
// the Gate is forgotten, since the limits may have changed.
func (q *Queue) realignTenants() {
	var fallback *tierState
	if q.defaultTier != "" {
		if tr := q.tiers[q.defaultTier]; tr != nil && !tr.retired {
			fallback = tr
		}
	}
	for _, ts := range q.tenants {
		if cur := q.tiers[ts.tier.name]; cur != nil && cur != ts.tier {
			// ts pointed at a tier that emptied, was dropped and is back.
			ts.tier = cur
		}
		target := ts.tier
		if lt, ok := q.listed[ts.id]; ok {
			if tr := q.tiers[lt.tier]; tr != nil && !tr.retired {
				target = tr
			}
		} else if fallback != nil {
			target = fallback
		}
		if target != ts.tier {
			q.moveTenant(ts, target)
		}
		ts.limit = q.limitFor(ts.id, ts.tier)
		ts.weight = q.weightFor(ts.id)
	}
	q.unblockLocked()
}

// applyFairness takes the policy's fairness: a change of mode forgets
// every counter (the heaps are rebuilt after), and a change of weights
// re-weighs every queued job's reservation, O(n).
func (q *Queue) applyFairness(p *policy.Policy) {
	f := p.FairnessOf()
	tokens := f.Mode == policy.FairnessTokens
	if tokens != q.tokens {
		q.tokens = tokens
		q.resetFair()
	}
	reweigh := f.InputWeight != q.fair.InputWeight || f.OutputWeight != q.fair.OutputWeight
	q.fair = f
	if !reweigh {
		return
	}
	for _, ts := range q.tenants {
		ts.queuedTokens = 0
	}
	for _, tr := range q.tiers {
		tr.queuedTokens = 0
		for j := tr.arrival.head; j != nil; j = j.link[byTier].next {
			j.wcost = f.Cost(j.h.cost.Prompt, j.h.cost.Output)
			tr.queuedTokens += j.wcost
			j.ts.queuedTokens += j.wcost
		}
	}
}

// rekey recomputes every queued job's key for the current rate and bases.
func (q *Queue) rekey() {
	for _, tr := range q.tiers {
		for j := tr.arrival.head; j != nil; j = j.link[byTier].next {
			j.key = q.keyFor(tr, j.enq)
		}
	}
}

// rebuildHeap rebuilds the runnable heap after limits and keys may all
// have changed, O(T).
func (q *Queue) rebuildHeap() {
	clear(q.heap)
	q.heap = q.heap[:0]
	q.rebuildFair()
	if q.tokens {
		return
	}
	for _, ts := range q.tenants {
		ts.idx = -1
		if ts.fifo.head != nil {
			ts.hkey, ts.hseq = ts.fifo.head.key, ts.fifo.head.seq
		}
		if q.runnable(ts) {
			ts.idx = len(q.heap)
			q.heap = append(q.heap, ts)
		}
	}
	q.heapInit()
}

// moveTenant moves ts and its queued jobs (claimed ones too) to tier to,
// re-keying the jobs and keeping both tiers' arrival lists in arrival
// order. O(k + queued in to).
func (q *Queue) moveTenant(ts *tenant, to *tierState) {
	from := ts.tier
	ts.tier = to
	if q.tokens && !ts.moved {
		ts.moved = true // lifted in its new tier once all have moved
		q.moved = append(q.moved, ts)
	}
	for _, l := range [2]*jobList{&ts.fifo, &ts.claimed} {
		for j := l.head; j != nil; j = j.link[byTenant].next {
			from.arrival.remove(j, byTier)
			j.tr = to
			j.key = q.keyFor(to, j.enq)
			to.arrival.insertBySeq(j)
		}
	}
	from.queued -= ts.queued
	to.queued += ts.queued
	from.queuedTokens -= ts.queuedTokens
	to.queuedTokens += ts.queuedTokens
	q.maybeDropTier(from)
}
