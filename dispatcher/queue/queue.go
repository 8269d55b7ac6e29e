package queue

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/tiergate/tiergate/dispatcher/policy"
)

// Option configures a Queue.
type Option func(*config)

type config struct {
	gate        Gate
	drainWindow time.Duration
	serviceEWMA float64
	freeMax     int
}

func defaults() config {
	return config{drainWindow: 10 * time.Second, serviceEWMA: 0.1, freeMax: 4096}
}

func (c *config) validate() error {
	if c.drainWindow <= 0 {
		return fmt.Errorf("queue: drain window must be > 0, got %s", c.drainWindow)
	}
	if c.serviceEWMA <= 0 || c.serviceEWMA > 1 {
		return fmt.Errorf("queue: service-time EWMA weight must be in (0, 1], got %v", c.serviceEWMA)
	}
	if c.freeMax < 0 {
		return fmt.Errorf("queue: free-list size must be >= 0, got %d", c.freeMax)
	}
	return nil
}

// WithGate puts a fleet-wide Gate (fleet mode) in front of the local counts.
// Without it the queue is in local mode and uses its own counts only.
func WithGate(g Gate) Option { return func(c *config) { c.gate = g } }

// WithDrainWindow sets the time constant of the per-tier drain-rate EWMA
// (default 10s).
func WithDrainWindow(d time.Duration) Option { return func(c *config) { c.drainWindow = d } }

// WithServiceTimeWeight sets the weight of a new sample in the service-time
// EWMA (default 0.1).
func WithServiceTimeWeight(w float64) Option { return func(c *config) { c.serviceEWMA = w } }

// Handle states. A job is queued, then dispatched and released, or it ends
// queued as abandoned, expired or drained. Exactly one end per job.
const (
	stQueued uint8 = iota
	stDispatched
	stReleased
	stAbandoned
	stExpired
	stDrained
)

// Handle is the caller's reference to one admitted request. Its methods are
// safe for concurrent use. It stays valid for ever; the queue's internal job
// record behind it is recycled once the handle can no longer reach it.
type Handle struct {
	q        *Queue
	j        *job // nil once the job record has been recycled
	tenant   string
	tier     string
	position int

	// guarded by q.mu
	state  uint8
	err    error
	waited time.Duration
}

// job is the queue's record of one request: its place in its tenant's FIFO
// and its tier's arrival list. Recycled through Queue.freeJobs.
type job struct {
	h            *Handle
	ts           *tenant
	tr           *tierState
	key          int64 // base × rate + enqueue time, ns; smaller is served sooner
	seq          uint64
	enq          int64 // ns since Queue.epoch
	dispatchedAt int64

	prev, next   *job // tenant FIFO
	tprev, tnext *job // tier arrival list

	ch      chan struct{} // wake-up token for Wait, capacity 1; made by the first Wait that parks
	waiters int
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
	oldest, newest   *job

	dispatched, abandoned, expired, drained uint64
	refusedCapacity, refusedTenant          uint64

	// drain-rate EWMA: a decayed dispatch count
	drainCount    float64
	lastDispatch  int64
	firstDispatch int64
	everDispatch  bool
}

type tenant struct {
	id               string
	tier             *tierState
	limit            int
	head, tail       *job
	queued, inFlight int
	idx              int // index in Queue.heap, -1 when not runnable
	gateBlocked      bool
	// the head job's key and seq, cached so heap comparisons touch only
	// tenants and not jobs scattered across memory
	hkey int64
	hseq uint64
}

type listedTenant struct {
	tier           string
	maxConcurrency int
}

