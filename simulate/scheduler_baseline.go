package simulate

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/dispatcher/queue"
	"github.com/tiergate/tiergate/internal/baseline"
)

// baselineImpl is what FCFS, Strict and Seed of internal/baseline share.
type baselineImpl interface {
	Enqueue(j *baseline.Job[*request], now time.Duration) error
	Next(now time.Duration) *baseline.Job[*request]
	Done(j *baseline.Job[*request], now time.Duration)
	Queued(tier int) int
	InFlight() int
	TenantInFlight(tenant string) int
}

// remover is a baseline that withdraws a queued job whose client left.
type remover interface {
	Remove(j *baseline.Job[*request]) bool
}

// expirer is a baseline that expires queued jobs.
type expirer interface {
	Expire(now time.Duration, out []*baseline.Job[*request]) []*baseline.Job[*request]
	NextDeadline() (time.Duration, bool)
}

// baselineScheduler puts a baseline of internal/baseline behind the
// scheduler seam. Baselines are synchronous: after every call that can
// start work it runs Next until nothing more starts, and keeps what
// happened for Outcomes.
type baselineScheduler struct {
	env  *schedEnv
	impl baselineImpl
	// set installs a policy's limits into impl.
	set func(p *policy.Policy)
	pol *policy.Policy

	out, spare []outcome
	expired    []*baseline.Job[*request]
	// Lifetime counts, for Check.
	admitted, dispatched, withdrawn, expiredN uint64
}

var _ scheduler = (*baselineScheduler)(nil)

func newFCFS(env *schedEnv) scheduler {
	impl := baseline.NewFCFS[*request](len(env.tiers))
	return &baselineScheduler{env: env, impl: impl, set: func(p *policy.Policy) { impl.SetSlots(p.Slots) }}
}

func newStrict(env *schedEnv) scheduler {
	bases := make([]int, len(env.tiers))
	for i, t := range env.tiers {
		bases[i] = t.base
	}
	impl := baseline.NewStrict[*request](bases)
	return &baselineScheduler{env: env, impl: impl, set: func(p *policy.Policy) {
		bounds := make([]int, len(env.tiers))
		for name, tl := range strictLimits(p, env).tiers {
			bounds[env.index[name]] = tl.bound
		}
		impl.SetLimits(p.Slots, bounds, secs(p.ClientTimeoutSeconds))
	}}
}

func newSeed(env *schedEnv) scheduler {
	tiers := make([]baseline.SeedTier, len(env.tiers))
	for i, t := range env.tiers {
		tiers[i].Base = t.base
	}
	impl := baseline.NewSeed[*request](env.ageing, tiers)
	return &baselineScheduler{env: env, impl: impl, set: func(p *policy.Policy) {
		bounds, caps := seedFormulas(p, env)
		impl.SetLimits(p.Slots, bounds, caps)
	}}
}

// strictLimits: tiergate's tier bounds, no tenant limits.
func strictLimits(p *policy.Policy, _ *schedEnv) enforced {
	l := enforced{tiers: map[string]tierLimits{}}
	for _, t := range p.Tiers {
		l.tiers[t.Name] = tierLimits{bound: t.QueueBound}
	}
	return l
}

// seedFormulas are the seed's bounds and caps, indexed by tier, for the
// slots of p and the pool's declared service time.
func seedFormulas(p *policy.Policy, env *schedEnv) (bounds, caps []int) {
	waits := make([]time.Duration, len(env.tiers))
	shares := make([]float64, len(env.tiers))
	for i, t := range env.tiers {
		waits[i], shares[i] = t.wait, t.share
	}
	return baseline.SeedLimits(p.Slots, env.serviceTime, waits, shares)
}

func seedLimits(p *policy.Policy, env *schedEnv) enforced {
	bounds, caps := seedFormulas(p, env)
	l := enforced{tiers: map[string]tierLimits{}}
	for i, t := range env.tiers {
		l.tiers[t.name] = tierLimits{bound: bounds[i], tenantLimit: caps[i]}
	}
	return l
}

func (s *baselineScheduler) UpdatePolicy(p *policy.Policy) {
	s.pol = p
	s.set(p)
	s.drain(s.env.now())
}

