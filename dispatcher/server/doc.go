// Package server is the dispatcher's data path (DESIGN.md section 6): for
// every request it identifies the tenant, sends exempt paths straight to a
// backend, admits the rest through dispatcher/queue, waits, picks a backend
// (dispatcher/balancer: the fewest outstanding among those passive health
// keeps in service), proxies (SSE flushed per event) and releases the slot
// exactly once: with ReleaseServed for a 2xx answer read to its end, the
// only kind that measures the service time. Every refusal is written by
// dispatcher/apierror and counted by cause.
//
// Each request's outcome goes back to the balancer (an answer, a 5xx or
// broken answer, a refused connection, or nothing learnt when the client
// left). A request whose connection to its backend failed sent nothing, so
// it is retried once on another backend inside its slot; a body read from
// the client as it streams (exempt paths) is not retried.
//
// Requests that are not model calls: CONNECT gets 405 and the connection
// closes; a protocol upgrade (Connection: upgrade) gets 400 unless its
// path is exempt, since a switched connection would hold a slot for as
// long as the client likes; an h2c upgrade is ignored. From the drain on,
// every response says Connection: close.
//
// The request body is read in full (bounded by MaxBodyBytes and BodyTimeout)
// before admission, so a slow uploader never holds a slot and an oversized
// body gets a clean 413.
//
// requests_total is counted once per request, in ServeHTTP, from the status
// a capturing writer saw; the data path overrides it only with 499 (the
// client left first) or 502 (the backend cut a stream it had started).
//
// Concurrency model: one goroutine per request (net/http). The per-policy
// state (identifier, exempt paths, tier waits) is an immutable value swapped
// atomically by SetPolicy; the queue, balancer and metrics are safe for
// concurrent use. Per-request state (an exchange, taken from a sync.Pool)
// belongs to the request's goroutine and reaches the proxy hooks through
// the request context. A counter of requests inside the handler lets drain
// wait for them.
package server
