package queue

// Cost is a request's size as the queue sees it at admission: its
// estimated prompt tokens and the output tokens reserved for it. The
// policy's fairness weights make it weighted tokens (policy.Fairness.Cost).
type Cost struct{ Prompt, Output int64 }

// WithCounterSink makes the queue report every change it makes to a Tokens
// counter by charging or correcting: each dispatch's (in fleet mode each
// claim's) charge, the refund of a claim that did not get its slot, and
// each Settle's correction, as delta (weighted tokens ÷ weight) on the
// counter of tenant in tier. Lifts and ApplySharedCounters are not
// reported: they are not charges. sink is called with the queue's lock
// held, in the order of the changes: it must not block or call the queue.
func WithCounterSink(sink func(tier, tenant string, delta float64)) Option {
	return func(c *config) { c.sink = sink }
}

// Settle reports the request's actual usage: prompt and output tokens. It
// counts once: later calls are no-ops, as is a call on a handle whose job
// never ran (still queued, or ended without dispatch). In Tokens mode it
// corrects the tenant's counter by (actual − reserved weighted cost) ÷
// weight, with the weights and weight of the charge. Once the job was
// released with ReleaseServed (before or after Settle) its weighted usage
// and time in its slot feed Measured.TokensPerSlotSecond.
func (h *Handle) Settle(prompt, output int64) {
	q := h.q
	q.mu.Lock()
	defer q.unlock()
	if h.settled || (h.state != stDispatched && h.state != stReleased) {
		return
	}
	h.settled = true
	h.actual = q.fair.Cost(max(prompt, 0), max(output, 0))
	if h.charged && h.fairEpoch == q.fairEpoch {
		actual := h.fair.Cost(max(prompt, 0), max(output, 0))
		if d := float64(actual-h.wcost) / float64(h.weight); d != 0 {
			q.adjustCounter(h.chargeTr, h.tenant, d)
		}
	}
	if h.served {
		q.observeTokens(h.actual, h.slotNs)
	}
}

// tokensWeight is the weight of a new sample in the tokens-per-slot-second
// EWMAs, as serviceWeight is in the service time's.
const tokensWeight = serviceWeight

// observeTokens folds one served, settled job into the tokens-per-slot-
// second estimate: a ratio of two EWMAs (weighted tokens, slot time), so
// that short requests do not dominate it as a mean of ratios would.
func (q *Queue) observeTokens(weighted, slotNs int64) {
	tok, slot := float64(weighted), float64(slotNs)
	if q.tokSamples == 0 {
		q.tokEWMA, q.slotEWMA = tok, slot
	} else {
		q.tokEWMA += tokensWeight * (tok - q.tokEWMA)
		q.slotEWMA += tokensWeight * (slot - q.slotEWMA)
	}
	q.tokSamples++
}

// tokensPerSlotSecond is the measured rate, 0 until a served job settled
// with time in its slot.
func (q *Queue) tokensPerSlotSecond() float64 {
	if q.tokSamples == 0 || q.slotEWMA <= 0 {
		return 0
	}
	return q.tokEWMA / (q.slotEWMA / 1e9)
}

// ApplySharedCounters takes the fleet's view of the counters of tier's
// tenants in Tokens mode (a no-op otherwise). counters[id] must be what
// the OTHER dispatchers charged tenant id in tier: the shared total minus
// every delta this queue's sink gave for it (a syncer that flushes its
// deltas and reads the total in one sequence subtracts what it flushed).
// This queue's own charges are never in counters, so none is counted
// twice, and they stay in the local counter, so none is lost, flushed or
// not. Each tenant's counter moves by the change of that value since the
// last one applied to it; a tenant whose last value is unknown (new here,
// or its counter was pruned) takes max(its counter, the value), as a lift
// does. Tenants absent from counters are left as they are; values for
// tenants with no state here are kept as idle counters when above the
// tier's floor. O(k log T) for k entries.
func (q *Queue) ApplySharedCounters(tier string, counters map[string]float64) {
	q.mu.Lock()
	defer q.unlock()
	tr := q.tiers[tier]
	if !q.tokens || tr == nil {
		return
	}
	// Records first, then idle counters, pruned against the floor those
	// give: the outcome does not depend on the map's order.
	for id, v := range counters {
		if ts := q.tenants[id]; ts != nil && ts.tier == tr {
			ts.vc, ts.shared, ts.sharedKnown = applyShared(ts.vc, ts.shared, ts.sharedKnown, v)
			q.fixFair(ts)
		}
	}
	for id, v := range counters {
		if ts := q.tenants[id]; ts != nil && ts.tier == tr {
			continue
		}
		e := tr.idle[id]
		e.vc, e.shared, e.sharedKnown = applyShared(e.vc, e.shared, e.sharedKnown, v)
		if f, ok := q.floor(tr); ok && e.vc <= f {
			delete(tr.idle, id)
			continue
		}
		if tr.idle == nil {
			tr.idle = map[string]idleCounter{}
		}
		tr.idle[id] = e
	}
}

func applyShared(vc, last float64, known bool, v float64) (float64, float64, bool) {
	if known {
		return vc + v - last, v, true
	}
	return max(vc, v), v, true
}
