// Package balancer picks a backend for each dispatched request: the one
// with the fewest outstanding requests (docs/architecture.md#the-data-path), ties
// round-robin, among the backends that passive health checking keeps in
// service.
//
// Passive health: every request ends with an Outcome (Done). A run of
// Failed outcomes (5xx answers, broken responses) or of Unreachable and
// Dropped ones (refused connections, connections closed unanswered) ejects
// the backend for a back-off that doubles with each ejection in a row,
// from Health.BaseEjection up to Health.MaxEjection. When it ends the
// backend is half-open: Pick sends it one probe request, whose success
// restores it and whose failure ejects it again. The back-off starts over
// once a backend has stayed in service for MaxEjection. A backend is never
// ejected when it is the last one in service; if every backend is out
// anyway (the set changed), Pick uses the one whose ejection ends first.
// Consecutive failures also count into a backend's score, so one that
// fails fast never looks least loaded.
//
// The package is pure: it imports no net/http and takes an injected clock.
//
// Concurrency model: the backend set is an immutable slice swapped
// atomically by Update; each backend's counts and health are atomics. Pick
// scans the set without a lock, so two concurrent picks may both choose
// the same least-loaded backend; the imbalance is at most the number of
// concurrent picks and corrects itself on the next pick. The probe of a
// half-open backend is taken with a compare-and-swap, so exactly one
// request probes it. Health transitions (eject, restore) and Update are
// serialised by one mutex. A backend that Update keeps (same address and
// scheme) keeps its counts and health; one that is removed while it still
// runs requests is remembered until they end, so it keeps counting them
// if it comes back.
package balancer
