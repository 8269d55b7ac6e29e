package simulate

import (
	"fmt"

	clocktesting "k8s.io/utils/clock/testing"
)

func newEngine(in *Input, opts Options, kind *schedKind) *engine {
	e := &engine{
		in:       in,
		load:     &in.Load.Spec,
		opts:     opts,
		kind:     kind,
		seed:     in.Load.Spec.Seed,
		clk:      clocktesting.NewFakeClock(epoch),
		warmup:   in.Load.Spec.Warmup.Duration,
		duration: in.Load.Spec.Duration.Duration,
		tiers:    map[string]*tierState{},
	}
	if opts.Seed != nil {
		e.seed = *opts.Seed
	}
	return e
}

// setup computes the bounds at the Load's replicas, builds the tiers, the
// tenants and the dispatchers, pushes the first policies and schedules the
// first events.
func (e *engine) setup() error {
	n := e.fleetSize()
	first, err := e.computeBounds(e.load.Replicas, n)
	if err != nil {
		return err
	}
	e.first = first
	e.sampler = loadSampler(e.load.ServiceTime, first.Pool.ServiceTime)
	e.rates = poolTokenRates(&e.in.Pool.Spec)
	e.res = e.newResult()
	e.env = e.newEnv()
	e.addTiers()
	if err := e.addTenants(); err != nil {
		return err
	}
	e.addDispatchers(n)
	if err := e.applyPolicy(first, e.load.Replicas); err != nil {
		return err
	}
	e.stateLimits()
	if err := e.checkCosts(); err != nil {
		return err
	}
	e.push(event{at: e.duration, kind: evEnd})
	for i, c := range e.load.ReplicaChanges {
		e.push(event{at: c.At.Duration, kind: evReplicas, n: int32(i)})
	}
	e.startClients()
	return nil
}

// newEnv is what the schedulers know of the pool beyond their policy.
func (e *engine) newEnv() *schedEnv {
	env := &schedEnv{clk: e.clk, index: map[string]int{}, serviceTime: e.first.Pool.ServiceTime, ageing: e.first.Pool.AgeingRate}
	share := map[string]float64{}
	for _, t := range e.in.Tiers {
		share[t.Name] = t.Spec.TenantShare.AsApproximateFloat64()
	}
	for i, tb := range e.first.Tiers {
		env.tiers = append(env.tiers, tierSpec{name: tb.Name, base: int(tb.BasePriority), wait: tb.TolerableWait, share: share[tb.Name]})
		env.index[tb.Name] = i
	}
	return env
}

// stateLimits puts what the scheduler enforces pool-wide at the Load's
// replicas next to the figures.
func (e *engine) stateLimits() {
	for name, tr := range e.res.Tiers {
		tl := e.stated.tiers[name]
		tr.Bound, tr.TenantLimit, tr.TenantQueueLimit = tl.bound, tl.tenantLimit, tl.tenantQueueLimit
		tr.QueueTokenBound, tr.TenantQueueTokenLimit = tl.tokenBound, tl.tenantTokenLimit
	}
	for _, ts := range e.tenants {
		ts.res.TenantLimit = e.stated.capOf(ts.name, ts.tier.name)
		ts.res.QueueLimit = e.stated.tiers[ts.tier.name].tenantQueueLimit
		if b := e.stated.budgetOf(ts.name, ts.tier.name); !b.IsZero() {
			ts.res.Budget = &b
			e.res.tokens = true
		}
		if ts.promptTokens != nil || ts.outputTokens != nil {
			e.res.tokens = true
		}
	}
}

