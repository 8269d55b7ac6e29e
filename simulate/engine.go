package simulate

import (
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	clocktesting "k8s.io/utils/clock/testing"
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
	// Compare names baselines (Baselines) to run on the same traffic after
	// tiergate; their results go to Result.Compare (--compare).
	Compare []string

	// checkInvariants compares the simulator's own counts with the
	// schedulers' after every event and checks their invariants (tests).
	checkInvariants bool
	// onRequest, when set, sees every new request: its tenant, arrival
	// time and service time (tests).
	onRequest func(sched, tenant string, at, service time.Duration)
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
	return checkCompare(o.Compare)
}

// epoch is the fake clock's start; any fixed instant keeps runs identical.
var epoch = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

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

// event is one thing that happens at a simulated time. Events of the same
// instant run in the order they were scheduled (seq).
type event struct {
	at   time.Duration
	seq  uint64
	kind eventKind
	// attempt is the request's attempt a timeout or completion belongs
	// to; a stale one is ignored.
	attempt int32
	// n is the index of a burst arrival or of a replica change.
	n   int32
	req *request
	ten *tenantState
}

// eventHeap is a binary min-heap of events by (at, seq). It is typed
// rather than a container/heap so that pushing an event does not box it.
type eventHeap []event

func (h eventHeap) Len() int { return len(h) }

func (h eventHeap) less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}

func (h *eventHeap) push(ev event) {
	*h = append(*h, ev)
	s := *h
	for i := len(s) - 1; i > 0; {
		p := (i - 1) / 2
		if !s.less(i, p) {
			break
		}
		s[i], s[p] = s[p], s[i]
		i = p
	}
}

func (h *eventHeap) pop() event {
	s := *h
	top := s[0]
	n := len(s) - 1
	s[0] = s[n]
	s[n] = event{}
	s = s[:n]
	for i := 0; ; {
		l, small := 2*i+1, i
		if l < n && s.less(l, small) {
			small = l
		}
		if r := l + 1; r < n && s.less(r, small) {
			small = r
		}
		if small == i {
			break
		}
		s[i], s[small] = s[small], s[i]
		i = small
	}
	*h = s
	return top
}

// engine is one run: the event loop over simulated time, the clients that
// send requests, the dispatchers whose schedulers queue them, and the
// figures.
type engine struct {
	in   *Input
	load *LoadSpec
	opts Options
	kind *schedKind
	seed uint64
	clk  *clocktesting.FakeClock
	env  *schedEnv
	disp []*dispatcher
	// rr is the round-robin position of the next attempt.
	rr       int
	now      time.Duration
	warmup   time.Duration
	duration time.Duration
	events   eventHeap
	seq      uint64
	nextID   uint64
	sampler  sampler
	// rates are the pool's token rates; nil: service times are drawn.
	rates *tokenRates
	// serviceSum and serviceN are over every request's service time: with
	// token rates, the Load's mean service time is theirs.
	serviceSum float64
	serviceN   int64

	tiers map[string]*tierState
	// tierList is tiers in base-priority order.
	tierList []*tierState
	tenants  []*tenantState
	policyState
	// inflight is the pool's, over every dispatcher.
	inflight int
	// admitted counts successful admissions over the whole run.
	admitted uint64

	// lastT is the end of the time already integrated into the areas.
	lastT        time.Duration
	inflightArea float64
	slotsArea    float64
	// wasted is slot-seconds, in the window, of generations whose client
	// had left or left before the answer came.
	wasted float64

	res *Result
	err error
}

// Run simulates in and returns what it measured: tiergate's run, and one
// per Options.Compare baseline on the same traffic. It is single-threaded
// and deterministic: the same input and seed give the same Result.
func Run(in *Input, opts Options) (*Result, error) {
	opts.defaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if in == nil || in.Pool == nil || in.Load == nil {
		return nil, fmt.Errorf("%w: input needs a ModelPool and a Load", ErrInvalid)
	}
	res, err := runOne(in, opts, kinds[SchedTiergate])
	if err != nil {
		return nil, err
	}
	for _, name := range opts.Compare {
		other, err := runScheduler(in, opts, kinds[name])
		if err != nil {
			return nil, fmt.Errorf("--compare %s: %w", name, err)
		}
		if res.Compare == nil {
			res.Compare = map[string]*Result{}
		}
		res.Compare[name] = other
		res.compareOrder = append(res.compareOrder, name)
	}
	return res, nil
}

// runScheduler simulates in with kind, a variant on its changed copy of the
// pool.
func runScheduler(in *Input, opts Options, kind *schedKind) (*Result, error) {
	if kind.vary != nil {
		var err error
		if in, err = variantInput(in, kind.vary); err != nil {
			return nil, err
		}
	}
	return runOne(in, opts, kind)
}

// runOne simulates in with one kind of scheduler.
func runOne(in *Input, opts Options, kind *schedKind) (*Result, error) {
	e := newEngine(in, opts, kind)
	if err := e.setup(); err != nil {
		return nil, err
	}
	log := opts.Log.WithValues("pool", e.res.Pool, "seed", e.seed, "scheduler", kind.name)
	log.V(1).Info("simulating", "duration", e.duration, "warmup", e.warmup, "tenants", len(e.tenants), "dispatchers", len(e.disp), "slots", e.slots)
	e.loop()
	if e.opts.checkInvariants && e.err == nil {
		e.fail(e.check(true))
	}
	for _, d := range e.disp {
		e.fail(d.sched.Close())
	}
	log.V(1).Info("simulated", "events", e.seq, "requests", e.nextID, "policyChanges", len(e.res.PolicyChanges))
	if e.err != nil {
		return nil, e.err
	}
	return e.finish(), nil
}

func (e *engine) push(ev event) {
	ev.seq = e.seq
	e.seq++
	e.events.push(ev)
}

// fail keeps the first error of the run; nil is ignored.
func (e *engine) fail(err error) {
	if e.err == nil {
		e.err = err
	}
}

func (e *engine) inWindow() bool { return e.now >= e.warmup }

func (e *engine) loop() {
	for e.events.Len() > 0 && e.err == nil {
		if e.expireDue() {
			continue
		}
		ev := e.events.pop()
		e.advance(ev.at)
		if ev.kind == evEnd {
			return
		}
		e.handle(ev)
		if e.opts.checkInvariants {
			e.fail(e.check(false))
		}
	}
}

// expireDue steps to the earliest expiry of any dispatcher when it comes
// before the next event. Queued requests expire at exactly their deadline,
// before any other event of the same instant; the scheduler expires them
// synchronously (the queue's own timer would do it on a goroutine).
func (e *engine) expireDue() bool {
	first, at := -1, time.Duration(0)
	for i, d := range e.disp {
		if dl, ok := d.sched.NextDeadline(); ok && (first < 0 || dl < at) {
			first, at = i, dl
		}
	}
	if first < 0 || at > e.events[0].at {
		return false
	}
	e.advance(max(at, e.now))
	e.disp[first].sched.ExpireDue()
	e.settle(first)
	return true
}

func (e *engine) handle(ev event) {
	switch ev.kind {
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
		e.changeReplicas(ev.n)
	}
}

// advance moves simulated time, and the fake clock, to t.
func (e *engine) advance(t time.Duration) {
	if t < e.now {
		e.fail(fmt.Errorf("%w: time went backwards: %s < %s", ErrInternal, t, e.now))
		return
	}
	e.integrate(t)
	if t != e.now {
		e.now = t
		e.clk.SetTime(epoch.Add(t))
	}
}
