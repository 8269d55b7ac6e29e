package simulate

import (
	"container/heap"
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

	// checkInvariants compares the simulator's own counts with the
	// scheduler's after every event and checks the scheduler's invariants
	// (tests).
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

// engine is one run: the event loop over simulated time, the clients that
// send requests, the scheduler that queues them and the figures.
type engine struct {
	in       *Input
	load     *LoadSpec
	opts     Options
	seed     uint64
	clk      *clocktesting.FakeClock
	sched    scheduler
	now      time.Duration
	warmup   time.Duration
	duration time.Duration
	events   eventHeap
	seq      uint64
	nextID   uint64
	sampler  sampler

	tiers   map[string]*tierState
	tenants []*tenantState
	policyState
	inflight int
	// admitted counts successful admissions over the whole run.
	admitted uint64

	// lastT is the end of the time already integrated into the areas.
	lastT        time.Duration
	inflightArea float64
	slotsArea    float64

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
	e := newEngine(in, opts)
	if err := e.setup(); err != nil {
		return nil, err
	}
	log := opts.Log.WithValues("pool", e.res.Pool, "seed", e.seed)
	log.V(1).Info("simulating", "duration", e.duration, "warmup", e.warmup, "tenants", len(e.tenants), "slots", e.slots)
	e.loop()
	if e.opts.checkInvariants && e.err == nil {
		e.fail(e.sched.Verify(e, true))
	}
	e.fail(e.sched.Close())
	log.V(1).Info("simulated", "events", e.seq, "requests", e.nextID, "policyChanges", len(e.res.PolicyChanges))
	if e.err != nil {
		return nil, e.err
	}
	return e.finish(), nil
}

func (e *engine) push(ev event) {
	ev.seq = e.seq
	e.seq++
	heap.Push(&e.events, ev)
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
		ev := heap.Pop(&e.events).(event)
		e.advance(ev.at)
		if ev.kind == evEnd {
			return
		}
		e.handle(ev)
		if e.opts.checkInvariants {
			e.fail(e.sched.Verify(e, false))
		}
	}
}

// expireDue steps to the scheduler's next expiry when it comes before the
// next event. Queued requests expire at exactly their deadline, before any
// other event of the same instant; the scheduler expires them
// synchronously (the queue's own timer would do it on a goroutine).
func (e *engine) expireDue() bool {
	dl, ok := e.sched.NextDeadline()
	if !ok || dl > e.events[0].at {
		return false
	}
	e.advance(max(dl, e.now))
	e.sched.ExpireDue()
	e.settle()
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
