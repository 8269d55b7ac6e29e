package apierror

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/tiergate/tiergate/dispatcher/budget"
	"github.com/tiergate/tiergate/dispatcher/identity"
	"github.com/tiergate/tiergate/dispatcher/queue"
	"github.com/tiergate/tiergate/dispatcher/tokens"
)

// statuses is the HTTP status of each refusal cause (queue.Causes); this
// table is the only place that decides it.
var statuses = map[string]int{
	queue.CauseCapacity:         http.StatusTooManyRequests,
	queue.CauseTenantLimit:      http.StatusTooManyRequests,
	queue.CauseUnauthenticated:  http.StatusUnauthorized,
	queue.CauseUnknownTenant:    http.StatusForbidden,
	queue.CauseUnavailable:      http.StatusServiceUnavailable,
	queue.CauseDraining:         http.StatusServiceUnavailable,
	queue.CauseQueueTimeout:     http.StatusGatewayTimeout,
	queue.CauseBodyTooLarge:     http.StatusRequestEntityTooLarge,
	queue.CauseBadRequest:       http.StatusBadRequest,
	queue.CauseRequestTimeout:   http.StatusRequestTimeout,
	queue.CauseBackendError:     http.StatusBadGateway,
	queue.CauseMethodNotAllowed: http.StatusMethodNotAllowed,
	queue.CauseOverloaded:       http.StatusServiceUnavailable,
	queue.CauseBackendTimeout:   http.StatusGatewayTimeout,
	queue.CauseRateLimited:      http.StatusTooManyRequests,
}

// statusOf is the HTTP status of a cause; 500 for one that statuses lacks,
// which TestEveryCauseHasAStatus rules out.
func statusOf(cause string) int {
	if s, ok := statuses[cause]; ok {
		return s
	}
	return http.StatusInternalServerError
}

// Header names of the refusal contract.
const (
	HeaderRetryAfter    = "Retry-After"
	HeaderQueuePosition = "X-Queue-Position"
	HeaderTier          = "X-Tier"
	// HeaderQueueWaitMs is set on successful responses: milliseconds queued.
	HeaderQueueWaitMs = "X-Queue-Wait-Ms"
	// HeaderShouldRetry "false" tells the OpenAI SDKs not to retry a
	// refusal whatever its status (they honour it before the status).
	HeaderShouldRetry = "X-Should-Retry"
)

// Error is one refusal. Write sends it.
type Error struct {
	Status int
	// Cause is one of queue.Causes: the body's "type" and the metrics'
	// cause label.
	Cause   string
	Message string
	Tier    string
	// Position is the 1-based queue position; 0 leaves out X-Queue-Position.
	Position int
	// RetryAfter is rounded up to whole seconds; 0 leaves out Retry-After.
	RetryAfter time.Duration
	// Never: no wait makes the request acceptable, so Write adds
	// X-Should-Retry: false.
	Never bool
}

func (e *Error) Error() string { return e.Cause + ": " + e.Message }

func newError(cause, tier, msg string) *Error {
	return &Error{Status: statusOf(cause), Cause: cause, Tier: tier, Message: msg}
}

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
		Type: e.Cause, Message: e.Message, Tier: e.Tier, QueuePosition: e.Position, RetryAfterSeconds: ra,
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
	if e.Never {
		h.Set(HeaderShouldRetry, "false")
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
	var cold *queue.ColdStartRefusal
	switch {
	case errors.As(err, &ref):
		return fromRefusal(ref, tenant)
	case errors.As(err, &cold):
		return fromColdStart(cold)
	case errors.Is(err, queue.ErrUnknownTier):
		return unknownTenant(tenant)
	case errors.Is(err, queue.ErrNoPolicy):
		return NoPolicy()
	case errors.Is(err, queue.ErrNoCapacity):
		e := newError(queue.CauseUnavailable, tier, "the pool has no capacity right now (no ready backends)")
		e.RetryAfter = max(tierWait, time.Second)
		return e
	case errors.Is(err, queue.ErrDraining), errors.Is(err, queue.ErrDrained):
		e := Draining()
		e.Tier = tier
		return e
	case errors.Is(err, queue.ErrExpired):
		return newError(queue.CauseQueueTimeout, tier,
			fmt.Sprintf("the request waited in the queue of tier %q for the client timeout (%s) without being dispatched", tier, clientTimeout))
	default:
		// A fleet-state failure (a Gate error) or anything unforeseen.
		e := newError(queue.CauseUnavailable, tier, "admission failed: "+err.Error())
		e.RetryAfter = unavailableRetry
		return e
	}
}

