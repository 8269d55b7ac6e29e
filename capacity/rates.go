package capacity

import (
	"fmt"
	"math/big"
	"time"

	"github.com/tiergate/tiergate/api/v1alpha1"
)

// rates are a pool's service figures. Everything that turns requests into
// time or time into requests is a method here, so the case of one replica
// starting from zero changes this one place.
type rates struct {
	replicas    int32 // R
	concurrency int64 // P = R × C, the slots serving now
	// boundsFor is the slots the bounds describe: P, or C while the pool
	// is at zero and a first replica is expected after coldStart.
	boundsFor int64
	// coldStart is spec.coldStart while the pool is at zero, else 0.
	coldStart   time.Duration
	serviceTime time.Duration // S, > 0
	source      v1alpha1.ServiceTimeSource
	// tokens is r, the weighted tokens per slot-second of the token
	// bounds (tokenbounds.go); nil when the queues are bounded by requests.
	tokens      *big.Rat
	tokenSource v1alpha1.ServiceTimeSource
}

// poolRates takes R from the caller, C from the spec and S from the spec
// or, when the source is Measured and something was measured, from
// observed. At R = 0 with spec.coldStart the bounds are those of one
// replica: μ₁ = C / S, serving from coldStart on.
func poolRates(spec *v1alpha1.ModelPoolSpec, replicas int32, observed time.Duration) (rates, error) {
	r := rates{
		replicas:    replicas,
		concurrency: int64(replicas) * int64(spec.ConcurrencyPerReplica),
		serviceTime: spec.ServiceTime.Mean.Duration,
		source:      spec.ServiceTime.Source,
	}
	r.boundsFor = r.concurrency
	if replicas == 0 && spec.ColdStart != nil && spec.ColdStart.Duration > 0 {
		r.boundsFor = int64(spec.ConcurrencyPerReplica)
		r.coldStart = spec.ColdStart.Duration
	}
	if r.source == v1alpha1.ServiceTimeMeasured && observed > 0 {
		r.serviceTime = observed
	}
	if r.concurrency > maxInt32 {
		return rates{}, fmt.Errorf("%w: readyReplicas × concurrencyPerReplica = %d exceeds %d", ErrInvalidInput, r.concurrency, maxInt32)
	}
	return r, nil
}

// held is true while the pool is at zero and holds requests for its first
// replica.
func (r rates) held() bool { return r.coldStart > 0 }

// perSecond is slots / S, the requests per second that many slots serve.
func (r rates) perSecond(slots int64) *big.Rat {
	return new(big.Rat).SetFrac(big.NewInt(slots*int64(time.Second)), big.NewInt(int64(r.serviceTime)))
}

// serviceRate is μ = P / S per second: what the pool serves now.
func (r rates) serviceRate() *big.Rat { return r.perSecond(r.concurrency) }

// boundsRate is the rate the bounds assume: μ, or μ₁ = C / S while held.
func (r rates) boundsRate() *big.Rat { return r.perSecond(r.boundsFor) }

// servedWithin is the requests the pool finishes in d: floor(P × d / S),
// or while held floor(C × (d − coldStart) / S) and never below 0. It is
// capped at the int32 range.
func (r rates) servedWithin(d time.Duration) int64 {
	d -= r.coldStart
	if d <= 0 {
		return 0
	}
	n := new(big.Int).Mul(big.NewInt(r.boundsFor), big.NewInt(int64(d)))
	return clampInt32(floorDiv(n, big.NewInt(int64(r.serviceTime))))
}

// drainTime is ceil(n × S / P) (C while held), how long the slots the
// bounds describe take to serve n requests. They must be positive.
func (r rates) drainTime(n int64) time.Duration {
	t := new(big.Int).Mul(big.NewInt(n), big.NewInt(int64(r.serviceTime)))
	return time.Duration(ceilDiv(t, big.NewInt(r.boundsFor)))
}

// ageingRate applies spec.ageing. spread is max base − min base. With
// starvationBound and a spread of 0 (one tier, or all bases equal) there is
// nothing to climb, so the bound itself is used as the rate: it keeps the
// horizon 0 and still orders equal-base work by arrival.
func ageingRate(a v1alpha1.Ageing, spread int32) time.Duration {
	switch {
	case a.Rate != nil:
		return a.Rate.Duration
	case a.StarvationBound != nil:
		if spread <= 0 {
			return a.StarvationBound.Duration
		}
		return a.StarvationBound.Duration / time.Duration(spread)
	default:
		return DefaultAgeingRate
	}
}

// baseSpread is max base − min base of tiers sorted by sortedTiers; 0 for
// none.
func baseSpread(sorted []v1alpha1.ServiceTier) int32 {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[len(sorted)-1].Spec.BasePriority - sorted[0].Spec.BasePriority
}
