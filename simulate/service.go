package simulate

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tiergate/tiergate/dispatcher/queue"
)

// settle handles the outcomes of every request that the last scheduler
// operation took off the queue.
func (e *engine) settle() {
	outs, err := e.sched.Outcomes()
	if err != nil {
		e.fail(err)
		return
	}
	for _, o := range outs {
		e.resolve(o)
	}
}

// resolve handles how a queued request left the queue: dispatched, expired
// by the queue, or withdrawn by its client.
func (e *engine) resolve(o outcome) {
	r := o.req
	if r.state != stQueued {
		e.fail(fmt.Errorf("%w: request %d resolved twice (%v)", ErrInternal, r.id, o.err))
		return
	}
	e.leaveQueue(r)
	switch {
	case o.err == nil:
		e.dispatch(r, o.waited)
	case errors.Is(o.err, queue.ErrExpired):
		e.count(r.ten, func(f *Figures) { f.Expired++ })
		ser := r.ten.tier.ser
		ser.expired[ser.bucket(e.now.Seconds())]++
		e.finalOutcome(r, 0)
	case errors.Is(o.err, context.Canceled):
		e.count(r.ten, func(f *Figures) { f.Abandoned++ })
		e.finalOutcome(r, 0)
	default:
		e.fail(fmt.Errorf("%w: request %d: Wait: %w", ErrInternal, r.id, o.err))
	}
}

// dispatch starts r's generation: it holds a slot, and one of its tenant's,
// for its service time.
func (e *engine) dispatch(r *request, waited time.Duration) {
	ts := r.ten
	if e.opts.checkInvariants && waited != e.now-r.admitAt {
		e.fail(fmt.Errorf("%w: request %d: Waited %s but the simulation saw %s", ErrInternal, r.id, waited, e.now-r.admitAt))
	}
	e.recordWait(r, waited)
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
}

// complete is a generation that finished: the client has its answer.
func (e *engine) complete(r *request) {
	e.release(r)
	e.count(r.ten, func(f *Figures) { f.Served++ })
	e.finalOutcome(r, 0)
	e.settle()
}

// release frees r's slot; the scheduler may dispatch into it.
func (e *engine) release(r *request) {
	e.sched.Release(r)
	r.ten.inflight--
	e.inflight--
}
