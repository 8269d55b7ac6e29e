// Package apierror is the one place where the dispatcher's refusals become
// HTTP: the status, the headers (Retry-After, X-Queue-Position, X-Tier, and
// X-Should-Retry: false for a request no wait can help) and the JSON body
//
//	{"error":{"type":"…","message":"…","tier":"…","queue_position":N,"retry_after_seconds":N}}
//
// that docs/architecture.md#answers-and-refusals fixes. The causes (the body's "type", also the
// cause label of tiergate_rejections_total) are dispatcher/queue's Cause
// constants; one table here gives each its HTTP status. FromQueue maps the queue's
// errors (errors.As on *queue.Refusal for the tier, position and
// Retry-After) and FromIdentity the identity errors (errors.As on
// *identity.Error for the reason and tenant), RateLimited a refusal of the
// tenant's budgets (a tokens.Decision); the other constructors cover
// refusals made before the queue is asked.
//
// Concurrency: everything here is a pure function of its arguments.
package apierror