// Queue is the ageing, bounded, tenant-capped queue of one dispatcher. All
// methods are safe for concurrent use; every operation runs under one mutex
// and dispatches inline.
type Queue struct {
	cfg   config
	gate  Gate
	clk   clock.WithDelayedExecution
	epoch time.Time

	mu          sync.Mutex
	pol         *policy.Policy
	policyMark  uint64
	slots       int
	rateNs      int64
	timeoutNs   int64
	serviceRate float64
	defaultTier string
	tiers       map[string]*tierState
	listed      map[string]listedTenant
	tenants     map[string]*tenant
	heap        []*tenant
	gateBlocked []*tenant
	seq         uint64
	inFlight    int
	queued      int
	draining    bool
	idle        []chan struct{}
	timer       clock.Timer
	timerArmed  bool
	fire        func() // the timer callback, made once
	freeJobs    []*job
	freeTenants []*tenant

	serviceTime    float64 // ns, EWMA
	completed      uint64
	doubleReleases uint64
	totals         Totals

	onDispatch func(*Handle) // tests and benchmarks only: called under mu
}

// New returns an empty queue that admits nothing until UpdatePolicy. It
// panics on invalid options (a programming error).
func New(clk clock.WithDelayedExecution, opts ...Option) *Queue {
	cfg := defaults()
	for _, o := range opts {
		o(&cfg)
	}
	if err := cfg.validate(); err != nil {
		panic(err)
	}
	q := &Queue{
		cfg:     cfg,
		gate:    cfg.gate,
		clk:     clk,
		epoch:   clk.Now(),
		tiers:   map[string]*tierState{},
		listed:  map[string]listedTenant{},
		tenants: map[string]*tenant{},
	}
	q.fire = func() { go q.onTimer() }
	return q
}

func (q *Queue) now() int64 { return int64(q.clk.Since(q.epoch)) }

const maxKey = math.MaxInt64 / 4

// secondsToNs converts policy seconds, saturating so keys never overflow.
func secondsToNs(s float64) int64 {
	if !(s > 0) {
		return 0
	}
	ns := s * 1e9
	if ns >= maxKey {
		return maxKey
	}
	return int64(math.Round(ns))
}

func (q *Queue) keyFor(tr *tierState, enq int64) int64 {
	b := int64(tr.base)
	if b > 0 && q.rateNs > maxKey/b {
		return maxKey + enq
	}
	return b*q.rateNs + enq
}

func (q *Queue) limitFor(id string, tr *tierState) int {
	if lt, ok := q.listed[id]; ok && lt.maxConcurrency > 0 {
		return lt.maxConcurrency
	}
	return tr.conc
}

// UpdatePolicy applies a new policy: slots, bounds, limits, ageing rate and
// bases. No queued job is lost. Keys are rebuilt (O(n)) only when the rate
// or a base priority changed. Shrinking slots never cancels in-flight work;
// dispatch simply waits until in-flight falls below the new slots. Tiers
// that disappear keep their queued jobs until they end; Admit refuses them.
// p must already be validated by the caller and must not be mutated later.
func (q *Queue) UpdatePolicy(p *policy.Policy) {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.now()

	newRate := secondsToNs(p.AgeingRate)
	rekey := q.pol != nil && newRate != q.rateNs
	timeoutChanged := secondsToNs(p.ClientTimeoutSeconds) != q.timeoutNs

	q.pol = p
	q.policyMark++
	q.slots = p.Slots
	q.rateNs = newRate
	q.timeoutNs = secondsToNs(p.ClientTimeoutSeconds)
	q.serviceRate = p.ServiceRate
	q.defaultTier = p.DefaultTier

	for _, pt := range p.Tiers {
		tr := q.tiers[pt.Name]
		if tr == nil {
			tr = &tierState{name: pt.Name}
			q.tiers[pt.Name] = tr
		}
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
	clear(q.listed)
	for _, tn := range p.Tenants {
		q.listed[tn.ID] = listedTenant{tier: tn.Tier, maxConcurrency: tn.MaxConcurrency}
	}

	// A listed tenant follows its listed tier; an unlisted tenant whose tier
	// went away moves to the default tier. Its queued jobs move with it.
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
		} else if ts.tier.retired && fallback != nil {
			target = fallback
		}
		if target != ts.tier {
			q.moveTenant(ts, target)
		}
		ts.limit = q.limitFor(ts.id, ts.tier)
		ts.gateBlocked = false
	}
	q.gateBlocked = q.gateBlocked[:0]

	if rekey {
		for _, tr := range q.tiers {
			for j := tr.oldest; j != nil; j = j.tnext {
				j.key = q.keyFor(tr, j.enq)
			}
		}
	}
	for name, tr := range q.tiers {
		if tr.retired && tr.queued == 0 && tr.inFlight == 0 {
			delete(q.tiers, name)
		}
	}

	// Limits and keys may all have changed: rebuild the runnable heap, O(T).
	clear(q.heap)
	q.heap = q.heap[:0]
	for _, ts := range q.tenants {
		ts.idx = -1
		if ts.head != nil {
			ts.hkey, ts.hseq = ts.head.key, ts.head.seq
		}
		if q.runnable(ts) {
			ts.idx = len(q.heap)
			q.heap = append(q.heap, ts)
		}
	}
	q.heapInit()

	if timeoutChanged {
		q.expireLocked(now)
		q.timerArmed = false // re-arm below for the new deadline
	}
	q.armTimer(now)
	q.dispatchLocked(now)
}

