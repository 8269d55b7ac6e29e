package apierror

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/tiergate/tiergate/dispatcher/queue"
)

// Types: the "type" of the JSON body and the cause label of the metrics.
const (
	TypeCapacity        = "capacity"        // 429
	TypeTenantLimit     = "tenant_limit"    // 429
	TypeUnauthenticated = "unauthenticated" // 401
	TypeUnknownTenant   = "unknown_tenant"  // 403
	TypeUnavailable     = "unavailable"     // 503
	TypeDraining        = "draining"        // 503
	TypeQueueTimeout    = "queue_timeout"   // 504
	TypeBodyTooLarge    = "body_too_large"  // 413
	TypeBadRequest      = "bad_request"     // 400: malformed credentials or body
	TypeRequestTimeout  = "request_timeout" // 408: the body arrived too slowly
	TypeBackendError    = "backend_error"   // 502
)

// Header names of the refusal contract.
const (
	HeaderRetryAfter    = "Retry-After"
	HeaderQueuePosition = "X-Queue-Position"
	HeaderTier          = "X-Tier"
	// HeaderQueueWaitMs is set on successful responses: milliseconds queued.
	HeaderQueueWaitMs = "X-Queue-Wait-Ms"
)

// Error is one refusal. Write sends it.
type Error struct {
	Status  int
	Type    string
	Message string
	Tier    string
	// Position is the 1-based queue position; 0 leaves out X-Queue-Position.
	Position int
	// RetryAfter is rounded up to whole seconds; 0 leaves out Retry-After.
	RetryAfter time.Duration
}

func (e *Error) Error() string { return e.Type + ": " + e.Message }

// body is the JSON shape; every field is always present so clients can
// parse every refusal the same way.
type body struct {
	Error bodyError `json:"error"`
}

type bodyError struct {
	Type              string `json:"type"`
	Message           string `json:"message"`
	Tier              string `json:"tier"`
	QueuePosition     int    `json:"queue_position"`
	RetryAfterSeconds int    `json:"retry_after_seconds"`
}

// RetryAfterSeconds is RetryAfter in whole seconds, rounded up.
func (e *Error) RetryAfterSeconds() int {
	if e.RetryAfter <= 0 {
		return 0
	}
	return int(math.Ceil(e.RetryAfter.Seconds()))
}

// Write sends the refusal. It must be called before anything else was
// written to w.
func (e *Error) Write(w http.ResponseWriter) {
	ra := e.RetryAfterSeconds()
	b, _ := json.Marshal(body{Error: bodyError{
		Type: e.Type, Message: e.Message, Tier: e.Tier, QueuePosition: e.Position, RetryAfterSeconds: ra,
	}})
	b = append(b, '\n')
	h := w.Header()
	// A refusal replaces whatever a success path had prepared.
	h.Del(HeaderQueueWaitMs)
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	h.Set("Cache-Control", "no-store")
	if ra > 0 {
		h.Set(HeaderRetryAfter, strconv.Itoa(ra))
	}
	if e.Position > 0 {
		h.Set(HeaderQueuePosition, strconv.Itoa(e.Position))
	}
	if e.Tier != "" {
		h.Set(HeaderTier, e.Tier)
	}
	w.WriteHeader(e.Status)
	_, _ = w.Write(b)
}

// unavailableRetry is the Retry-After of 503s: a dispatcher without a policy
// or draining is expected to be replaced or configured within a second.
const unavailableRetry = time.Second

