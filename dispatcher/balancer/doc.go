// Package balancer picks the backend with the fewest outstanding requests
// (ties go round-robin), the rule DESIGN.md section 6 asks for.
//
// Concurrency model: the backend set is an immutable slice swapped
// atomically by Update; each backend's outstanding count is an atomic
// counter. Pick scans the set without a lock, so two concurrent picks may
// both choose the same least-loaded backend; the imbalance is at most the
// number of concurrent picks and corrects itself on the next pick. A backend
// that Update keeps (same address and scheme) keeps its count; one that is
// removed finishes its outstanding requests and is forgotten.
package balancer
