// Package baseline holds the schedulers tiergate is compared with: what a
// user would put in front of a model server instead of tiergate's queue.
//
//   - FCFS: one unbounded FIFO. No caps, no expiry, and it never notices
//     that a client left: a request whose client gave up is still
//     computed when its turn comes.
//   - Strict: strict priority by base priority, FIFO within a band of
//     equal priority, with per-tier queue bounds and expiry after the
//     client timeout, but no ageing and no tenant caps.
//   - Seed: the scheduler of the seed document as it describes itself: one
//     heap keyed by base priority, rescored (every key recomputed as base −
//     waited/rate, then re-heapified) by its run loop once a second has
//     passed and more than 16 jobs are queued; a dispatch pops jobs until
//     one's tenant is under its cap and pushes the capped ones back; its
//     bounds and caps come from its own formulas (SeedLimits).
//
// Each is written from a description of the algorithm, not from anyone's
// code. They are small on purpose: the simulator drives them through the
// same seam as the real queue, and dispatcher/queue's benchmarks time Seed
// against the real queue.
//
// A job's tier is an index into the tiers the scheduler was built with.
// Time is a time.Duration on the caller's clock, passed to every call that
// needs it; nothing here reads a clock, sleeps or starts a goroutine.
//
// Concurrency model: none. A scheduler is not safe for concurrent use; the
// caller serialises every call, as a single-threaded event loop does.
package baseline
