package queue

import (
	"time"

	"github.com/tiergate/tiergate/dispatcher/queue/gate"
)

// The queue's records and their intrusive lists. A queued job is linked
// twice: into its tenant's FIFO (or, while its fleet acquire is in flight,
// the tenant's claimed list) through link[byTenant], and into its tier's
// arrival list through link[byTier].

const (
	byTenant = iota
	byTier
)

// Fleet states of a job (always fleetNone in local mode).
const (
	fleetNone    uint8 = iota
	fleetClaimed       // its acquire is in flight; still queued
	fleetOrphan        // ended while claimed: the exchange's answer returns its lease
)

type links struct{ prev, next *job }

// job is the queue's record of one request. Recycled through Queue.freeJobs.
type job struct {
	h            *Handle
	ts           *tenant
	tr           *tierState
	key          int64 // base × rate + enqueue time, ns; smaller is served sooner
	seq          uint64
	enq          int64 // ns since Queue.epoch
	wcost        int64 // the reservation's weighted tokens (policy fairness weights)
	dispatchedAt int64
	lease        gate.Lease
	fleet        uint8
	link         [2]links

	ch      chan struct{} // wake-up token for Wait, capacity 1; made by the first Wait that parks
	waiters int
}

// jobList is a doubly linked list of jobs through link[k].
type jobList struct{ head, tail *job }

func (l *jobList) pushBack(j *job, k int) {
	j.link[k] = links{prev: l.tail}
	if l.tail != nil {
		l.tail.link[k].next = j
	} else {
		l.head = j
	}
	l.tail = j
}

func (l *jobList) remove(j *job, k int) {
	lk := &j.link[k]
	if lk.prev != nil {
		lk.prev.link[k].next = lk.next
	} else {
		l.head = lk.next
	}
	if lk.next != nil {
		lk.next.link[k].prev = lk.prev
	} else {
		l.tail = lk.prev
	}
	*lk = links{}
}

// insertAfter links j after at, or at the front when at is nil.
func (l *jobList) insertAfter(at, j *job, k int) {
	if at == nil {
		j.link[k] = links{next: l.head}
		if l.head != nil {
			l.head.link[k].prev = j
		} else {
			l.tail = j
		}
		l.head = j
		return
	}
	next := at.link[k].next
	j.link[k] = links{prev: at, next: next}
	if next != nil {
		next.link[k].prev = j
	} else {
		l.tail = j
	}
	at.link[k].next = j
}

// insertBySeq keeps an arrival list in arrival order, scanning from the
// newest: a job moved between tiers is usually among the newest.
func (l *jobList) insertBySeq(j *job) {
	at := l.tail
	for at != nil && at.seq > j.seq {
		at = at.link[byTier].prev
	}
	l.insertAfter(at, j, byTier)
}

// insertByKey keeps a tenant FIFO in (key, seq) order, scanning from the
// head: a job the fleet refused is older than the rest of its tenant's.
func (l *jobList) insertByKey(j *job) {
	var at *job
	for n := l.head; n != nil && (n.key < j.key || (n.key == j.key && n.seq < j.seq)); n = n.link[byTenant].next {
		at = n
	}
	l.insertAfter(at, j, byTenant)
}

type tierState struct {
	name       string
	base       int
	bound      int
	conc       int
	qlimit     int
	w          time.Duration
	retired    bool // gone from the policy; kept until its jobs end
	policyMark uint64

	queued, inFlight int
	arrival          jobList // queued jobs, oldest first

	// token bounds: 0 is none (Requests bounding)
	tokenBound, tokenLimit int64
	queuedTokens           int64 // weighted reservations of its queued jobs

	// Tokens fairness (fair.go)
	run, pick, back iheap[*tenant]
	heapIdx         int // in Queue.tiersByKey, -1 when absent
	idle            map[string]idleCounter
	sweepAt         int
	lastServed      float64
	hasLast         bool
	maxCharge       float64 // the largest charge (cost ÷ weight) since Tokens mode began

	dispatched, abandoned, expired, drained uint64
	refusedCapacity, refusedTenant          uint64
	offered                                 meter // requests that reached the tier

	// drain-rate EWMA: a decayed dispatch count
	drainCount    float64
	drainTokens   float64 // the same, of weighted tokens dispatched
	lastDispatch  int64
	firstDispatch int64
	everDispatch  bool
}

type tenant struct {
	id       string
	tier     *tierState
	limit    int
	fifo     jobList // queued jobs not claimed, in key order
	claimed  jobList // fleet: queued jobs whose acquire is in flight
	queued   int     // fifo and claimed
	nClaimed int
	inFlight int
	idx      int // index in Queue.heap, -1 when not runnable
	// fleet: the Gate found the tenant full; it waits for its own release
	// or Kick. listed: it is in fleetState.blocked.
	gateBlocked, listed bool
	// the head job's key and seq, cached so heap comparisons touch only
	// tenants and not jobs scattered across memory
	hkey int64
	hseq uint64

	queuedTokens int64 // weighted reservations of its queued jobs
	weight       int   // the policy's, >= 1
	// Tokens fairness (fair.go): the counter, the fleet's part of it last
	// applied (ApplySharedCounters), and the tenant's indexes in its tier's
	// heaps (-1: absent)
	vc                       float64
	shared                   float64
	sharedKnown              bool
	moved                    bool // a policy moved it with queued work: liftMoved
	runIdx, pickIdx, backIdx int
}

