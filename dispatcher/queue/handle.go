package queue

import (
	"context"
	"time"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

// Handle states. A job is queued, then dispatched and released, or it ends
// queued as abandoned, expired or drained. Exactly one end per job.
const (
	stQueued uint8 = iota
	stDispatched
	stReleased
	stAbandoned
	stExpired
	stDrained
)

// Handle is the caller's reference to one admitted request. Its methods are
// safe for concurrent use. It stays valid for ever; the queue's internal job
// record behind it is recycled once the handle can no longer reach it.
type Handle struct {
	q *Queue
	j *job // nil once the job record has been recycled
	// tier is the tier the job was admitted to; it never changes.
	tier string

	// guarded by q.mu
	state  uint8
	err    error
	waited time.Duration

	// tokens (fair.go, settle.go): the tenant, its charge in Tokens mode
	// (the reservation's weighted cost, the weights and tenant weight it
	// was charged with, what it added to the counter of which tier, in
	// which Tokens period), and what Settle and ReleaseServed saw.
	tenant    string
	cost      Cost // as admitted
	charged   bool
	wcost     int64
	weight    int
	fair      policy.Fairness
	charge    float64
	chargeTr  *tierState
	fairEpoch uint64
	settled   bool
	served    bool
	actual    int64 // settled weighted tokens
	slotNs    int64 // dispatch to ReleaseServed
}

// Wait blocks until the job is dispatched (nil: the caller now holds a slot
// and must call Release), ctx ends while it is queued (the job is removed at
// once, counted abandoned, and ctx.Err() is returned; if dispatch won the
// race Wait returns nil instead), it expires (ErrExpired) or FlushQueued
// ends it (ErrDrained). Calling Wait again returns the same outcome.
func (h *Handle) Wait(ctx context.Context) error {
	q := h.q
	q.mu.Lock()
	defer q.unlock()
	for h.state == stQueued {
		j := h.j
		if j.ch == nil {
			j.ch = make(chan struct{}, 1)
		}
		j.waiters++
		q.mu.Unlock()
		cancelled := false
		select {
		case <-j.ch:
		case <-ctx.Done():
			cancelled = true
		}
		q.mu.Lock()
		j.waiters--
		if cancelled && h.state == stQueued {
			q.endQueued(j, stAbandoned, ctx.Err(), q.now())
			continue
		}
		if h.state == stQueued {
			continue // a stale token; park again
		}
		if j.waiters > 0 {
			wake(j) // pass the token on to the next waiter
		} else if h.state != stDispatched && h.j == j {
			q.recycle(j)
		}
	}
	switch h.state {
	case stDispatched, stReleased:
		return nil
	}
	return h.err
}

// Release gives the job's slot back and dispatches the next job. It is
// idempotent: a second call is a no-op counted in Stats.DoubleReleases.
// Releasing a job that is still queued abandons it (Wait returns
// context.Canceled); releasing one that ended without dispatch does nothing.
// The job's time in its slot is not a service-time sample: use
// ReleaseServed for a job the model served.
func (h *Handle) Release() { h.release(false) }

// ReleaseServed is Release for a job the model served (a 2xx answer, read
// to its end): its dispatch-to-release time joins the measured service
// time (Stats.ServiceTime, Stats.Served), which the controller may use as
// S. Failures, abandoned and cancelled requests must not count: a backend
// that fails fast would otherwise shrink S and grow every bound.
func (h *Handle) ReleaseServed() { h.release(true) }

func (h *Handle) release(served bool) {
	q := h.q
	q.mu.Lock()
	defer q.unlock()
	now := q.now()
	switch h.state {
	case stReleased:
		q.doubleReleases++
		return
	case stQueued:
		q.endQueued(h.j, stAbandoned, context.Canceled, now)
		return
	case stDispatched:
	default:
		return
	}
	j := h.j
	ts, tr := j.ts, j.tr
	h.state = stReleased
	ts.inFlight--
	tr.inFlight--
	q.inFlight--
	q.completed++
	if served {
		q.observeService(now - j.dispatchedAt)
		h.served, h.slotNs = true, now-j.dispatchedAt
		if h.settled {
			q.observeTokens(h.actual, h.slotNs)
		}
	}
	if q.gate != nil {
		q.fleetRelease(ts, j.lease)
	}
	q.fixTenant(ts)
	q.maybeDropTenant(ts)
	q.maybeDropTier(tr)
	q.recycle(j)
	q.dispatchLocked(now)
}

// Tier is the tier the job was admitted to (see Admit). A later policy
// may move a queued job to another tier; this stays the admission's.
func (h *Handle) Tier() string { return h.tier }

// Waited is the time from enqueue to dispatch (or to the end, for a job
// that was never dispatched); 0 while still queued.
func (h *Handle) Waited() time.Duration {
	h.q.mu.Lock()
	defer h.q.mu.Unlock()
	return h.waited
}
