package simulate

import (
	"cmp"
	"container/heap"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/go-logr/logr"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/tiergate/tiergate/capacity"
	"github.com/tiergate/tiergate/dispatcher/policy"
	"github.com/tiergate/tiergate/dispatcher/queue"
)

// ErrInternal reports a simulator or queue inconsistency; it is a bug.
var ErrInternal = errors.New("simulate: internal error")

// Options tune a run. The zero value is valid.
type Options struct {
	// Seed, when set, replaces the Load's seed (--seed).
	Seed *uint64
	// Log receives progress at V(1).
	Log logr.Logger
	// PlotBuckets is the number of time buckets of the wait-over-time
	// series (default 120).
	PlotBuckets int

	// checkInvariants compares the simulator's own counts with the queue's
	// Stats after every event and checks the queue's invariants (tests).
	checkInvariants bool
}

func (o *Options) defaults() {
	if o.PlotBuckets == 0 {
		o.PlotBuckets = 120
	}
}

func (o *Options) validate() error {
	if o.PlotBuckets < 1 {
		return fmt.Errorf("%w: PlotBuckets must be at least 1, got %d", ErrInvalid, o.PlotBuckets)
	}
	return nil
}

// epoch is the fake clock's start; any fixed instant keeps runs identical.
var epoch = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// bridgeTimeout guards against a queue that does not resolve a Wait it
// counted; it is real time and never reached in a healthy run.
const bridgeTimeout = 10 * time.Second

type eventKind uint8

const (
	evEnd eventKind = iota
	evArrive
	evClosed
	evRetry
	evTimeout
	evComplete
	evReplicas
)

type event struct {
	at      time.Duration
	seq     uint64
	kind    eventKind
	attempt int32
	n       int32
	req     *request
	ten     *tenantState
}

