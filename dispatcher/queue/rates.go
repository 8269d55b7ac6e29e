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

// retryAfterTokens is retryAfter for a token-bound refusal: ahead, the
// weighted tokens queued before the refused job and its own, divided by the
// tier's measured drain rate in weighted tokens per second, or the policy's
// TokenServiceRate until one is measured (and while held at zero slots,
// after the cold start). Without either, a queue of jobs the size of this
// one at the request rate: ahead ÷ (ServiceRate × w); a job of no cost
// gets retryAfter's answer for its position.
func (q *Queue) retryAfterTokens(tr *tierState, ahead, w int64, pos int, now int64) time.Duration {
	rate, ok := q.tokenDrainRate(tr, now)
	var wait float64
	if q.slots <= 0 {
		rate, ok, wait = 0, false, q.pol.ColdStartSeconds
	}
	if !ok {
		rate = q.pol.TokenServiceRate
	}
	if !(rate > 0) {
		if w <= 0 {
			return q.retryAfter(tr, pos, now)
		}
		rate = q.serviceRate * float64(w)
	}
	upper := max(int64(tr.w/time.Second), 1)
	secs := upper
	if rate > 0 {
		if est := math.Ceil(wait + float64(ahead)/rate); est < float64(upper) {
			secs = int64(est)
		}
	}
	return time.Duration(max(secs, 1)) * time.Second
}

// tokenDrainRate is drainRate in weighted tokens per second; false until
// measured, or while nothing dispatched had a cost.
func (q *Queue) tokenDrainRate(tr *tierState, now int64) (float64, bool) {
	r, ok := q.drainRate(tr, now)
	if !ok || tr.drainCount <= 0 || tr.drainTokens <= 0 {
		return 0, false
	}
	return r * tr.drainTokens / tr.drainCount, true
}

func (q *Queue) noteDispatch(tr *tierState, w, now int64) {
	tr.dispatched++
	q.totals.Dispatched++
	if !tr.everDispatch {
		tr.everDispatch = true
		tr.firstDispatch = now
		tr.lastDispatch = now
	}
	if dt := now - tr.lastDispatch; dt > 0 {
		f := math.Exp(-float64(dt) / 1e9 / drainWindow.Seconds())
		tr.drainCount *= f
		tr.drainTokens *= f
	}
	tr.drainCount++
	tr.drainTokens += float64(w)
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
