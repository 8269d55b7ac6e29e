package queue

import (
	"math"
	"sync"
	"time"

	"k8s.io/utils/clock"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/dispatcher/queue/gate"
)

// Option configures a Queue.
type Option func(*config)

type config struct {
	gate gate.Gate
	sink func(tier, tenant string, delta float64)
	// spawn runs the fleet pump; tests replace it to drive the pump.
	spawn func(func())
}

// WithGate puts a fleet-wide Gate (fleet mode) in front of the local counts.
// Without it the queue is in local mode and uses its own counts only.
func WithGate(g gate.Gate) Option { return func(c *config) { c.gate = g } }

const (
	// drainWindow is the time constant of the per-tier drain-rate EWMA.
	drainWindow = 10 * time.Second
	// serviceWeight is the weight of a new sample in the service-time EWMA.
	serviceWeight = 0.1
	// freeMax bounds each free list of recycled job and tenant records.
	freeMax = 4096
)

type listedTenant struct {
	tier           string
	maxConcurrency int
	weight         int
}

// Queue is the ageing, bounded, tenant-capped queue of one dispatcher. All
// methods are safe for concurrent use; see the package doc for the
// concurrency model.
type Queue struct {
	cfg   config
	gate  gate.Gate
	clk   clock.WithDelayedExecution
	epoch time.Time

	mu          sync.Mutex
	pol         *policy.Policy
	policyMark  uint64
	slots       int
	rateNs      int64
	timeoutNs   int64
	serviceRate float64
	tokenRate   float64 // the policy's TokenServiceRate
	coldStart   float64 // the policy's ColdStartSeconds
	defaultTier string
	tiers       map[string]*tierState
	listed      map[string]listedTenant
	tenants     map[string]*tenant
	heap        []*tenant // Requests mode: the runnable tenants
	// Tokens mode (fair.go): tiers with a runnable tenant, by its oldest
	// head key; fairEpoch counts the switches of mode, so a Settle of an
	// older period corrects no counter.
	tokens     bool
	fair       policy.Fairness
	tiersByKey iheap[*tierState]
	fairEpoch  uint64
	moved      []*tenant
	rebuilding bool // UpdatePolicy, until it rebuilds the heaps
	seq         uint64
	inFlight    int
	queued      int
	draining    bool
	idle        []chan struct{}
	timer       clock.Timer
	timerArmed  bool
	fire        func() // the timer callback, made once
	freeJobs    []*job
	freeTenants []*tenant

	serviceTime    float64 // ns, EWMA of served jobs
	served         uint64  // its samples
	// tokens per slot second (settle.go): EWMAs of the served jobs'
	// settled weighted tokens and of their time in a slot (ns)
	tokEWMA, slotEWMA float64
	tokSamples        uint64
	completed      uint64  // released jobs, served or not
	doubleReleases uint64
	totals         Totals

	// offeredSince is when the first policy came: the start of the span
	// the offered-load rates are read over (offered.go).
	offeredSince int64

	fleet fleetState

	onDispatch func(*Handle) // set by tests only (export_test.go); called under mu
}

// New returns an empty queue that admits nothing until UpdatePolicy.
func New(clk clock.WithDelayedExecution, opts ...Option) *Queue {
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.spawn == nil {
		cfg.spawn = func(f func()) { go f() }
	}
	q := &Queue{
		cfg:     cfg,
		gate:    cfg.gate,
		clk:     clk,
		epoch:   clk.Now(),
		tiers:   map[string]*tierState{},
		listed:  map[string]listedTenant{},
		tenants: map[string]*tenant{},

		tiersByKey: newTiersByKey(),
		fair:       (&policy.Policy{}).FairnessOf(),
	}
	q.fire = func() { go q.onTimer() }
	q.fleet.pump = q.pumpLoop
	return q
}

func (q *Queue) now() int64 { return int64(q.clk.Since(q.epoch)) }

// unlock releases mu. In fleet mode it first starts the pump when an
// exchange with the Gate is due, so that every operation which frees a
// slot, queues work or ends a lease is followed by one.
func (q *Queue) unlock() {
	if q.gate == nil || q.fleet.pumping || !q.exchangeDue() {
		q.mu.Unlock()
		return
	}
	q.fleet.pumping = true
	q.mu.Unlock()
	q.cfg.spawn(q.fleet.pump)
}

const maxKey = math.MaxInt64 / 4

// secondsToNs converts policy seconds, saturating so keys never overflow.
func secondsToNs(s float64) int64 {
	if !(s > 0) {
		return 0
	}
	ns := s * 1e9
	if ns >= maxKey {
		return maxKey
	}
	return int64(math.Round(ns))
}

func (q *Queue) keyFor(tr *tierState, enq int64) int64 {
	b := int64(tr.base)
	if b > 0 && q.rateNs > maxKey/b {
		return maxKey + enq
	}
	return b*q.rateNs + enq
}

func (q *Queue) weightFor(id string) int {
	if lt, ok := q.listed[id]; ok && lt.weight > 0 {
		return lt.weight
	}
	return 1
}

func (q *Queue) limitFor(id string, tr *tierState) int {
	if lt, ok := q.listed[id]; ok && lt.maxConcurrency > 0 {
		return lt.maxConcurrency
	}
	return tr.conc
}
