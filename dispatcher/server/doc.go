// Package server is the dispatcher's data path (DESIGN.md section 6): for
// every request it identifies the tenant, sends exempt paths straight to a
// backend, admits the rest through dispatcher/queue, waits, picks the backend
// with the fewest outstanding requests, proxies (SSE flushed per event) and
// releases the slot exactly once. Every refusal is written by
// dispatcher/apierror and counted by cause.
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
