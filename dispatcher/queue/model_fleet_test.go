package queue

import "github.com/tiergate/tiergate/dispatcher/queue/gate"

// The model's fleet: the pump's state as the queue keeps it, and the
// fleet's counts as the gate keeps them (derived from the jobs' leases and
// the slots other dispatchers hold).
type mFleet struct {
	pumping  bool
	poolFull bool
	kicks    uint64
	blocked  map[string]bool // tenants the fleet found full
	returns  []*mJob         // leases for the next exchange
	foreign  map[string]int  // slots other dispatchers hold, by tenant
	round    *mRound         // the exchange in flight, while held
}

// mRound is one exchange: what it returns and claims, as sent.
type mRound struct {
	returns []*mJob
	jobs    []*mJob
	limits  []int
	slots   int
	kicks   uint64
}

func (m *model) fleetSlots() int {
	n := m.count(func(j *mJob) bool { return j.lease == leaseSlot })
	for _, k := range m.fleet.foreign {
		n += k
	}
	return n
}

func (m *model) fleetTenantSlots(t string) int {
	return m.count(func(j *mJob) bool { return j.lease == leaseSlot && j.tenant == t }) + m.fleet.foreign[t]
}

func (m *model) fleetTierQueued(tier string) int {
	return m.count(func(j *mJob) bool { return j.lease == leaseQueued && j.admitTier == tier })
}

func (m *model) fleetTenantQueued(t string) int {
	return m.count(func(j *mJob) bool { return j.lease == leaseQueued && j.tenant == t })
}

func (m *model) claimedCount(t string) int {
	return m.count(func(j *mJob) bool { return j.claimed && !j.orphan && (t == "" || j.tenant == t) })
}

// bestClaimable is the job the queue claims next, or nil.
func (m *model) bestClaimable() *mJob {
	if m.fleet.poolFull || m.inFlight()+m.claimedCount("") >= m.slots {
		return nil
	}
	return m.pick(func(j *mJob) bool {
		return j.state == stQueued && !j.claimed && !m.fleet.blocked[j.tenant] &&
			m.tenantInFlight(j.tenant)+m.claimedCount(j.tenant) < m.limit(j.tenant)
	})
}

func (m *model) exchangeDue() bool {
	return len(m.fleet.returns) > 0 || m.bestClaimable() != nil
}

// afterOp is the queue's unlock: a pump is scheduled when an exchange is
// due and none runs.
func (m *model) afterOp() {
	if m.gateMode && !m.fleet.pumping && m.exchangeDue() {
		m.fleet.pumping = true
	}
}

// startRound is what the pump sends next, or nil when nothing is due (the
// pump then stops).
func (m *model) startRound() *mRound {
	r := &mRound{slots: m.slots, kicks: m.fleet.kicks}
	for len(r.jobs) < maxClaims {
		j := m.bestClaimable()
		if j == nil {
			break
		}
		m.charge(j)
		j.claimed = true
		r.jobs = append(r.jobs, j)
		r.limits = append(r.limits, m.limit(j.tenant))
	}
	r.returns, m.fleet.returns = m.fleet.returns, nil
	if len(r.jobs) == 0 && len(r.returns) == 0 {
		m.fleet.pumping = false
		return nil
	}
	return r
}

// decide is the fleet answering r: returns first, then the claims in order.
func (m *model) decide(r *mRound) []gate.Result {
	for _, j := range r.returns {
		j.lease = leaseNone
	}
	res := make([]gate.Result, len(r.jobs))
	for i, j := range r.jobs {
		switch {
		case m.fleetSlots() >= r.slots:
			res[i] = gate.PoolFull
		case m.fleetTenantSlots(j.tenant) >= r.limits[i]:
			res[i] = gate.TenantFull
		default:
			j.lease = leaseSlot
		}
	}
	return res
}

// settle applies the answers as the queue does.
func (m *model) settle(r *mRound, res []gate.Result) {
	kicked := m.fleet.kicks != r.kicks
	for i, j := range r.jobs {
		if j.orphan && res[i] == gate.OK {
			kicked = true
		}
	}
	for i, j := range r.jobs {
		j.claimed = false
		switch {
		case j.orphan:
			j.orphan = false
			m.fleet.returns = append(m.fleet.returns, j)
			continue
		case res[i] == gate.OK:
			if !j.f.charged {
				m.charge(j) // claimed before Tokens mode began
			}
			j.state = stDispatched
			continue
		}
		m.refund(j)
		switch {
		case kicked:
		case res[i] == gate.PoolFull:
			m.fleet.poolFull = true
		default:
			m.fleet.blocked[j.tenant] = true
		}
	}
}

// pump runs rounds until none is due, each decided at once.
func (m *model) pump() {
	for r := m.startRound(); r != nil; r = m.startRound() {
		m.settle(r, m.decide(r))
	}
}

// kick forgets every refusal of the fleet.
func (m *model) kick() {
	m.fleet.kicks++
	m.fleet.poolFull = false
	clear(m.fleet.blocked)
}
