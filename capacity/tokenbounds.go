package capacity

import (
	"math"
	"math/big"
	"strconv"
	"time"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/api/v1alpha1"
)

// MaxQueueTokenBound caps a queue's token bound: 2⁵³ − 1, the largest
// integer a float64 holds exactly, so that the bound survives JSON readers
// and Redis's Lua, whose numbers are doubles.
const MaxQueueTokenBound = 1<<53 - 1

// tokenRate is r, the weighted tokens one slot serves per second, behind
// the token bounds (spec.tokens.boundBy Tokens); nil bounds by requests.
//
// With spec.serviceTime.source Measured and a measured rate, r is that
// rate. Otherwise it is declared: the cost of a balanced reference request
// (P prompt and P output tokens) over the time it holds a slot,
//
//	r = (P × in + P × out) / (P / prefill + P / decode)
//	  = (in + out) × prefill × decode / (prefill + decode),
//
// exactly; Measured learns the live mix instead.
func tokenRate(spec *v1alpha1.ModelPoolSpec, observed float64) (*big.Rat, v1alpha1.ServiceTimeSource) {
	t := spec.Tokens
	if t == nil || t.BoundBy != v1alpha1.BoundByTokens {
		return nil, ""
	}
	if spec.ServiceTime.Source == v1alpha1.ServiceTimeMeasured && observed > 0 && !math.IsInf(observed, 0) {
		// The float's shortest decimal, so that a measured 0.7 is 7/10
		// and not the binary value just below it, which floors one less.
		q, _ := new(big.Rat).SetString(strconv.FormatFloat(observed, 'g', -1, 64))
		return q, v1alpha1.ServiceTimeMeasured
	}
	if t.PrefillTokensPerSecond < 1 || t.DecodeTokensPerSecond < 1 {
		return nil, ""
	}
	f := fairnessOf(spec.Fairness)
	pre, dec := int64(t.PrefillTokensPerSecond), int64(t.DecodeTokensPerSecond)
	num := big.NewInt((int64(f.InputWeight) + int64(f.OutputWeight)) * pre * dec)
	return new(big.Rat).SetFrac(num, big.NewInt(pre+dec)), v1alpha1.ServiceTimeDeclared
}

// fairnessOf is spec.fairness with its defaults, as the policy reads it.
func fairnessOf(f *v1alpha1.Fairness) policy.Fairness {
	p := policy.Policy{}
	if f != nil {
		p.Fairness = &policy.Fairness{Mode: string(f.Mode), InputWeight: int(f.InputWeight), OutputWeight: int(f.OutputWeight)}
	}
	return p.FairnessOf()
}

// policyFairness is spec.fairness for the policy: nil when it is absent or
// says what an absent one does (mode Requests, weights 1 and 2), so that
// a pool that does not use it pushes the policy of revision 2.
func policyFairness(f *v1alpha1.Fairness) *policy.Fairness {
	eff := fairnessOf(f)
	if eff == fairnessOf(nil) {
		return nil
	}
	return &eff
}

// tokensWithin is the weighted tokens the slots the bounds describe serve
// in d at r per slot-second: floor(P × r × d), or while held floor(C × r
// × (d − coldStart)) and never below 0, capped at MaxQueueTokenBound.
func (r rates) tokensWithin(rate *big.Rat, d time.Duration) int64 {
	d -= r.coldStart
	if d <= 0 {
		return 0
	}
	slotTime := new(big.Int).Mul(big.NewInt(r.boundsFor), big.NewInt(int64(d))) // may pass int64
	v := new(big.Rat).Mul(rate, new(big.Rat).SetFrac(slotTime, big.NewInt(int64(time.Second))))
	return clampTokens(floorRat(v))
}

// tokenServiceRate is slots × r, the weighted tokens per second that many
// slots serve; 0 when rate is nil.
func tokenServiceRate(rate *big.Rat, slots int64) float64 {
	if rate == nil {
		return 0
	}
	f, _ := new(big.Rat).Mul(rate, new(big.Rat).SetInt64(slots)).Float64()
	return f
}

// tierTokenBounds sets each tier's QueueTokenBound = floor(P × r ×
// min(W, clientTimeout)) and TenantQueueTokenLimit = max(1, floor(bound ×
// share)), following QueueBound's rule: at least 1 while the pool serves,
// and 0 exactly when QueueBound is 0 (at zero replicas, and while held for
// a tier that cannot wait out the cold start), so the two refuse alike.
// rate nil leaves them 0: the tiers are bounded by requests.
func tierTokenBounds(tiers []TierBounds, sorted []v1alpha1.ServiceTier, r rates, clientTimeout time.Duration) {
	rate := r.tokens
	if rate == nil {
		return
	}
	for i := range tiers {
		tb := &tiers[i]
		if tb.QueueBound == 0 {
			continue
		}
		weff := tb.TolerableWait
		if clientTimeout > 0 && clientTimeout < weff {
			weff = clientTimeout
		}
		tb.QueueTokenBound = atLeastOne(r.tokensWithin(rate, weff))
		share := shareRat(sorted[i].Spec.TenantShare)
		tb.TenantQueueTokenLimit = atLeastOne(clampTokens(floorRat(new(big.Rat).Mul(new(big.Rat).SetInt64(tb.QueueTokenBound), share))))
	}
}

func clampTokens(v *big.Int) int64 {
	if v.Cmp(big.NewInt(MaxQueueTokenBound)) > 0 {
		return MaxQueueTokenBound
	}
	return v.Int64()
}

// tokens scales a pool-wide token bound to this part's slice of the slots
// (share, in Redis mode too: each dispatcher enforces its token bounds
// alone, so the slices must add up to the pool's): floor(v × share / P),
// at least 1; 0 stays 0 (no token bound), and while held a part with no
// share of the first replica holds nothing, as bound.
func (s part) tokens(v int64) int64 {
	if v == 0 || (s.held && s.share == 0) {
		return 0
	}
	if s.pool == 0 {
		return v
	}
	n := new(big.Int).Mul(big.NewInt(v), big.NewInt(s.share))
	return atLeastOne(floorDiv(n, big.NewInt(s.pool)).Int64())
}
