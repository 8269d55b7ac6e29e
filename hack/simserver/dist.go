package main

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"time"
)

// serviceTime draws one request's service time.
type serviceTime interface {
	Sample() time.Duration
	String() string
}

var errBadDist = errors.New("bad --service-time")

// parseServiceTime understands:
//
//	0 | const:0         no service time at all (benchmarks)
//	const:200ms | 200ms every request takes exactly this long
//	exp:6s              exponential with this mean
//	lognormal:6s,2s     log-normal with this mean and standard deviation
//	                    (of the duration itself, not of its logarithm)
func parseServiceTime(s string, rng *lockedRand) (serviceTime, error) {
	kind, arg, found := strings.Cut(s, ":")
	if !found {
		kind, arg = "const", s
	}
	switch kind {
	case "const":
		d, err := parsePositiveDuration(arg)
		if err != nil {
			return nil, err
		}
		return constDist(d), nil
	case "exp":
		d, err := parsePositiveDuration(arg)
		if err != nil {
			return nil, err
		}
		return expDist{mean: d, rng: rng}, nil
	case "lognormal":
		ms, ss, ok := strings.Cut(arg, ",")
		if !ok {
			return nil, fmt.Errorf("%w %q: lognormal needs MEAN,STDDEV", errBadDist, s)
		}
		mean, err := parsePositiveDuration(ms)
		if err != nil {
			return nil, err
		}
		sd, err := parsePositiveDuration(ss)
		if err != nil {
			return nil, err
		}
		if mean <= 0 {
			return nil, fmt.Errorf("%w %q: lognormal mean must be > 0", errBadDist, s)
		}
		// Moments of the log-normal: for mean m and deviation s of X,
		// sigma² = ln(1 + s²/m²) and mu = ln(m) − sigma²/2.
		m, sdev := mean.Seconds(), sd.Seconds()
		sigma2 := math.Log(1 + (sdev*sdev)/(m*m))
		return lognormalDist{mu: math.Log(m) - sigma2/2, sigma: math.Sqrt(sigma2), mean: mean, sd: sd, rng: rng}, nil
	default:
		return nil, fmt.Errorf("%w %q: unknown kind %q (want const, exp or lognormal)", errBadDist, s, kind)
	}
}

func parsePositiveDuration(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if s == "0" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%w: %v", errBadDist, err)
	}
	if d < 0 {
		return 0, fmt.Errorf("%w: negative duration %s", errBadDist, s)
	}
	return d, nil
}

type constDist time.Duration

func (c constDist) Sample() time.Duration { return time.Duration(c) }
func (c constDist) String() string        { return "const:" + time.Duration(c).String() }

type expDist struct {
	mean time.Duration
	rng  *lockedRand
}

func (e expDist) Sample() time.Duration {
	return time.Duration(e.rng.ExpFloat64() * float64(e.mean))
}
func (e expDist) String() string { return "exp:" + e.mean.String() }

type lognormalDist struct {
	mu, sigma float64
	mean, sd  time.Duration
	rng       *lockedRand
}

func (l lognormalDist) Sample() time.Duration {
	return time.Duration(math.Exp(l.mu+l.sigma*l.rng.NormFloat64()) * float64(time.Second))
}
func (l lognormalDist) String() string { return "lognormal:" + l.mean.String() + "," + l.sd.String() }

// lockedRand makes a seeded generator safe for concurrent handlers, so a
// fixed --seed gives a reproducible sequence of draws.
type lockedRand struct {
	mu sync.Mutex
	r  *rand.Rand
}

func newLockedRand(seed uint64) *lockedRand {
	return &lockedRand{r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

func (l *lockedRand) ExpFloat64() float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.r.ExpFloat64()
}

func (l *lockedRand) NormFloat64() float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.r.NormFloat64()
}
