package metrics

import (
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tiergate/tiergate/dispatcher/queue"
)

// Abandonment stages of abandoned_total.
const (
	StageQueued   = "queued"   // the client left while queued
	StageDispatch = "dispatch" // the client was gone when its slot came
	StageInflight = "inflight" // the client left mid-generation
)

// TierLevel is one tier's queue state.
type TierLevel struct {
	Queued, Bound int
	OldestAge     time.Duration
	// QueuedTokens is the weighted tokens the tier's queued requests
	// reserve; TokenBound its queue's bound in them, 0 when the tier is
	// bounded in requests (then neither gauge is reported).
	QueuedTokens, TokenBound int64
	// Fair says the tier orders its tenants by their token counters
	// (Tokens fairness): only then are FairnessGap, the largest
	// difference in counters between its backlogged tenants, and
	// FairnessGapBound, the most that difference can be (see
	// docs/scheduling.md), reported.
	Fair                          bool
	FairnessGap, FairnessGapBound float64
}

// Snapshot is the state the level metrics report. Pool == "" means no
// policy yet: nothing is reported.
type Snapshot struct {
	Pool            string
	Slots, InFlight int
	PolicyVersion   int64
	Tiers           map[string]TierLevel
	// Backends maps address to outstanding requests.
	Backends map[string]int64
	// BodyBytes is what the bodies being read and queued hold of the
	// BodyBudget (--max-queued-bytes).
	BodyBytes, BodyBudget int64
	// BackendHealth maps address to its passive health.
	BackendHealth map[string]BackendHealth
	// BytesPerToken is the pool's learned prompt bytes per token; 0 leaves
	// the gauge out.
	BytesPerToken float64
}

// BackendHealth is one backend's passive health.
type BackendHealth struct {
	Ejected   bool
	Ejections uint64
}

// Metrics holds the dispatcher's metrics.
type Metrics struct {
	queueWait  *prometheus.HistogramVec
	service    *prometheus.HistogramVec
	rejections *prometheus.CounterVec
	abandoned  *prometheus.CounterVec
	requests   *prometheus.CounterVec
	tokens     *prometheus.CounterVec
	estimate   *prometheus.HistogramVec

	snapshot func() Snapshot

	queueLength, queueBound, oldestAge, inflight, slots, utilisation, backendInflight, policyVersion *prometheus.Desc
	backendEjected, backendEjections                                                                 *prometheus.Desc
	bodyBytes, bodyBudget, bytesPerToken                                                             *prometheus.Desc
	queueTokens, queueTokenBound, fairnessGap, fairnessGapBound                                      *prometheus.Desc

	mu    sync.Mutex
	pool  string
	tiers []string
}

