package queue

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel errors, matched with errors.Is. dispatcher/apierror maps them to
// HTTP statuses; the comments name the status and the Cause.
var (
	// ErrQueueFull: the tier queue is at its bound (429 "capacity").
	ErrQueueFull = errors.New("queue: tier queue is full")
	// ErrTenantLimit: the tenant's queued count is at its limit (429 "tenant_limit").
	ErrTenantLimit = errors.New("queue: tenant queue limit reached")
	// ErrUnknownTier: the tier is not in the policy (403 "unknown_tenant").
	ErrUnknownTier = errors.New("queue: unknown tier")
	// ErrNoPolicy: no policy has been applied yet (503 "unavailable").
	ErrNoPolicy = errors.New("queue: no policy")
	// ErrNoCapacity: the policy has 0 slots, e.g. the pool is scaled to zero (503 "unavailable").
	ErrNoCapacity = errors.New("queue: no capacity")
	// ErrDraining: Drain was called; Admit refuses (503 "draining").
	ErrDraining = errors.New("queue: draining")
	// ErrExpired: Wait ended because the job was queued longer than clientTimeout (504 "queue_timeout").
	ErrExpired = errors.New("queue: expired in queue")
	// ErrDrained: Wait ended because FlushQueued removed the job (503 "draining").
	ErrDrained = errors.New("queue: drained")
)

// Refusal is the error Admit returns for ErrQueueFull and ErrTenantLimit;
// get it with errors.As. errors.Is(err, ErrQueueFull) also works.
type Refusal struct {
	// Cause is ErrQueueFull or ErrTenantLimit.
	Cause error
	Tier  string
	// Position is the would-be 1-based position in the tier queue
	// (queued in the tier + 1).
	Position int
	// RetryAfter is a whole number of seconds in [1s, tier W].
	RetryAfter time.Duration
}

func (r *Refusal) Error() string {
	return fmt.Sprintf("%v: tier %q, position %d, retry after %s", r.Cause, r.Tier, r.Position, r.RetryAfter)
}

func (r *Refusal) Unwrap() error { return r.Cause }

// ColdStartRefusal is the error Admit returns while the pool is at zero
// replicas and holds requests for its first replica (the policy holds for
// a cold start), for a tier whose bound at zero is 0: its tolerable wait
// does not outlast the cold start, so it is refused at once rather than
// held. It wraps ErrNoCapacity (503 "unavailable"); get it with errors.As.
type ColdStartRefusal struct {
	Tier string
	// ColdStart is the policy's coldStartSeconds: how long the first
	// replica is expected to take.
	ColdStart time.Duration
}

func (r *ColdStartRefusal) Error() string {
	return fmt.Sprintf("%v: the pool is starting from zero replicas (cold start %s) and tier %q cannot wait that long", ErrNoCapacity, r.ColdStart, r.Tier)
}

func (r *ColdStartRefusal) Unwrap() error { return ErrNoCapacity }

// CauseLabel is the refusal's cause: CauseCapacity or CauseTenantLimit.
func (r *Refusal) CauseLabel() string { return causeLabel(r.Cause) }

func causeLabel(err error) string {
	if errors.Is(err, ErrTenantLimit) {
		return CauseTenantLimit
	}
	return CauseCapacity
}

// Causes of refusal: the "type" of a refused request's JSON body, the cause
// label of tiergate_rejections_total and the keys of TierStats.Refused.
// Every refusal the dispatcher makes, in the queue or before it, has one of
// these; they live here, in the lowest package that every refusal path
// shares, so that each is spelled once. dispatcher/apierror gives each its
// HTTP status. The statuses in the comments are that mapping.
const (
	CauseCapacity         = "capacity"           // 429: the tier queue is at its bound
	CauseTenantLimit      = "tenant_limit"       // 429: the tenant has its share of the tier queue
	CauseUnauthenticated  = "unauthenticated"    // 401: no credential, or an unknown one
	CauseUnknownTenant    = "unknown_tenant"     // 403: a tenant the policy does not list, no default tier
	CauseUnavailable      = "unavailable"        // 503: no policy, no capacity, no backend or a Gate failure
	CauseDraining         = "draining"           // 503: the dispatcher is shutting down
	CauseQueueTimeout     = "queue_timeout"      // 504: queued for the client timeout
	CauseBodyTooLarge     = "body_too_large"     // 413: a body over --max-body-bytes
	CauseBadRequest       = "bad_request"        // 400: a malformed credential or body
	CauseRequestTimeout   = "request_timeout"    // 408: the body arrived too slowly
	CauseBackendError     = "backend_error"      // 502: the backend failed before answering
	CauseMethodNotAllowed = "method_not_allowed" // 405: CONNECT, which the dispatcher never tunnels
	CauseOverloaded       = "overloaded"         // 503: the bodies held would exceed --max-queued-bytes
	CauseBackendTimeout   = "backend_timeout"    // 504: the backend sent no response head in time
	CauseRateLimited      = "rate_limited"       // 429: the tenant's requests or tokens budget cannot take the request now
)

// Causes lists every cause above, in that order; each call returns a new
// slice.
func Causes() []string {
	return []string{
		CauseCapacity, CauseTenantLimit, CauseUnauthenticated, CauseUnknownTenant, CauseUnavailable,
		CauseDraining, CauseQueueTimeout, CauseBodyTooLarge, CauseBadRequest, CauseRequestTimeout, CauseBackendError,
		CauseMethodNotAllowed,
		CauseOverloaded, CauseBackendTimeout, CauseRateLimited,
	}
}
