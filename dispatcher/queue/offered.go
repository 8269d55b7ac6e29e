package queue

import (
	"math"
	"time"
)

// Offered load: the requests per second that reached the queue, by tier,
// which the dispatcher reports in its policy Ack so the controller can
// size the pool by Little's law. A request counts when it is admitted,
// refused for capacity (the tier's bound, here or fleet-wide), or refused
// because the pool has no slots at all (ErrNoCapacity, and a tier refused
// at zero for its cold start): demand the pool did not serve for want of
// room. A tenant over its own queue limit is not demand the pool should
// grow for, and requests refused before the queue (authentication, bad
// requests) never reach it.

// offeredWindow is the time constant of the offered-load average: long
// enough to smooth the noise of random arrivals for an autoscaler, short
// enough to follow a change within a couple of resyncs.
const offeredWindow = time.Minute

// minOfferedSpan is the shortest observed span a rate is divided by, so
// the first requests after the start do not read as an unbounded rate.
const minOfferedSpan = time.Second

// meter is an exponentially weighted rate of events: every event adds one
// to count, and count decays by e^(−Δt/τ) with τ = offeredWindow. Times
// are ns on the queue's clock. Pure: it reads no clock of its own.
type meter struct {
	count float64 // the decayed number of events, as of at
	at    int64   // the time of the last event
}

// add counts one event at now.
func (m *meter) add(now int64) {
	if dt := now - m.at; dt > 0 {
		if m.count > 0 {
			m.count *= math.Exp(-float64(dt) / float64(offeredWindow))
		}
		m.at = now
	}
	m.count++
}

// rate is the events per second at now, for a meter observing since
// since: the decayed count over the decayed length of the span observed,
// τ × (1 − e^(−span/τ)), so a steady rate reads the same from the first
// seconds on as after many windows.
func (m meter) rate(now, since int64) float64 {
	if m.count == 0 {
		return 0
	}
	c := m.count
	if dt := now - m.at; dt > 0 {
		c *= math.Exp(-float64(dt) / float64(offeredWindow))
	}
	span := max(now-since, int64(minOfferedSpan))
	return c / (offeredWindow.Seconds() * -math.Expm1(-float64(span)/float64(offeredWindow)))
}

// noteOffered counts one request that reached tier tr at now.
func (q *Queue) noteOffered(tr *tierState, now int64) { tr.offered.add(now) }