// FromQueue maps an error of queue.Admit or Handle.Wait to its refusal.
// tenant and tier name the request; tierWait is the tier's tolerable wait
// (used as Retry-After when the pool has no capacity) and clientTimeout the
// policy's queue expiry (for the 504 message).
func FromQueue(err error, tenant, tier string, tierWait, clientTimeout time.Duration) *Error {
	var ref *queue.Refusal
	switch {
	case errors.As(err, &ref):
		e := &Error{Status: http.StatusTooManyRequests, Tier: tier, Position: ref.Position, RetryAfter: ref.RetryAfter}
		if errors.Is(ref.Cause, queue.ErrTenantLimit) {
			e.Type = TypeTenantLimit
			e.Message = fmt.Sprintf("tenant %q has as many requests queued as tier %q allows one tenant; retry after %ds", tenant, tier, e.RetryAfterSeconds())
		} else {
			e.Type = TypeCapacity
			e.Message = fmt.Sprintf("the queue of tier %q is full; retry after %ds", tier, e.RetryAfterSeconds())
		}
		return e
	case errors.Is(err, queue.ErrUnknownTier):
		return UnknownTenant(tenant)
	case errors.Is(err, queue.ErrNoPolicy):
		return NoPolicy()
	case errors.Is(err, queue.ErrNoCapacity):
		return &Error{Status: http.StatusServiceUnavailable, Type: TypeUnavailable, Tier: tier,
			RetryAfter: max(tierWait, time.Second),
			Message:    "the pool has no capacity right now (no ready backends)"}
	case errors.Is(err, queue.ErrDraining), errors.Is(err, queue.ErrDrained):
		e := Draining()
		e.Tier = tier
		return e
	case errors.Is(err, queue.ErrExpired):
		return &Error{Status: http.StatusGatewayTimeout, Type: TypeQueueTimeout, Tier: tier,
			Message: fmt.Sprintf("the request waited in the queue of tier %q for the client timeout (%s) without being dispatched", tier, clientTimeout)}
	default:
		// A fleet-state failure (a Gate error) or anything unforeseen.
		return &Error{Status: http.StatusServiceUnavailable, Type: TypeUnavailable, Tier: tier,
			RetryAfter: unavailableRetry, Message: "admission failed: " + err.Error()}
	}
}

// NoPolicy is the 503 of a dispatcher that has not been configured yet.
func NoPolicy() *Error {
	return &Error{Status: http.StatusServiceUnavailable, Type: TypeUnavailable, RetryAfter: unavailableRetry,
		Message: "the dispatcher has no policy yet"}
}

// NoBackend is the 503 when a request may proceed but no backend is known.
func NoBackend(tier string) *Error {
	return &Error{Status: http.StatusServiceUnavailable, Type: TypeUnavailable, Tier: tier, RetryAfter: unavailableRetry,
		Message: "no ready backend"}
}

// Draining is the 503 of a dispatcher that is shutting down.
func Draining() *Error {
	return &Error{Status: http.StatusServiceUnavailable, Type: TypeDraining, RetryAfter: unavailableRetry,
		Message: "the dispatcher is shutting down; retry on another instance"}
}

// Unauthenticated is the 401 for a missing or unknown credential.
func Unauthenticated(msg string) *Error {
	return &Error{Status: http.StatusUnauthorized, Type: TypeUnauthenticated, Message: msg}
}

// UnknownTenant is the 403 for a tenant the policy does not know when the
// pool has no default tier.
func UnknownTenant(tenant string) *Error {
	return &Error{Status: http.StatusForbidden, Type: TypeUnknownTenant,
		Message: fmt.Sprintf("tenant %q is not known and the pool has no default tier", tenant)}
}

// BadRequest is the 400 for malformed credentials or an unreadable body.
func BadRequest(msg string) *Error {
	return &Error{Status: http.StatusBadRequest, Type: TypeBadRequest, Message: msg}
}

// BodyTooLarge is the 413 for a body over --max-body-bytes.
func BodyTooLarge(limit int64) *Error {
	return &Error{Status: http.StatusRequestEntityTooLarge, Type: TypeBodyTooLarge,
		Message: fmt.Sprintf("the request body is larger than %d bytes", limit)}
}

// RequestTimeout is the 408 for a body that did not arrive in time.
func RequestTimeout(limit time.Duration) *Error {
	return &Error{Status: http.StatusRequestTimeout, Type: TypeRequestTimeout,
		Message: fmt.Sprintf("the request body did not arrive within %s", limit)}
}

// BackendError is the 502 for a backend that failed before answering.
func BackendError(tier string) *Error {
	return &Error{Status: http.StatusBadGateway, Type: TypeBackendError, Tier: tier,
		Message: "the model backend failed before answering"}
}
