// Package gate is the contract between the queue (dispatcher/queue) and a
// store that makes the queue's counts exact across a fleet of dispatchers
// (dispatcher/fleet keeps them in Redis). The queue keeps its own order and
// its local counts; a Gate adds the fleet-wide checks: tier bounds and
// tenant queue limits when a job is admitted, pool slots and tenant
// concurrency limits when it is dispatched.
//
// Every job the queue admits in fleet mode holds one Lease from Enqueue on:
// a queued place, which an Exchange may turn into an in-flight slot. The
// queue hands each lease back exactly once, in a later Exchange, whatever
// it holds by then.
//
// Concurrency model: both methods may block on the network. The queue never
// calls them with its own lock held, and never calls back into a Gate from
// inside one. Enqueue is called by many goroutines at once (one per
// admission); Exchange by one goroutine at a time, so the gate sees the
// queue's dispatch decisions in the queue's order. A Gate wakes the queue
// (queue.Kick) when capacity may have freed elsewhere; it never does so
// from inside a Gate method.
package gate