// moveTenant moves ts and its queued jobs to tier to, re-keying the jobs and
// keeping both tiers' arrival lists in arrival order. O(k + queued in to).
func (q *Queue) moveTenant(ts *tenant, to *tierState) {
	from := ts.tier
	ts.tier = to
	for j := ts.head; j != nil; j = j.next {
		tierUnlink(from, j)
		j.tr = to
		j.key = q.keyFor(to, j.enq)
		tierInsertOrdered(to, j)
	}
	from.queued -= ts.queued
	to.queued += ts.queued
	q.maybeDropTier(from)
}

func tierUnlink(tr *tierState, j *job) {
	if j.tprev != nil {
		j.tprev.tnext = j.tnext
	} else {
		tr.oldest = j.tnext
	}
	if j.tnext != nil {
		j.tnext.tprev = j.tprev
	} else {
		tr.newest = j.tprev
	}
	j.tprev, j.tnext = nil, nil
}

func tierAppend(tr *tierState, j *job) {
	j.tprev, j.tnext = tr.newest, nil
	if tr.newest != nil {
		tr.newest.tnext = j
	} else {
		tr.oldest = j
	}
	tr.newest = j
}

// tierInsertOrdered inserts j by arrival sequence, scanning from the newest.
func tierInsertOrdered(tr *tierState, j *job) {
	after := tr.newest
	for after != nil && after.seq > j.seq {
		after = after.tprev
	}
	if after == nil {
		j.tprev, j.tnext = nil, tr.oldest
		if tr.oldest != nil {
			tr.oldest.tprev = j
		} else {
			tr.newest = j
		}
		tr.oldest = j
		return
	}
	j.tprev, j.tnext = after, after.tnext
	if after.tnext != nil {
		after.tnext.tprev = j
	} else {
		tr.newest = j
	}
	after.tnext = j
}

func (q *Queue) maybeDropTier(tr *tierState) {
	if tr.retired && tr.queued == 0 && tr.inFlight == 0 && q.tiers[tr.name] == tr {
		delete(q.tiers, tr.name)
	}
}

func (q *Queue) runnable(ts *tenant) bool {
	return ts.queued > 0 && ts.inFlight < ts.limit && !ts.gateBlocked
}

