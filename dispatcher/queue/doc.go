// Package queue is tiergate's ageing, bounded priority queue with per-tenant
// concurrency caps (docs/architecture.md#the-queue). It decides which admitted request
// gets the next free slot of the model pool, refuses work that could not be
// served in time, and measures drain rates and service time.
//
// Job: Admit refuses a request (draining, no policy, unknown tier, no
// capacity, the tier's bound, the tenant's queue limit) or returns a Handle.
// The tier is the one the policy in force gives the tenant, decided under
// the lock, whatever policy the caller identified it under. The handle's
// Wait returns once the job holds a slot, and Release gives the slot back;
// ReleaseServed does too and makes the job a service-time sample. A job that never gets one ends queued: abandoned (its context
// ended, or Release on a queued handle), expired (queued longer than the
// policy's clientTimeout) or drained (FlushQueued). Every admitted job ends
// exactly once, and Stats.Totals counts each end.
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
//   - In local mode a request whose tenant is under its cap while a slot is
//     free runs at once, even if its tier's queue is at its bound: the bound
//     limits waiting, not running.
//   - At zero slots a policy that holds for a cold start
//     (policy.HoldsForColdStart) admits requests within the bounds and
//     holds them as queued jobs with no slot; a tier with bound 0 is
//     refused (*ColdStartRefusal). Without a cold start 0 slots refuse
//     everything (ErrNoCapacity). The first policy with slots dispatches
//     the held jobs in key order; until then they expire, are abandoned
//     or drained like any queued job.
//   - Each tier meters its offered load (offered.go): admitted requests
//     and those refused for want of room, an exponentially weighted rate
//     over about a minute, reported in Stats and the policy Ack.
//
// Fairness within a tier (docs/scheduling.md#fairness-within-a-tier): in
// the policy's Requests mode (the default) the structures above serve a
// tier's jobs by age. In Tokens mode (fair.go) the order between tiers is
// the same ageing key, and within a tier the slot goes to the oldest job of
// the runnable tenant with the smallest Virtual Token Counter: the
// weighted tokens of its reservations (AdmitCost's Cost) charged at
// dispatch, corrected by Handle.Settle, divided by its weight; a tenant
// that becomes backlogged is lifted to the tier's smallest backlogged
// counter. Each tier keeps three indexed heaps of tenants (runnable by
// head key, runnable by counter, backlogged by counter) and a heap of
// tiers orders them: O(log T) per operation. A policy that switches mode
// rebuilds them in O(n) and starts counters from zero. Counters of idle
// tenants are kept only while above the floor a lift would give them.
//
// Token bounds: a tier with QueueTokenBound bounds its queue in weighted
// tokens instead of requests (a lone request larger than the bound enters
// an empty tier queue), with Retry-After from its token drain rate. Settle
// and ReleaseServed together measure the weighted tokens served per slot
// second (Stats.TokensPerSlotSecond). WithCounterSink and
// ApplySharedCounters are the seam for counters shared across a fleet.
//
// Fleet mode (WithGate): a gate.Gate makes the bounds, slots and tenant
// limits exact across every dispatcher of a pool; queue order stays local.
// Admit reserves a queued place with Gate.Enqueue; dispatch claims the best
// runnable jobs locally (counted against the local slots and limits while
// their acquire is in flight) and a pump asks the Gate for their slots with
// Gate.Exchange, which also returns every lease of a job that ended. A
// refusal blocks the pool (PoolFull) or the tenant (TenantFull) until Kick,
// a policy or one of its own releases. A job abandoned, expired or drained
// while its claim is in flight ends at once; the exchange's answer then
// returns whatever it got, so every lease is returned exactly once.
//
// Concurrency model: one mutex guards all state; the counter sink is
// called under it and must not block. Every local operation,
// including dispatch in local mode, runs inline under it, triggered by an
// event (Admit, Release, Wait's cancellation, UpdatePolicy, Kick, the
// expiry timer); nothing polls or sleeps, and all time comes from the
// injected clock. Wait parks on a per-job channel outside the lock. The
// expiry timer's callback takes the lock on a fresh goroutine, because a
// k8s.io/utils FakeClock runs callbacks while holding its own lock; with a
// FakeClock, call ExpireDue after stepping the clock for deterministic
// expiry (NextDeadline says when). The Gate is never called with the lock
// held: Admit calls Enqueue between two critical sections, and the pump, at
// most one goroutine at a time, started on demand and ending when idle,
// calls Exchange between them. A slow Gate therefore delays only the
// admissions and dispatches that wait for its answer, never Stats, local
// refusals or other callers.
package queue
