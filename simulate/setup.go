package simulate

import (
	"fmt"

	clocktesting "k8s.io/utils/clock/testing"
)

func newEngine(in *Input, opts Options) *engine {
	e := &engine{
		in:       in,
		load:     &in.Load.Spec,
		opts:     opts,
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
// tenants and the scheduler, pushes the first policy and schedules the
// first events.
func (e *engine) setup() error {
	first, err := e.computeBounds(e.load.Replicas)
	if err != nil {
		return err
	}
	e.first = first
	e.sampler = loadSampler(e.load.ServiceTime, first.Pool.ServiceTime)
	e.res = e.newResult()
	e.addTiers()
	if err := e.addTenants(); err != nil {
		return err
	}
	e.sched = newQueueScheduler(e.clk)
	if err := e.applyPolicy(first, e.load.Replicas); err != nil {
		return err
	}
	for _, ts := range e.tenants {
		ts.res.TenantLimit = ts.limit
		ts.res.QueueLimit = ts.queueLimit
	}
	e.push(event{at: e.duration, kind: evEnd})
	for i, c := range e.load.ReplicaChanges {
		e.push(event{at: c.At.Duration, kind: evReplicas, n: int32(i)})
	}
	e.startClients()
	return nil
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
			BasePriority:     tb.BasePriority,
			Bound:            int(tb.QueueBound),
			TenantLimit:      int(tb.TenantConcurrencyLimit),
			TenantQueueLimit: int(tb.TenantQueueLimit),
			MaxWait:          round6(tb.MaxWait.Seconds()),
		}
		ts := &tierState{name: tb.Name, res: tr, ser: newSeries(e.opts.PlotBuckets, width)}
		ts.ser.maxWaitSec = tr.MaxWait
		e.tiers[tb.Name] = ts
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
		e.tenants = append(e.tenants, ts)
		e.res.Tenants[tl.Tenant] = tr
	}
	return nil
}