// fromRefusal is the 429 of a full tier queue or a tenant at its limit,
// in the tier the queue refused it in (that of the policy in force, which
// may not be the caller's).
func fromRefusal(ref *queue.Refusal, tenant string) *Error {
	tier := ref.Tier
	e := newError(ref.CauseLabel(), tier, "")
	e.Position, e.RetryAfter = ref.Position, ref.RetryAfter
	if e.Cause == queue.CauseTenantLimit {
		e.Message = fmt.Sprintf("tenant %q has as many requests queued as tier %q allows one tenant; retry after %ds", tenant, tier, e.RetryAfterSeconds())
	} else {
		e.Message = fmt.Sprintf("the queue of tier %q is full; retry after %ds", tier, e.RetryAfterSeconds())
	}
	return e
}

// fromColdStart is the 503 of a tier that cannot wait for a pool starting
// from zero replicas. Retry-After is the cold start, at least 1s: by then
// a replica may be Ready.
func fromColdStart(c *queue.ColdStartRefusal) *Error {
	e := newError(queue.CauseUnavailable, c.Tier, "")
	e.RetryAfter = max(c.ColdStart, time.Second)
	e.Message = fmt.Sprintf("the pool is starting from zero replicas and its first replica takes %s to become ready, longer than tier %q can wait, so the request is refused rather than held; retry after %ds",
		c.ColdStart, c.Tier, e.RetryAfterSeconds())
	return e
}

// FromIdentity maps an identity.Identify error to its refusal: 403 for an
// unknown tenant, 400 for a malformed credential, 401 otherwise.
func FromIdentity(err error) *Error {
	var ie *identity.Error
	if !errors.As(err, &ie) {
		return unauthenticated(err.Error())
	}
	switch {
	case errors.Is(ie.Kind, identity.ErrUnknownTenant):
		return unknownTenant(ie.Tenant)
	case errors.Is(ie.Kind, identity.ErrMalformed):
		return BadRequest(ie.Reason)
	default:
		return unauthenticated(ie.Reason)
	}
}

// NoPolicy is the 503 of a dispatcher that has not been configured yet.
func NoPolicy() *Error {
	e := newError(queue.CauseUnavailable, "", "the dispatcher has no policy yet")
	e.RetryAfter = unavailableRetry
	return e
}

// NoBackend is the 503 when a request may proceed but no backend is known.
func NoBackend(tier string) *Error {
	e := newError(queue.CauseUnavailable, tier, "no ready backend")
	e.RetryAfter = unavailableRetry
	return e
}

// Draining is the 503 of a dispatcher that is shutting down.
func Draining() *Error {
	e := newError(queue.CauseDraining, "", "the dispatcher is shutting down; retry on another instance")
	e.RetryAfter = unavailableRetry
	return e
}

// unauthenticated is the 401 for a missing or unknown credential.
func unauthenticated(msg string) *Error { return newError(queue.CauseUnauthenticated, "", msg) }

// unknownTenant is the 403 for a tenant the policy does not know when the
// pool has no default tier.
func unknownTenant(tenant string) *Error {
	return newError(queue.CauseUnknownTenant, "", fmt.Sprintf("tenant %q is not known and the pool has no default tier", tenant))
}

// BadRequest is the 400 for malformed credentials or an unreadable body.
func BadRequest(msg string) *Error { return newError(queue.CauseBadRequest, "", msg) }

