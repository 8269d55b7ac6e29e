package capacity

import (
	"fmt"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/api/v1alpha1"
)

// The per-tenant budgets (requests and tokens per minute). They are
// pool-wide in the objects. In Redis mode every dispatcher gets them
// whole, as the buckets live in Redis and are shared. In Local mode each
// dispatcher keeps its own buckets, so each gets a part, the way it gets a
// part of the slots: the dispatchers that serve (hold a slot) share the
// budget as evenly as whole numbers allow, the first ones one more, and
// their parts sum to the budget. That is exact only for a tenant whose
// requests spread evenly over the dispatchers: one whose requests all
// reach one dispatcher gets that dispatcher's part, less than its budget.
// No part is below 1, since 0 is no budget at all: a budget smaller than
// the dispatchers that share it gives each of them 1, so they admit up to
// their count in all. A dispatcher that serves nothing (excluded as
// failing, or left without a slot) takes no request, so it gets the
// least part, 1, and the serving ones share the whole budget.

// LimitsSplit is a tenant's budgets as Local mode splits them.
type LimitsSplit struct {
	// Dispatchers is how many dispatchers serve and share the budgets.
	Dispatchers int
	// Min and Max are the smallest and the largest part of each budget
	// over those dispatchers; a budget the tenant lacks is 0 in both.
	Min, Max policy.Limits
}

// limitsOf is a CRD's budgets as the policy's; nil stays nil.
func limitsOf(l *v1alpha1.Limits) *policy.Limits {
	if l == nil {
		return nil
	}
	return &policy.Limits{RequestsPerMinute: l.RequestsPerMinute, TokensPerMinute: l.TokensPerMinute}
}

// valueOf is *l, or no budgets for nil.
func valueOf(l *policy.Limits) policy.Limits {
	if l == nil {
		return policy.Limits{}
	}
	return *l
}

// limitsSource says where the budgets in force come from, given the
// quota's own: each budget in force is the quota's when it sets it, else
// the tier's. "" when none is in force.
func limitsSource(own *policy.Limits, inForce policy.Limits) v1alpha1.LimitsSource {
	o := valueOf(own)
	var quota, tier bool
	for _, b := range [][2]int64{{inForce.RequestsPerMinute, o.RequestsPerMinute}, {inForce.TokensPerMinute, o.TokensPerMinute}} {
		switch {
		case b[0] == 0:
		case b[1] > 0:
			quota = true
		default:
			tier = true
		}
	}
	switch {
	case quota && tier:
		return v1alpha1.LimitsFromBoth
	case quota:
		return v1alpha1.LimitsFromTenantQuota
	case tier:
		return v1alpha1.LimitsFromServiceTier
	}
	return ""
}

// budgetSplit gives each dispatcher its part of a pool-wide budget. The
// zero value (whole) gives every dispatcher the whole budget: Redis mode.
type budgetSplit struct {
	split bool
	// rank is each dispatcher's place among those that serve, -1 for one
	// that serves nothing.
	rank []int
	// serving is how many dispatchers serve (n when none does).
	serving int
}

// newBudgetSplit splits over the dispatchers that hold a slot (slots has
// one entry each); when none holds one (a pool at zero without a cold
// start), over all of them.
func newBudgetSplit(slots []int64) budgetSplit {
	b := budgetSplit{split: true, rank: make([]int, len(slots))}
	for i, s := range slots {
		b.rank[i] = -1
		if s > 0 {
			b.rank[i] = b.serving
			b.serving++
		}
	}
	if b.serving == 0 {
		for i := range b.rank {
			b.rank[i] = i
		}
		b.serving = len(slots)
	}
	return b
}

// part is dispatcher i's part of limit (0, no budget, stays 0).
func (b budgetSplit) part(limit int64, i int) int64 {
	if !b.split || limit <= 0 {
		return limit
	}
	k := b.rank[i]
	if k < 0 {
		return 1
	}
	n := int64(b.serving)
	p := limit / n
	if int64(k) < limit%n {
		p++
	}
	return max(p, 1)
}

// limits is dispatcher i's part of l; nil stays nil.
func (b budgetSplit) limits(l *policy.Limits, i int) *policy.Limits {
	if l == nil {
		return nil
	}
	return &policy.Limits{RequestsPerMinute: b.part(l.RequestsPerMinute, i), TokensPerMinute: b.part(l.TokensPerMinute, i)}
}

// summary is how l is split; nil when it is not (Redis mode, no budget,
// no dispatcher).
func (b budgetSplit) summary(l policy.Limits) *LimitsSplit {
	if !b.split || b.serving == 0 || l.IsZero() {
		return nil
	}
	first, last := b.nth(0), b.nth(b.serving-1)
	return &LimitsSplit{
		Dispatchers: b.serving,
		Max:         policy.Limits{RequestsPerMinute: b.part(l.RequestsPerMinute, first), TokensPerMinute: b.part(l.TokensPerMinute, first)},
		Min:         policy.Limits{RequestsPerMinute: b.part(l.RequestsPerMinute, last), TokensPerMinute: b.part(l.TokensPerMinute, last)},
	}
}

// nth is the dispatcher of rank k among those that serve.
func (b budgetSplit) nth(k int) int {
	for i, r := range b.rank {
		if r == k {
			return i
		}
	}
	return -1
}

// validateLimits refuses budgets the schema refuses: below 1, above
// MaxBudgetPerMinute, or a value that sets neither. what names the field.
func validateLimits(what string, l *v1alpha1.Limits) []string {
	if l == nil {
		return nil
	}
	var errs []string
	for _, b := range []struct {
		name string
		v    int64
	}{{"requestsPerMinute", l.RequestsPerMinute}, {"tokensPerMinute", l.TokensPerMinute}} {
		if b.v < 0 || b.v > v1alpha1.MaxBudgetPerMinute {
			errs = append(errs, fmt.Sprintf("%s.%s: %d must be from 1 to %d", what, b.name, b.v, int64(v1alpha1.MaxBudgetPerMinute)))
		}
	}
	if l.RequestsPerMinute == 0 && l.TokensPerMinute == 0 {
		errs = append(errs, what+": sets neither requestsPerMinute nor tokensPerMinute")
	}
	return errs
}
