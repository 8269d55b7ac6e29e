package queue

// Tokens fairness (policy fairness mode Tokens): a Virtual Token Counter
// per tenant (Sheng et al., OSDI 2024) orders the tenants within a tier.
//
//   - Between tiers the order is the ageing key's, as in Requests mode: a
//     heap of tiers keyed by their oldest runnable head job (Queue.tiersByKey).
//   - Within the tier the slot goes to the head job of the runnable tenant
//     with the smallest counter (ties: the older head job).
//
// Each tier keeps three heaps of its tenants: runnable by head key (its
// place among the tiers), runnable by counter (the choice) and backlogged,
// capped or not, by counter (the lift). Every change is O(log T).
//
// A counter is float64: charges are divided by the tenant's weight, the
// fleet seam exchanges float64, and a float64 counts integers exactly up
// to 2^53 weighted tokens (a tenant served a million tokens a second for
// 285 years); the same operations in the same order give the same value,
// which the reference model relies on.

// idleSweepMin is the size of a tier's idle-counter map below which it is
// never swept.
const idleSweepMin = 64

// idleCounter is the counter of a tenant that has nothing queued or in
// flight, kept while a lift would not overwrite it.
type idleCounter struct {
	vc, shared  float64
	sharedKnown bool
}

func runLess(a, b *tenant) bool { return tenantLess(a, b) }

func pickLess(a, b *tenant) bool {
	if a.vc != b.vc {
		return a.vc < b.vc
	}
	return tenantLess(a, b)
}

func backLess(a, b *tenant) bool { return a.vc < b.vc }

func tierLess(a, b *tierState) bool { return runLess(a.run.top(), b.run.top()) }

func runAt(t *tenant) *int     { return &t.runIdx }
func pickAt(t *tenant) *int    { return &t.pickIdx }
func backAt(t *tenant) *int    { return &t.backIdx }
func tierAt(t *tierState) *int { return &t.heapIdx }

func newTierState(name string) *tierState {
	return &tierState{
		name:    name,
		heapIdx: -1,
		run:     iheap[*tenant]{less: runLess, at: runAt},
		pick:    iheap[*tenant]{less: pickLess, at: pickAt},
		back:    iheap[*tenant]{less: backLess, at: backAt},
		sweepAt: idleSweepMin,
	}
}

func newTiersByKey() iheap[*tierState] { return iheap[*tierState]{less: tierLess, at: tierAt} }

// bestTenant is the tenant whose head job gets the next slot, nil when no
// tenant is runnable.
func (q *Queue) bestTenant() *tenant {
	if !q.tokens {
		if len(q.heap) == 0 {
			return nil
		}
		return q.heap[0]
	}
	if q.tiersByKey.len() == 0 {
		return nil
	}
	return q.tiersByKey.top().pick.top()
}

// fixFair is fixTenant in Tokens mode: the tenant's place in its tier's
// three heaps and the tier's among the tiers. O(log T).
func (q *Queue) fixFair(ts *tenant) {
	tr := ts.tier
	if h := ts.fifo.head; h != nil {
		ts.hkey, ts.hseq = h.key, h.seq
	}
	run := q.runnable(ts)
	tr.run.set(ts, run)
	tr.pick.set(ts, run)
	tr.back.set(ts, ts.queued > 0)
	q.tiersByKey.set(tr, tr.run.len() > 0)
}

// floor is what a tenant becoming backlogged in tr is lifted to: the
// smallest counter of the tier's backlogged tenants, or, when none is,
// the counter of the tenant served last (VTC's rule). false: nothing to
// lift to (nothing served in the tier since Tokens mode began).
func (q *Queue) floor(tr *tierState) (float64, bool) {
	if tr.back.len() > 0 {
		return tr.back.top().vc, true
	}
	return tr.lastServed, tr.hasLast
}

// lift raises the counter of a tenant that is becoming backlogged (it is
// not in its tier's backlog yet) to the tier's floor.
func (q *Queue) lift(ts *tenant) {
	if f, ok := q.floor(ts.tier); ok && f > ts.vc {
		ts.vc = f
	}
}

// charge adds a dispatched (or, in fleet mode, claimed) job's reserved
// cost ÷ weight to its tenant's counter.
func (q *Queue) charge(j *job) {
	if !q.tokens {
		return
	}
	ts, h := j.ts, j.h
	d := float64(j.wcost) / float64(ts.weight)
	ts.vc += d
	tr := ts.tier
	tr.lastServed, tr.hasLast = ts.vc, true
	tr.maxCharge = max(tr.maxCharge, d)
	h.charged, h.charge, h.chargeTr, h.fairEpoch = true, d, tr, q.fairEpoch
	h.wcost, h.weight, h.fair = j.wcost, ts.weight, q.fair
	q.sinkDelta(tr.name, ts.id, d)
}

// refund takes back the charge of a claimed job that did not get its slot
// (the Gate refused it, or it ended while claimed).
func (q *Queue) refund(j *job) {
	h := j.h
	if !h.charged {
		return
	}
	h.charged = false
	if h.fairEpoch == q.fairEpoch {
		q.adjustCounter(h.chargeTr, j.ts.id, -h.charge)
	}
}

