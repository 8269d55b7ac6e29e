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
// Shutdown (the context of Serve ends, e.g. on SIGTERM): readyz fails and
// new requests get 503 draining; queued requests get DrainTimeout to be
// dispatched, then 503 draining; in-flight requests finish; the data port
// answers (503) until the last one has, then both servers close and Serve
// returns nil.
//
// Fleet mode plugs in through a queue.Gate (Config.Gate, or a --state URL
// scheme registered with RegisterState). A Gate that also implements
// PolicyObserver is told about every applied policy.
//
// Concurrency: Apply is serialised; everything else is safe for concurrent
// use. The policy-file watcher is one goroutine driven by a ticker.
package dispatcher
