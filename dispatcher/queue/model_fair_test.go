package queue

import (
	"sort"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

// The model's Tokens fairness, as naive as the rest of it: counters in
// maps, every choice and floor by a scan over all jobs.

type mCounter struct {
	vc, shared float64
	known      bool
}

// mFair is the model's fairness state, part of model.
type mFair struct {
	tokens bool
	fair   policy.Fairness
	epoch  uint64
	vc     map[string]*mCounter // tenants with a record (queued or in flight)
}

// mTierFair is a tier's part.
type mTierFair struct {
	tokenBound, tokenLimit int64
	idle                   map[string]mCounter
	lastServed             float64
	hasLast                bool
}

// mJobFair is a job's part.
type mJobFair struct {
	cost    Cost
	wcost   int64
	charged bool
	charge  float64
	// chargedCost is wcost when it was charged: a policy that changes the
	// weights re-costs a claimed job, which is still queued, but its
	// Settle corrects the charge made (the queue's Handle.wcost).
	chargedCost int64
	chargeTier  *mTier
	epoch       uint64
	weight      int
	fair        policy.Fairness
	settled     bool
}

func (m *model) weightOf(t string) int {
	if lt, ok := m.listed[t]; ok {
		return lt.WeightOf()
	}
	return 1
}

func (m *model) backlogged(t string) bool { return m.tenantQueued(t) > 0 }

func (m *model) tierQueuedTokens(tr *mTier) int64 {
	var n int64
	for _, j := range m.jobs {
		if j.state == stQueued && j.tier == tr {
			n += j.f.wcost
		}
	}
	return n
}

func (m *model) tenantQueuedTokens(t string) int64 {
	var n int64
	for _, j := range m.jobs {
		if j.state == stQueued && j.tenant == t {
			n += j.f.wcost
		}
	}
	return n
}

// floor is the lift target of tier tr: the smallest counter of its
// backlogged tenants, else the last served counter.
func (m *model) floor(tr *mTier) (float64, bool) {
	found, lo := false, 0.0
	for t, c := range m.f.vc {
		if m.tenantTier[t] == tr && m.backlogged(t) && (!found || c.vc < lo) {
			found, lo = true, c.vc
		}
	}
	if found {
		return lo, true
	}
	return tr.f.lastServed, tr.f.hasLast
}

// pick is the job the queue serves next among those ok allows: the tier
// of the smallest ageing key; in Tokens mode, within it, the oldest job of
// the tenant with the smallest counter.
func (m *model) pick(ok func(*mJob) bool) *mJob {
	var best *mJob
	for _, j := range m.jobs {
		if ok(j) && (best == nil || m.less(j, best)) {
			best = j
		}
	}
	if best == nil || !m.f.tokens {
		return best
	}
	var p *mJob
	for _, j := range m.jobs {
		if !ok(j) || j.tier != best.tier {
			continue
		}
		if p == nil {
			p = j
			continue
		}
		cj, cp := m.f.vc[j.tenant].vc, m.f.vc[p.tenant].vc
		if cj < cp || cj == cp && m.less(j, p) {
			p = j
		}
	}
	return p
}

func (m *model) charge(j *mJob) {
	if !m.f.tokens {
		return
	}
	c := m.f.vc[j.tenant]
	w := m.weightOf(j.tenant)
	d := float64(j.f.wcost) / float64(w)
	c.vc += d
	tr := m.tenantTier[j.tenant]
	tr.f.lastServed, tr.f.hasLast = c.vc, true
	j.f.charged, j.f.charge, j.f.chargeTier, j.f.epoch, j.f.weight, j.f.fair = true, d, tr, m.f.epoch, w, m.f.fair
	j.f.chargedCost = j.f.wcost
}

func (m *model) refund(j *mJob) {
	if !j.f.charged {
		return
	}
	j.f.charged = false
	if j.f.epoch == m.f.epoch {
		m.adjust(j.f.chargeTier, j.tenant, -j.f.charge)
	}
}

func (m *model) adjust(tr *mTier, t string, d float64) {
	if m.tiers[tr.name] != tr {
		return
	}
	if c := m.f.vc[t]; c != nil && m.tenantTier[t] == tr {
		c.vc += d
		return
	}
	if e, ok := tr.f.idle[t]; ok {
		e.vc += d
		tr.f.idle[t] = e
	}
}

// lift raises a tenant becoming backlogged in tr to tr's floor.
func (m *model) lift(t string, tr *mTier) {
	if f, ok := m.floor(tr); ok && f > m.f.vc[t].vc {
		m.f.vc[t].vc = f
	}
}

// open gives a tenant that has no record one, with the counter its tier
// kept.
func (m *model) open(t string, tr *mTier) {
	c := &mCounter{}
	if m.f.tokens {
		if e, ok := tr.f.idle[t]; ok {
			*c = e
			delete(tr.f.idle, t)
		}
	}
	m.f.vc[t] = c
}

// park keeps a dropped record's counter unless it is at most the floor.
func (m *model) park(t string, tr *mTier) {
	c := m.f.vc[t]
	delete(m.f.vc, t)
	if !m.f.tokens {
		return
	}
	f, ok := m.floor(tr)
	if ok && c.vc <= f || !ok && c.vc == 0 && !c.known {
		return
	}
	if tr.f.idle == nil {
		tr.f.idle = map[string]mCounter{}
	}
	tr.f.idle[t] = *c
}

func (m *model) settleJob(j *mJob, prompt, output int64) {
	if j.f.settled || (j.state != stDispatched && j.state != stReleased) {
		return
	}
	j.f.settled = true
	if j.f.charged && j.f.epoch == m.f.epoch {
		actual := j.f.fair.Cost(max(prompt, 0), max(output, 0))
		if d := float64(actual-j.f.chargedCost) / float64(j.f.weight); d != 0 {
			m.adjust(j.f.chargeTier, j.tenant, d)
		}
	}
}

func (m *model) applyShared(tier string, counters map[string]float64) {
	tr := m.tiers[tier]
	if !m.f.tokens || tr == nil {
		return
	}
	ids := make([]string, 0, len(counters))
	for id := range counters {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		if c := m.f.vc[id]; c != nil && m.tenantTier[id] == tr {
			c.vc, c.shared, c.known = applyShared(c.vc, c.shared, c.known, counters[id])
		}
	}
	for _, id := range ids {
		if c := m.f.vc[id]; c != nil && m.tenantTier[id] == tr {
			continue
		}
		e := tr.f.idle[id]
		e.vc, e.shared, e.known = applyShared(e.vc, e.shared, e.known, counters[id])
		if f, ok := m.floor(tr); ok && e.vc <= f {
			delete(tr.f.idle, id)
			continue
		}
		if tr.f.idle == nil {
			tr.f.idle = map[string]mCounter{}
		}
		tr.f.idle[id] = e
	}
}

// updateFair is the policy's fairness: a change of mode forgets every
// counter, a change of weights re-weighs the queued jobs.
func (m *model) updateFair(p *policy.Policy) {
	f := p.FairnessOf()
	tokens := f.Mode == policy.FairnessTokens
	if tokens != m.f.tokens {
		m.f.tokens = tokens
		m.f.epoch++
		for _, c := range m.f.vc {
			*c = mCounter{}
		}
		for _, tr := range m.tiers {
			tr.f.idle, tr.f.lastServed, tr.f.hasLast = nil, 0, false
		}
	}
	if f.InputWeight != m.f.fair.InputWeight || f.OutputWeight != m.f.fair.OutputWeight {
		m.reweighed = true
	}
	m.f.fair = f
	for _, j := range m.jobs {
		if j.state == stQueued {
			j.f.wcost = f.Cost(j.f.cost.Prompt, j.f.cost.Output)
		}
	}
}

// liftMoved lifts each backlogged tenant the policy moved to the floor of
// its new tier among the tenants that did not move.
func (m *model) liftMoved(moved map[string]bool) {
	if !m.f.tokens {
		return
	}
	for t := range moved {
		tr := m.tenantTier[t]
		if tr == nil || !m.backlogged(t) {
			continue
		}
		found, lo := false, 0.0
		for u, c := range m.f.vc {
			if !moved[u] && m.tenantTier[u] == tr && m.backlogged(u) && (!found || c.vc < lo) {
				found, lo = true, c.vc
			}
		}
		if !found {
			found, lo = tr.f.hasLast, tr.f.lastServed
		}
		if found && lo > m.f.vc[t].vc {
			m.f.vc[t].vc = lo
		}
	}
}

// dropTier forgets a retired tier once nothing is queued or in flight in
// it, as the queue does when its last job ends.
func (m *model) dropTier(tr *mTier) {
	if tr.retired && m.tiers[tr.name] == tr && m.count(func(j *mJob) bool { return j.tier == tr && (j.state == stQueued || j.state == stDispatched) }) == 0 {
		delete(m.tiers, tr.name)
	}
}

// bounds is Admit's refusal by the tier's bound and the tenant's limit, in
// requests or (with a token bound) in weighted tokens.
func (m *model) bounds(tr *mTier, tenant string, known bool, w int64) (admitResult, bool) {
	n := m.tierQueued(tr)
	refuse := func(err error) (admitResult, bool) {
		return admitResult{err: err, tier: tr.name, position: n + 1}, true
	}
	if tr.f.tokenBound == 0 {
		switch {
		case n >= tr.bound:
			return refuse(ErrQueueFull)
		case known && m.tenantQueued(tenant) >= tr.qlimit:
			return refuse(ErrTenantLimit)
		}
		return admitResult{}, false
	}
	if n > 0 && m.tierQueuedTokens(tr)+w > tr.f.tokenBound {
		return refuse(ErrQueueFull)
	}
	if !known || m.tenantQueued(tenant) == 0 {
		return admitResult{}, false
	}
	if tr.f.tokenLimit > 0 && m.tenantQueuedTokens(tenant)+w > tr.f.tokenLimit || tr.f.tokenLimit == 0 && m.tenantQueued(tenant) >= tr.qlimit {
		return refuse(ErrTenantLimit)
	}
	return admitResult{}, false
}
