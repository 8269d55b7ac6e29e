package simulate

import (
	"context"
	"fmt"
	"time"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/dispatcher/tokens"
)

// The per-tenant budgets (docs/tokens.md). Each simulated dispatcher keeps
// its tenants' buckets in a tokens.Local on the run's fake clock, with the
// limits of its own policy: in Local mode its part of each budget, in Redis
// mode (one dispatcher) the whole. An attempt reserves its request's cost
// before the queue sees it; a refusal is 429 rate_limited, never queued.
// A request that never reaches a backend is refunded entirely, one that
// ran settles on the tokens it used. Only tiergate has budgets: the
// baselines' limits carry none.

// requestCost is a request's tokens: what it reserves and what it uses.
type requestCost struct {
	// prompt and output are what the request uses when its answer
	// completes; output is at most maxOut.
	prompt, output int64
	// maxOut is the output it reserves: its max_tokens, else the pool's
	// defaultMaxTokens; 0 when it has no output.
	maxOut int64
}

// reservation is what the request reserves: its prompt and its maximum
// output (the simulation's prompt estimate is exact).
func (c requestCost) reservation() int64 { return c.prompt + c.maxOut }

// drawCost draws a new request's tokens from its tenant's token stream.
func (ts *tenantState) drawCost() requestCost {
	c := requestCost{maxOut: ts.maxOut}
	if ts.promptTokens != nil {
		c.prompt = ts.promptTokens.tokens(ts.tok)
	}
	if ts.outputTokens != nil {
		c.output = min(ts.outputTokens.tokens(ts.tok), c.maxOut)
	}
	return c
}

// budgetKey is a tenant's buckets on every dispatcher.
func (e *engine) budgetKey(ts *tenantState) tokens.Key {
	return tokens.Key{Pool: e.res.Pool, Tenant: ts.name}
}

// reserve takes r's reservation from its tenant's budgets on its
// dispatcher. false: they refused it, and the refusal was handled.
func (e *engine) reserve(r *request) bool {
	lim := r.ten.at[r.disp].budget
	if lim.IsZero() {
		return true
	}
	dec, err := e.disp[r.disp].budgets.Reserve(context.Background(), e.budgetKey(r.ten), lim, r.cost.reservation())
	if err != nil {
		e.fail(fmt.Errorf("%w: reserve: %w", ErrInternal, err))
		return false
	}
	if !dec.OK {
		e.rateLimited(r, dec)
		return false
	}
	r.reserved, r.limits = true, lim
	return true
}

// settleBudget replaces r's reservation, if it holds one, with what it
// used; refund also gives the request back (it never reached a backend).
// The limits are those it reserved under.
func (e *engine) settleBudget(r *request, used int64, refund bool) {
	if !r.reserved {
		return
	}
	r.reserved = false
	s := tokens.Settlement{Reserved: r.cost.reservation(), Used: used, RefundRequest: refund}
	if _, err := e.disp[r.disp].budgets.Settle(context.Background(), e.budgetKey(r.ten), r.limits, s); err != nil {
		e.fail(fmt.Errorf("%w: settle: %w", ErrInternal, err))
	}
}

// refundBudget gives back all of r's reservation: r never reached a
// backend.
func (e *engine) refundBudget(r *request) { e.settleBudget(r, 0, true) }

// settleCompleted settles a generation that ran to its end, with its
// budgets and its scheduler.
func (e *engine) settleCompleted(r *request) {
	e.settleBudget(r, r.cost.prompt+r.cost.output, false)
	e.disp[r.disp].sched.Settle(r, r.cost.prompt, r.cost.output)
}

// settleCancelled settles a generation cancelled now: its prompt and the
// part of its output streamed so far, the output streaming evenly over
// the service time.
func (e *engine) settleCancelled(r *request) {
	streamed := int64(0)
	if r.service > 0 {
		part := float64(e.now-r.dispatchAt) / float64(r.service)
		streamed = min(int64(part*float64(r.cost.output)), r.cost.output)
	}
	e.settleBudget(r, r.cost.prompt+streamed, false)
	e.disp[r.disp].sched.Settle(r, r.cost.prompt, streamed)
}

// rateLimited counts a budget's refusal (429 rate_limited). The client
// retries after Retry-After, which the dispatcher rounds up to whole
// seconds; a reservation above the whole budget says x-should-retry:
// false, which the OpenAI clients honour, so the request ends (a
// closed-loop client then waits 1 s before it thinks, as after a 503).
func (e *engine) rateLimited(r *request, dec tokens.Decision) {
	e.count(r.ten, func(f *Figures) { f.Refused.RateLimited++ })
	if dec.Never {
		e.finalOutcome(r, unavailableBackoff)
		return
	}
	e.retryOrEnd(r, ceilSecond(dec.RetryAfter))
}

// ceilSecond is d rounded up to whole seconds, at least 1 s: a
// Retry-After header.
func ceilSecond(d time.Duration) time.Duration {
	return max((d+time.Second-1)/time.Second, 1) * time.Second
}

// budgetOf is the budgets in force under l for tenant in tier: its own,
// each falling back to the tier's (policy.LimitsOf).
func (l enforced) budgetOf(tenant, tier string) policy.Limits {
	return policy.LimitsOf(&policy.Tenant{Limits: l.tenantBudgets[tenant]}, &policy.Tier{TenantLimits: l.tierBudgets[tier]})
}

// checkCosts refuses a tenant with a tokens budget whose requests cost no
// tokens: the budget would never refuse one, which is not what its author
// meant to simulate.
func (e *engine) checkCosts() error {
	for i, ts := range e.tenants {
		b := e.stated.budgetOf(ts.name, ts.tier.name)
		if b.TokensPerMinute > 0 && ts.cfg.PromptTokens == nil && ts.cfg.OutputTokens == nil {
			return fmt.Errorf("%w: Load spec.tenants[%d]: tenant %q has a budget of %d tokens per minute but no promptTokens or outputTokens, so its requests would cost no tokens and the budget would never refuse one; give them a cost",
				ErrInvalid, i, ts.name, b.TokensPerMinute)
		}
	}
	return nil
}
