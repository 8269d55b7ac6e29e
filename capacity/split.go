package capacity

import (
	"math/big"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/api/v1alpha1"
)

// basePolicy is what every dispatcher's policy shares: everything but the
// slots, the rate, the bounds, the tenants and the backends.
func basePolicy(pool *v1alpha1.ModelPool, spec *v1alpha1.ModelPoolSpec, b PoolBounds, defaultTier string, jwks *policy.JWKS) policy.Policy {
	auth := policyAuthentication(spec.Authentication, jwks)
	state := policy.StateLocal
	if spec.SharedState == v1alpha1.SharedStateRedis {
		state = policy.StateRedis
	}
	rate := b.ServiceRate
	if b.ColdStart > 0 {
		// The bounds describe the first replica; so does the drain rate
		// Retry-After uses.
		rate = b.FirstReplicaRate
	}
	var tokens *policy.Tokens
	if spec.Tokens != nil {
		tokens = &policy.Tokens{DefaultMaxTokens: int(spec.Tokens.DefaultMaxTokens)}
	}
	return policy.Policy{
		Tokens:               tokens,
		Fairness:             policyFairness(spec.Fairness),
		TokenServiceRate:     b.TokenServiceRate,
		Pool:                 pool.Namespace + "/" + pool.Name,
		ServiceRate:          rate,
		ColdStartSeconds:     b.ColdStart.Seconds(),
		AgeingRate:           b.AgeingRate.Seconds(),
		ClientTimeoutSeconds: b.ClientTimeout.Seconds(),
		SharedState:          state,
		Authentication:       auth,
		DefaultTier:          defaultTier,
		ExemptPaths:          spec.ExemptPaths,
	}
}

// splitPolicies gives n dispatchers one policy each. In Local mode each
// gets its slice of the pool's slots (shareSlots: none for an excluded
// one), the pool-wide bounds scaled by its slot fraction and its part of
// the budgets (budgets.go); in Redis mode each gets the pool-wide numbers,
// except the token bounds and their drain rate, which are its slice in
// both modes (the Gate counts queued requests, not their tokens).
// While held every policy has 0 slots and no backends, and the fractions
// are those of the first replica's C slots. It returns the budgets' split
// too, for the tenants' status.
func splitPolicies(base policy.Policy, r rates, tiers []TierBounds, live []liveTenant, backends []policy.Backend, n int, excluded []bool) ([]policy.Policy, budgetSplit) {
	whole := base.SharedState == policy.StateRedis
	slots := shareSlots(r.boundsFor, n, excluded)
	var budgets budgetSplit
	if !whole {
		budgets = newBudgetSplit(slots)
	}
	if r.held() {
		backends = nil
	}
	var out []policy.Policy
	for i := 0; i < n; i++ {
		s := part{mine: r.boundsFor, pool: r.boundsFor, share: slots[i], whole: whole, held: r.held(), budgets: budgets, index: i}
		if !whole {
			s.mine = slots[i]
		}
		out = append(out, s.policy(base, r, tiers, live, backends))
	}
	return out, budgets
}

// part is one dispatcher's slice of a pool of P slots (C while held).
type part struct {
	mine, pool int64
	// share is this dispatcher's slice of the slots in either mode: token
	// bounds are split by it in Redis mode too, since the fleet's Gate
	// counts queued requests, not their tokens.
	share int64
	// whole is true when the dispatcher holds pool-wide numbers (Redis).
	whole bool
	// held is true while the pool is at zero, holding for its first
	// replica: the part then serves nothing yet.
	held bool
	// budgets split the tenants' budgets; index is this dispatcher's.
	budgets budgetSplit
	index   int
}

// of scales a pool-wide number to this part: floor(v × mine / P), at
// least 1.
func (s part) of(v int32) int {
	if s.whole || s.pool == 0 {
		return int(v)
	}
	n := new(big.Int).Mul(big.NewInt(int64(v)), big.NewInt(s.mine))
	return int(atLeastOne(floorDiv(n, big.NewInt(s.pool)).Int64()))
}