// fixTenant puts ts into, moves it within or takes it out of the runnable
// heap after any change to its head, counts or limit. O(log T).
func (q *Queue) fixTenant(ts *tenant) {
	run := q.runnable(ts)
	if run && ts.idx >= 0 && ts.head.key == ts.hkey && ts.head.seq == ts.hseq {
		return // same head, still runnable: already in place
	}
	if ts.head != nil {
		ts.hkey, ts.hseq = ts.head.key, ts.head.seq
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
	*ts = tenant{id: id, tier: tr, limit: q.limitFor(id, tr), idx: -1}
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
	delete(q.tenants, ts.id)
	*ts = tenant{idx: -1}
	if len(q.freeTenants) < q.cfg.freeMax {
		q.freeTenants = append(q.freeTenants, ts)
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

// recycle returns j to the free list once its handle has ended and no
// Wait is parked on it; the handle forgets it first.
func (q *Queue) recycle(j *job) {
	if j.waiters > 0 {
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
	if len(q.freeJobs) < q.cfg.freeMax {
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

// Admit enqueues a request of tenant in tier, or refuses it. If a slot is
// free and nothing outranks it, the job is dispatched before Admit returns
// (Wait then returns nil at once). Refusals: ErrDraining, ErrNoPolicy,
// ErrUnknownTier, ErrNoCapacity, and *Refusal wrapping ErrQueueFull or
// ErrTenantLimit, checked in that order. In fleet mode a Gate error other
// than those two is returned wrapped.
func (q *Queue) Admit(tenantID, tierName string) (*Handle, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.draining {
		return nil, ErrDraining
	}
	if q.pol == nil {
		return nil, ErrNoPolicy
	}
	tr := q.tiers[tierName]
	if tr == nil || tr.retired {
		return nil, fmt.Errorf("%w %q", ErrUnknownTier, tierName)
	}
	if q.slots <= 0 {
		return nil, ErrNoCapacity
	}
	now := q.now()
	ts := q.tenants[tenantID]
	if ts != nil && ts.tier != tr {
		// The caller resolved another tier (a policy moved the tenant):
		// its queued work follows so its FIFO stays in key order.
		q.moveTenant(ts, tr)
		ts.limit = q.limitFor(ts.id, tr)
		q.fixTenant(ts)
		q.dispatchLocked(now) // its new limit may let queued work run
	}

	// Local fast path: a free slot means no runnable tenant is waiting, so a
	// tenant under its cap runs now; the bound limits waiting, not running.
	if q.gate == nil && q.inFlight < q.slots && (ts == nil || ts.inFlight < ts.limit) {
		ts = q.getTenant(tenantID, tr)
		j := q.newJob()
		h := &Handle{q: q, j: j, tenant: tenantID, tier: tierName, state: stDispatched}
		j.h, j.ts, j.tr, j.enq, j.seq = h, ts, tr, now, q.seq
		q.seq++
		q.totals.Admitted++
		q.startJob(j, now)
		return h, nil
	}

	if tr.queued >= tr.bound {
		return nil, q.refuse(tr, ErrQueueFull, tr.queued, now)
	}
	if ts != nil && ts.queued >= tr.qlimit {
		return nil, q.refuse(tr, ErrTenantLimit, tr.queued, now)
	}
	if q.gate != nil {
		n, err := q.gate.Enqueue(tenantID, tierName, tr.bound, tr.qlimit)
		switch {
		case err == nil:
		case isRefusalCause(err):
			return nil, q.refuse(tr, err, n, now)
		default:
			return nil, fmt.Errorf("queue: gate enqueue: %w", err)
		}
	}

	ts = q.getTenant(tenantID, tr)
	j := q.newJob()
	h := &Handle{q: q, j: j, tenant: tenantID, tier: tierName}
	j.h, j.ts, j.tr, j.enq, j.seq = h, ts, tr, now, q.seq
	q.seq++
	j.key = q.keyFor(tr, now)
	j.prev, j.next = ts.tail, nil
	if ts.tail != nil {
		ts.tail.next = j
	} else {
		ts.head = j
	}
	ts.tail = j
	tierAppend(tr, j)
	ts.queued++
	tr.queued++
	q.queued++
	h.position = tr.queued
	q.totals.Admitted++
	q.fixTenant(ts)
	q.armTimer(now)
	q.dispatchLocked(now)
	return h, nil
}

func isRefusalCause(err error) bool {
	return errors.Is(err, ErrQueueFull) || errors.Is(err, ErrTenantLimit)
}

func (q *Queue) refuse(tr *tierState, cause error, queuedInTier int, now int64) error {
	if errors.Is(cause, ErrTenantLimit) {
		cause = ErrTenantLimit
		tr.refusedTenant++
	} else {
		cause = ErrQueueFull
		tr.refusedCapacity++
	}
	pos := queuedInTier + 1
	return &Refusal{Cause: cause, Tier: tr.name, Position: pos, RetryAfter: q.retryAfter(tr, pos, now)}
}

// retryAfter estimates when position pos will have drained: pos divided by
// the tier's measured drain rate, or the policy's service rate until one is
// measured; whole seconds rounded up, clamped to [1s, W].
func (q *Queue) retryAfter(tr *tierState, pos int, now int64) time.Duration {
	upper := int64(tr.w / time.Second)
	if upper < 1 {
		upper = 1
	}
	rate, ok := q.drainRate(tr, now)
	if !ok {
		rate = q.serviceRate
	}
	secs := upper
	if rate > 0 {
		est := math.Ceil(float64(pos) / rate)
		if est < float64(upper) {
			secs = int64(est)
		}
	}
	if secs < 1 {
		secs = 1
	}
	return time.Duration(secs) * time.Second
}

// minDrainSample is how long a tier must have been dispatching before its
// measured rate replaces the policy's service rate.
const minDrainSample = time.Second

// drainRate is the tier's dispatches per second: a count decayed with time
// constant tau, normalised by the part of the window observed so far.
func (q *Queue) drainRate(tr *tierState, now int64) (float64, bool) {
	if !tr.everDispatch {
		return 0, false
	}
	elapsed := now - tr.firstDispatch
	if elapsed < int64(minDrainSample) {
		return 0, false
	}
	tau := q.cfg.drainWindow.Seconds()
	c := tr.drainCount * math.Exp(-float64(now-tr.lastDispatch)/1e9/tau)
	norm := tau * (1 - math.Exp(-float64(elapsed)/1e9/tau))
	return c / norm, true
}

func (q *Queue) noteDispatch(tr *tierState, now int64) {
	tr.dispatched++
	q.totals.Dispatched++
	if !tr.everDispatch {
		tr.everDispatch = true
		tr.firstDispatch = now
		tr.lastDispatch = now
	}
	if dt := now - tr.lastDispatch; dt > 0 {
		tr.drainCount *= math.Exp(-float64(dt) / 1e9 / q.cfg.drainWindow.Seconds())
	}
	tr.drainCount++
	tr.lastDispatch = now
}

// startJob gives j a slot: counts, stats and the waiter's wake-up.
func (q *Queue) startJob(j *job, now int64) {
	ts := j.ts
	ts.inFlight++
	j.tr.inFlight++
	q.inFlight++
	j.dispatchedAt = now
	h := j.h
	h.state = stDispatched
	h.waited = time.Duration(now - j.enq)
	q.noteDispatch(j.tr, now)
	if q.onDispatch != nil {
		q.onDispatch(h)
	}
	q.fixTenant(ts)
	wake(j)
}

// dispatchLocked hands free slots to the best runnable tenants' head jobs.
// O(log T) per dispatch, whatever a capped tenant has queued.
func (q *Queue) dispatchLocked(now int64) {
	for q.inFlight < q.slots && len(q.heap) > 0 {
		ts := q.heap[0]
		if q.gate != nil {
			// Gate calls name the tier a job was admitted to, which the
			// gate counted it under, even if a policy has moved it since.
			switch q.gate.Acquire(ts.id, ts.head.h.tier, q.slots, ts.limit) {
			case PoolFull:
				return // resumes on a release or Kick
			case TenantFull:
				ts.gateBlocked = true
				q.gateBlocked = append(q.gateBlocked, ts)
				q.heapRemove(0)
				continue
			}
		}
		j := ts.head
		q.unlinkQueued(j)
		q.startJob(j, now)
	}
}

// unlinkQueued takes a queued job out of its tenant FIFO and tier list.
// The caller re-fixes the tenant in the heap.
func (q *Queue) unlinkQueued(j *job) {
	ts, tr := j.ts, j.tr
	if j.prev != nil {
		j.prev.next = j.next
	} else {
		ts.head = j.next
	}
	if j.next != nil {
		j.next.prev = j.prev
	} else {
		ts.tail = j.prev
	}
	j.prev, j.next = nil, nil
	tierUnlink(tr, j)
	ts.queued--
	tr.queued--
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

// endQueued ends a queued job without dispatch: abandoned, expired or
// drained. O(log T): a head job re-keys its tenant, a middle job unlinks.
func (q *Queue) endQueued(j *job, state uint8, err error, now int64) {
	ts, tr := j.ts, j.tr
	q.unlinkQueued(j)
	if q.gate != nil {
		q.gate.Dequeue(ts.id, j.h.tier)
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

// expireLocked ends every job queued for clientTimeout or longer. The oldest
// job of each tier is at its list's front, so this is O(expired × tiers).
func (q *Queue) expireLocked(now int64) {
	if q.timeoutNs <= 0 {
		return
	}
	for _, tr := range q.tiers {
		for j := tr.oldest; j != nil && now-j.enq >= q.timeoutNs; j = tr.oldest {
			q.endQueued(j, stExpired, ErrExpired, now)
		}
	}
}

// oldestEnq is the enqueue time of the oldest queued job of any tier.
func (q *Queue) oldestEnq() (int64, bool) {
	var best int64
	found := false
	for _, tr := range q.tiers {
		if tr.oldest != nil && (!found || tr.oldest.enq < best) {
			best, found = tr.oldest.enq, true
		}
	}
	return best, found
}

// armTimer sets the single expiry timer for the oldest queued job unless it
// is already set. It may fire early (the oldest left); it then re-arms.
func (q *Queue) armTimer(now int64) {
	if q.timerArmed || q.timeoutNs <= 0 {
		return
	}
	enq, ok := q.oldestEnq()
	if !ok {
		return
	}
	d := time.Duration(enq + q.timeoutNs - now)
	if d < 0 {
		d = 0
	}
	// A fresh timer each time: a FakeClock timer sends on a channel of one
	// when it fires and would block the clock on a second firing after a
	// Reset, and a FakeClock runs the callback under its own lock while we
	// call the clock under q.mu, so the callback takes q.mu elsewhere.
	if q.timer != nil {
		q.timer.Stop()
	}
	q.timer = q.clk.AfterFunc(d, q.fire)
	q.timerArmed = true
}

func (q *Queue) onTimer() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.timerArmed = false
	now := q.now()
	q.expireLocked(now)
	q.armTimer(now)
}

// ExpireDue ends, synchronously, every job whose clientTimeout has passed at
// the clock's current time. The timer does the same on its own goroutine; a
// discrete-event driver calls ExpireDue after stepping a fake clock to
// NextDeadline so the outcome does not depend on goroutine scheduling.
func (q *Queue) ExpireDue() {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.now()
	q.expireLocked(now)
	q.armTimer(now)
}

// NextDeadline is when the oldest queued job expires; false when nothing is
// queued or clientTimeout is 0.
func (q *Queue) NextDeadline() (time.Time, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.timeoutNs <= 0 {
		return time.Time{}, false
	}
	enq, ok := q.oldestEnq()
	if !ok {
		return time.Time{}, false
	}
	return q.epoch.Add(time.Duration(enq + q.timeoutNs)), true
}

// Drain makes Admit refuse with ErrDraining from now on. Queued jobs still
// dispatch; in-flight jobs are untouched.
func (q *Queue) Drain() {
	q.mu.Lock()
	q.draining = true
	q.mu.Unlock()
}

// FlushQueued ends every still-queued job: its Wait returns ErrDrained.
func (q *Queue) FlushQueued() {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.now()
	for _, tr := range q.tiers {
		for tr.oldest != nil {
			q.endQueued(tr.oldest, stDrained, ErrDrained, now)
		}
	}
}

// Idle returns a channel closed once nothing is queued (a fresh channel on
// every call; already closed if the queue is empty now).
func (q *Queue) Idle() <-chan struct{} {
	ch := make(chan struct{})
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.queued == 0 {
		close(ch)
	} else {
		q.idle = append(q.idle, ch)
	}
	return ch
}

// Kick re-runs dispatch after an outside event, such as a slot released by
// another dispatcher in fleet mode. Tenants the Gate found full are asked
// again.
func (q *Queue) Kick() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.unblockGate()
	q.dispatchLocked(q.now())
}

func (q *Queue) unblockGate() {
	for _, ts := range q.gateBlocked {
		if ts.gateBlocked {
			ts.gateBlocked = false
			q.fixTenant(ts)
		}
	}
	clear(q.gateBlocked)
	q.gateBlocked = q.gateBlocked[:0]
}

// Wait blocks until the job is dispatched (nil: the caller now holds a slot
// and must call Release), ctx ends while it is queued (the job is removed at
// once, counted abandoned, and ctx.Err() is returned; if dispatch won the
// race Wait returns nil instead), it expires (ErrExpired) or FlushQueued
// ends it (ErrDrained). Calling Wait again returns the same outcome.
func (h *Handle) Wait(ctx context.Context) error {
	q := h.q
	q.mu.Lock()
	defer q.mu.Unlock()
	for h.state == stQueued {
		j := h.j
		if j.ch == nil {
			j.ch = make(chan struct{}, 1)
		}
		j.waiters++
		q.mu.Unlock()
		cancelled := false
		select {
		case <-j.ch:
		case <-ctx.Done():
			cancelled = true
		}
		q.mu.Lock()
		j.waiters--
		if cancelled && h.state == stQueued {
			q.endQueued(j, stAbandoned, ctx.Err(), q.now())
			continue
		}
		if h.state == stQueued {
			continue // a stale token; park again
		}
		if j.waiters > 0 {
			wake(j) // pass the token on to the next waiter
		} else if h.state != stDispatched && h.j == j {
			q.recycle(j)
		}
	}
	switch h.state {
	case stDispatched, stReleased:
		return nil
	}
	return h.err
}

// Release gives the job's slot back and dispatches the next job. It is
// idempotent: a second call is a no-op counted in Stats.DoubleReleases.
// Releasing a job that is still queued abandons it (Wait returns
// context.Canceled); releasing one that ended without dispatch does nothing.
func (h *Handle) Release() {
	q := h.q
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.now()
	switch h.state {
	case stReleased:
		q.doubleReleases++
		return
	case stQueued:
		q.endQueued(h.j, stAbandoned, context.Canceled, now)
		return
	case stDispatched:
	default:
		return
	}
	j := h.j
	ts, tr := j.ts, j.tr
	h.state = stReleased
	ts.inFlight--
	tr.inFlight--
	q.inFlight--
	sample := float64(now - j.dispatchedAt)
	if q.completed == 0 {
		q.serviceTime = sample
	} else {
		q.serviceTime += q.cfg.serviceEWMA * (sample - q.serviceTime)
	}
	q.completed++
	if q.gate != nil {
		q.gate.Release(ts.id, h.tier)
		ts.gateBlocked = false // its own slot freed: ask the gate again
	}
	q.fixTenant(ts)
	q.maybeDropTenant(ts)
	q.maybeDropTier(tr)
	q.recycle(j)
	q.dispatchLocked(now)
}

// Waited is the time from enqueue to dispatch (or to the end, for a job
// that was never dispatched); 0 while still queued.
func (h *Handle) Waited() time.Duration {
	h.q.mu.Lock()
	defer h.q.mu.Unlock()
	return h.waited
}

// Position is the job's 1-based position in its tier when it was admitted;
// 0 if it was dispatched at once without queueing.
func (h *Handle) Position() int { return h.position }

// Tenant is the tenant the job was admitted for.
func (h *Handle) Tenant() string { return h.tenant }

// Tier is the tier the job was admitted to.
func (h *Handle) Tier() string { return h.tier }
