// Package queue is tiergate's ageing, bounded priority queue with per-tenant
// concurrency caps (DESIGN.md section 5). It decides which admitted request
// gets the next free slot of the model pool, refuses work that could not be
// served in time, and measures drain rates and service time.
//
// Algorithm:
//   - Ageing is a static key: key = base × ageingRate + enqueueTime, in
//     nanoseconds, ties broken by arrival sequence. Smaller is served first.
//     No rescoring; keys change only when a policy changes the rate or a base.
//   - One FIFO per tenant (already in key order, since a tenant's jobs share a
//     tier) and one heap of runnable tenants (work queued, under their cap)
//     keyed by their head job. A capped tenant leaves the heap and returns
//     when one of its slots frees: dispatch is O(log T).
//   - A queued job is removed through its Handle in O(log T): a head job
//     re-keys its tenant, a middle job unlinks from the intrusive FIFO.
//   - Each tier keeps an arrival-ordered list; one timer, armed for the
//     oldest queued job, expires jobs after clientTimeout with no new
//     arrivals needed.
//
// Concurrency model: one mutex guards all state; every operation, including
// dispatch, runs inline under it, triggered by an event (Admit, Release,
// Wait's cancellation, UpdatePolicy, Kick, the expiry timer). Nothing polls
// or sleeps, and all time comes from the injected clock. Wait parks on a
// per-job channel outside the lock. The expiry timer's callback takes the
// lock on a fresh goroutine, because a k8s.io/utils FakeClock runs
// callbacks while holding its own lock; with a FakeClock, call ExpireDue
// after stepping the clock for deterministic expiry (NextDeadline says when).
//
// Fleet mode: WithGate puts a shared Gate (Redis, in dispatcher/state) in
// front of the local counts; the queue calls it under its lock. Local mode
// (no gate) is the default. In local mode a request whose tenant is under its
// cap while a slot is free runs at once, even if its tier's queue is at its
// bound (the bound limits waiting, not running).
//
// Additions to the agreed API (/tmp/tg/queue-api.md), all backward
// compatible: ExpireDue and NextDeadline (for discrete-event drivers),
// Stats.Totals (lifetime counts: Admitted = Dispatched + Abandoned + Expired
// + Drained once idle), Stats.Draining, TierStats.InFlight and .Retired,
// Stats.Measured (the policy Ack's figures), Refusal.CauseLabel with
// CauseCapacity/CauseTenantLimit, AcquireResult.String, and the options
// WithDrainWindow and WithServiceTimeWeight. Semantics worth knowing:
// Handle.Position is 0 for a job dispatched without queueing; Release on a
// still-queued handle abandons it (its Wait returns context.Canceled);
// every Gate call names the job's admission tier; a tier removed by a policy
// keeps its queued jobs (Admit refuses it with ErrUnknownTier) and a listed
// tenant moved to another tier takes its queued jobs along, so a policy
// change can leave a tier above its new bound until it drains (admission
// never does).
package queue
