// Package limitertest is the conformance suite of tokens.Limiter, the
// per-tenant token budgets of issue 22: Run holds an implementation to
// the bucket semantics every implementation shares, whether it keeps its
// buckets in memory (tokens.Local, on a fake clock) or in Redis
// (dispatcher/fleet's Budgets, on Redis's own clock). The cases: a new
// bucket is full; both buckets or neither; refusals with their budget,
// Never and RetryAfter; settlements that give back and take (below 0, by
// at most two windows' worth, and never below one window's debt);
// refunded requests; negative counts; lowered and raised limits; no
// budget; the header values; independent keys; limiters sharing a store;
// and the fleet property, that K limiters sharing one store under 32
// concurrent clients never admit more than the budget plus its refill
// over the elapsed time.
//
// A store on a real clock moves between calls: expected levels, waits and
// resets are then checked within the harness's Slack, and the refill it
// may add. On a fake clock Slack is 0 and every value is exact.
//
// It is for tests only: it imports package testing.
//
// Concurrency model: Run and its cases run on the test's goroutine, except
// the fleet case, whose 32 clients call the Limiters concurrently and
// count what they were admitted with atomics.
package limitertest
