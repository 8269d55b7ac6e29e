package simulate

import (
	"time"

	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
)

// simClock is the FakeClock the queue runs on, with one repair: a FakeClock
// timer made by AfterFunc keeps a one-slot channel that nobody reads, so
// after it has fired once, Reset and a second firing block SetTime for
// ever. Here Reset stops the old timer and arms a fresh one, which is what
// a real clock's Reset amounts to.
type simClock struct {
	*clocktesting.FakeClock
}

var _ clock.WithDelayedExecution = simClock{}

func (c simClock) AfterFunc(d time.Duration, f func()) clock.Timer {
	return &freshTimer{clk: c.FakeClock, f: f, t: c.FakeClock.AfterFunc(d, f)}
}

// freshTimer is used under the queue's lock only, like any clock.Timer the
// queue holds.
type freshTimer struct {
	clk *clocktesting.FakeClock
	f   func()
	t   clock.Timer
}

func (t *freshTimer) C() <-chan time.Time { return t.t.C() }
func (t *freshTimer) Stop() bool          { return t.t.Stop() }
func (t *freshTimer) Reset(d time.Duration) bool {
	active := t.t.Stop()
	t.t = t.clk.AfterFunc(d, t.f)
	return active
}
