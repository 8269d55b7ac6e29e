package tokens

import (
	"context"
	"time"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

// The budgets a Decision can name.
const (
	BudgetRequests = "requests"
	BudgetTokens   = "tokens"
)

// Window is what a budget's limit is per: a bucket holds one window's worth
// and refills at limit ÷ Window, continuously.
const Window = time.Minute

// Key names one tenant's buckets within a pool.
type Key struct {
	Pool, Tenant string
}

// Bucket is one budget's state after a decision, for the x-ratelimit-*
// headers.
type Bucket struct {
	// Limit is the budget per Window; 0 means the tenant has no such
	// budget (the other fields are then 0 too).
	Limit int64
	// Remaining is what the bucket holds, rounded down, never below 0
	// (the level itself may be negative after a settlement).
	Remaining int64
	// Reset is the time until the bucket is full again.
	Reset time.Duration
}

// Decision is Reserve's answer.
type Decision struct {
	// OK: the request's reservation was taken from every budget it has.
	OK bool
	// Budget names the budget that refused (BudgetRequests or
	// BudgetTokens); "" when OK. When both refuse, BudgetRequests, except
	// that a reservation above the whole tokens limit is always refused
	// by BudgetTokens as Never: no wait admits it, so the client must not
	// be told to retry.
	Budget string
	// Never: the reservation is more than the refusing budget's whole
	// Limit, so no wait makes it fit (x-should-retry: false).
	Never bool
	// RetryAfter is, when refused and not Never, the time until the
	// refusing bucket (the later of the two when both refuse) holds the
	// request's reservation, if nothing else takes from it.
	RetryAfter time.Duration
	// Requests and Tokens are the buckets after the decision.
	Requests, Tokens Bucket
}

// Settlement is what a request used, given back to its buckets.
type Settlement struct {
	// Reserved is the tokens Reserve took.
	Reserved int64
	// Used is the tokens the request used; Reserved − Used goes back to
	// the token bucket (a negative difference is taken from it, and the
	// level may go below 0, down to one window's debt: −Limit; see
	// bucket.go).
	Used int64
	// RefundRequest gives the request back to the requests bucket: the
	// request never reached a backend.
	RefundRequest bool
}

// Limiter keeps per-tenant budgets. Limits are passed with every call (the
// policy in force when the request was reserved); a bucket first seen is
// full, and a limit that changed caps the bucket's level at the new limit
// without refilling it. A Limits with both fields 0 is no budget: Reserve
// answers OK with zero Buckets and nothing is stored. A limit above
// MaxLimit counts as MaxLimit. ReserveAt and SettleAt (bucket.go) are the
// semantics every implementation computes.
type Limiter interface {
	// Reserve takes one request and tokens (the reservation, >= 0) from
	// k's buckets: from both or from neither. A refusal takes nothing.
	// An error means the budgets could not be read; the caller then
	// refuses the request as unavailable.
	Reserve(ctx context.Context, k Key, l policy.Limits, tokens int64) (Decision, error)
	// Settle corrects k's buckets with what a reserved request used and
	// returns the buckets after it. Settling never refuses.
	Settle(ctx context.Context, k Key, l policy.Limits, s Settlement) (Decision, error)
}
