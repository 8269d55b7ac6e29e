// Package simulate runs a tier configuration against synthetic traffic
// before it is applied: `tiergate simulate -f pool.yaml -f tiers.yaml -f
// load.yaml`.
//
// It reads ModelPool, ServiceTier and TenantQuota documents with the API
// types and the scheme's strict decoder, applies the CRD defaults that the
// API server would (input.go), and computes the bounds with the
// controller's own code (capacity.ComputeBounds, one dispatcher in Local
// mode). The traffic is a Load document (load.go). A run is made of:
//
//   - the event loop (engine.go): simulated time jumps from one event to
//     the next on a fake clock, stopping at every queue expiry deadline;
//   - the clients (clients.go): arrival processes, attempts, refusals and
//     retries after Retry-After, client timeouts, closed-loop think time;
//   - the scheduler (scheduler.go): the interface through which the engine
//     admits, withdraws and releases requests, learns their outcomes,
//     expires them and pushes policies. queueScheduler
//     (scheduler_queue.go) puts the real dispatcher/queue behind it;
//   - the service model (service.go): a dispatched request holds its slot
//     for a drawn service time (dist.go), then completes or is cancelled;
//   - policy changes (bounds.go): at every replica change the bounds are
//     recomputed and pushed with a new version;
//   - accounting (accounting.go): counts, waits and time-weighted queue
//     lengths after the warm-up, per tier and per tenant, turned into a
//     Result (result.go) and printed (report.go, plot.go).
//
// Concurrency model: a run is single-threaded. The queue's Handle.Wait
// blocks, so queueScheduler parks one goroutine in Wait per queued request,
// which reports its outcome on a channel; after every queue operation it
// collects exactly the outcomes the queue's Stats say were resolved and
// hands them over in request order, so a run never depends on goroutine
// scheduling. Each tenant draws its arrivals and service times from its own
// PCG stream seeded by (seed, tenant name): the same seed gives the same
// Result, and adding a tenant does not change the others' traffic.
package simulate