func blankTenant() tenant { return tenant{idx: -1, runIdx: -1, pickIdx: -1, backIdx: -1} }

// takeOut unlinks a queued job from its tenant's FIFO (or claimed list)
// and its tier's arrival list, and counts it out. The caller re-fixes the
// tenant in the heap.
func (q *Queue) takeOut(j *job) {
	ts, tr := j.ts, j.tr
	if j.fleet == fleetClaimed {
		ts.claimed.remove(j, byTenant)
		ts.nClaimed--
		q.fleet.claimed--
	} else {
		ts.fifo.remove(j, byTenant)
	}
	tr.arrival.remove(j, byTier)
	ts.queued--
	tr.queued--
	ts.queuedTokens -= j.wcost
	tr.queuedTokens -= j.wcost
	q.queued--
	if q.queued == 0 {
		if q.timerArmed {
			q.timer.Stop() // nothing left to expire
			q.timerArmed = false
		}
		for _, ch := range q.idle {
			close(ch)
		}
		clear(q.idle)
		q.idle = q.idle[:0]
	}
}

func (q *Queue) getTenant(id string, tr *tierState) *tenant {
	if ts := q.tenants[id]; ts != nil {
		return ts
	}
	var ts *tenant
	if n := len(q.freeTenants); n > 0 {
		ts = q.freeTenants[n-1]
		q.freeTenants[n-1] = nil
		q.freeTenants = q.freeTenants[:n-1]
	} else {
		ts = &tenant{}
	}
	*ts = blankTenant()
	ts.id, ts.tier, ts.limit, ts.weight = id, tr, q.limitFor(id, tr), q.weightFor(id)
	if q.tokens {
		q.unpark(ts, tr)
	}
	q.tenants[id] = ts
	return ts
}

func (q *Queue) maybeDropTenant(ts *tenant) {
	if ts.queued != 0 || ts.inFlight != 0 {
		return
	}
	if ts.idx >= 0 {
		q.heapRemove(ts.idx)
	}
	if q.tokens {
		q.fixFair(ts) // out of its tier's heaps
		q.park(ts)
	}
	delete(q.tenants, ts.id)
	*ts = blankTenant()
	if len(q.freeTenants) < freeMax {
		q.freeTenants = append(q.freeTenants, ts)
	}
}

func (q *Queue) maybeDropTier(tr *tierState) {
	if tr.retired && tr.queued == 0 && tr.inFlight == 0 && q.tiers[tr.name] == tr {
		delete(q.tiers, tr.name)
		q.emptyDroppedTier(tr)
	}
}

// emptyDroppedTier takes a tier just dropped from q.tiers (by a policy, or
// when its last job ended) out of the heap of tiers and empties its
// heaps: they may still name tenants that moved away, which kept it in
// the heap of tiers, and a tenant left pointing at it (unlisted, no
// default tier, only running work) must find them empty, with no index
// into them. While a policy rebuilds, the heap of tiers is stale
// (fixTenant waits for the rebuild), so the index is checked first.
func (q *Queue) emptyDroppedTier(tr *tierState) {
	if tr.heapIdx >= 0 && tr.heapIdx < q.tiersByKey.len() && q.tiersByKey.s[tr.heapIdx] == tr {
		q.tiersByKey.set(tr, false)
	}
	tr.heapIdx = -1
	tr.run.reset()
	tr.pick.reset()
	tr.back.reset()
	for _, ts := range q.tenants {
		if ts.tier == tr {
			ts.runIdx, ts.pickIdx, ts.backIdx = -1, -1, -1
		}
	}
}

func (q *Queue) newJob() *job {
	if n := len(q.freeJobs); n > 0 {
		j := q.freeJobs[n-1]
		q.freeJobs[n-1] = nil
		q.freeJobs = q.freeJobs[:n-1]
		return j
	}
	return &job{}
}

// recycle returns j to the free list once its handle has ended, no Wait is
// parked on it and no exchange still refers to it; the handle forgets it
// first.
func (q *Queue) recycle(j *job) {
	if j.waiters > 0 || j.fleet != fleetNone {
		return
	}
	j.h.j = nil
	ch := j.ch
	if ch != nil {
		select { // drop a token nobody took
		case <-ch:
		default:
		}
	}
	*j = job{ch: ch}
	if len(q.freeJobs) < freeMax {
		q.freeJobs = append(q.freeJobs, j)
	}
}

// wake hands the wake-up token to a parked Wait, if any.
func wake(j *job) {
	if j.waiters > 0 {
		select {
		case j.ch <- struct{}{}:
		default:
		}
	}
}
