package simulate

import (
	"math"
	"slices"
	"time"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

// Result is what a run measured, after warm-up. It is also the --json
// document; field names are a contract with outside scripts.
type Result struct {
	Pool string `json:"pool"`
	Seed uint64 `json:"seed"`
	// SimulatedSeconds is the whole run, warm-up included.
	SimulatedSeconds float64 `json:"simulatedSeconds"`
	WarmupSeconds    float64 `json:"warmupSeconds"`
	// MeasuredSeconds is the window every figure covers.
	MeasuredSeconds float64 `json:"measuredSeconds"`
	// Utilisation is time-averaged in-flight over time-averaged slots
	// (after a scale-down, busy slots above the new count are counted as
	// slots until they free).
	Utilisation float64 `json:"utilisation"`
	// Goodput is answers received per measured second: generations that
	// completed, in the window, before their client left.
	Goodput float64 `json:"goodput"`
	// WastedServiceSeconds is slot-seconds, in the window, spent on
	// generations whose client had already left or left before the answer
	// came.
	WastedServiceSeconds float64 `json:"wastedServiceSeconds"`
	// MeasuredTokenRate is the weighted tokens per slot-second the
	// queues measured over the answers served (each dispatcher's
	// tokensPerSlotSecond, weighted by what it served, as the controller
	// combines them into status.observedTokenRate); 0 when nothing was
	// measured, as with the baselines.
	MeasuredTokenRate float64 `json:"measuredTokenRate,omitempty"`
	// Policy is the pool-wide computation at the Load's initial replicas.
	Policy PolicySummary `json:"policy"`
	// PolicyChanges are the recomputations after replica changes.
	PolicyChanges []PolicyChange           `json:"policyChanges,omitempty"`
	Tiers         map[string]*TierResult   `json:"tiers"`
	Tenants       map[string]*TenantResult `json:"tenants"`
	Warnings      []string                 `json:"warnings"`
	// Compare holds the --compare baselines' results on the same traffic,
	// by scheduler name; each has this shape, without Compare.
	Compare map[string]*Result `json:"compare,omitempty"`

	// series is wait over time per tier, for --plot.
	series map[string]*series
	// order lists the tiers by base priority.
	order []string
	// compareOrder lists Compare's names as --compare gave them.
	compareOrder []string
	// busySlotSeconds is in-flight integrated over the window.
	busySlotSeconds float64
	// tokens: some tenant's requests cost tokens or have a budget; the
	// tables then show the tokens and rate_limited columns.
	tokens bool
}

// PolicySummary is the controller's computation for the pool.
type PolicySummary struct {
	Replicas             int32   `json:"replicas"`
	Slots                int     `json:"slots"`
	ServiceRate          float64 `json:"serviceRate"`
	ServiceTimeSeconds   float64 `json:"serviceTimeSeconds"`
	AgeingRateSeconds    float64 `json:"ageingRateSeconds"`
	AgeingHorizonSeconds float64 `json:"ageingHorizonSeconds"`
	// ClientTimeoutSeconds is 0 when unset.
	ClientTimeoutSeconds float64 `json:"clientTimeoutSeconds"`
	// HorizonExceedsClientTimeout is the controller's
	// AgeingHorizonExceedsClientTimeout condition.
	HorizonExceedsClientTimeout bool `json:"horizonExceedsClientTimeout"`
	// TokenRate is r, the weighted tokens per slot-second behind the
	// tiers' token bounds (status.tokenRate); 0 when they are bounded in
	// requests.
	TokenRate float64 `json:"tokenRate,omitempty"`
}

// PolicyChange is one recomputation of the bounds.
type PolicyChange struct {
	AtSeconds float64        `json:"atSeconds"`
	Replicas  int32          `json:"replicas"`
	Slots     int            `json:"slots"`
	Bounds    map[string]int `json:"bounds"`
	// MaxWait is each tier's stated maxWait under this policy, seconds, as
	// its ServiceTier status would say; a tier with no guarantee (the
	// pool has no replica and no cold start, or refuses it at zero) is
	// left out.
	MaxWait map[string]float64 `json:"maxWait,omitempty"`
	// ColdStartSeconds is set while the pool is at zero replicas and holds
	// requests for its first replica; RefusedAtZero are then the tiers
	// whose bound at zero is 0, refused at once (503 unavailable).
	ColdStartSeconds float64  `json:"coldStartSeconds,omitempty"`
	RefusedAtZero    []string `json:"refusedAtZero,omitempty"`
}

// Figures are the counts and waits of one tier or one tenant. Counts are of
// events inside the measured window: offered by arrival time, waits by
// dispatch time, served by completion time.
type Figures struct {
	// Offered counts new requests (first attempts).
	Offered int64 `json:"offered"`
	// OfferedRate is Offered per measured second.
	OfferedRate float64 `json:"offeredRate"`
	// Retries counts attempts after a 429.
	Retries  int64 `json:"retries"`
	Admitted int64 `json:"admitted"`
	// Served counts requests whose generation completed.
	Served int64 `json:"served"`
	// Expired counts requests the queue removed after clientTimeout.
	Expired int64 `json:"expired"`
	// Abandoned counts clients that gave up (their timeout), queued or in
	// flight.
	Abandoned int64 `json:"abandoned"`
	// AbandonedInFlight is the part of Abandoned that had been dispatched:
	// GPU time spent for nobody.
	AbandonedInFlight int64   `json:"abandonedInFlight"`
	Refused           Refused `json:"refused"`
	// Wait is enqueue to dispatch, in seconds, of dispatched requests.
	Wait WaitStats `json:"wait"`
	// Throughput is Served per measured second.
	Throughput float64 `json:"throughput"`
	// ThroughputShare is this entry's part of all Served.
	ThroughputShare float64 `json:"throughputShare"`
	// TokensServed are the tokens of the Served requests.
	TokensServed TokenCounts `json:"tokensServed"`

	waits []float64
}

// Refused counts refused attempts by cause.
type Refused struct {
	Capacity    int64 `json:"capacity"`
	TenantLimit int64 `json:"tenant_limit"`
	// Unavailable is 503: no ready replica (slots 0).
	Unavailable int64 `json:"unavailable"`
	// RateLimited is 429: the tenant's budgets do not hold the request.
	RateLimited int64 `json:"rate_limited"`
}

// Total is every refusal.
func (r Refused) Total() int64 { return r.Capacity + r.TenantLimit + r.Unavailable + r.RateLimited }

// TokenCounts are tokens by kind.
type TokenCounts struct {
	Prompt     int64 `json:"prompt"`
	Completion int64 `json:"completion"`
}

// Total is prompt and completion.
func (c TokenCounts) Total() int64 { return c.Prompt + c.Completion }

// WaitStats summarises waits in seconds (nearest-rank percentiles).
type WaitStats struct {
	Count int64   `json:"count"`
	Mean  float64 `json:"mean"`
	P50   float64 `json:"p50"`
	P95   float64 `json:"p95"`
	P99   float64 `json:"p99"`
	Max   float64 `json:"max"`
}

// TierResult is one tier's figures next to its stated guarantees.
type TierResult struct {
	Figures
	BasePriority     int32 `json:"basePriority"`
	Bound            int   `json:"bound"`
	TenantLimit      int   `json:"tenantLimit"`
	TenantQueueLimit int   `json:"tenantQueueLimit"`
	// MaxWait is the stated guarantee (docs/architecture.md#the-queue), seconds.
	MaxWait float64 `json:"maxWait"`
	// MaxQueued is the longest the tier's queue was.
	MaxQueued int `json:"maxQueued"`
	// UnderLimits are the waits of requests whose tenant stayed under its
	// own concurrency limit from admission to dispatch: the requests the
	// guarantee is about.
	UnderLimits UnderLimits `json:"underLimits"`
	// Queue holds the Little's-law figures.
	Queue QueueFigures `json:"queue"`
	// HeldAtZero is what the tier's queue held while the pool was at zero
	// replicas holding for a cold start; absent when it never was.
	HeldAtZero *HeldFigures `json:"heldAtZero,omitempty"`
	// SLOAttainment is the share of the requests offered in the window
	// whose client received the answer and whose generation started within
	// tolerableWait of their first attempt.
	SLOAttainment float64 `json:"sloAttainment"`
	// Jain is Jain's fairness index over the throughput of the tier's Load
	// tenants (0 when none was served).
	Jain float64 `json:"jain"`
	// JainTokens is Jain's index over the tier's Load tenants' weighted
	// tokens served (prompt × inputWeight + completion × outputWeight)
	// divided by their weights: 1 when each got tokens in proportion to
	// its weight (0 when no token was served).
	JainTokens float64 `json:"jainTokens"`
	// QueueTokenBound and TenantQueueTokenLimit are the tier's bounds in
	// weighted tokens, pool-wide, when the scheduler bounds by tokens
	// (vtc-tokenbound); MaxQueuedTokens is the most weighted tokens its
	// queue held, reserved cost (prompt and maximum output).
	QueueTokenBound       int64 `json:"queueTokenBound,omitempty"`
	TenantQueueTokenLimit int64 `json:"tenantQueueTokenLimit,omitempty"`
	MaxQueuedTokens       int64 `json:"maxQueuedTokens,omitempty"`

	// tolerableWait is the tier's W, the bound of SLOAttainment.
	tolerableWait time.Duration
}

// HeldFigures count, in the window, the requests of one tier admitted
// while the pool was at zero replicas (held for its first replica) and
// those refused then because the tier cannot wait out the cold start.
// Their waits are held to the stated maxWait at zero, not to the
// UnderLimits guarantee of the Load's replicas.
type HeldFigures struct {
	Held       int64 `json:"held"`
	Dispatched int64 `json:"dispatched"`
	Expired    int64 `json:"expired"`
	Abandoned  int64 `json:"abandoned"`
	// RefusedAtZero counts 503s of a tier whose bound at zero is 0.
	RefusedAtZero int64 `json:"refusedAtZero"`
	// MaxWait is the longest wait of a held request that was dispatched,
	// StatedMaxWait the tier's maxWait at zero (0 when it is refused at
	// zero), seconds.
	MaxWait       float64 `json:"maxWait"`
	StatedMaxWait float64 `json:"statedMaxWait"`
	WithinMaxWait bool    `json:"withinMaxWait"`
}

// UnderLimits is the observed side of the guarantee.
type UnderLimits struct {
	Count   int64   `json:"count"`
	MaxWait float64 `json:"maxWait"`
	// WithinMaxWait is true when MaxWait <= the tier's stated maxWait.
	WithinMaxWait bool `json:"withinMaxWait"`
}

// QueueFigures are the Little's-law figures of one tier: MeanLength should
// equal AdmissionRate × MeanTimeInQueue.
type QueueFigures struct {
	// MeanLength is the time-weighted mean number of queued requests.
	MeanLength float64 `json:"meanLength"`
	// AdmissionRate is admitted requests per measured second.
	AdmissionRate float64 `json:"admissionRate"`
	// MeanTimeInQueue is over every request that left the queue (dispatched,
	// expired or abandoned), seconds.
	MeanTimeInQueue float64 `json:"meanTimeInQueue"`
}

// TenantResult is one tenant's figures.
type TenantResult struct {
	Figures
	Tier string `json:"tier"`
	// TenantLimit is the tenant's in-flight cap.
	TenantLimit int `json:"tenantLimit"`
	// QueueLimit is how many it may have queued.
	QueueLimit int `json:"queueLimit"`
	// Budget is the tenant's budgets in force, pool-wide; absent when it
	// has none (and under a baseline, which has no budgets).
	Budget *policy.Limits `json:"budget,omitempty"`
	// TokenShare is the tenant's part of its tier's weighted tokens
	// served (0 when the tier served none).
	TokenShare float64 `json:"tokenShare"`
}

// series is wait over time of one tier in fixed buckets of the whole run.
type series struct {
	width      float64 // seconds
	sum, max   []float64
	count      []int64
	expired    []int64
	maxWaitSec float64
}

func newSeries(buckets int, width float64) *series {
	return &series{width: width, sum: make([]float64, buckets), max: make([]float64, buckets),
		count: make([]int64, buckets), expired: make([]int64, buckets)}
}

func (s *series) bucket(at float64) int {
	i := int(at / s.width)
	return min(max(i, 0), len(s.sum)-1)
}

// runs lists the buckets with dispatches, grouped into consecutive runs.
func (s *series) runs() [][]int {
	var out [][]int
	var cur []int
	for b, n := range s.count {
		if n == 0 {
			if len(cur) > 0 {
				out = append(out, cur)
				cur = nil
			}
			continue
		}
		cur = append(cur, b)
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

func (s *series) add(at, wait float64) {
	i := s.bucket(at)
	s.sum[i] += wait
	s.count[i]++
	s.max[i] = max(s.max[i], wait)
}

// finish turns the raw waits into WaitStats and rates.
func (f *Figures) finish(window float64) {
	f.OfferedRate = round6(float64(f.Offered) / window)
	f.Throughput = round6(float64(f.Served) / window)
	f.Wait = summarise(f.waits)
}

func summarise(w []float64) WaitStats {
	if len(w) == 0 {
		return WaitStats{}
	}
	slices.Sort(w)
	var sum float64
	for _, v := range w {
		sum += v
	}
	rank := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(w)))) - 1
		return round6(w[min(max(i, 0), len(w)-1)])
	}
	return WaitStats{
		Count: int64(len(w)),
		Mean:  round6(sum / float64(len(w))),
		P50:   rank(0.50),
		P95:   rank(0.95),
		P99:   rank(0.99),
		Max:   round6(w[len(w)-1]),
	}
}

// round6 keeps JSON output short and stable: microsecond resolution.
func round6(v float64) float64 { return math.Round(v*1e6) / 1e6 }