// newResult is the Result before any figure: the pool's computation at the
// Load's replicas.
func (e *engine) newResult() *Result {
	pool := e.first.Pool
	return &Result{
		Pool:             e.in.Pool.Namespace + "/" + e.in.Pool.Name,
		Seed:             e.seed,
		SimulatedSeconds: round6(e.duration.Seconds()),
		WarmupSeconds:    round6(e.warmup.Seconds()),
		MeasuredSeconds:  round6((e.duration - e.warmup).Seconds()),
		Policy: PolicySummary{
			Replicas:                    e.load.Replicas,
			Slots:                       int(pool.Concurrency),
			ServiceRate:                 round6(pool.ServiceRate),
			ServiceTimeSeconds:          round6(pool.ServiceTime.Seconds()),
			AgeingRateSeconds:           round6(pool.AgeingRate.Seconds()),
			AgeingHorizonSeconds:        round6(pool.AgeingHorizon.Seconds()),
			ClientTimeoutSeconds:        round6(pool.ClientTimeout.Seconds()),
			HorizonExceedsClientTimeout: pool.HorizonExceedsClientTimeout,
			TokenRate:                   round6(pool.TokenRate),
		},
		Tiers:    map[string]*TierResult{},
		Tenants:  map[string]*TenantResult{},
		Warnings: append([]string{}, e.in.Warnings...),
		series:   map[string]*series{},
	}
}

// addTiers makes one tierState per computed tier, with its stated
// guarantees, in base-priority order.
func (e *engine) addTiers() {
	width := e.duration.Seconds() / float64(e.opts.PlotBuckets)
	for _, tb := range e.first.Tiers {
		tr := &TierResult{
			BasePriority:  tb.BasePriority,
			MaxWait:       round6(tb.MaxWait.Seconds()),
			tolerableWait: tb.TolerableWait,
		}
		ts := &tierState{name: tb.Name, wait: tb.TolerableWait, res: tr, ser: newSeries(e.opts.PlotBuckets, width)}
		ts.ser.maxWaitSec = tr.MaxWait
		e.tiers[tb.Name] = ts
		e.tierList = append(e.tierList, ts)
		e.res.Tiers[tb.Name] = tr
		e.res.series[tb.Name] = ts.ser
		e.res.order = append(e.res.order, tb.Name)
	}
}

// addTenants puts every Load tenant in the tier of its TenantQuota, or the
// pool's defaultTier.
func (e *engine) addTenants() error {
	pol := e.first.PolicyFor(0)
	tierOf := map[string]string{}
	for _, t := range pol.Tenants {
		tierOf[t.ID] = t.Tier
	}
	for i := range e.load.Tenants {
		tl := &e.load.Tenants[i]
		tier, ok := tierOf[tl.Tenant]
		if !ok {
			tier = pol.DefaultTier
		}
		if tier == "" {
			return fmt.Errorf("%w: Load spec.tenants[%d]: tenant %q has no TenantQuota in pool %s and the pool has no defaultTier, so every request would be refused", ErrInvalid, i, tl.Tenant, e.res.Pool)
		}
		tr := &TenantResult{Tier: tier}
		ts := &tenantState{
			cfg: tl, name: tl.Tenant, tier: e.tiers[tier], rng: newRand(e.seed, tl.Tenant),
			maxRetries: tl.maxRetries(), res: tr,
		}
		ts.svc = ts.rng
		e.addCosts(ts, pol.MaxTokens())
		if tl.Arrival.Process == ProcClosed {
			// Its think times are drawn as its answers come, which depends
			// on the scheduler: its service times get a stream of their
			// own, so its k-th request needs the same under any scheduler.
			ts.svc = newServiceRand(e.seed, tl.Tenant)
		}
		e.tenants = append(e.tenants, ts)
		e.res.Tenants[tl.Tenant] = tr
	}
	return nil
}

// addCosts gives ts its token distributions, their own random stream, and
// the output each request reserves: maxTokens, else the pool's
// defaultMaxTokens (a request that names no maximum).
func (e *engine) addCosts(ts *tenantState, defaultMax int) {
	tl := ts.cfg
	ts.promptTokens, ts.outputTokens = tokenSampler(tl.PromptTokens), tokenSampler(tl.OutputTokens)
	if ts.promptTokens == nil && ts.outputTokens == nil {
		return
	}
	ts.tok = newTokenRand(e.seed, tl.Tenant)
	if ts.outputTokens != nil {
		ts.maxOut = int64(defaultMax)
		if tl.MaxTokens != nil {
			ts.maxOut = *tl.MaxTokens
		}
	}
}
