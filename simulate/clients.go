package simulate

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/dispatcher/queue"
	"github.com/tiergate/tiergate/internal/baseline"
)

// tenantState is one Load tenant: its clients, its limits in force and its
// figures.
type tenantState struct {
	cfg  *TenantLoad
	name string
	tier *tierState
	// rng draws the tenant's arrivals (and think times); svc its service
	// times (rng itself for an open-loop tenant); tok its token counts.
	rng, svc, tok *rand.Rand
	// promptTokens and outputTokens draw a request's tokens (nil: none);
	// maxOut is the output each reserves (requestCost).
	promptTokens, outputTokens *sampler
	maxOut                     int64
	// at is the tenant on each dispatcher.
	at         []tenantAt
	maxRetries int
	burstStart time.Duration
	res        *TenantResult
}

type reqState uint8

const (
	stNew reqState = iota
	stQueued
	stInFlight
	stDone
)

// request is one client request, over all its attempts. state is the
// request's in the dispatcher; its client may have left before (gone).
type request struct {
	id      uint64
	ten     *tenantState
	service time.Duration
	cost    requestCost
	// queuedCost is the weighted cost it reserved while queued.
	queuedCost int64
	// reserved: the current attempt holds a reservation of cost on its
	// dispatcher's budgets, taken under limits.
	reserved bool
	limits   policy.Limits
	attempt  int32
	retries  int
	state    reqState
	// gone: the client left before its answer came, but the scheduler did
	// not notice, so the request is still queued or running.
	gone bool
	// disp is the dispatcher of the current attempt.
	disp int
	// arrived is the first attempt's time; admitAt the current one's
	// admission; dispatchAt the start of its generation.
	arrived, admitAt, dispatchAt time.Duration
	// ticket is the queue's handle on the admitted request; job a
	// baseline's.
	ticket queueTicket
	job    baseline.Job[*request]
	// underLimits: the tenant was under its concurrency limit when the
	// request was admitted; capMark is its capHits then.
	underLimits bool
	capMark     uint64
	// heldAtZero: admitted while the pool was at zero, held for its first
	// replica (zero.go).
	heldAtZero bool
}

// unavailableBackoff is how long a closed-loop client waits after a 503,
// which carries no measured Retry-After.
const unavailableBackoff = time.Second

// startClients schedules every tenant's first arrivals.
func (e *engine) startClients() {
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
}

// arrive sends an open-loop request and schedules the tenant's next one.
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

// think is when a closed-loop client sends again.
func (e *engine) think(ts *tenantState) time.Duration {
	return e.now + expGap(ts.rng, durOr(ts.cfg.Arrival.Think, 0))
}

func (e *engine) newRequest(ts *tenantState) {
	e.nextID++
	r := &request{id: e.nextID, ten: ts, arrived: e.now}
	if m := e.rates; m != nil {
		r.cost = ts.drawCost()
		r.service = m.serviceTime(r.cost)
	} else {
		r.service, r.cost = e.sampler.draw(ts.svc), ts.drawCost()
	}
	e.serviceSum += r.service.Seconds()
	e.serviceN++
	if e.opts.onRequest != nil {
		e.opts.onRequest(e.kind.name, ts.name, e.now, r.service)
	}
	e.count(ts, func(f *Figures) { f.Offered++ })
	e.attempt(r)
}

// attempt sends the request (again) to the next dispatcher.
func (e *engine) attempt(r *request) {
	r.attempt++
	if r.retries > 0 {
		e.count(r.ten, func(f *Figures) { f.Retries++ })
	}
	r.disp = e.pick()
	d := e.disp[r.disp]
	if !e.reserve(r) {
		return
	}
	if err := d.sched.Admit(r); err != nil {
		e.refundBudget(r)
		e.refused(r, err)
		return
	}
	d.admitted++
	e.enqueued(r)
	if to := r.ten.cfg.Timeout.Duration; to > 0 {
		e.push(event{at: e.now + to, kind: evTimeout, req: r, attempt: r.attempt})
	}
	e.settle(r.disp)
}

