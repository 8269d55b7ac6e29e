package simulate

import (
	"hash/fnv"
	"math"
	"math/rand/v2"
	"time"
)

// newRand returns the random stream of one named purpose (a tenant's
// arrivals and service times). Each tenant has its own stream so that adding
// or removing a tenant leaves every other tenant's traffic exactly as it was
// (common random numbers: comparisons between runs measure the policy, not
// the dice).
func newRand(seed uint64, name string) *rand.Rand {
	h := fnv.New64a()
	_, _ = h.Write([]byte(name))
	return rand.New(rand.NewPCG(seed, h.Sum64()))
}

// newServiceRand is the stream of a closed-loop tenant's service times,
// apart from its think times.
func newServiceRand(seed uint64, name string) *rand.Rand {
	return newPurposeRand(seed, "service", name)
}

// newTokenRand is the stream of a tenant's token counts, apart from its
// arrivals and service times, so that giving a tenant tokens leaves its
// traffic as it was.
func newTokenRand(seed uint64, name string) *rand.Rand { return newPurposeRand(seed, "tokens", name) }

// newPurposeRand is the stream of one purpose of a tenant other than its
// arrivals.
func newPurposeRand(seed uint64, purpose, name string) *rand.Rand {
	h := fnv.New64a()
	_, _ = h.Write([]byte(purpose + "\x00"))
	_, _ = h.Write([]byte(name))
	return rand.New(rand.NewPCG(seed, h.Sum64()))
}

// sampler draws from a distribution: service times in seconds, or token
// counts.
type sampler struct {
	dist string
	mean float64
	// lognormal parameters of the underlying normal.
	mu, sigma float64
}

// newSampler is a distribution of mean and, for lognormal, stddev, in any
// unit.
func newSampler(dist string, mean, stddev float64) sampler {
	s := sampler{dist: dist, mean: mean}
	if dist == DistLognormal {
		s.sigma = math.Sqrt(math.Log1p(stddev * stddev / (mean * mean)))
		s.mu = math.Log(mean) - s.sigma*s.sigma/2
	}
	return s
}

// loadSampler is the Load's service-time distribution; without one, and for
// an unset mean, the pool's declared mean, exponential.
func loadSampler(st *ServiceTimeSpec, poolMean time.Duration) sampler {
	if st == nil {
		return newSampler(DistExponential, poolMean.Seconds(), 0)
	}
	return newSampler(st.Distribution, durOr(st.Mean, poolMean).Seconds(), durOr(st.Stddev, 0).Seconds())
}

// value is one draw.
func (s sampler) value(r *rand.Rand) float64 {
	switch s.dist {
	case DistExponential:
		return r.ExpFloat64() * s.mean
	case DistLognormal:
		return math.Exp(s.mu + s.sigma*r.NormFloat64())
	}
	return s.mean // constant
}

// draw returns one service time, at least 1ns so that a completion always
// comes after its dispatch.
func (s sampler) draw(r *rand.Rand) time.Duration {
	return max(secs(s.value(r)), 1)
}

// secs converts seconds to a Duration, rounding to the nanosecond.
func secs(v float64) time.Duration {
	if v >= float64(math.MaxInt64)/1e9 {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(math.Round(v * 1e9))
}

// expGap is an exponential gap with the given mean.
func expGap(r *rand.Rand, mean time.Duration) time.Duration {
	return secs(r.ExpFloat64() * mean.Seconds())
}
