package simulate

import (
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

// scheduler is what the engine sends requests through: the real dispatcher
// queue (queueScheduler), or a baseline it is compared with
// (baselineScheduler). A run has one per simulated dispatcher.
//
// The engine calls it from one goroutine, at the simulated time of the
// clock the scheduler was built with. A request the scheduler admits leaves
// the queue exactly once, reported by Outcomes or Withdraw; a dispatched
// one holds its slot until Release.
type scheduler interface {
	// UpdatePolicy installs a policy, as the controller's push would. It
	// may dispatch or expire queued requests: Outcomes reports them.
	UpdatePolicy(p *policy.Policy)
	// Admit offers r. nil: r is queued, or dispatched at once, and
	// Outcomes reports it. Otherwise the refusal: a *queue.Refusal (429,
	// with its Retry-After) or queue.ErrNoCapacity (503).
	Admit(r *request) error
	// Outcomes returns, in request order, the requests that left the queue
	// since the last call. The slice is valid until the next call.
	Outcomes() ([]outcome, error)
	// WatchesClients is true when a client that leaves is noticed: its
	// queued request is withdrawn (Withdraw) and its generation cancelled.
	// When false, the request stays queued and is computed in full when
	// its turn comes.
	WatchesClients() bool
	// Withdraw is r's client disconnecting while r is queued. It returns
	// r's outcome: withdrawn, or dispatched if dispatch won the race.
	Withdraw(r *request) (outcome, error)
	// Settle reports, before Release, the tokens a dispatched request
	// used: the queue replaces the cost it charged at dispatch with them.
	Settle(r *request, prompt, output int64)
	// Release gives back the slot of a dispatched request whose generation
	// completed or was cancelled; served says its client got the answer,
	// which makes its time in the slot a measurement (the queue's
	// ReleaseServed). It may dispatch queued requests.
	Release(r *request, served bool)
	// Measured is the weighted tokens per slot-second the scheduler
	// measured over its served, settled requests, and how many were
	// served; 0, 0 for one that does not measure.
	Measured() (tokensPerSlotSecond float64, served uint64)
	// NextDeadline is the simulated time at which the oldest queued request
	// expires; false when none will.
	NextDeadline() (time.Duration, bool)
	// ExpireDue expires every queued request whose deadline has come.
	ExpireDue()
	// Check checks the scheduler's own invariants and returns its counts,
	// which the engine compares with its own: after an event, or at the
	// end of the run (end). Only tests turn it on.
	Check(end bool) (snapshot, error)
	// Close ends every request still queued, so that nothing outlives the
	// run.
	Close() error
}

// outcome is how an admitted request left the queue.
type outcome struct {
	req *request
	// err is nil when the request was dispatched, queue.ErrExpired when
	// the queue expired it and context.Canceled when its client withdrew
	// it.
	err error
	// waited is enqueue to dispatch, as the scheduler measured it; set
	// when the request was dispatched.
	waited time.Duration
}

// snapshot is a scheduler's own count of its requests.
type snapshot struct {
	inflight int
	// admitted counts every admission of the run.
	admitted uint64
	queued   func(tier string) int
	// queuedTokens is the reserved cost queued in a tier; nil for a
	// scheduler that does not count tokens.
	queuedTokens   func(tier string) int64
	tenantInflight func(tenant string) int
}

// schedEnv is what every scheduler of a run may know beyond its policy:
// the pool's tiers (with their tenantShare, which a policy does not
// carry) and declared service time.
type schedEnv struct {
	clk *clocktesting.FakeClock
	// tiers are in base-priority order; index is their position.
	tiers       []tierSpec
	index       map[string]int
	serviceTime time.Duration
	// ageing is the pool's ageing rate (time per priority point).
	ageing time.Duration
}

type tierSpec struct {
	name  string
	base  int
	wait  time.Duration
	share float64
}

// now is the simulated time.
func (env *schedEnv) now() time.Duration { return env.clk.Since(epoch) }

// enforced is what a scheduler holds requests to under one policy; 0 means
// no limit.
type enforced struct {
	tiers map[string]tierLimits
	// tenantCap replaces the tier's tenant limit for a listed tenant.
	tenantCap map[string]int
	// tierBudgets and tenantBudgets are the policy's tiers[].tenantLimits
	// and tenants[].limits (budgetOf); nil maps: no budgets.
	tierBudgets, tenantBudgets map[string]*policy.Limits
}

type tierLimits struct {
	bound, tenantLimit, tenantQueueLimit int
	// tokenBound and tenantTokenLimit are the bounds in weighted tokens
	// (0: the tier is bounded in requests).
	tokenBound, tenantTokenLimit int64
}

// capOf is the in-flight cap of tenant in tier; 0: none.
func (l enforced) capOf(tenant, tier string) int {
	if c := l.tenantCap[tenant]; c > 0 {
		return c
	}
	return l.tiers[tier].tenantLimit
}

// policyLimits is what tiergate's queue enforces under p.
func policyLimits(p *policy.Policy) enforced {
	l := enforced{tiers: map[string]tierLimits{}, tenantCap: map[string]int{},
		tierBudgets: map[string]*policy.Limits{}, tenantBudgets: map[string]*policy.Limits{}}
	for _, t := range p.Tiers {
		l.tiers[t.Name] = tierLimits{bound: t.QueueBound, tenantLimit: t.TenantConcurrencyLimit, tenantQueueLimit: t.TenantQueueLimit,
			tokenBound: t.QueueTokenBound, tenantTokenLimit: t.TenantQueueTokenLimit}
		l.tierBudgets[t.Name] = t.TenantLimits
	}
	for _, t := range p.Tenants {
		if t.MaxConcurrency > 0 {
			l.tenantCap[t.ID] = t.MaxConcurrency
		}
		l.tenantBudgets[t.ID] = t.Limits
	}
	return l
}
