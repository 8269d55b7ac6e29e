package queue

import (
	"math"
	"time"
)

// retryAfter estimates when position pos will have drained: pos divided by
// the tier's measured drain rate, or the policy's service rate until one is
// measured; whole seconds rounded up, clamped to [1s, W]. While held at
// zero slots the first replica is a cold start away and the measured rate
// is that of replicas that are gone: the cold start plus pos at the
// policy's rate (the first replica's share).
func (q *Queue) retryAfter(tr *tierState, pos int, now int64) time.Duration {
	upper := max(int64(tr.w/time.Second), 1)
	rate, ok := q.drainRate(tr, now)
	var wait float64
	if q.slots <= 0 {
		rate, ok, wait = q.serviceRate, true, q.pol.ColdStartSeconds
	}
	if !ok {
		rate = q.serviceRate
	}
	secs := upper
	if rate > 0 {
		est := math.Ceil(wait + float64(pos)/rate)
		if est < float64(upper) {
			secs = int64(est)
		}
	}
	return time.Duration(max(secs, 1)) * time.Second
}

// minDrainSample is how long a tier must have been dispatching before its
// measured rate replaces the policy's service rate.
const minDrainSample = time.Second

// drainRate is the tier's dispatches per second: a count decayed with time
// constant drainWindow, normalised by the part of the window observed so
// far.
func (q *Queue) drainRate(tr *tierState, now int64) (float64, bool) {
	if !tr.everDispatch {
		return 0, false
	}
	elapsed := now - tr.firstDispatch
	if elapsed < int64(minDrainSample) {
		return 0, false
	}
	tau := drainWindow.Seconds()
	c := tr.drainCount * math.Exp(-float64(now-tr.lastDispatch)/1e9/tau)
	norm := tau * (1 - math.Exp(-float64(elapsed)/1e9/tau))
	return c / norm, true
}

func (q *Queue) noteDispatch(tr *tierState, now int64) {
	tr.dispatched++
	q.totals.Dispatched++
	if !tr.everDispatch {
		tr.everDispatch = true
		tr.firstDispatch = now
		tr.lastDispatch = now
	}
	if dt := now - tr.lastDispatch; dt > 0 {
		tr.drainCount *= math.Exp(-float64(dt) / 1e9 / drainWindow.Seconds())
	}
	tr.drainCount++
	tr.lastDispatch = now
}

// observeService folds one served job's dispatch-to-release time (ns)
// into the service-time EWMA.
func (q *Queue) observeService(ns int64) {
	sample := float64(ns)
	if q.served == 0 {
		q.serviceTime = sample
	} else {
		q.serviceTime += serviceWeight * (sample - q.serviceTime)
	}
	q.served++
}
