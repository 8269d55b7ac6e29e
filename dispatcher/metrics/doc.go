// Package metrics defines every dispatcher metric of docs/architecture.md#metrics
// (prefix tiergate_). Labels never include a tenant.
//
// Two kinds:
//   - events the data path observes (queue_wait_seconds, service_seconds,
//     rejections_total, abandoned_total, requests_total, tokens_total,
//     token_estimate_error_ratio), kept in vectors;
//   - levels read at scrape time from a Snapshot function (queue_length,
//     queue_bound, oldest_queued_age_seconds, inflight, slots, utilisation,
//     backend_inflight, policy_version, queued_body_bytes,
//     queued_body_budget_bytes, bytes_per_token, and, where a tier uses
//     them, queue_tokens, queue_token_bound, fairness_gap_tokens and
//     fairness_gap_bound_tokens), so they are never
//     stale and a tier or backend that went away simply stops appearing.
//
// SetTiers deletes the event series of tiers (and of a pool) that the
// current policy no longer has. Series is one pool and tier's event series,
// each looked up once and kept, so the data path pays no label hashing per
// request.
//
// Concurrency: the vectors and a Series (atomic pointers to its children)
// are safe for concurrent use; SetTiers is
// serialised by a mutex; the Snapshot function must be safe to call from
// the scrape goroutine.
package metrics