// BodyTooLarge is the 413 for a body over --max-body-bytes.
func BodyTooLarge(limit int64) *Error {
	return newError(queue.CauseBodyTooLarge, "", fmt.Sprintf("the request body is larger than %d bytes", limit))
}

// RequestTimeout is the 408 for a body that did not arrive in time.
func RequestTimeout(limit time.Duration) *Error {
	return newError(queue.CauseRequestTimeout, "", fmt.Sprintf("the request body did not arrive within %s", limit))
}

// MethodNotAllowed is the 405 for a method the dispatcher never proxies
// (CONNECT); the caller sets the Allow header.
func MethodNotAllowed(method string) *Error {
	return newError(queue.CauseMethodNotAllowed, "", fmt.Sprintf("the dispatcher does not accept %s: it proxies model API calls and is not a tunnel", method))
}

// BackendError is the 502 for a backend that failed before answering.
func BackendError(tier string) *Error {
	return newError(queue.CauseBackendError, tier, "the model backend failed before answering")
}

// BackendTimeout is the 504 for a backend that sent no response head
// within the dispatcher's --backend-response-header-timeout.
func BackendTimeout(tier string) *Error {
	return newError(queue.CauseBackendTimeout, tier, "the model backend did not start its answer in time")
}

// overloadedRetry is the Retry-After of an overloaded refusal: queued
// bodies leave the budget as their requests are dispatched, within about a
// service time, and clients spread their retries.
const overloadedRetry = time.Second

// Overloaded is the 503 of a request whose body would take the bodies the
// dispatcher holds past its budget of limit bytes.
func Overloaded(tier string, limit int64) *Error {
	e := newError(queue.CauseOverloaded, tier,
		fmt.Sprintf("queued request bodies would exceed the dispatcher's %s budget (--max-queued-bytes); retry shortly or on another instance", budget.FormatBytes(limit)))
	e.RetryAfter = overloadedRetry
	return e
}

// RateLimited is the 429 of a request that its tenant's budget refused
// (d, a refused tokens.Decision); reservation is the tokens it asked for.
// The message names the budget, its limit and the request's cost. A
// request more than the whole budget (d.Never) is marked Never and has no
// Retry-After: waiting cannot make it fit.
func RateLimited(tenant, tier string, d tokens.Decision, reservation int64) *Error {
	limit, cost := d.Tokens.Limit, fmt.Sprintf("%d tokens", reservation)
	if d.Budget == tokens.BudgetRequests {
		limit, cost = d.Requests.Limit, "1 request"
	}
	e := newError(queue.CauseRateLimited, tier, "")
	over := fmt.Sprintf("tenant %q is over its %s budget (%d per minute): this request reserves %s", tenant, d.Budget, limit, cost)
	if d.Never {
		e.Never = true
		e.Message = over + ", more than the whole budget, so it can never be admitted; lower max_tokens (or max_completion_tokens) or shorten the prompt"
		return e
	}
	// The message's wait is exact to the millisecond, rounded up;
	// Retry-After has it in whole seconds, rounded up.
	e.RetryAfter = max(d.RetryAfter, time.Millisecond)
	e.Message = fmt.Sprintf("%s; retry after %s", over, ceilMillis(e.RetryAfter))
	return e
}

// ceilMillis is d rounded up to a whole millisecond.
func ceilMillis(d time.Duration) time.Duration {
	return (d + time.Millisecond - 1).Truncate(time.Millisecond)
}

// budgetRetry is the Retry-After of budgets that could not be read: the
// store (Redis) is expected back, or the client retries elsewhere.
const budgetRetry = time.Second

// BudgetsUnavailable is the 503 of a request whose tenant's budgets could
// not be read or settled (err: the Limiter's), as a failure of the
// fleet's shared state is.
func BudgetsUnavailable(tier string, err error) *Error {
	e := newError(queue.CauseUnavailable, tier, "the tenant's budgets could not be checked: "+err.Error())
	e.RetryAfter = budgetRetry
	return e
}