// bound scales a tier's queue bound. While held a bound of 0 stays 0, and
// a part with no share of the first replica holds nothing: it would have
// no slot to serve them when that replica arrives.
func (s part) bound(v int32) int {
	if s.held && (v == 0 || (!s.whole && s.mine == 0)) {
		return 0
	}
	return s.of(v)
}

func (s part) policy(base policy.Policy, r rates, tiers []TierBounds, live []liveTenant, backends []policy.Backend) policy.Policy {
	pol := base
	pol.Slots = int(s.mine)
	if s.held {
		pol.Slots = 0
	}
	pol.ExemptPaths = append([]string(nil), base.ExemptPaths...)
	pol.Backends = append([]policy.Backend{}, backends...)
	if base.Tokens != nil {
		t := *base.Tokens
		pol.Tokens = &t
	}
	if base.Fairness != nil {
		f := *base.Fairness
		pol.Fairness = &f
	}
	if !s.whole && s.pool > 0 {
		// This dispatcher drains its own slice of the pool.
		pol.ServiceRate, _ = r.perSecond(s.mine).Float64()
	}
	if s.pool > 0 && pol.TokenServiceRate > 0 {
		// Token bounds are this dispatcher's slice in both modes, and so
		// is the rate that drains them.
		pol.TokenServiceRate = tokenServiceRate(r.tokens, s.share)
	}
	pol.Tiers = make([]policy.Tier, 0, len(tiers))
	for _, tb := range tiers {
		pol.Tiers = append(pol.Tiers, policy.Tier{
			Name:                   tb.Name,
			BasePriority:           int(tb.BasePriority),
			TolerableWaitSeconds:   tb.TolerableWait.Seconds(),
			QueueBound:             s.bound(tb.QueueBound),
			TenantConcurrencyLimit: s.of(tb.TenantConcurrencyLimit),
			TenantQueueLimit:       s.of(tb.TenantQueueLimit),
			TenantLimits:           s.budgets.limits(tb.TenantLimits, s.index),
			QueueTokenBound:        s.tokens(tb.QueueTokenBound),
			TenantQueueTokenLimit:  s.tokens(tb.TenantQueueTokenLimit),
		})
	}
	for _, lt := range live {
		t := policy.Tenant{ID: lt.bounds.Tenant, Tier: lt.bounds.Tier, Limits: s.budgets.limits(lt.own, s.index), Weight: lt.weight}
		if lt.override > 0 {
			t.MaxConcurrency = s.of(lt.override)
		}
		if len(lt.hashes) > 0 {
			t.APIKeySHA256 = append([]string(nil), lt.hashes...)
		}
		pol.Tenants = append(pol.Tenants, t)
	}
	return pol
}

// shareSlots spreads p over the n dispatchers that excluded (nil, or one
// entry each) does not mark, in order (splitSlots); the excluded ones get
// 0. When every one is excluded it spreads p over all of them: a pool
// whose dispatchers are all failing is no better served by none.
func shareSlots(p int64, n int, excluded []bool) []int64 {
	var holders []int
	for i := 0; i < n; i++ {
		if excluded == nil || !excluded[i] {
			holders = append(holders, i)
		}
	}
	if len(holders) == 0 || len(holders) == n {
		return splitSlots(p, n)
	}
	out := make([]int64, n)
	for k, s := range splitSlots(p, len(holders)) {
		out[holders[k]] = s
	}
	return out
}

// splitSlots spreads p over n dispatchers as evenly as whole numbers allow;
// the first p mod n dispatchers get one more. The slices sum to p.
func splitSlots(p int64, n int) []int64 {
	if n <= 0 {
		return nil
	}
	out := make([]int64, n)
	base, rem := p/int64(n), p%int64(n)
	for i := range out {
		out[i] = base
		if int64(i) < rem {
			out[i]++
		}
	}
	return out
}
