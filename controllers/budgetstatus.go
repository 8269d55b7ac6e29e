package controllers

import (
	"fmt"
	"strings"

	"github.com/tiergate/tiergate/api/v1alpha1"
	"github.com/tiergate/tiergate/capacity"
)

// Pure helpers from a tenant's budgets in force (capacity.TenantBounds) to
// TenantQuota status.limits and to the words of its Ready condition.

// limitsStatus is status.limits: the budgets in force, pool-wide, with
// Local mode's per-dispatcher parts; nil when the tenant has none.
func limitsStatus(tb capacity.TenantBounds) *v1alpha1.LimitsStatus {
	if tb.Limits.IsZero() {
		return nil
	}
	st := &v1alpha1.LimitsStatus{
		RequestsPerMinute: tb.Limits.RequestsPerMinute,
		TokensPerMinute:   tb.Limits.TokensPerMinute,
		Source:            tb.LimitsSource,
	}
	if s := tb.LimitsSplit; s != nil {
		st.PerDispatcher = &v1alpha1.LimitsSplit{
			Dispatchers:       int32(s.Dispatchers),
			RequestsPerMinute: budgetRange(s.Min.RequestsPerMinute, s.Max.RequestsPerMinute),
			TokensPerMinute:   budgetRange(s.Min.TokensPerMinute, s.Max.TokensPerMinute),
		}
	}
	return st
}

// budgetRange is nil for a budget that is not set (0).
func budgetRange(lo, hi int64) *v1alpha1.BudgetRange {
	if hi == 0 {
		return nil
	}
	return &v1alpha1.BudgetRange{Min: lo, Max: hi}
}

// limitsMessage says what budgets the tenant has and how they are
// enforced, for the Ready condition; "" when it has none.
func limitsMessage(tb capacity.TenantBounds, own *v1alpha1.Limits, state v1alpha1.SharedStateMode) string {
	l := tb.Limits
	if l.IsZero() {
		return ""
	}
	from := func(ownSet bool) string {
		if ownSet {
			return "this TenantQuota"
		}
		return fmt.Sprintf("ServiceTier %q", tb.Tier)
	}
	var budgets []string
	if l.RequestsPerMinute > 0 {
		budgets = append(budgets, fmt.Sprintf("%s (from %s)", count(l.RequestsPerMinute, "requests"), from(own != nil && own.RequestsPerMinute > 0)))
	}
	if l.TokensPerMinute > 0 {
		budgets = append(budgets, fmt.Sprintf("%s (from %s)", count(l.TokensPerMinute, "tokens"), from(own != nil && own.TokensPerMinute > 0)))
	}
	msg := "budgets per minute: " + strings.Join(budgets, " and ")
	s := tb.LimitsSplit
	switch {
	case state == v1alpha1.SharedStateRedis:
		return msg + "; every dispatcher takes them from the same buckets in Redis, so they hold exactly across the pool"
	case s == nil:
		return msg + "; no dispatcher enforces them yet"
	case s.Dispatchers == 1:
		return msg + "; one dispatcher serves and enforces them whole"
	}
	var parts []string
	if l.RequestsPerMinute > 0 {
		parts = append(parts, rangeText(s.Min.RequestsPerMinute, s.Max.RequestsPerMinute, "requests"))
	}
	if l.TokensPerMinute > 0 {
		parts = append(parts, rangeText(s.Min.TokensPerMinute, s.Max.TokensPerMinute, "tokens"))
	}
	msg += fmt.Sprintf("; in Local mode each of the %d dispatchers that serve enforces its own part, %s, so a tenant whose requests do not spread evenly over them gets less than its budget (sharedState Redis enforces it exactly)",
		s.Dispatchers, strings.Join(parts, " and "))
	for _, b := range []struct {
		limit int64
		unit  string
	}{{l.RequestsPerMinute, "requests"}, {l.TokensPerMinute, "tokens"}} {
		if b.limit > 0 && b.limit < int64(s.Dispatchers) {
			msg += fmt.Sprintf("; %s is fewer than the %d dispatchers, so each admits 1 and together up to %d", count(b.limit, b.unit), s.Dispatchers, s.Dispatchers)
		}
	}
	return msg
}

// rangeText is "300 tokens", "300 to 301 tokens" or "1 token" (unit is
// a plural).
func rangeText(lo, hi int64, unit string) string {
	if lo == hi {
		return count(lo, unit)
	}
	return fmt.Sprintf("%d to %s", lo, count(hi, unit))
}

// count is "1 request" or "2 requests" (unit is a plural).
func count(n int64, unit string) string {
	if n == 1 {
		unit = strings.TrimSuffix(unit, "s")
	}
	return fmt.Sprintf("%d %s", n, unit)
}
