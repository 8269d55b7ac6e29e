// Package server is the dispatcher's data path (docs/architecture.md#the-data-path): for
// every request it identifies the tenant, sends exempt paths straight to a
// backend, admits the rest through dispatcher/queue, waits, picks a backend
// (dispatcher/balancer: the fewest outstanding among those passive health
// keeps in service), forwards with dispatcher/forward (SSE flushed per
// event, on the request's own goroutine) and releases the slot
// exactly once: with ReleaseServed for a 2xx answer read to its end, the
// only kind that measures the service time. Every refusal is written by
// dispatcher/apierror, at the one exit below.
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
// Bodies being read and queued share one memory budget (MaxQueuedBytes,
// dispatcher/budget). A body's buffer grows as its bytes arrive, doubling
// from 4 KiB up to its declared length (or MaxBodyBytes), and every growth
// is charged before it is made, so a request holds at most twice what it
// sent plus 4 KiB, and a large declared Content-Length reserves nothing.
// A request whose declared length does not fit what is free, or whose
// buffer would outgrow it, gets 503 overloaded at once; the rest of its
// body is then read and thrown away (bounded by MaxBodyBytes and
// BodyTimeout, holding nothing) so that clients still sending see the
// answer instead of a broken pipe, and the connection is closed. The charge is released
// once, when the request is dispatched (from then on it is in flight, and
// the slots bound the bodies in flight to slots × MaxBodyBytes), or when
// it ends any other way: refused, abandoned, expired or drained. Exempt
// paths stream their body to the backend, hold none and are not charged.
//
// Tokens (docs/tokens.md, dispatcher/tokens; tokens.go): once the body is
// read, the request's cost is estimated (the pool's learned bytes per
// token, the policy's defaultMaxTokens) and, when its tenant has a budget
// (the tenant's Limits, else its tier's, else the default tier's for an
// unlisted tenant), reserved from it before the queue is asked. A
// reservation that does not fit gets 429 rate_limited at once, never
// queued; a Limiter that fails gets 503 unavailable. An admitted request is
// settled exactly once when it ends, before the exit writes anything: one
// that never reached a backend is refunded, request included; any other is
// charged what its answer's usage says (a Meter watches the bytes of a 2xx
// answer as they go to the client), else its prompt estimate and the
// content chunks it streamed. Every answer after the reservation, success
// or refusal, carries the x-ratelimit-* headers of the latest Decision, set
// as its head goes out; a backend's own are replaced. Answers that report
// usage teach the pool's bytes-per-token Ratio, which outlives policies.
// Bodies of 64 KiB and more are estimated GOMAXPROCS at a time: decoding a
// prompt copies it, and this bounds what those copies hold at once.
//
// One exit: every stage (serve, queueAndForward, forward, settle,
// forwardExempt, the refusals) returns an outcome (a refusal, a code set
// without writing, an abandoned stage, an error) and only ServeHTTP writes
// it and counts it, once per request: rejections_total by cause,
// abandoned_total by stage, requests_total by the status a capturing
// writer saw, or the outcome's 499 (the client left first) or 502 (the
// backend cut a stream it had started). The series it counts on always
// exists (the policy's, or one made for a tier or pool it lacks).
//
// Concurrency model: one goroutine per request (net/http). The per-policy
// state (identifier, exempt paths, tier waits) is an immutable value swapped
// atomically by SetPolicy; the queue, balancer and metrics are safe for
// concurrent use. Per-request state (an exchange, taken from a sync.Pool)
// belongs to the request's goroutine. A counter of requests inside the handler lets drain
// wait for them.
package server
