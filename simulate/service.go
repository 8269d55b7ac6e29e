package simulate

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tiergate/tiergate/dispatcher/queue"
)

// resolve handles how a queued request left the queue: dispatched, expired
// by the queue, or withdrawn by its client.
func (e *engine) resolve(o outcome) {
	r := o.req
	if r.state != stQueued {
		e.fail(fmt.Errorf("%w: request %d resolved twice (%v)", ErrInternal, r.id, o.err))
		return
	}
	e.leaveQueue(r)
	if o.err != nil {
		// Expired or withdrawn: it never reached a backend.
		e.refundBudget(r)
	}
	switch {
	case o.err == nil:
		e.dispatch(r, o.waited)
	case r.gone:
		r.state = stDone // its client's end was counted when it left
	case errors.Is(o.err, queue.ErrExpired):
		e.count(r.ten, func(f *Figures) { f.Expired++ })
		if r.heldAtZero {
			e.heldCount(r, func(h *HeldFigures) { h.Expired++ })
		}
		ser := r.ten.tier.ser
		ser.expired[ser.bucket(e.now.Seconds())]++
		e.finalOutcome(r, 0)
	case errors.Is(o.err, context.Canceled):
		e.count(r.ten, func(f *Figures) { f.Abandoned++ })
		if r.heldAtZero {
			e.heldCount(r, func(h *HeldFigures) { h.Abandoned++ })
		}
		e.finalOutcome(r, 0)
	default:
		e.fail(fmt.Errorf("%w: request %d: Wait: %w", ErrInternal, r.id, o.err))
	}
}

// dispatch starts r's generation: it holds a slot of its dispatcher, and
// one of its tenant's there, for its service time. A request whose client
// already left is computed for nobody.
func (e *engine) dispatch(r *request, waited time.Duration) {
	d, ta := e.disp[r.disp], &r.ten.at[r.disp]
	if e.opts.checkInvariants && waited != e.now-r.admitAt {
		e.fail(fmt.Errorf("%w: request %d: Waited %s but the simulation saw %s", ErrInternal, r.id, waited, e.now-r.admitAt))
	}
	// After the pool shrinks, in-flight may exceed the slots, but no
	// dispatch may happen until it is back under them. Each scheduler is
	// held to its own caps (fcfs and strict have none).
	if e.opts.checkInvariants && (d.inflight >= d.slots || ta.atCap()) {
		e.fail(fmt.Errorf("%w: at %s request %d of %s dispatched on dispatcher %d with %d/%d in flight, tenant %d/%d",
			ErrInternal, e.now, r.id, r.ten.name, r.disp, d.inflight, d.slots, ta.inflight, ta.limit))
	}
	r.dispatchAt = e.now
	if r.gone {
		e.waste(e.now, e.now+r.service)
	} else {
		e.recordWait(r, waited)
	}
	ta.inflight++
	if ta.atCap() {
		ta.capHits++
	}
	d.inflight++
	e.inflight++
	r.state = stInFlight
	e.push(event{at: e.now + r.service, kind: evComplete, req: r, attempt: r.attempt})
}

// complete is a generation that finished: the client has its answer, or
// had left.
func (e *engine) complete(r *request) {
	e.settleCompleted(r)
	// Served when its client is still there for the answer.
	e.release(r, !r.gone)
	if r.gone {
		r.state = stDone
	} else {
		e.served(r)
		e.finalOutcome(r, 0)
	}
	e.settle(r.disp)
}

// release frees r's slot; the scheduler may dispatch into it. served:
// its client got the answer.
func (e *engine) release(r *request, served bool) {
	e.disp[r.disp].sched.Release(r, served)
	r.ten.at[r.disp].inflight--
	e.disp[r.disp].inflight--
	e.inflight--
}
