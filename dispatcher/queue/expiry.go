package queue

import "time"

// expireLocked ends every job queued for clientTimeout or longer. The oldest
// job of each tier is at its list's front, so this is O(expired × tiers).
func (q *Queue) expireLocked(now int64) {
	if q.timeoutNs <= 0 {
		return
	}
	for _, tr := range q.tiers {
		for j := tr.arrival.head; j != nil && now-j.enq >= q.timeoutNs; j = tr.arrival.head {
			q.endQueued(j, stExpired, ErrExpired, now)
		}
	}
}

// oldestEnq is the enqueue time of the oldest queued job of any tier.
func (q *Queue) oldestEnq() (int64, bool) {
	var best int64
	found := false
	for _, tr := range q.tiers {
		if o := tr.arrival.head; o != nil && (!found || o.enq < best) {
			best, found = o.enq, true
		}
	}
	return best, found
}

// armTimer sets the single expiry timer for the oldest queued job unless it
// is already set. It may fire early (the oldest left); it then re-arms.
func (q *Queue) armTimer(now int64) {
	if q.timerArmed || q.timeoutNs <= 0 {
		return
	}
	enq, ok := q.oldestEnq()
	if !ok {
		return
	}
	d := max(time.Duration(enq+q.timeoutNs-now), 0)
	// A fresh timer each time: a FakeClock timer sends on a channel of one
	// when it fires and would block the clock on a second firing after a
	// Reset, and a FakeClock runs the callback under its own lock while we
	// call the clock under q.mu, so the callback takes q.mu elsewhere.
	if q.timer != nil {
		q.timer.Stop()
	}
	q.timer = q.clk.AfterFunc(d, q.fire)
	q.timerArmed = true
}

func (q *Queue) onTimer() {
	q.mu.Lock()
	defer q.unlock()
	q.timerArmed = false
	now := q.now()
	q.expireLocked(now)
	q.armTimer(now)
}

// ExpireDue ends, synchronously, every job whose clientTimeout has passed at
// the clock's current time. The timer does the same on its own goroutine; a
// discrete-event driver calls ExpireDue after stepping a fake clock to
// NextDeadline so the outcome does not depend on goroutine scheduling.
func (q *Queue) ExpireDue() {
	q.mu.Lock()
	defer q.unlock()
	now := q.now()
	q.expireLocked(now)
	q.armTimer(now)
}

// NextDeadline is when the oldest queued job expires; false when nothing is
// queued or clientTimeout is 0.
func (q *Queue) NextDeadline() (time.Time, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.timeoutNs <= 0 {
		return time.Time{}, false
	}
	enq, ok := q.oldestEnq()
	if !ok {
		return time.Time{}, false
	}
	return q.epoch.Add(time.Duration(enq + q.timeoutNs)), true
}

// Drain makes Admit refuse with ErrDraining from now on. Queued jobs still
// dispatch; in-flight jobs are untouched.
func (q *Queue) Drain() {
	q.mu.Lock()
	q.draining = true
	q.mu.Unlock()
}

// FlushQueued ends every still-queued job: its Wait returns ErrDrained.
func (q *Queue) FlushQueued() {
	q.mu.Lock()
	defer q.unlock()
	now := q.now()
	for _, tr := range q.tiers {
		for tr.arrival.head != nil {
			q.endQueued(tr.arrival.head, stDrained, ErrDrained, now)
		}
	}
}

// Idle returns a channel closed once nothing is queued (a fresh channel on
// every call; already closed if the queue is empty now).
func (q *Queue) Idle() <-chan struct{} {
	ch := make(chan struct{})
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.queued == 0 {
		close(ch)
	} else {
		q.idle = append(q.idle, ch)
	}
	return ch
}
