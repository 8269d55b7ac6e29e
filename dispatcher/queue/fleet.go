package queue

import "github.com/tiergate/tiergate/dispatcher/queue/gate"

// Fleet mode: the queue decides locally, under its lock, which jobs should
// run next (it claims them) and what it gives back; one pump goroutine at a
// time carries that to the Gate in an Exchange, without the lock, and
// settles the answers under it again.

// maxClaims bounds the claims of one exchange.
const maxClaims = 128

type fleetState struct {
	claimed  int  // jobs whose acquire is in flight
	pumping  bool // a pump is scheduled or running
	poolFull bool // the Gate said PoolFull; cleared by a kick
	// kicks counts events that may have freed capacity fleet-wide (Kick,
	// a policy, a local release): a refusal answered across one of them
	// does not block, since it may be stale.
	kicks   uint64
	blocked []*tenant    // tenants the Gate found full, until a kick
	returns []gate.Lease // leases to end in the next exchange
	spare   []gate.Lease // the previous exchange's returns, for reuse
	batch   []*job       // the claimed jobs of the exchange in flight
	claims  []gate.Claim // and their claims, in the same order
	pump    func()       // pumpLoop, made once
}

// exchangeDue reports whether the Gate has something to hear: leases to
// return, or a job that may claim a free slot.
func (q *Queue) exchangeDue() bool {
	return len(q.fleet.returns) > 0 || q.canClaim()
}

func (q *Queue) canClaim() bool {
	return !q.fleet.poolFull && q.inFlight+q.fleet.claimed < q.slots && q.bestTenant() != nil
}

// pumpLoop runs exchanges until none is due. Only one runs at a time
// (fleetState.pumping); whoever finds one due while it runs leaves the work
// to it.
func (q *Queue) pumpLoop() {
	q.mu.Lock()
	for {
		n := q.claimLocked()
		rets := q.fleet.returns
		if n == 0 && len(rets) == 0 {
			q.fleet.pumping = false
			q.mu.Unlock()
			return
		}
		q.fleet.returns = q.fleet.spare[:0]
		slots, kicks := q.slots, q.fleet.kicks
		q.mu.Unlock()

		q.gate.Exchange(slots, rets, q.fleet.claims[:n])

		q.mu.Lock()
		clear(rets)
		q.fleet.spare = rets[:0]
		q.settleLocked(kicks, q.now())
	}
}

// claimLocked takes the best runnable tenants' head jobs, as local dispatch
// would, up to the free local slots, and marks them claimed: still queued,
// but counted against the slots and their tenant's limit.
func (q *Queue) claimLocked() int {
	f := &q.fleet
	f.batch, f.claims = f.batch[:0], f.claims[:0]
	for len(f.batch) < maxClaims && q.canClaim() {
		ts := q.bestTenant()
		j := ts.fifo.head
		q.charge(j) // before the next choice, as local dispatch does
		ts.fifo.remove(j, byTenant)
		ts.claimed.pushBack(j, byTenant)
		ts.nClaimed++
		f.claimed++
		j.fleet = fleetClaimed
		q.fixTenant(ts)
		f.batch = append(f.batch, j)
		f.claims = append(f.claims, gate.Claim{Lease: j.lease, TenantLimit: ts.limit})
	}
	return len(f.batch)
}

// settleLocked applies the Gate's answers: a granted job starts; a refused
// one goes back to its place in its tenant's FIFO, and the pool or the
// tenant is blocked until a kick; a job that ended meanwhile returns its
// lease (whether it got the slot or not) in the next exchange.
func (q *Queue) settleLocked(kicks uint64, now int64) {
	f := &q.fleet
	kicked := f.kicks != kicks
	for i, j := range f.batch {
		if j.fleet == fleetOrphan && f.claims[i].Result == gate.OK {
			kicked = true // its slot goes back before the next claims
		}
	}
	for i, j := range f.batch {
		f.batch[i] = nil
		res := f.claims[i].Result
		if j.fleet == fleetOrphan { // refunded when it ended
			j.fleet = fleetNone
			f.returns = append(f.returns, j.lease)
			q.recycle(j)
			continue
		}
		if res == gate.OK {
			q.takeOut(j)
			j.fleet = fleetNone
			q.startJob(j, now)
			continue
		}
		ts := j.ts
		q.refund(j)
		ts.claimed.remove(j, byTenant)
		ts.nClaimed--
		f.claimed--
		j.fleet = fleetNone
		ts.fifo.insertByKey(j)
		if !kicked {
			if res == gate.PoolFull {
				f.poolFull = true
			} else {
				q.blockTenant(ts)
			}
		}
		q.fixTenant(ts)
	}
	f.batch = f.batch[:0]
}

// fleetRelease gives a released job's slot back in the next exchange. The
// slot is free fleet-wide once that lands, so the pool and the tenant may
// be asked again.
func (q *Queue) fleetRelease(ts *tenant, lease gate.Lease) {
	f := &q.fleet
	f.returns = append(f.returns, lease)
	f.kicks++
	f.poolFull = false
	ts.gateBlocked = false
}

func (q *Queue) blockTenant(ts *tenant) {
	ts.gateBlocked = true
	if !ts.listed {
		ts.listed = true
		q.fleet.blocked = append(q.fleet.blocked, ts)
	}
}

// unblockLocked forgets every refusal of the Gate: the pool and the tenants
// are asked again.
func (q *Queue) unblockLocked() {
	f := &q.fleet
	f.kicks++
	f.poolFull = false
	for _, ts := range f.blocked {
		ts.listed = false
		if ts.gateBlocked {
			ts.gateBlocked = false
			q.fixTenant(ts)
		}
	}
	clear(f.blocked)
	f.blocked = f.blocked[:0]
}