// adjustCounter applies a correction to the counter of tenant id in tr,
// wherever it is kept: its record, or its idle entry. A counter already
// pruned (it was at most the floor) takes none; the sink hears of it
// whatever.
func (q *Queue) adjustCounter(tr *tierState, id string, d float64) {
	q.sinkDelta(tr.name, id, d)
	if q.tiers[tr.name] != tr {
		return // the tier is gone, and its counters with it
	}
	if ts := q.tenants[id]; ts != nil && ts.tier == tr {
		ts.vc += d
		q.fixFair(ts)
		return
	}
	if e, ok := tr.idle[id]; ok {
		e.vc += d
		tr.idle[id] = e
	}
}

func (q *Queue) sinkDelta(tier, tenant string, d float64) {
	if q.cfg.sink != nil {
		q.cfg.sink(tier, tenant, d)
	}
}

// park keeps the counter of a tenant whose record is being dropped, unless
// a lift would overwrite it anyway (it is at most the tier's floor), and
// sweeps the tier's idle counters when they doubled since the last sweep,
// so they stay as many as the tenants served above the floor.
func (q *Queue) park(ts *tenant) {
	tr := ts.tier
	f, ok := q.floor(tr)
	if ok && ts.vc <= f || !ok && ts.vc == 0 && !ts.sharedKnown {
		return
	}
	if tr.idle == nil {
		tr.idle = map[string]idleCounter{}
	}
	tr.idle[ts.id] = idleCounter{vc: ts.vc, shared: ts.shared, sharedKnown: ts.sharedKnown}
	if len(tr.idle) > tr.sweepAt {
		for id, e := range tr.idle {
			if ok && e.vc <= f {
				delete(tr.idle, id)
			}
		}
		tr.sweepAt = max(idleSweepMin, 2*len(tr.idle))
	}
}

// unpark gives a new tenant record in tr the counter kept for it.
func (q *Queue) unpark(ts *tenant, tr *tierState) {
	if e, ok := tr.idle[ts.id]; ok {
		ts.vc, ts.shared, ts.sharedKnown = e.vc, e.shared, e.sharedKnown
		delete(tr.idle, ts.id)
	}
}

// resetFair forgets every counter, for a policy that turns Tokens mode on
// or off: counters start from zero in each Tokens period.
func (q *Queue) resetFair() {
	q.fairEpoch++
	for _, ts := range q.tenants {
		ts.vc, ts.shared, ts.sharedKnown = 0, 0, false
	}
	for _, tr := range q.tiers {
		tr.idle = nil
		tr.sweepAt = idleSweepMin
		tr.lastServed, tr.hasLast = 0, false
		tr.maxCharge = 0
	}
}

// rebuildFair rebuilds every tier's heaps and the heap of tiers, O(T).
func (q *Queue) rebuildFair() {
	byTier := map[*tierState][3][]*tenant{}
	for _, ts := range q.tenants {
		ts.runIdx, ts.pickIdx, ts.backIdx = -1, -1, -1
		if !q.tokens {
			continue
		}
		ts.idx = -1 // out of the Requests heap, cleared by the caller
		if h := ts.fifo.head; h != nil {
			ts.hkey, ts.hseq = h.key, h.seq
		}
		l := byTier[ts.tier]
		if q.runnable(ts) {
			l[0] = append(l[0], ts)
		}
		if ts.queued > 0 {
			l[1] = append(l[1], ts)
		}
		byTier[ts.tier] = l
	}
	var ready []*tierState
	for _, tr := range q.tiers {
		tr.heapIdx = -1
		l := byTier[tr]
		tr.run.build(l[0])
		tr.pick.build(l[0])
		tr.back.build(l[1])
		if tr.run.len() > 0 {
			ready = append(ready, tr)
		}
	}
	q.tiersByKey.build(ready)
}

// liftMoved lifts the tenants a policy moved into another tier with their
// queued work, each to the floor of its new tier among the tenants that
// did not move (so the order the policy visited them in does not matter).
func (q *Queue) liftMoved() {
	if len(q.moved) == 0 {
		return
	}
	type fl struct {
		v  float64
		ok bool
	}
	floors := map[*tierState]fl{}
	for _, ts := range q.tenants {
		if ts.queued > 0 && !ts.moved {
			if f := floors[ts.tier]; !f.ok || ts.vc < f.v {
				floors[ts.tier] = fl{ts.vc, true}
			}
		}
	}
	for _, ts := range q.moved {
		ts.moved = false
		if ts.queued == 0 {
			continue // not backlogged: lifted when it is
		}
		f, ok := floors[ts.tier]
		if !ok {
			f = fl{ts.tier.lastServed, ts.tier.hasLast}
		}
		if q.tokens && f.ok && f.v > ts.vc {
			ts.vc = f.v
			q.fixFair(ts)
		}
	}
	clear(q.moved)
	q.moved = q.moved[:0]
}