// New registers the metrics with reg. snapshot is called on every scrape.
func New(reg prometheus.Registerer, snapshot func() Snapshot) (*Metrics, error) {
	pt := []string{"pool", "tier"}
	m := &Metrics{
		queueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tiergate_queue_wait_seconds",
			Help:    "Time dispatched requests spent queued, by tier.",
			Buckets: []float64{.001, .005, .01, .05, .1, .25, .5, 1, 2.5, 5, 10, 20, 30, 60, 120},
		}, pt),
		service: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tiergate_service_seconds",
			Help:    "Time dispatched requests held a slot (dispatch to release), by tier.",
			Buckets: []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300},
		}, pt),
		rejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tiergate_rejections_total",
			Help: "Refused requests by cause (" + strings.Join(queue.Causes(), ", ") + ").",
		}, []string{"pool", "tier", "cause"}),
		abandoned: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tiergate_abandoned_total",
			Help: "Requests whose client went away, by stage (queued, dispatch, inflight).",
		}, []string{"pool", "tier", "stage"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tiergate_requests_total",
			Help: "Finished requests by HTTP status sent (499: the client went away first).",
		}, []string{"pool", "tier", "code"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tiergate_tokens_total",
			Help: "Tokens settled against requests that reached a backend, by kind (prompt, completion): the answer's usage, else the estimate.",
		}, []string{"pool", "tier", "kind"}),
		estimate: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tiergate_token_estimate_error_ratio",
			Help:    "A prompt's estimated tokens over the usage.prompt_tokens its answer reported (1 is exact).",
			Buckets: estimateBuckets(),
		}, []string{"pool"}),
		snapshot:        snapshot,
		queueLength:     prometheus.NewDesc("tiergate_queue_length", "Requests queued now, by tier.", pt, nil),
		queueBound:      prometheus.NewDesc("tiergate_queue_bound", "Queue bound of the tier (this dispatcher's share).", pt, nil),
		oldestAge:       prometheus.NewDesc("tiergate_oldest_queued_age_seconds", "Age of the oldest queued request, by tier; 0 when none.", pt, nil),
		inflight:        prometheus.NewDesc("tiergate_inflight", "Requests holding a slot now.", []string{"pool"}, nil),
		slots:           prometheus.NewDesc("tiergate_slots", "Slots of this dispatcher (its share of the pool's concurrency).", []string{"pool"}, nil),
		utilisation:     prometheus.NewDesc("tiergate_utilisation", "inflight / slots; 0 with no slots.", []string{"pool"}, nil),
		backendInflight: prometheus.NewDesc("tiergate_backend_inflight", "Requests outstanding at each backend (queued requests excluded).", []string{"pool", "backend"}, nil),
		policyVersion:   prometheus.NewDesc("tiergate_policy_version", "Version of the applied policy.", []string{"pool"}, nil),
		backendEjected: prometheus.NewDesc("tiergate_backend_ejected",
			"1 while passive health checking keeps the backend out of service (ejected, or waiting for its probe), else 0.", []string{"pool", "backend"}, nil),
		backendEjections: prometheus.NewDesc("tiergate_backend_ejections_total",
			"Times the backend was ejected for failing requests in a row.", []string{"pool", "backend"}, nil),
		bodyBytes:       prometheus.NewDesc("tiergate_queued_body_bytes", "Bytes of the request bodies being read or queued, charged to --max-queued-bytes.", []string{"pool"}, nil),
		bodyBudget:      prometheus.NewDesc("tiergate_queued_body_budget_bytes", "The budget of queued request bodies (--max-queued-bytes); past it requests get 503 overloaded.", []string{"pool"}, nil),
		queueTokens:     prometheus.NewDesc("tiergate_queue_tokens", "Weighted tokens the tier's queued requests reserve, when the tier is bounded in tokens.", pt, nil),
		queueTokenBound: prometheus.NewDesc("tiergate_queue_token_bound", "Queue bound of the tier in weighted tokens (this dispatcher's share), when it is bounded in tokens.", pt, nil),
		fairnessGap: prometheus.NewDesc("tiergate_fairness_gap_tokens",
			"Largest difference in virtual token counters between the tier's backlogged tenants (weighted tokens / weight), in Tokens fairness.", pt, nil),
		fairnessGapBound: prometheus.NewDesc("tiergate_fairness_gap_bound_tokens",
			"The most tiergate_fairness_gap_tokens can be while the tenants stay backlogged, as Tokens fairness promises.", pt, nil),
		bytesPerToken: prometheus.NewDesc("tiergate_bytes_per_token",
			"Prompt bytes per token the pool's estimate uses, learned from the answers' usage.prompt_tokens.", []string{"pool"}, nil),
	}
	for _, c := range []prometheus.Collector{m.queueWait, m.service, m.rejections, m.abandoned, m.requests, m.tokens, m.estimate, levels{m}} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// ObserveWait records a dispatched request's time in the queue.
func (m *Metrics) ObserveWait(pool, tier string, d time.Duration) {
	m.queueWait.WithLabelValues(pool, tier).Observe(d.Seconds())
}

// ObserveService records how long a request held its slot.
func (m *Metrics) ObserveService(pool, tier string, d time.Duration) {
	m.service.WithLabelValues(pool, tier).Observe(d.Seconds())
}

// Reject counts a refusal; cause is one of queue.Causes, tier is "" when
// it was not known yet.
func (m *Metrics) Reject(pool, tier, cause string) {
	m.rejections.WithLabelValues(pool, tier, cause).Inc()
}

// Abandon counts a client that went away at stage.
func (m *Metrics) Abandon(pool, tier, stage string) {
	m.abandoned.WithLabelValues(pool, tier, stage).Inc()
}

// Request counts a finished request by the status it got.
func (m *Metrics) Request(pool, tier string, code int) {
	m.requests.WithLabelValues(pool, tier, strconv.Itoa(code)).Inc()
}

// Tokens counts the tokens settled against a request, by kind.
func (m *Metrics) Tokens(pool, tier string, prompt, completion int64) {
	m.tokens.WithLabelValues(pool, tier, KindPrompt).Add(float64(prompt))
	m.tokens.WithLabelValues(pool, tier, KindCompletion).Add(float64(completion))
}

