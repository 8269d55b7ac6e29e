package queue

import "time"

func (q *Queue) runnable(ts *tenant) bool {
	return ts.fifo.head != nil && ts.inFlight+ts.nClaimed < ts.limit && !ts.gateBlocked
}

// fixTenant puts ts into, moves it within or takes it out of the runnable
// heap after any change to its head, counts or limit. O(log T).
func (q *Queue) fixTenant(ts *tenant) {
	if q.rebuilding {
		return // UpdatePolicy rebuilds every heap once it is done
	}
	if q.tokens {
		q.fixFair(ts)
		return
	}
	run := q.runnable(ts)
	head := ts.fifo.head
	if run && ts.idx >= 0 && head.key == ts.hkey && head.seq == ts.hseq {
		return // same head, still runnable: already in place
	}
	if head != nil {
		ts.hkey, ts.hseq = head.key, head.seq
	}
	switch {
	case run && ts.idx < 0:
		q.heapPush(ts)
	case run:
		q.heapFix(ts.idx)
	case ts.idx >= 0:
		q.heapRemove(ts.idx)
	}
}

// dispatchLocked hands free slots to the best runnable tenants' head jobs,
// O(log T) per dispatch, whatever a capped tenant has queued. In fleet
// mode it does nothing: the pump claims slots from the Gate (see unlock).
func (q *Queue) dispatchLocked(now int64) {
	if q.gate != nil {
		return
	}
	for q.inFlight < q.slots {
		ts := q.bestTenant()
		if ts == nil {
			return
		}
		j := ts.fifo.head
		q.takeOut(j)
		q.startJob(j, now)
	}
}

// startJob gives j, already taken out of the queue, a slot: counts, stats
// and the waiter's wake-up.
func (q *Queue) startJob(j *job, now int64) {
	ts := j.ts
	if !j.h.charged {
		q.charge(j) // in fleet mode, charged at its claim
	}
	ts.inFlight++
	j.tr.inFlight++
	q.inFlight++
	j.dispatchedAt = now
	h := j.h
	h.state = stDispatched
	h.waited = time.Duration(now - j.enq)
	q.noteDispatch(j.tr, j.wcost, now)
	if q.onDispatch != nil {
		q.onDispatch(h)
	}
	q.fixTenant(ts)
	wake(j)
}

// endQueued ends a queued job without dispatch: abandoned, expired or
// drained. O(log T): a head job re-keys its tenant, a middle job unlinks.
// In fleet mode its queued place goes back to the Gate, or, while its
// acquire is in flight, the exchange's answer returns whatever it got.
func (q *Queue) endQueued(j *job, state uint8, err error, now int64) {
	ts, tr := j.ts, j.tr
	q.takeOut(j)
	q.refund(j) // a claimed job's charge: it never ran
	switch {
	case j.fleet == fleetClaimed:
		j.fleet = fleetOrphan
	case q.gate != nil:
		q.fleet.returns = append(q.fleet.returns, j.lease)
	}
	switch state {
	case stAbandoned:
		tr.abandoned++
		q.totals.Abandoned++
	case stExpired:
		tr.expired++
		q.totals.Expired++
	case stDrained:
		tr.drained++
		q.totals.Drained++
	}
	h := j.h
	h.state = state
	h.err = err
	h.waited = time.Duration(now - j.enq)
	q.fixTenant(ts)
	q.maybeDropTenant(ts)
	q.maybeDropTier(tr)
	wake(j)
	q.recycle(j)
}

// Kick re-runs dispatch after an outside event, such as a slot released by
// another dispatcher in fleet mode: the pool and the tenants the Gate found
// full are asked again.
func (q *Queue) Kick() {
	q.mu.Lock()
	defer q.unlock()
	q.unblockLocked()
	q.dispatchLocked(q.now())
}
