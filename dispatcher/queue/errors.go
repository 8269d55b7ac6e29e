package queue

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel errors, matched with errors.Is. The dispatcher maps them to HTTP
// statuses in one place.
var (
	// ErrQueueFull: the tier queue is at its bound (429 "capacity").
	ErrQueueFull = errors.New("queue: tier queue is full")
	// ErrTenantLimit: the tenant's queued count is at its limit (429 "tenant_limit").
	ErrTenantLimit = errors.New("queue: tenant queue limit reached")
	// ErrUnknownTier: the tier is not in the policy.
	ErrUnknownTier = errors.New("queue: unknown tier")
	// ErrNoPolicy: no policy has been applied yet (503 "unavailable").
	ErrNoPolicy = errors.New("queue: no policy")
	// ErrNoCapacity: the policy has 0 slots, e.g. the pool is scaled to zero (503 "unavailable").
	ErrNoCapacity = errors.New("queue: no capacity")
	// ErrDraining: Drain was called; Admit refuses (503 "draining").
	ErrDraining = errors.New("queue: draining")
	// ErrExpired: Wait ended because the job was queued longer than clientTimeout (504).
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

// CauseLabel is the refusal's cause as used in the HTTP body and metrics:
// "capacity" or "tenant_limit".
func (r *Refusal) CauseLabel() string { return causeLabel(r.Cause) }

func causeLabel(err error) string {
	if errors.Is(err, ErrTenantLimit) {
		return CauseTenantLimit
	}
	return CauseCapacity
}

// Refusal causes as they appear in TierStats.Refused and the HTTP body.
const (
	CauseCapacity    = "capacity"
	CauseTenantLimit = "tenant_limit"
)
