// Package capacity is the bounds computation of docs/architecture.md#the-bounds: from a
// ModelPool's spec, its ready replicas, its ServiceTiers and TenantQuotas
// to the status values and to one Policy per dispatcher. The controller and
// `tiergate simulate` both call ComputeBounds, so what the simulator shows
// is what the controller pushes.
//
// ComputeBounds runs in named steps, each in its own file:
//
//   - rates.go: R, C and S give P = R × C and μ = P / S; every conversion
//     between requests and time goes through the rates type. At R = 0 with
//     spec.coldStart the bounds are those of the first replica, μ₁ = C / S
//     serving from the cold start on (docs/architecture.md#the-bounds).
//   - tiers.go: each tier's queue bound and tenant limits, then its maxWait.
//   - tokenbounds.go: with spec.tokens.boundBy Tokens, each tier's bound
//     in weighted tokens, P × r × min(W, clientTimeout), r declared (a
//     balanced reference request) or measured (docs/tokens.md).
//   - tenants.go: which TenantQuota is in force for a tenant, and which
//     tenant owns an API key listed twice.
//   - split.go: one Policy per dispatcher, with its slice of the pool.
//   - budgets.go: the tenants' budgets (requests and tokens per minute),
//     whole to every dispatcher in Redis mode and split over the serving
//     dispatchers, like the slots, in Local mode.
//
// demand.go is apart from ComputeBounds: DesiredReplicas applies Little's
// law to the offered load the dispatchers report and gives the replicas the
// pool needs (status.desiredReplicas).
//
// defaults.go holds the CRD defaults that both callers apply to objects
// that did not pass through the API server. All rounding is exact integer
// or rational arithmetic, so floor(4/s × 5s) is 20 and never 19.
//
// Concurrency model: none. The package holds no state, starts no
// goroutine and reads no clock; every function is safe to call from any
// goroutine, and the same input always gives the same output.
package capacity
