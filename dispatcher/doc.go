// Package dispatcher wires the dispatcher process (`tiergate dispatcher`):
// the queue (dispatcher/queue), the balancer, the metrics, the data path
// (dispatcher/server) on --listen and the admin API (dispatcher/admin) on
// --admin-listen, the optional --policy-file watcher, and the drain on
// shutdown.
//
// A Dispatcher applies policies (from the admin API or the file) one at a
// time under a mutex: version check, then balancer, queue, data path and
// metrics, in that order, so a tier is known to the queue before a request
// can name it.
//
// Readiness (/readyz): Ready with a policy and not draining, except that a
// dispatcher whose Local-mode policy gives it 0 slots while the pool has
// ready backends reports NotReady. It would refuse every request with 503;
// NotReady makes the Service send them to the dispatchers that hold the
// slots. That happens when the pool has fewer slots than dispatchers, or
// when the controller moved a failing pod's share to the others. With no
// backend at all (no ready replica, or a pool at zero holding requests for
// its cold start) every dispatcher stays Ready.
//
// Shutdown (the context of Serve ends, e.g. on SIGTERM): keep-alives stop
// (idle connections close, every response says Connection: close, so
// pooled clients reconnect elsewhere); a moment later readyz fails and new
// requests get 503 draining; queued requests get DrainTimeout to be
// dispatched, then 503 draining; in-flight requests finish; the data port
// answers (503) until the last one has, then both servers close and Serve
// returns nil.
//
// Apply refuses a policy for another pool than the one applied: a
// dispatcher serves one pool until it restarts.
//
// Fleet mode (Config.Fleet with a redis:// URL): New builds the Redis gate
// of dispatcher/fleet and puts it in front of the queue; Apply tells it
// each policy before the queue applies it; Serve starts it with the
// queue's Kick as its wake-up and closes it after the drain.
//
// Concurrency: Apply is serialised; everything else is safe for concurrent
// use. The policy-file watcher is one goroutine driven by a ticker.
package dispatcher
