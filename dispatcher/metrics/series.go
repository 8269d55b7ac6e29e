package metrics

import (
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tiergate/tiergate/dispatcher/queue"
)

// Series is one pool and tier's event series, each looked up in its vector
// once, on first use, and then kept: a request pays no label hashing. The
// data path builds one per tier of every policy it applies (SetTiers later
// deletes the series of tiers that went away; a Series of the previous
// policy may still count an in-flight request into a deleted series, which
// is then simply not exported).
type Series struct {
	m          *Metrics
	pool, tier string
	wait       atomic.Pointer[prometheus.Observer]
	service    atomic.Pointer[prometheus.Observer]
	requests   [600]atomic.Pointer[prometheus.Counter] // by HTTP status
	rejections []atomic.Pointer[prometheus.Counter]    // by index in queue.Causes()
	tokens     [2]atomic.Pointer[prometheus.Counter]   // prompt, completion
	estimate   atomic.Pointer[prometheus.Observer]     // the pool's, shared by its tiers
}

// Series returns pool and tier's series, none of them created yet.
func (m *Metrics) Series(pool, tier string) *Series {
	return &Series{m: m, pool: pool, tier: tier, rejections: make([]atomic.Pointer[prometheus.Counter], len(causes))}
}

// causes is queue.Causes(), read once.
var causes = queue.Causes()

// ObserveWait is Metrics.ObserveWait for this series.
func (s *Series) ObserveWait(d time.Duration) {
	o := s.wait.Load()
	if o == nil {
		v := s.m.queueWait.WithLabelValues(s.pool, s.tier)
		o = &v
		s.wait.Store(o)
	}
	(*o).Observe(d.Seconds())
}

// ObserveService is Metrics.ObserveService for this series.
func (s *Series) ObserveService(d time.Duration) {
	o := s.service.Load()
	if o == nil {
		v := s.m.service.WithLabelValues(s.pool, s.tier)
		o = &v
		s.service.Store(o)
	}
	(*o).Observe(d.Seconds())
}

// Request is Metrics.Request for this series.
func (s *Series) Request(code int) {
	if code < 0 || code >= len(s.requests) {
		s.m.Request(s.pool, s.tier, code)
		return
	}
	c := s.requests[code].Load()
	if c == nil {
		v := s.m.requests.WithLabelValues(s.pool, s.tier, strconv.Itoa(code))
		c = &v
		s.requests[code].Store(c)
	}
	(*c).Inc()
}

// Reject is Metrics.Reject for this series.
func (s *Series) Reject(cause string) {
	i := 0
	for i < len(causes) && causes[i] != cause {
		i++
	}
	if i == len(causes) {
		s.m.Reject(s.pool, s.tier, cause)
		return
	}
	c := s.rejections[i].Load()
	if c == nil {
		v := s.m.rejections.WithLabelValues(s.pool, s.tier, cause)
		c = &v
		s.rejections[i].Store(c)
	}
	(*c).Inc()
}

// Abandon is Metrics.Abandon for this series (rare: not cached).
func (s *Series) Abandon(stage string) { s.m.Abandon(s.pool, s.tier, stage) }

// Tokens is Metrics.Tokens for this series.
func (s *Series) Tokens(prompt, completion int64) {
	s.tokenCounter(0, KindPrompt).Add(float64(prompt))
	s.tokenCounter(1, KindCompletion).Add(float64(completion))
}

func (s *Series) tokenCounter(i int, kind string) prometheus.Counter {
	c := s.tokens[i].Load()
	if c == nil {
		v := s.m.tokens.WithLabelValues(s.pool, s.tier, kind)
		c = &v
		s.tokens[i].Store(c)
	}
	return *c
}

// ObserveEstimateError is Metrics.ObserveEstimateError for this series'
// pool.
func (s *Series) ObserveEstimateError(ratio float64) {
	o := s.estimate.Load()
	if o == nil {
		v := s.m.estimate.WithLabelValues(s.pool)
		o = &v
		s.estimate.Store(o)
	}
	(*o).Observe(ratio)
}
