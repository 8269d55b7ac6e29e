// Package apierror is the one place where the dispatcher's refusals become
// HTTP: the status, the headers (Retry-After, X-Queue-Position, X-Tier) and
// the JSON body
//
//	{"error":{"type":"…","message":"…","tier":"…","queue_position":N,"retry_after_seconds":N}}
//
// that DESIGN.md section 6 fixes. FromQueue maps the queue's sentinel errors;
// the other constructors cover refusals made before the queue is asked. The
// Type of an Error is also the "cause" label of tiergate_rejections_total.
//
// Concurrency: everything here is a pure function of its arguments.
package apierror
