// Package simulate runs a tier configuration against synthetic traffic
// before it is applied: `tiergate simulate -f pool.yaml -f tiers.yaml -f
// load.yaml`.
//
// It reads ModelPool, ServiceTier and TenantQuota documents with the API
// types and the scheme's strict decoder, applies the CRD defaults that the
// API server would (input.go), and computes the bounds with the
// controller's own code (capacity.ComputeBounds, for the Load's
// dispatchers). The traffic is a Load document (load.go). A run is made of:
//
//   - the event loop (engine.go): simulated time jumps from one event to
//     the next on a fake clock, stopping at every queue expiry deadline;
//   - the clients (clients.go): arrival processes, attempts, refusals and
//     retries after Retry-After, client timeouts, closed-loop think time;
//   - the dispatchers (fleet.go): one scheduler each, with its slice of
//     the pool in Local mode (one with the pool-wide numbers in Redis
//     mode), attempts spread round-robin;
//   - the scheduler (scheduler.go): the interface through which the engine
//     admits, withdraws and releases requests, learns their outcomes,
//     expires them and pushes policies. queueScheduler
//     (scheduler_queue.go) puts the real dispatcher/queue behind it,
//     baselineScheduler (scheduler_baseline.go) the fcfs, strict and seed
//     schedulers of internal/baseline that --compare runs on the same
//     traffic (compare.go, report_compare.go, plot_compare.go), next to
//     tiergate's variants vtc and vtc-tokenbound, which run a copy of the
//     pool changed to fairness mode Tokens (and boundBy Tokens) through
//     the same path;
//   - the service model (service.go): a dispatched request holds its slot
//     for a drawn service time (dist.go), or, with the pool's declared
//     token rates (spec.tokens, pool_tokens.go), for its prompt ÷
//     prefill plus output ÷ decode, then completes or is cancelled; the
//     queue is told what it used (Settle) before its slot is released,
//     as served (ReleaseServed) when its client got the answer;
//   - the budgets (budgets.go): a request's tokens are drawn
//     (load_tokens.go); each dispatcher reserves them in a tokens.Local on
//     the fake clock under its policy's budgets before the queue sees the
//     request, refuses with rate_limited what does not fit, refunds what
//     never reached a backend and settles the rest on what it used;
//   - policy changes (bounds.go): at every replica change the bounds are
//     recomputed and pushed with a new version; at zero replicas with
//     spec.coldStart the real queue holds requests within the bounds at
//     zero, and zero.go counts what was held and warns of the phase;
//   - accounting (accounting.go): counts, waits, time-weighted queue
//     lengths, goodput, wasted service, SLO attainment, Jain's index over
//     throughput and over weighted tokens (jainTokens) after the warm-up,
//     per tier and per tenant, turned into a Result
//     (result.go) and printed (report.go, plot.go).
//
// Concurrency model: a run is single-threaded; Run makes one run per
// scheduler, one after the other, and independent runs may go on
// concurrently (they share only their read-only Input). The queue's
// Handle.Wait blocks, so queueScheduler parks one goroutine in Wait per
// queued request, which reports its outcome on a channel; after every queue
// operation it collects exactly the outcomes the queue's Stats say were
// resolved and hands them over in request order, so a run never depends on
// goroutine scheduling. Each tenant draws its arrivals and service times
// from its own PCG stream seeded by (seed, tenant name), a closed-loop
// tenant its service times from a second one, and every tenant its token
// counts from a third: the same seed gives the same Result and the same
// traffic to every scheduler, and adding a tenant does not change the
// others' traffic.
package simulate
