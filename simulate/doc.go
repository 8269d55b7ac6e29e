// Package simulate runs a tier configuration against synthetic traffic
// before it is applied: `tiergate simulate -f pool.yaml -f tiers.yaml -f
// load.yaml`.
//
// It reads ModelPool, ServiceTier and TenantQuota documents with the API
// types and the scheme's strict decoder, applies the CRD defaults that the
// API server would, and computes the bounds with the controller's own code
// (capacity.ComputeBounds, one dispatcher in Local mode). The traffic is a
// Load document (load.go). The requests go through the real
// dispatcher/queue, driven by a fake clock in discrete events: arrivals,
// completions, client timeouts, retries after Retry-After, replica changes
// (which recompute the bounds and push a new policy) and queue expiry
// deadlines (NextDeadline, then ExpireDue). Figures are collected after the
// warm-up, per tier and per tenant.
//
// Concurrency model: a run is single-threaded. The queue's Handle.Wait
// blocks, so each queued request has one goroutine parked in Wait that
// reports its outcome on a channel; after every queue operation the engine
// collects exactly the outcomes the queue's Stats say were resolved and
// handles them in request order, so a run never depends on goroutine
// scheduling. Each tenant draws its arrivals and service times from its own
// PCG stream seeded by (seed, tenant name): the same seed gives the same
// Result, and adding a tenant does not change the others' traffic.
package simulate