// ObserveEstimateError records a prompt's estimate over its actual tokens.
func (m *Metrics) ObserveEstimateError(pool string, ratio float64) {
	m.estimate.WithLabelValues(pool).Observe(ratio)
}

// estimateBuckets are 0.25 to 4 in steps of 2^(1/4): about 19% wide, with
// 0.5, 1, 2 and 4 exact bounds (math.Exp2 of whole numbers is exact).
func estimateBuckets() []float64 {
	b := make([]float64, 17)
	for i := range b {
		b[i] = math.Exp2(float64(i-8) / 4)
	}
	return b
}

// Kinds of tokens_total.
const (
	KindPrompt     = "prompt"
	KindCompletion = "completion"
)

// deleter is what SetTiers needs of a vector.
type deleter interface {
	DeletePartialMatch(prometheus.Labels) int
}

// SetTiers tells which pool and tiers the current policy has, deleting the
// series of any other pool, and of this pool's tiers that went away.
// Refusals made before a tier was known (tier "") are kept.
func (m *Metrics) SetTiers(pool string, tiers []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	vecs := []deleter{m.queueWait, m.service, m.rejections, m.abandoned, m.requests, m.tokens}
	if m.pool != "" && m.pool != pool {
		for _, v := range append(vecs, m.estimate) {
			v.DeletePartialMatch(prometheus.Labels{"pool": m.pool})
		}
	} else {
		for _, t := range m.tiers {
			if !slices.Contains(tiers, t) {
				for _, v := range vecs {
					v.DeletePartialMatch(prometheus.Labels{"pool": pool, "tier": t})
				}
			}
		}
	}
	m.pool, m.tiers = pool, slices.Clone(tiers)
}

// levels is the scrape-time collector.
type levels struct{ m *Metrics }

func (l levels) Describe(ch chan<- *prometheus.Desc) {
	m := l.m
	for _, d := range []*prometheus.Desc{m.queueLength, m.queueBound, m.oldestAge, m.inflight, m.slots, m.utilisation, m.backendInflight, m.policyVersion, m.backendEjected, m.backendEjections, m.bodyBytes, m.bodyBudget, m.bytesPerToken, m.queueTokens, m.queueTokenBound, m.fairnessGap, m.fairnessGapBound} {
		ch <- d
	}
}

func (l levels) Collect(ch chan<- prometheus.Metric) {
	m := l.m
	s := m.snapshot()
	if s.Pool == "" {
		return
	}
	gauge := func(d *prometheus.Desc, v float64, lv ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, lv...)
	}
	for tier, t := range s.Tiers {
		gauge(m.queueLength, float64(t.Queued), s.Pool, tier)
		gauge(m.queueBound, float64(t.Bound), s.Pool, tier)
		gauge(m.oldestAge, t.OldestAge.Seconds(), s.Pool, tier)
		if t.TokenBound > 0 {
			gauge(m.queueTokens, float64(t.QueuedTokens), s.Pool, tier)
			gauge(m.queueTokenBound, float64(t.TokenBound), s.Pool, tier)
		}
		if t.Fair {
			gauge(m.fairnessGap, t.FairnessGap, s.Pool, tier)
			gauge(m.fairnessGapBound, t.FairnessGapBound, s.Pool, tier)
		}
	}
	gauge(m.inflight, float64(s.InFlight), s.Pool)
	gauge(m.slots, float64(s.Slots), s.Pool)
	util := 0.0
	if s.Slots > 0 {
		util = float64(s.InFlight) / float64(s.Slots)
	}
	gauge(m.utilisation, util, s.Pool)
	for addr, n := range s.Backends {
		gauge(m.backendInflight, float64(n), s.Pool, addr)
	}
	for addr, h := range s.BackendHealth {
		ejected := 0.0
		if h.Ejected {
			ejected = 1
		}
		gauge(m.backendEjected, ejected, s.Pool, addr)
		ch <- prometheus.MustNewConstMetric(m.backendEjections, prometheus.CounterValue, float64(h.Ejections), s.Pool, addr)
	}
	gauge(m.policyVersion, float64(s.PolicyVersion), s.Pool)
	gauge(m.bodyBytes, float64(s.BodyBytes), s.Pool)
	gauge(m.bodyBudget, float64(s.BodyBudget), s.Pool)
	if s.BytesPerToken > 0 {
		gauge(m.bytesPerToken, s.BytesPerToken, s.Pool)
	}
}