// refused counts an attempt the queue refused. A 429 is sent again after
// its Retry-After while the client has retries left; otherwise the request
// ends.
func (e *engine) refused(r *request, err error) {
	ts := r.ten
	var ref *queue.Refusal
	backoff := unavailableBackoff
	switch {
	case errors.As(err, &ref):
		if ref.CauseLabel() == queue.CauseTenantLimit {
			e.count(ts, func(f *Figures) { f.Refused.TenantLimit++ })
		} else {
			e.count(ts, func(f *Figures) { f.Refused.Capacity++ })
		}
		e.retryOrEnd(r, ref.RetryAfter)
		return
	case errors.Is(err, queue.ErrNoCapacity):
		e.count(ts, func(f *Figures) { f.Refused.Unavailable++ })
		var cold *queue.ColdStartRefusal
		if errors.As(err, &cold) {
			// The 503 of a tier that cannot wait out the cold start says
			// Retry-After = the cold start.
			backoff = max(cold.ColdStart, time.Second)
			e.heldCount(r, func(h *HeldFigures) { h.RefusedAtZero++ })
		}
	default:
		e.fail(fmt.Errorf("%w: admit tenant %q tier %q: %w", ErrInternal, ts.name, ts.tier.name, err))
		return
	}
	e.finalOutcome(r, backoff)
}

// retryOrEnd sends a request refused with 429 again after its Retry-After
// while its client has retries left; otherwise the request ends and a
// closed-loop client waits the Retry-After out.
func (e *engine) retryOrEnd(r *request, retryAfter time.Duration) {
	if r.retries < r.ten.maxRetries {
		r.retries++
		e.push(event{at: e.now + retryAfter, kind: evRetry, req: r})
		return
	}
	e.finalOutcome(r, retryAfter)
}

// giveUp is the client's own timeout. A scheduler that watches its
// clients withdraws a queued request and cancels a running one, freeing
// its slot; one that does not keeps the request and computes it in full
// for nobody.
func (e *engine) giveUp(r *request) {
	if r.state != stQueued && r.state != stInFlight {
		return
	}
	sched := e.disp[r.disp].sched
	if !sched.WatchesClients() {
		e.count(r.ten, func(f *Figures) {
			f.Abandoned++
			if r.state == stInFlight {
				f.AbandonedInFlight++
			}
		})
		if r.state == stInFlight {
			e.waste(r.dispatchAt, r.dispatchAt+r.service)
		}
		r.gone = true
		e.clientLeaves(r, 0)
		return
	}
	if r.state == stQueued {
		o, err := sched.Withdraw(r)
		if err != nil {
			e.fail(err)
			return
		}
		e.resolve(o)
		if r.state != stInFlight {
			e.settle(r.disp)
			return
		}
	}
	e.count(r.ten, func(f *Figures) {
		f.Abandoned++
		f.AbandonedInFlight++
	})
	e.waste(r.dispatchAt, e.now)
	e.settleCancelled(r)
	e.release(r, false)
	e.finalOutcome(r, 0)
	e.settle(r.disp)
}

// finalOutcome ends the request, for the dispatcher and its client.
func (e *engine) finalOutcome(r *request, backoff time.Duration) {
	r.state = stDone
	e.clientLeaves(r, backoff)
}

// clientLeaves is the end of the request for its client. A closed-loop
// client then waits backoff (the Retry-After of a final refusal: no client
// sends again before it), thinks, and sends its next request.
func (e *engine) clientLeaves(r *request, backoff time.Duration) {
	if r.ten.cfg.Arrival.Process == ProcClosed {
		if at := e.think(r.ten) + backoff; at < e.duration {
			e.push(event{at: at, kind: evClosed, ten: r.ten})
		}
	}
}
