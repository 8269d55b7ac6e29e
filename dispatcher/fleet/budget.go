package fleet

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
	"k8s.io/utils/clock"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/dispatcher/tokens"
)

// Budgets is the tokens.Limiter of fleet mode: every tenant's token
// buckets live in Redis, so every dispatcher of a pool takes from the same
// budgets. Reserve and Settle are one script round trip each (EVALSHA),
// timed by Redis's own clock. It has no state of its own and is safe for
// concurrent use; it shares the Gate's client, op timeout and metrics.
type Budgets struct {
	client  redis.UniversalClient
	timeout time.Duration
	clk     clock.PassiveClock
	m       *metrics
}

var _ tokens.Limiter = (*Budgets)(nil)

// ErrBudgetsUnavailable is wrapped by every error of Reserve and Settle
// that comes from Redis (unreachable, too slow, closed, a reply of the
// wrong shape): the budgets could not be read, and the data path refuses
// the request as unavailable.
var ErrBudgetsUnavailable = errors.New("fleet: the token budgets in Redis are unavailable")

// Budgets returns the Limiter that keeps the pool's token budgets in the
// Redis this Gate uses. Its calls fail with ErrBudgetsUnavailable once the
// Gate is closed.
func (g *Redis) Budgets() *Budgets {
	return &Budgets{client: g.client, timeout: g.cfg.OpTimeout, clk: g.clk, m: g.m}
}

// budget is one tenant's budget hash.
func (k keys) budget(tenant string) string { return k.tag + ":budget:" + tenant }

// The bucket maths' constants, as the tokens package's bucket.go has them
// (UnitsPerToken, MaxLimit): the scripts compute in units of a token per
// millisecond of the window, and a larger limit counts as the largest
// that stays exact.
const (
	budgetUnits    = int64(tokens.Window / time.Millisecond)
	budgetMaxLimit = 1_000_000_000
)

// budgetLimit is a limit as the scripts use it: 0 for no budget, at most
// budgetMaxLimit.
func budgetLimit(limit int64) int64 { return min(max(limit, 0), budgetMaxLimit) }

// Reserve implements tokens.Limiter: one round trip of reserveScript,
// unless l sets no budget. A negative count reserves 0 tokens.
func (b *Budgets) Reserve(ctx context.Context, k tokens.Key, l policy.Limits, n int64) (tokens.Decision, error) {
	rl, tl := budgetLimit(l.RequestsPerMinute), budgetLimit(l.TokensPerMinute)
	if rl == 0 && tl == 0 {
		return tokens.Decision{OK: true}, nil
	}
	return b.run(ctx, opReserve, reserveScript, k, rl, tl, max(n, 0))
}

// Settle implements tokens.Limiter: one round trip of settleScript, unless
// l sets no budget. Negative counts count as 0.
func (b *Budgets) Settle(ctx context.Context, k tokens.Key, l policy.Limits, s tokens.Settlement) (tokens.Decision, error) {
	rl, tl := budgetLimit(l.RequestsPerMinute), budgetLimit(l.TokensPerMinute)
	if rl == 0 && tl == 0 {
		return tokens.Decision{OK: true}, nil
	}
	refund := 0
	if s.RefundRequest {
		refund = 1
	}
	return b.run(ctx, opSettle, settleScript, k, rl, tl, max(s.Reserved, 0)-max(s.Used, 0), refund)
}

// run is one script call bounded by the op timeout, and its Decision.
func (b *Budgets) run(ctx context.Context, op string, s *redis.Script, k tokens.Key, rl, tl int64, args ...any) (tokens.Decision, error) {
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	b.m.inflight.Inc()
	defer b.m.inflight.Dec()
	start := b.clk.Now()
	v, err := s.Run(ctx, b.client, []string{keysFor(k.Pool).budget(k.Tenant)},
		append([]any{budgetUnits, rl, tl}, args...)...).Result()
	b.m.ops.WithLabelValues(op).Observe(b.clk.Since(start).Seconds())
	var d tokens.Decision
	if err == nil {
		d, err = budgetDecision(op, v)
	}
	if err != nil {
		b.m.errors.WithLabelValues(op).Inc()
		return tokens.Decision{}, fmt.Errorf("%w: %s for tenant %q of pool %q: %w", ErrBudgetsUnavailable, op, k.Tenant, k.Pool, err)
	}
	return d, nil
}

// budgetDecision reads a script's reply (budgetscripts.go).
func budgetDecision(op string, v any) (tokens.Decision, error) {
	r, err := ints(op, v, 8)
	if err != nil {
		return tokens.Decision{}, err
	}
	d := tokens.Decision{
		RetryAfter: time.Duration(r[1]) * time.Millisecond,
		Requests:   tokens.Bucket{Limit: r[2], Remaining: r[3], Reset: time.Duration(r[4]) * time.Millisecond},
		Tokens:     tokens.Bucket{Limit: r[5], Remaining: r[6], Reset: time.Duration(r[7]) * time.Millisecond},
	}
	switch r[0] {
	case budgetOK:
		d.OK = true
	case budgetRequestsShort:
		d.Budget = tokens.BudgetRequests
	case budgetTokensShort:
		d.Budget = tokens.BudgetTokens
	case budgetTokensNever:
		d.Budget, d.Never = tokens.BudgetTokens, true
	default:
		return tokens.Decision{}, fmt.Errorf("%w: %s: code %d", errReply, op, r[0])
	}
	return d, nil
}
