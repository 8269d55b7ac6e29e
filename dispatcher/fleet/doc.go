// Package fleet is the dispatcher's fleet mode (docs/fleet.md): a
// gate.Gate on Redis that makes tier bounds, tenant queue limits, pool
// slots and tenant concurrency limits exact across every dispatcher replica
// of a pool. Local mode (--state=local, the default) needs none of it.
//
// Counting. Every queued place and every in-flight slot is a lease: a
// member "<dispatcherID>:<n>" of Redis sorted sets (per tier and per tenant
// for queued places; per pool and per tenant for slots) scored by its
// expiry in Redis server time. A job keeps one member from admission to
// its end; granting it a slot moves the member from the queued sets to the
// slot sets. Four Lua scripts do all the work, each one EVALSHA round trip:
// enqueue (tier bound, then tenant queue limit, then add), exchange (first
// remove what the queue gives back, then decide its claims in order: pool
// slots, then tenant limit, then move the member; it announces freed slots
// on the pool's channel), remove (replays and leaving) and renew. Each
// script first drops expired members of what it counts, so counts are
// exact over live leases. Every key of a pool carries the hash tag {pool},
// so the scripts run on Redis Cluster.
//
// Leases. The owner renews all its leases in one batch every renew
// interval (renewScript, one round trip per pool) and registers itself in
// the pool's dispatcher set. A crashed dispatcher stops renewing, so its
// capacity returns within the lease TTL; a dispatcher blocked by a full
// set is told by the script when the earliest lease expires and re-checks
// then.
//
// Waking up. An exchange that frees slots publishes on tg:{pool}:freed;
// every other dispatcher's subscriber turns that into queue.Kick. A queue
// the fleet has blocked also re-checks on a timer bounded by the re-check
// interval (lost messages, expired leases). Nothing polls: the timer is
// armed only by a refusal.
//
// Fair hand-off. A dispatcher refused for a full pool is starved for a
// while; the slots other dispatchers' returns free go to starved ones as
// short holds (HandoffHold) that count as used for everyone else, so a
// busy dispatcher cannot keep re-claiming what it frees.
//
// Degraded mode. When a Redis call fails or times out (OpTimeout), the
// Gate logs once, sets tiergate_state_degraded to 1 and answers from its
// own ledger: this dispatcher's slice of the pool-wide numbers, split as
// local mode splits them (slots evenly over the dispatchers Redis last
// listed, the rest scaled by the slot fraction, never below 1). Requests
// keep flowing; none waits on Redis. The renewal loop keeps trying; when
// Redis answers it replays the removals Redis missed, writes back every
// lease the dispatcher holds (reconciliation), and fleet mode resumes.
//
// Budgets. Budgets (from Redis.Budgets) is the tokens.Limiter of fleet
// mode: each tenant's request and token buckets are one hash under the
// pool's hash tag, and Reserve and Settle are one script round trip each
// (reserveScript, settleScript), refilled by Redis's TIME, so every
// dispatcher of the pool takes from the same budgets. A failed call is an
// error wrapping ErrBudgetsUnavailable; budgets have no degraded mode.
//
// Fairness counters. Counters (from Redis.Counters) shares the virtual
// token counters of Tokens fairness: one hash per tier under the pool's
// hash tag, to which each dispatcher adds its charges (HINCRBYFLOAT) and
// from which it reads the others' back in one script round trip
// (countersScript), every DefaultCounterSync while its queue has work.
// It hands the queue what the other dispatchers charged (the totals minus
// what it sent), so the queue's own charges count once.
//
// Concurrency model: the queue calls Enqueue (from every admission at
// once) and Exchange (from its pump, one at a time) without its own lock.
// One mutex guards the Gate's ledger and mode; it is never held across a
// Redis round trip, so concurrent calls go to Redis concurrently (go-redis
// keeps a pool of connections), and the Gate never calls back into the
// queue from a Gate method. Three goroutines, started by Start and stopped
// by Close: the renewal loop (ticker), the pub/sub subscriber and the
// waker, which calls the queue's Kick for coalesced wake-up signals.
// Budgets holds no state of its own: its calls run concurrently on the
// Gate's client. Counters guards its pending and sent deltas with its own
// mutex, never held across a round trip; its Run loop is one goroutine the
// dispatcher starts and stops.
package fleet
