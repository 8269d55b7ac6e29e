package main

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"
)

// dist draws non-negative numbers: seconds for --service-time, tokens for
// --output-tokens. Both flags share one grammar:
//
//	X | const:X          always X
//	exp:MEAN             exponential with this mean
//	lognormal:MEAN,SD    log-normal with this mean and standard deviation
//	                     (of the value itself, not of its logarithm)
type dist interface {
	Sample() float64
	String() string
}

// unit parses and prints one flag's numbers.
type unit struct {
	parse  func(string) (float64, error)
	format func(float64) string
}

// parseDist reads s in the grammar above; err wraps bad, which names the flag.
func parseDist(s string, u unit, rng *lockedRand, bad error) (dist, error) {
	kind, arg, found := strings.Cut(s, ":")
	if !found {
		kind, arg = "const", s
	}
	num := func(a string) (float64, error) {
		v, err := u.parse(strings.TrimSpace(a))
		if err != nil {
			return 0, fmt.Errorf("%w: %v", bad, err)
		}
		if v < 0 {
			return 0, fmt.Errorf("%w: negative value %s", bad, a)
		}
		return v, nil
	}
	switch kind {
	case "const":
		v, err := num(arg)
		return constDist{v: v, u: u}, err
	case "exp":
		v, err := num(arg)
		return expDist{mean: v, u: u, rng: rng}, err
	case "lognormal":
		ms, ss, ok := strings.Cut(arg, ",")
		if !ok {
			return nil, fmt.Errorf("%w %q: lognormal needs MEAN,STDDEV", bad, s)
		}
		m, err := num(ms)
		if err != nil {
			return nil, err
		}
		sd, err := num(ss)
		if err != nil {
			return nil, err
		}
		if m <= 0 {
			return nil, fmt.Errorf("%w %q: lognormal mean must be > 0", bad, s)
		}
		// Moments of the log-normal: for mean m and deviation s of X,
		// sigma² = ln(1 + s²/m²) and mu = ln(m) − sigma²/2.
		sigma2 := math.Log(1 + (sd*sd)/(m*m))
		return lognormalDist{mu: math.Log(m) - sigma2/2, sigma: math.Sqrt(sigma2), mean: m, sd: sd, u: u, rng: rng}, nil
	default:
		return nil, fmt.Errorf("%w %q: unknown kind %q (want const, exp or lognormal)", bad, s, kind)
	}
}

type constDist struct {
	v float64
	u unit
}

func (c constDist) Sample() float64 { return c.v }
func (c constDist) String() string  { return "const:" + c.u.format(c.v) }

type expDist struct {
	mean float64
	u    unit
	rng  *lockedRand
}

func (e expDist) Sample() float64 { return e.rng.ExpFloat64() * e.mean }
func (e expDist) String() string  { return "exp:" + e.u.format(e.mean) }

type lognormalDist struct {
	mu, sigma, mean, sd float64
	u                   unit
	rng                 *lockedRand
}

func (l lognormalDist) Sample() float64 { return math.Exp(l.mu + l.sigma*l.rng.NormFloat64()) }
func (l lognormalDist) String() string {
	return "lognormal:" + l.u.format(l.mean) + "," + l.u.format(l.sd)
}

// serviceTime draws one request's service time (--service-time).
type serviceTime struct{ d dist }

var errBadDist = errors.New("bad --service-time")

var seconds = unit{
	parse: func(s string) (float64, error) {
		if s == "0" {
			return 0, nil
		}
		d, err := time.ParseDuration(s)
		return d.Seconds(), err
	},
	format: func(v float64) string { return time.Duration(v * float64(time.Second)).String() },
}

// parseServiceTime reads --service-time: durations such as 200ms or 6s in
// the grammar of dist ("0" is no service time at all, for benchmarks).
func parseServiceTime(s string, rng *lockedRand) (serviceTime, error) {
	d, err := parseDist(s, seconds, rng, errBadDist)
	return serviceTime{d: d}, err
}

func (s serviceTime) Sample() time.Duration {
	return time.Duration(s.d.Sample() * float64(time.Second))
}
func (s serviceTime) String() string { return s.d.String() }

var errBadCount = errors.New("bad --output-tokens")

var tokenCount = unit{
	parse:  func(s string) (float64, error) { return strconv.ParseFloat(s, 64) },
	format: func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) },
}

// parseOutputTokens reads --output-tokens: token counts in the grammar of
// dist. Empty means every answer uses its whole maximum.
func parseOutputTokens(s string, rng *lockedRand) (dist, error) {
	if s == "" {
		return nil, nil
	}
	return parseDist(s, tokenCount, rng, errBadCount)
}

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
