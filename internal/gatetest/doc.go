// Package gatetest holds what every implementation of the queue's
// gate.Gate is tested with: Fleet, an in-memory fleet-wide store with exact
// counts whose per-dispatcher Fakes the queue's own tests use, and Run, a
// conformance suite of cases (bounds, refusals with exact counts, claims
// and returns, tenant caps, exactly-once accounting, lease expiry, the
// hand-off of freed slots to a waiting dispatcher) that the Fake (with
// HandOff on) and the Redis Gate of dispatcher/fleet both pass.
//
// It is for tests only: it imports package testing.
//
// Concurrency model: a Fleet is safe for concurrent use; one mutex guards
// its counts. An Exchange held by Hold waits outside that mutex, so the
// test and other dispatchers keep using the fleet meanwhile.
package gatetest
