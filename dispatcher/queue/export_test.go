package queue

// Test-only hooks.

// setOnDispatch calls f, under the queue's lock, for every job dispatched
// from now on (benchmarks collect the handles to Wait on).
func (q *Queue) setOnDispatch(f func(*Handle)) {
	q.mu.Lock()
	q.onDispatch = f
	q.mu.Unlock()
}

// withSpawn replaces the goroutine that runs the fleet pump: tests run it
// inline, or record it and run it when they choose.
func withSpawn(spawn func(func())) Option { return func(c *config) { c.spawn = spawn } }

// inline runs the pump on the caller's goroutine, so a test that drives the
// queue from one goroutine sees every exchange done when a call returns.
func inline(f func()) { f() }
