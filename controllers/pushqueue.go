package controllers

import (
	"context"
	"time"

	"k8s.io/client-go/util/workqueue"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

// pushEvent is what a worker reports to Pusher.trace about a key.
type pushEvent int

const (
	pushSkipped  pushEvent = iota // the pod is current, or no longer a target: nothing pushed
	pushDeferred                  // the pod is still backing off: queued again for the rest of it
	pushDone                      // pushed and recorded
	pushBackoff                   // pushed, failed, queued again after its backoff
	pushDropped                   // pushed, but the pod stopped being a target meanwhile: not recorded
)

func (p *Pusher) note(k pushKey, ev pushEvent) {
	if p.trace != nil {
		p.trace(k, ev)
	}
}

// processNext takes one key off the queue and pushes its newest target
// when the pod needs it; false when the queue shut down.
func (p *Pusher) processNext(ctx context.Context, q workqueue.TypedRateLimitingInterface[pushKey]) bool {
	k, shutdown := q.Get()
	if shutdown {
		return false
	}
	defer q.Done(k)
	j, ok := p.take(ctx, q, k)
	if !ok {
		return true
	}
	start := p.opts.Clock.Now()
	a := p.push(j.ctx, j.target, j.rev)
	if ctx.Err() != nil {
		return false // shutting down: the answer to a cancelled push is not the pod's
	}
	if !p.record(q, k, j.pp, j.target, a) {
		p.note(k, pushDropped)
		return true
	}
	tgt := j.target
	log := p.opts.Log.WithValues("pool", k.pool.String(), "pod", tgt.Name, "address", tgt.Address, "version", tgt.Policy.Version)
	if a.err != nil {
		log.Info("push failed", "result", string(a.result), "error", a.err.Error())
		p.note(k, pushBackoff)
	} else {
		log.V(1).Info("pushed", "acked", a.ack.Version, "queued", j.waited.String(), "took", p.opts.Clock.Since(start).String())
		p.note(k, pushDone)
	}
	p.opts.Notify(k.pool)
	return true
}

// pushJob is one push a worker took: the key's target, the schema
// revision to write it at, the context that dropping the pod cancels, and
// how long the key waited for a worker.
type pushJob struct {
	pp     *podPush
	target Target
	rev    int
	ctx    context.Context
	waited time.Duration
}

// take is the key's target to push now and the schema revision to write
// it at (the pod's, once it answered; this build's before); ok is false
// when there is nothing to push yet.
func (p *Pusher) take(ctx context.Context, q workqueue.TypedRateLimitingInterface[pushKey], k pushKey) (j pushJob, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pp, ok := p.pods[k]
	if !ok {
		p.note(k, pushSkipped)
		return j, false
	}
	need, wait := p.planLocked(pp)
	switch {
	case !need:
		pp.queued = time.Time{}
		p.note(k, pushSkipped)
		return j, false
	case wait > 0:
		// An earlier backoff's entry came due before this one's.
		q.AddAfter(k, wait)
		p.note(k, pushDeferred)
		return j, false
	}
	pp.force = false
	j = pushJob{pp: pp, target: pp.target, rev: policy.SchemaVersion}
	if pp.state.SchemaKnown {
		j.rev = pp.state.SchemaVersion
	}
	if !pp.queued.IsZero() {
		j.waited = p.opts.Clock.Since(pp.queued)
		pp.queued = time.Time{}
	}
	j.ctx, pp.cancel = context.WithCancel(ctx)
	pp.inFlight = pp.target
	return j, true
}

// record folds an attempt into the pod's state; false when the pod was
// dropped (or dropped and added again) while it was pushed. A failure
// queues the key again after the limiter's backoff (AddRateLimited,
// unrolled so the retry time is known); a success forgets the failures.
func (p *Pusher) record(q workqueue.TypedRateLimitingInterface[pushKey], k pushKey, pp *podPush, tgt Target, a attempt) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	pp.cancel()
	pp.cancel = nil
	if p.pods[k] != pp {
		return false
	}
	st := &pp.state
	st.Attempts++
	st.Result = a.result
	st.Err = a.err
	if a.known {
		st.SchemaKnown, st.SchemaVersion = true, a.schema
		_, st.Dropped = tgt.Policy.At(a.schema)
	}
	if a.result == PushOK {
		st.AckedVersion = a.ack.Version
		st.Stats = a.ack.Stats
		st.Failures = 0
		st.HeldVersion = 0
		st.HeldPool = ""
		q.Forget(k)
		return true
	}
	st.Failures++
	if a.result == PushConflict {
		st.HeldVersion = a.held
	}
	st.HeldPool = a.heldPool
	pp.failedVersion = tgt.Policy.Version
	delay := p.limiter.When(k)
	pp.retryAt = p.opts.Clock.Now().Add(delay)
	q.AddAfter(k, delay)
	return true
}