func (s *baselineScheduler) Admit(r *request) error {
	if s.pol.Slots <= 0 {
		return queue.ErrNoCapacity
	}
	now := s.env.now()
	tier := s.env.index[r.ten.tier.name]
	r.job = baseline.Job[*request]{Value: r, Tenant: r.ten.name, Tier: tier}
	if err := s.impl.Enqueue(&r.job, now); err != nil {
		pos := s.impl.Queued(tier) + 1
		return &queue.Refusal{Cause: queue.ErrQueueFull, Tier: r.ten.tier.name, Position: pos, RetryAfter: s.retryAfter(tier, pos)}
	}
	s.admitted++
	s.drain(now)
	return nil
}

// retryAfter is the time position pos takes to drain at the policy's
// service rate, in whole seconds within [1s, W], as the queue estimates it
// before it has measured a drain rate.
func (s *baselineScheduler) retryAfter(tier, pos int) time.Duration {
	upper := max(1, int64(s.env.tiers[tier].wait/time.Second))
	n := upper
	if s.pol.ServiceRate > 0 {
		n = min(upper, int64(math.Ceil(float64(pos)/s.pol.ServiceRate)))
	}
	return time.Duration(max(n, 1)) * time.Second
}

// drain starts what the baseline starts at now.
func (s *baselineScheduler) drain(now time.Duration) {
	for j := s.impl.Next(now); j != nil; j = s.impl.Next(now) {
		s.out = append(s.out, outcome{req: j.Value, waited: now - j.Enqueued})
		s.dispatched++
	}
}

func (s *baselineScheduler) Outcomes() ([]outcome, error) {
	got := s.out
	slices.SortFunc(got, func(a, b outcome) int { return cmp.Compare(a.req.id, b.req.id) })
	clear(s.spare)
	s.out, s.spare = s.spare[:0], got
	return got, nil
}

func (s *baselineScheduler) WatchesClients() bool {
	_, ok := s.impl.(remover)
	return ok
}

func (s *baselineScheduler) Withdraw(r *request) (outcome, error) {
	rm, ok := s.impl.(remover)
	if !ok || !rm.Remove(&r.job) {
		return outcome{}, fmt.Errorf("%w: request %d is not queued in the %T baseline", ErrInternal, r.id, s.impl)
	}
	s.withdrawn++
	return outcome{req: r, err: context.Canceled}, nil
}

// Settle does nothing: the baselines order by arrival and priority alone,
// never by tokens.
func (s *baselineScheduler) Settle(*request, int64, int64) {}

// Measured is 0, 0: the baselines measure nothing.
func (s *baselineScheduler) Measured() (float64, uint64) { return 0, 0 }

func (s *baselineScheduler) Release(r *request, _ bool) {
	now := s.env.now()
	s.impl.Done(&r.job, now)
	s.drain(now)
}

func (s *baselineScheduler) NextDeadline() (time.Duration, bool) {
	if ex, ok := s.impl.(expirer); ok {
		return ex.NextDeadline()
	}
	return 0, false
}

func (s *baselineScheduler) ExpireDue() {
	ex, ok := s.impl.(expirer)
	if !ok {
		return
	}
	s.expired = ex.Expire(s.env.now(), s.expired[:0])
	for i, j := range s.expired {
		s.out = append(s.out, outcome{req: j.Value, err: queue.ErrExpired})
		s.expired[i] = nil
	}
	s.expiredN += uint64(len(s.expired))
}

func (s *baselineScheduler) Check(bool) (snapshot, error) {
	var queued int
	for i := range s.env.tiers {
		queued += s.impl.Queued(i)
	}
	if ended := s.dispatched + s.withdrawn + s.expiredN + uint64(queued); ended != s.admitted {
		return snapshot{}, fmt.Errorf("%w: the %T baseline admitted %d jobs but %d ended or are queued", ErrInternal, s.impl, s.admitted, ended)
	}
	return snapshot{
		inflight:       s.impl.InFlight(),
		admitted:       s.admitted,
		queued:         func(tier string) int { return s.impl.Queued(s.env.index[tier]) },
		tenantInflight: s.impl.TenantInFlight,
	}, nil
}

// Close has nothing to end: a baseline holds no goroutine.
func (s *baselineScheduler) Close() error { return nil }