type eventHeap []event

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(event)) }
func (h *eventHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

type reqState uint8

const (
	stNew reqState = iota
	stQueued
	stInFlight
	stDone
)

type request struct {
	id      uint64
	ten     *tenantState
	service time.Duration
	attempt int32
	retries int
	state   reqState
	admitAt time.Duration
	h       *queue.Handle
	cancel  context.CancelFunc
	// underLimits: the tenant was under its concurrency limit when the
	// request was admitted; capMark is its capHits then.
	underLimits bool
	capMark     uint64
}

type waitResult struct {
	req *request
	err error
}

type tierState struct {
	name       string
	queued     int
	area       float64 // ∫ queued dt over the window, request-seconds
	sojournSum float64
	sojournN   int64
	underMax   time.Duration
	res        *TierResult
	ser        *series
}

type tenantState struct {
	cfg        *TenantLoad
	name       string
	tier       *tierState
	rng        *rand.Rand
	limit      int
	queueLimit int
	inflight   int
	// capHits counts the times the tenant reached its limit.
	capHits    uint64
	maxRetries int
	burstStart time.Duration
	res        *TenantResult
}

type engine struct {
	in       *Input
	load     *LoadSpec
	opts     Options
	seed     uint64
	clk      *clocktesting.FakeClock
	q        *queue.Queue
	now      time.Duration
	warmup   time.Duration
	duration time.Duration
	events   eventHeap
	seq      uint64
	nextID   uint64
	sampler  sampler

	tiers    map[string]*tierState
	tenants  []*tenantState
	bounds   capacity.Bounds // in force
	first    capacity.Bounds // at the Load's replicas
	version  int64
	slots    int
	inflight int

	lastT        time.Duration
	inflightArea float64
	slotsArea    float64

	admitted uint64 // successful Admits over the whole run
	results  chan waitResult
	got      []waitResult
	guard    *time.Timer
	resolved uint64
	queued   map[*request]struct{}

	res *Result
	err error
}

// Run simulates in and returns what it measured. It is single-threaded and
// deterministic: the same input and seed give the same Result.
func Run(in *Input, opts Options) (*Result, error) {
	opts.defaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if in == nil || in.Pool == nil || in.Load == nil {
		return nil, fmt.Errorf("%w: input needs a ModelPool and a Load", ErrInvalid)
	}
	e := &engine{
		in:       in,
		load:     &in.Load.Spec,
		opts:     opts,
		seed:     in.Load.Spec.Seed,
		clk:      clocktesting.NewFakeClock(epoch),
		warmup:   in.Load.Spec.Warmup.Duration,
		duration: in.Load.Spec.Duration.Duration,
		tiers:    map[string]*tierState{},
		results:  make(chan waitResult, 256),
		queued:   map[*request]struct{}{},
	}
	if opts.Seed != nil {
		e.seed = *opts.Seed
	}
	if err := e.setup(); err != nil {
		return nil, err
	}
	log := opts.Log.WithValues("pool", e.res.Pool, "seed", e.seed)
	log.V(1).Info("simulating", "duration", e.duration, "warmup", e.warmup, "tenants", len(e.tenants), "slots", e.slots)
	e.loop()
	if e.opts.checkInvariants && e.err == nil {
		e.checkTotals()
	}
	e.cleanup()
	log.V(1).Info("simulated", "events", e.seq, "requests", e.nextID, "policyChanges", len(e.res.PolicyChanges))
	if e.err != nil {
		return nil, e.err
	}
	return e.finish(), nil
}

func (e *engine) setup() error {
	first, err := e.computeBounds(e.load.Replicas)
	if err != nil {
		return err
	}
	e.first = first
	pool := first.Pool

	st := e.load.ServiceTime
	dist, mean, stddev := DistExponential, pool.ServiceTime, time.Duration(0)
	if st != nil {
		dist = st.Distribution
		mean = durOr(st.Mean, pool.ServiceTime)
		stddev = durOr(st.Stddev, 0)
	}
	e.sampler = newSampler(dist, mean, stddev)

	ns := e.in.Pool.Namespace + "/" + e.in.Pool.Name
	e.res = &Result{
		Pool:             ns,
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
	width := e.duration.Seconds() / float64(e.opts.PlotBuckets)
	for _, tb := range first.Tiers {
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

	pol := first.PolicyFor(0)
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
			return fmt.Errorf("%w: Load spec.tenants[%d]: tenant %q has no TenantQuota in pool %s and the pool has no defaultTier, so every request would be refused", ErrInvalid, i, tl.Tenant, ns)
		}
		tr := &TenantResult{Tier: tier}
		ts := &tenantState{
			cfg: tl, name: tl.Tenant, tier: e.tiers[tier], rng: newRand(e.seed, tl.Tenant),
			maxRetries: tl.maxRetries(), res: tr,
		}
		e.tenants = append(e.tenants, ts)
		e.res.Tenants[tl.Tenant] = tr
	}

	e.q = queue.New(e.clk)
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
	for _, ts := range e.tenants {
		a := &ts.cfg.Arrival
		switch a.Process {
		case ProcPoisson:
			e.push(event{at: expGap(ts.rng, secs(1/a.Rate)), kind: evArrive, ten: ts})
		case ProcConstant:
			e.push(event{at: secs(ts.rng.Float64() / a.Rate), kind: evArrive, ten: ts})
		case ProcClosed:
			for range a.Clients {
				e.push(event{at: e.think(ts), kind: evClosed, ten: ts})
			}
		case ProcBurst:
			ts.burstStart = a.At.Duration
			e.push(event{at: ts.burstStart, kind: evArrive, ten: ts})
		}
	}
	return nil
}

// computeBounds runs the controller's computation for one dispatcher in
// Local mode.
func (e *engine) computeBounds(replicas int32) (capacity.Bounds, error) {
	backends := make([]policy.Backend, replicas)
	port := e.in.Pool.Spec.Backend.Port
	if port == 0 {
		port = 8000
	}
	for i := range backends {
		backends[i] = policy.Backend{Address: fmt.Sprintf("10.%d.%d.%d:%d", (i>>16)&255, (i>>8)&255, i&255, port), Scheme: e.in.Pool.Spec.Backend.Scheme}
	}
	b, err := capacity.ComputeBounds(capacity.BoundsInput{
		Pool:          e.in.Pool,
		ReadyReplicas: replicas,
		Tiers:         e.in.Tiers,
		Quotas:        e.in.Quotas,
		Dispatchers:   1,
		Backends:      backends,
	})
	if err != nil {
		return b, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if len(b.Tiers) == 0 {
		return b, fmt.Errorf("%w: pool %s/%s has no ServiceTier", ErrInvalid, e.in.Pool.Namespace, e.in.Pool.Name)
	}
	return b, nil
}

// applyPolicy pushes b's policy to the queue, as the controller would.
func (e *engine) applyPolicy(b capacity.Bounds, replicas int32) error {
	pol := b.PolicyFor(0)
	e.version++
	pol.Version = e.version
	if err := pol.Validate(); err != nil {
		return fmt.Errorf("%w: the computed policy is invalid: %w", ErrInternal, err)
	}
	e.q.UpdatePolicy(&pol)
	e.bounds = b
	e.slots = pol.Slots

	tiers := map[string]policy.Tier{}
	for _, t := range pol.Tiers {
		tiers[t.Name] = t
	}
	override := map[string]int{}
	for _, t := range pol.Tenants {
		override[t.ID] = t.MaxConcurrency
	}
	for _, ts := range e.tenants {
		t := tiers[ts.tier.name]
		ts.limit = t.TenantConcurrencyLimit
		if o := override[ts.name]; o > 0 {
			ts.limit = o
		}
		ts.queueLimit = t.TenantQueueLimit
		if ts.inflight >= ts.limit {
			ts.capHits++
		}
	}
	if e.version > 1 {
		pc := PolicyChange{AtSeconds: round6(e.now.Seconds()), Replicas: replicas, Slots: pol.Slots, Bounds: map[string]int{}}
		for _, t := range pol.Tiers {
			pc.Bounds[t.Name] = t.QueueBound
		}
		e.res.PolicyChanges = append(e.res.PolicyChanges, pc)
	}
	return nil
}

func (e *engine) push(ev event) {
	ev.seq = e.seq
	e.seq++
	heap.Push(&e.events, ev)
}

func (e *engine) fail(err error) {
	if e.err == nil {
		e.err = err
	}
}

func (e *engine) inWindow() bool { return e.now >= e.warmup }

func (e *engine) loop() {
	for e.events.Len() > 0 && e.err == nil {
		// Queued requests expire at exactly their deadline, before any
		// other event of the same instant: step there and expire
		// synchronously (the queue's own timer would do it on a goroutine).
		if dl, ok := e.q.NextDeadline(); ok && dl.Sub(epoch) <= e.events[0].at {
			e.advance(max(dl.Sub(epoch), e.now))
			e.q.ExpireDue()
			e.settle()
			continue
		}
		ev := heap.Pop(&e.events).(event)
		e.advance(ev.at)
		switch ev.kind {
		case evEnd:
			return
		case evArrive:
			e.arrive(ev)
		case evClosed:
			e.newRequest(ev.ten)
		case evRetry:
			e.attempt(ev.req)
		case evTimeout:
			if ev.attempt == ev.req.attempt {
				e.giveUp(ev.req)
			}
		case evComplete:
			if ev.attempt == ev.req.attempt && ev.req.state == stInFlight {
				e.complete(ev.req)
			}
		case evReplicas:
			r := e.load.ReplicaChanges[ev.n].Replicas
			b, err := e.computeBounds(r)
			if err != nil {
				e.fail(err)
				return
			}
			if err := e.applyPolicy(b, r); err != nil {
				e.fail(err)
				return
			}
			e.settle()
		}
		if e.opts.checkInvariants {
			e.check()
		}
	}
}

// advance moves simulated time to t: it integrates the time-weighted
// figures over the part of [lastT, t] inside the window and moves the fake
// clock.
func (e *engine) advance(t time.Duration) {
	if t < e.now {
		e.fail(fmt.Errorf("%w: time went backwards: %s < %s", ErrInternal, t, e.now))
		return
	}
	from := max(e.lastT, e.warmup)
	if t > from {
		dt := (t - from).Seconds()
		e.inflightArea += float64(e.inflight) * dt
		// After a scale-down, slots still busy count as capacity until
		// they free.
		e.slotsArea += float64(max(e.slots, e.inflight)) * dt
		for _, ts := range e.tiers {
			ts.area += float64(ts.queued) * dt
		}
	}
	e.lastT = t
	if t != e.now {
		e.now = t
		e.clk.SetTime(epoch.Add(t))
	}
}

func (e *engine) arrive(ev event) {
	ts := ev.ten
	a := &ts.cfg.Arrival
	e.newRequest(ts)
	var next time.Duration
	n := int32(0)
	switch a.Process {
	case ProcPoisson:
		next = e.now + expGap(ts.rng, secs(1/a.Rate))
	case ProcConstant:
		next = e.now + secs(1/a.Rate)
	case ProcBurst:
		spread := durOr(a.Spread, 0)
		if n = ev.n + 1; n < a.Count {
			next = ts.burstStart + time.Duration(int64(spread)*int64(n)/int64(a.Count))
		} else if every := durOr(a.Every, 0); every > 0 {
			ts.burstStart += every
			next, n = ts.burstStart, 0
		} else {
			return
		}
	}
	if next < e.duration {
		e.push(event{at: next, kind: evArrive, ten: ts, n: n})
	}
}

func (e *engine) think(ts *tenantState) time.Duration {
	return e.now + expGap(ts.rng, durOr(ts.cfg.Arrival.Think, 0))
}

func (e *engine) newRequest(ts *tenantState) {
	e.nextID++
	r := &request{id: e.nextID, ten: ts, service: e.sampler.draw(ts.rng)}
	if e.inWindow() {
		ts.res.Offered++
		ts.tier.res.Offered++
	}
	e.attempt(r)
}

// attempt sends the request (again) to the queue.
func (e *engine) attempt(r *request) {
	ts, tier := r.ten, r.ten.tier
	r.attempt++
	win := e.inWindow()
	if win && r.retries > 0 {
		ts.res.Retries++
		tier.res.Retries++
	}
	h, err := e.q.Admit(ts.name, tier.name)
	if err != nil {
		var ref *queue.Refusal
		backoff := unavailableBackoff
		switch {
		case errors.As(err, &ref):
			if win {
				if ref.CauseLabel() == queue.CauseTenantLimit {
					ts.res.Refused.TenantLimit++
					tier.res.Refused.TenantLimit++
				} else {
					ts.res.Refused.Capacity++
					tier.res.Refused.Capacity++
				}
			}
			if r.retries < ts.maxRetries {
				r.retries++
				e.push(event{at: e.now + ref.RetryAfter, kind: evRetry, req: r})
				return
			}
			backoff = ref.RetryAfter
		case errors.Is(err, queue.ErrNoCapacity):
			if win {
				ts.res.Refused.Unavailable++
				tier.res.Refused.Unavailable++
			}
		default:
			e.fail(fmt.Errorf("%w: admit tenant %q tier %q: %w", ErrInternal, ts.name, tier.name, err))
			return
		}
		e.finalOutcome(r, backoff)
		return
	}
	if win {
		ts.res.Admitted++
		tier.res.Admitted++
	}
	e.admitted++
	r.state, r.h, r.admitAt = stQueued, h, e.now
	r.underLimits, r.capMark = ts.inflight < ts.limit, ts.capHits
	tier.queued++
	tier.res.MaxQueued = max(tier.res.MaxQueued, tier.queued)
	e.queued[r] = struct{}{}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { e.results <- waitResult{req: r, err: h.Wait(ctx)} }()
	if to := ts.cfg.Timeout.Duration; to > 0 {
		e.push(event{at: e.now + to, kind: evTimeout, req: r, attempt: r.attempt})
	}
	e.settle()
}

// settle collects every Wait the last queue operation resolved. The queue
// dispatches and expires synchronously inside Admit, Release,
// UpdatePolicy and its timers; its Stats count them, and each resolved Wait
// reports on e.results. Results are handled in request order so that the
// run does not depend on goroutine scheduling.
func (e *engine) settle() {
	tot := e.q.Stats().Totals
	total := tot.Dispatched + tot.Expired + tot.Drained
	n := int(total - e.resolved)
	if n <= 0 {
		return
	}
	e.resolved = total
	got := e.got[:0]
	for len(got) < n {
		r, ok := e.receive()
		if !ok {
			e.fail(fmt.Errorf("%w: the queue counted %d resolved waits but only %d returned", ErrInternal, n, len(got)))
			return
		}
		got = append(got, r)
	}
	slices.SortFunc(got, func(a, b waitResult) int { return cmp.Compare(a.req.id, b.req.id) })
	for _, r := range got {
		e.resolve(r.req, r.err)
	}
	clear(got)
	e.got = got
}

// receive takes the next Wait outcome; false after bridgeTimeout of real
// time without one.
func (e *engine) receive() (waitResult, bool) {
	select {
	case r := <-e.results:
		return r, true
	default:
	}
	if e.guard == nil {
		e.guard = time.NewTimer(bridgeTimeout)
	} else {
		e.guard.Reset(bridgeTimeout)
	}
	defer e.guard.Stop()
	select {
	case r := <-e.results:
		return r, true
	case <-e.guard.C:
		return waitResult{}, false
	}
}

func (e *engine) leaveQueue(r *request) {
	tier := r.ten.tier
	tier.queued--
	delete(e.queued, r)
	if e.inWindow() {
		tier.sojournSum += (e.now - r.admitAt).Seconds()
		tier.sojournN++
	}
}

func (e *engine) resolve(r *request, err error) {
	if r.state != stQueued {
		e.fail(fmt.Errorf("%w: request %d resolved twice (%v)", ErrInternal, r.id, err))
		return
	}
	ts, tier := r.ten, r.ten.tier
	e.leaveQueue(r)
	switch {
	case err == nil:
		waited := r.h.Waited()
		if e.opts.checkInvariants && waited != e.now-r.admitAt {
			e.fail(fmt.Errorf("%w: request %d: Waited %s but the simulation saw %s", ErrInternal, r.id, waited, e.now-r.admitAt))
		}
		if e.inWindow() {
			w := waited.Seconds()
			ts.res.waits = append(ts.res.waits, w)
			tier.res.waits = append(tier.res.waits, w)
			if r.underLimits && ts.capHits == r.capMark {
				tier.res.UnderLimits.Count++
				tier.underMax = max(tier.underMax, waited)
			}
		}
		tier.ser.add(e.now.Seconds(), waited.Seconds())
		// After the pool shrinks, in-flight may exceed the slots, but no
		// dispatch may happen until it is back under them.
		if e.opts.checkInvariants && (e.inflight >= e.slots || ts.inflight >= ts.limit) {
			e.fail(fmt.Errorf("%w: at %s request %d of %s dispatched with %d/%d in flight, tenant %d/%d", ErrInternal, e.now, r.id, ts.name, e.inflight, e.slots, ts.inflight, ts.limit))
		}
		ts.inflight++
		if ts.inflight >= ts.limit {
			ts.capHits++
		}
		e.inflight++
		r.state = stInFlight
		e.push(event{at: e.now + r.service, kind: evComplete, req: r, attempt: r.attempt})
	case errors.Is(err, queue.ErrExpired):
		if e.inWindow() {
			ts.res.Expired++
			tier.res.Expired++
		}
		tier.ser.expired[tier.ser.bucket(e.now.Seconds())]++
		e.finalOutcome(r, 0)
	case errors.Is(err, context.Canceled):
		if e.inWindow() {
			ts.res.Abandoned++
			tier.res.Abandoned++
		}
		e.finalOutcome(r, 0)
	default:
		e.fail(fmt.Errorf("%w: request %d: Wait: %w", ErrInternal, r.id, err))
	}
}

// giveUp is the client's own timeout: a queued request is withdrawn (the
// dispatcher sees the disconnect), an in-flight one is cancelled upstream
// and its slot freed.
func (e *engine) giveUp(r *request) {
	switch r.state {
	case stQueued:
		r.cancel()
		if res, ok := e.receive(); ok {
			if res.req != r {
				e.fail(fmt.Errorf("%w: cancelling request %d resolved request %d", ErrInternal, r.id, res.req.id))
				return
			}
			if res.err == nil {
				// Dispatch won the race; count it and drop it below.
				e.resolved++
			}
			e.resolve(r, res.err)
		} else {
			e.fail(fmt.Errorf("%w: Wait of request %d did not return after cancel", ErrInternal, r.id))
			return
		}
		if r.state != stInFlight {
			e.settle()
			return
		}
		fallthrough
	case stInFlight:
		if e.inWindow() {
			r.ten.res.Abandoned++
			r.ten.tier.res.Abandoned++
			r.ten.res.AbandonedInFlight++
			r.ten.tier.res.AbandonedInFlight++
		}
		e.release(r)
		e.finalOutcome(r, 0)
		e.settle()
	}
}

func (e *engine) release(r *request) {
	r.h.Release()
	r.ten.inflight--
	e.inflight--
}

func (e *engine) complete(r *request) {
	e.release(r)
	if e.inWindow() {
		r.ten.res.Served++
		r.ten.tier.res.Served++
	}
	e.finalOutcome(r, 0)
	e.settle()
}

// unavailableBackoff is how long a closed-loop client waits after a 503,
// which carries no measured Retry-After.
const unavailableBackoff = time.Second

// finalOutcome ends the request. A closed-loop client then waits backoff
// (the Retry-After of a final refusal: no client sends again before it),
// thinks, and sends its next request.
func (e *engine) finalOutcome(r *request, backoff time.Duration) {
	r.state = stDone
	if r.cancel != nil {
		r.cancel()
	}
	if r.ten.cfg.Arrival.Process == ProcClosed {
		if at := e.think(r.ten) + backoff; at < e.duration {
			e.push(event{at: at, kind: evClosed, ten: r.ten})
		}
	}
}

// cleanup ends every still-queued Wait so that no goroutine outlives Run.
func (e *engine) cleanup() {
	for r := range e.queued {
		r.cancel()
	}
	for range len(e.queued) {
		if _, ok := e.receive(); !ok {
			e.fail(fmt.Errorf("%w: queued Waits did not return after cancel", ErrInternal))
			return
		}
	}
}

// check compares the simulator's counts with the queue's and the queue's
// invariants (DESIGN.md section 5).
func (e *engine) check() {
	st := e.q.Stats()
	if st.InFlight != e.inflight {
		e.fail(fmt.Errorf("%w: at %s the queue has %d in flight, the simulation %d", ErrInternal, e.now, st.InFlight, e.inflight))
	}
	for name, ts := range e.tiers {
		qt := st.Tiers[name]
		if qt.Queued != ts.queued {
			e.fail(fmt.Errorf("%w: at %s tier %s: the queue has %d queued, the simulation %d", ErrInternal, e.now, name, qt.Queued, ts.queued))
		}
		if qt.Queued > qt.Bound {
			e.fail(fmt.Errorf("%w: at %s tier %s: %d queued exceeds its bound %d", ErrInternal, e.now, name, qt.Queued, qt.Bound))
		}
	}
	for _, ts := range e.tenants {
		if got := st.TenantInFlight[ts.name]; got != ts.inflight {
			e.fail(fmt.Errorf("%w: at %s tenant %s: the queue has %d in flight, the simulation %d", ErrInternal, e.now, ts.name, got, ts.inflight))
		}
	}
}

// checkTotals checks, at the end of the run, that every job the queue
// admitted ended exactly once or is still queued or in flight, and that no
// slot was released twice.
func (e *engine) checkTotals() {
	st := e.q.Stats()
	t := st.Totals
	if ended := t.Dispatched + t.Abandoned + t.Expired + t.Drained + uint64(st.Queued); t.Admitted != ended {
		e.fail(fmt.Errorf("%w: the queue admitted %d jobs but %d ended or are queued", ErrInternal, t.Admitted, ended))
	}
	if st.Completed+uint64(st.InFlight) != t.Dispatched {
		e.fail(fmt.Errorf("%w: %d dispatched, %d completed, %d in flight", ErrInternal, t.Dispatched, st.Completed, st.InFlight))
	}
	if st.DoubleReleases != 0 {
		e.fail(fmt.Errorf("%w: %d double releases", ErrInternal, st.DoubleReleases))
	}
	if t.Admitted != e.admitted {
		e.fail(fmt.Errorf("%w: the queue admitted %d jobs, the simulation %d", ErrInternal, t.Admitted, e.admitted))
	}
}

func (e *engine) finish() *Result {
	res := e.res
	window := (e.duration - e.warmup).Seconds()
	if e.slotsArea > 0 {
		res.Utilisation = round6(e.inflightArea / e.slotsArea)
	}
	var served int64
	for _, tr := range res.Tiers {
		served += tr.Served
	}
	share := func(n int64) float64 {
		if served == 0 {
			return 0
		}
		return round6(float64(n) / float64(served))
	}
	for _, ts := range e.tiers {
		tr := ts.res
		tr.finish(window)
		tr.ThroughputShare = share(tr.Served)
		tr.UnderLimits.MaxWait = round6(ts.underMax.Seconds())
		tr.UnderLimits.WithinMaxWait = ts.underMax <= maxWaitOf(e.first, ts.name)
		tr.Queue.MeanLength = round6(ts.area / window)
		tr.Queue.AdmissionRate = round6(float64(tr.Admitted) / window)
		if ts.sojournN > 0 {
			tr.Queue.MeanTimeInQueue = round6(ts.sojournSum / float64(ts.sojournN))
		}
	}
	for _, ts := range e.tenants {
		ts.res.finish(window)
		ts.res.ThroughputShare = share(ts.res.Served)
	}
	res.Warnings = append(res.Warnings, e.warnings()...)
	return res
}

func maxWaitOf(b capacity.Bounds, tier string) time.Duration {
	for _, t := range b.Tiers {
		if t.Name == tier {
			return t.MaxWait
		}
	}
	return 0
}
