package queue

import (
	"sort"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

// model is a deliberately naive reference of the queue's semantics: a flat
// list of jobs, dispatch by scanning for the smallest ageing key among
// tenants under their cap, expiry by scanning. The property and fuzz tests
// drive it and the real queue with the same operations and require the
// same outcome for every job after every step.
//
// In fleet mode it also models the fleet (what each job's lease holds, and
// the slots other dispatchers hold) and the pump: claims, the exchange in
// flight, and how its answers settle (model_fleet_test.go).
type model struct {
	gateMode    bool
	hasPolicy   bool
	draining    bool
	slots       int
	held        bool // 0 slots, holding for a cold start
	rateNs      int64
	timeoutNs   int64
	defaultTier string
	tiers       map[string]*mTier
	listed      map[string]policy.Tenant
	tenantTier  map[string]*mTier // while the tenant has jobs queued or in flight
	jobs        []*mJob
	seq         uint64
	moved       bool // the last operation moved queued jobs between tiers
	reweighed   bool // the last operation changed the weights of queued tokens
	// movedTenants collects the tenants a policy moves (liftMoved)
	movedTenants map[string]bool

	fleet mFleet
	f     mFair
}

type mTier struct {
	name                string
	base                int
	bound, conc, qlimit int
	retired             bool
	f                   mTierFair
}

type mJob struct {
	h         *Handle
	tenant    string
	admitTier string
	tier      *mTier
	enq       int64
	seq       uint64
	state     uint8
	// fleet mode
	claimed bool  // its acquire is in flight (state is stQueued)
	orphan  bool  // it ended while claimed
	lease   uint8 // what the fleet holds for it
	f       mJobFair
}

// What a job's lease holds in the fleet.
const (
	leaseNone uint8 = iota
	leaseQueued
	leaseSlot
)

func newModel(gate bool) *model {
	m := &model{gateMode: gate, tiers: map[string]*mTier{}, listed: map[string]policy.Tenant{}, tenantTier: map[string]*mTier{}}
	m.fleet.blocked = map[string]bool{}
	m.fleet.foreign = map[string]int{}
	m.f.vc = map[string]*mCounter{}
	m.f.fair = (&policy.Policy{}).FairnessOf()
	return m
}

func (m *model) key(j *mJob) int64 { return int64(j.tier.base)*m.rateNs + j.enq }

func (m *model) less(a, b *mJob) bool {
	ka, kb := m.key(a), m.key(b)
	if ka != kb {
		return ka < kb
	}
	return a.seq < b.seq
}

func (m *model) count(pred func(*mJob) bool) int {
	n := 0
	for _, j := range m.jobs {
		if pred(j) {
			n++
		}
	}
	return n
}

func (m *model) inFlight() int {
	return m.count(func(j *mJob) bool { return j.state == stDispatched })
}

func (m *model) tenantInFlight(t string) int {
	return m.count(func(j *mJob) bool { return j.state == stDispatched && j.tenant == t })
}

func (m *model) tenantQueued(t string) int {
	return m.count(func(j *mJob) bool { return j.state == stQueued && j.tenant == t })
}

func (m *model) tierQueued(tr *mTier) int {
	return m.count(func(j *mJob) bool { return j.state == stQueued && j.tier == tr })
}

func (m *model) limit(t string) int {
	if lt, ok := m.listed[t]; ok && lt.MaxConcurrency > 0 {
		return lt.MaxConcurrency
	}
	return m.tenantTier[t].conc
}

// forget drops the tenant's tier (and any refusal of the fleet) once it has
// nothing queued or in flight.
func (m *model) forget(t string) {
	if m.count(func(j *mJob) bool { return j.tenant == t && (j.state == stQueued || j.state == stDispatched) }) == 0 {
		if tr, ok := m.tenantTier[t]; ok {
			m.park(t, tr)
		}
		delete(m.tenantTier, t)
		delete(m.fleet.blocked, t)
	}
}

func (m *model) move(t string, to *mTier) {
	for _, j := range m.jobs {
		if j.tenant == t && j.state == stQueued {
			j.tier = to
			m.moved = true
		}
	}
	m.tenantTier[t] = to
	if m.movedTenants != nil {
		m.movedTenants[t] = true
	}
}

// dispatch is local mode's: the best queued jobs of tenants under their
// cap, while a slot is free. In fleet mode the pump claims instead.
func (m *model) dispatch() {
	if m.gateMode {
		return
	}
	for m.inFlight() < m.slots {
		best := m.pick(func(j *mJob) bool {
			return j.state == stQueued && m.tenantInFlight(j.tenant) < m.limit(j.tenant)
		})
		if best == nil {
			return
		}
		m.charge(best)
		best.state = stDispatched
	}
}

// tierFor is the tier the policy in force gives a new job of tenant: its
// queued work's, else its listed tier, else the default tier, else the
// caller's. A tenant with only running work is pointed at that tier.
func (m *model) tierFor(tenant, caller string) *mTier {
	cur, known := m.tenantTier[tenant]
	if known && m.tenantQueued(tenant) > 0 {
		return cur
	}
	name := caller
	if lt, ok := m.listed[tenant]; ok {
		name = lt.Tier
	} else if m.defaultTier != "" {
		name = m.defaultTier
	}
	tr := m.tiers[name]
	if known && tr != nil && !tr.retired {
		m.tenantTier[tenant] = tr
	}
	return tr
}

// admitResult is what the model expects of Admit.
type admitResult struct {
	err      error  // a sentinel
	tier     string // the tier a refusal names
	position int    // for refusals
	cold     bool   // a *ColdStartRefusal (wrapping ErrNoCapacity)
	job      *mJob  // when admitted
}

func (m *model) admitCost(tenant, tier string, c Cost, now int64) admitResult {
	c.Prompt, c.Output = max(c.Prompt, 0), max(c.Output, 0)
	w := m.f.fair.Cost(c.Prompt, c.Output)
	switch {
	case m.draining:
		return admitResult{err: ErrDraining}
	case !m.hasPolicy:
		return admitResult{err: ErrNoPolicy}
	}
	tr := m.tierFor(tenant, tier)
	if tr == nil || tr.retired {
		return admitResult{err: ErrUnknownTier}
	}
	if m.slots <= 0 && !m.held {
		return admitResult{err: ErrNoCapacity}
	}
	_, known := m.tenantTier[tenant]
	newJob := func(state uint8) *mJob {
		if !known {
			m.open(tenant, tr)
		}
		if state == stQueued && m.f.tokens && !m.backlogged(tenant) {
			m.tenantTier[tenant] = tr
			m.lift(tenant, tr)
		}
		m.tenantTier[tenant] = tr
		j := &mJob{tenant: tenant, admitTier: tr.name, tier: tr, enq: now, seq: m.seq, state: stQueued}
		j.f.cost, j.f.wcost = c, w
		m.seq++
		m.jobs = append(m.jobs, j)
		if state == stDispatched {
			m.charge(j)
			j.state = stDispatched
		}
		return j
	}
	if !m.gateMode && m.inFlight() < m.slots && (!known || m.tenantInFlight(tenant) < m.limit(tenant)) {
		return admitResult{job: newJob(stDispatched)}
	}
	if m.held && tr.bound == 0 && tr.f.tokenBound == 0 {
		return admitResult{err: ErrNoCapacity, cold: true, tier: tr.name}
	}
	if r, refused := m.bounds(tr, tenant, known, w); refused {
		return r
	}
	if m.gateMode {
		// The fleet counts places under the tier they were admitted to,
		// and holds those of ended jobs until their lease comes back; it
		// does not count tokens.
		n := m.fleetTierQueued(tr.name)
		switch {
		case tr.f.tokenBound == 0 && n >= tr.bound:
			return admitResult{err: ErrQueueFull, tier: tr.name, position: n + 1}
		case tr.f.tokenLimit == 0 && m.fleetTenantQueued(tenant) >= tr.qlimit:
			return admitResult{err: ErrTenantLimit, tier: tr.name, position: n + 1}
		}
	}
	j := newJob(stQueued)
	if m.gateMode {
		j.lease = leaseQueued
	}
	m.dispatch()
	return admitResult{job: j}
}

// end ends a job: a claimed one becomes an orphan whose lease the pump
// returns, any other queued one returns its lease in the next exchange.
func (m *model) end(j *mJob, state uint8) {
	if m.gateMode && j.state == stQueued {
		if j.claimed {
			j.orphan = true
		} else {
			m.fleet.returns = append(m.fleet.returns, j)
		}
	}
	if j.state == stQueued && j.claimed {
		m.refund(j)
	}
	j.state = state
	m.forget(j.tenant)
	m.dropTier(j.tier)
}

func (m *model) release(j *mJob) {
	switch j.state {
	case stQueued:
		m.end(j, stAbandoned)
	case stDispatched:
		m.end(j, stReleased)
		if m.gateMode {
			m.fleet.returns = append(m.fleet.returns, j)
			m.fleet.kicks++
			m.fleet.poolFull = false
			delete(m.fleet.blocked, j.tenant)
		}
		m.dispatch()
	}
}

func (m *model) expire(now int64) {
	if m.timeoutNs <= 0 {
		return
	}
	for _, j := range m.jobs {
		if j.state == stQueued && now-j.enq >= m.timeoutNs {
			m.end(j, stExpired)
		}
	}
}

func (m *model) flush() {
	for _, j := range m.jobs {
		if j.state == stQueued {
			m.end(j, stDrained)
		}
	}
}

func (m *model) update(p *policy.Policy, now int64) {
	newTimeout := secondsToNs(p.ClientTimeoutSeconds)
	timeoutChanged := newTimeout != m.timeoutNs
	m.hasPolicy = true
	m.slots = p.Slots
	m.held = p.HoldsForColdStart()
	m.rateNs = secondsToNs(p.AgeingRate)
	m.timeoutNs = newTimeout
	m.defaultTier = p.DefaultTier
	seen := map[string]bool{}
	for _, pt := range p.Tiers {
		tr := m.tiers[pt.Name]
		if tr == nil {
			tr = &mTier{name: pt.Name}
			m.tiers[pt.Name] = tr
		}
		tr.base, tr.bound, tr.conc, tr.qlimit, tr.retired = pt.BasePriority, pt.QueueBound, pt.TenantConcurrencyLimit, pt.TenantQueueLimit, false
		tr.f.tokenBound, tr.f.tokenLimit = pt.QueueTokenBound, pt.TenantQueueTokenLimit
		seen[pt.Name] = true
	}
	for name, tr := range m.tiers {
		if !seen[name] {
			tr.retired = true
		}
	}
	m.updateFair(p)
	m.listed = map[string]policy.Tenant{}
	for _, tn := range p.Tenants {
		m.listed[tn.ID] = tn
	}
	m.movedTenants = map[string]bool{}
	m.realign()
	// A retired tier with no job left is gone; if it comes back it is new.
	for name, tr := range m.tiers {
		if tr.retired && m.count(func(j *mJob) bool { return j.tier == tr && (j.state == stQueued || j.state == stDispatched) }) == 0 {
			delete(m.tiers, name)
		}
	}
	m.liftMoved(m.movedTenants)
	m.movedTenants = nil
	m.kick()
	if timeoutChanged {
		m.expire(now)
	}
	m.dispatch()
}

// realign moves every tenant to the tier the policy gives it: listed, else
// the default tier; without one an unlisted tenant stays.
func (m *model) realign() {
	var fallback *mTier
	if tr := m.tiers[m.defaultTier]; tr != nil && !tr.retired {
		fallback = tr
	}
	tenants := make([]string, 0, len(m.tenantTier))
	for t := range m.tenantTier {
		tenants = append(tenants, t)
	}
	sort.Strings(tenants)
	for _, t := range tenants {
		cur := m.tenantTier[t]
		if back := m.tiers[cur.name]; back != nil && back != cur {
			// t pointed at a tier that emptied, was dropped and is back
			// (the queue's realignTenants).
			m.tenantTier[t], cur = back, back
		}
		target := cur
		if lt, ok := m.listed[t]; ok {
			if tr := m.tiers[lt.Tier]; tr != nil && !tr.retired {
				target = tr
			}
		} else if fallback != nil {
			target = fallback
		}
		if target != cur {
			m.move(t, target)
		}
	}
}
