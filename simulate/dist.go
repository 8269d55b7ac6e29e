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
	h := fnv.New64a()
	_, _ = h.Write([]byte("service\x00"))
	_, _ = h.Write([]byte(name))
	return rand.New(rand.NewPCG(seed, h.Sum64()))
}

// sampler draws service times.
type sampler struct {
	dist string
	mean float64 // seconds
	// lognormal parameters of the underlying normal.
	mu, sigma float64
}

func newSampler(dist string, mean, stddev time.Duration) sampler {
	s := sampler{dist: dist, mean: mean.Seconds()}
	if dist == DistLognormal {
		m, sd := mean.Seconds(), stddev.Seconds()
		s.sigma = math.Sqrt(math.Log1p(sd * sd / (m * m)))
		s.mu = math.Log(m) - s.sigma*s.sigma/2
	}
	return s
}

// loadSampler is the Load's service-time distribution; without one, and for
// an unset mean, the pool's declared mean, exponential.
func loadSampler(st *ServiceTimeSpec, poolMean time.Duration) sampler {
	if st == nil {
		return newSampler(DistExponential, poolMean, 0)
	}
	return newSampler(st.Distribution, durOr(st.Mean, poolMean), durOr(st.Stddev, 0))
}

// draw returns one service time, at least 1ns so that a completion always
// comes after its dispatch.
func (s sampler) draw(r *rand.Rand) time.Duration {
	var v float64
	switch s.dist {
	case DistConstant:
		v = s.mean
	case DistExponential:
		v = r.ExpFloat64() * s.mean
	case DistLognormal:
		v = math.Exp(s.mu + s.sigma*r.NormFloat64())
	}
	return max(secs(v), 1)
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
