package main

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/dispatcher/tokens"
)

// The tenant over its tokens budget (docs/tokens.md): an openai-go stream
// whose requests cost far more tokens than its TenantQuota's
// tokensPerMinute lets through. The SDK retries its 429 rate_limited
// refusals after their Retry-After; between calls each worker also paces
// itself on the x-ratelimit-* headers of its last answer, as a client
// that knows its budget does.

// budgetPlan is what a budget stream's requests cost.
type budgetPlan struct {
	// PromptBytes is the prompt's text; the dispatcher estimates it at
	// its bytes-per-token ratio, simserver counts it at 4 bytes a token.
	PromptBytes int
	// MaxTokens is every request's max_tokens, which it reserves and
	// simserver then generates in full.
	MaxTokens int
	// Pace: wait, before a call, until the last answer's bucket holds the
	// call's cost.
	Pace bool
}

// bytesPerToken is the client's own rule of thumb for its cost, and
// simserver's default count.
const bytesPerToken = 4

// cost is what the client expects a call to reserve.
func (b *budgetPlan) cost() int64 {
	return int64(math.Ceil(float64(b.PromptBytes)/bytesPerToken)) + int64(b.MaxTokens)
}

// prompt is PromptBytes of text.
func (b *budgetPlan) prompt() string {
	const words = "Summarise the quarterly figures of every division in one table. "
	return strings.Repeat(words, b.PromptBytes/len(words)+1)[:b.PromptBytes]
}

// rateHeaders are the x-ratelimit-* tokens headers of one answer.
type rateHeaders struct {
	// Limit is the tokens budget the answering dispatcher enforces (in
	// Local mode its part); 0 when the answer had no such header.
	Limit, Remaining int64
	// NoRetry: x-should-retry: false, the reservation can never fit.
	NoRetry bool
}

func readRateHeaders(h http.Header) rateHeaders {
	var r rateHeaders
	r.Limit, _ = strconv.ParseInt(h.Get(tokens.HeaderLimitTokens), 10, 64)
	r.Remaining, _ = strconv.ParseInt(h.Get(tokens.HeaderRemainingTokens), 10, 64)
	r.NoRetry = h.Get("X-Should-Retry") == "false"
	return r
}

// paceFor is how long a client should wait before a call costing cost,
// given the last answer's headers: until that bucket, refilling at Limit
// a minute, holds the cost (0 when it does, or without headers). The
// next call may reach another dispatcher, whose bucket differs: in Local
// mode this is an estimate.
func paceFor(h rateHeaders, cost int64) time.Duration {
	if h.Limit <= 0 || h.Remaining >= cost {
		return 0
	}
	return time.Duration(float64(cost-h.Remaining) / float64(h.Limit) * float64(tokens.Window))
}

// pace waits out paceFor the call's last attempt, within the stream's
// window (to); it returns how long it waited, and false when the window
// or the load ended first.
func (g *loadGen) pace(ctx context.Context, b *budgetPlan, call openaiCall, to time.Duration) (time.Duration, bool) {
	if !b.Pace || len(call.Attempts) == 0 {
		return 0, true
	}
	wait := paceFor(call.Attempts[len(call.Attempts)-1].Rate, b.cost())
	if wait == 0 {
		return 0, true
	}
	from := g.rec.since()
	ok := g.sleepUntil(ctx, min(from+wait, to)) && from+wait < to
	return g.rec.since() - from, ok
}

// budgetParts reads the tenant's budgets from every dispatcher's policy:
// what each enforces (Local mode: its part).
func (d *demo) budgetParts(ctx context.Context, tenant string) ([]policy.Limits, error) {
	var out []policy.Limits
	for _, ref := range d.disps {
		var p policy.Policy
		if err := d.obs.getJSON(ctx, ref, "/v1/policy", &p); err != nil {
			return nil, err
		}
		out = append(out, limitsIn(&p, tenant))
	}
	return out, nil
}

// limitsIn is tenant's budgets under p, as the dispatcher finds them: its
// entry's, each falling back to its tier's; an unlisted tenant gets the
// default tier's.
func limitsIn(p *policy.Policy, tenant string) policy.Limits {
	tierOf := func(name string) *policy.Tier {
		for i := range p.Tiers {
			if p.Tiers[i].Name == name {
				return &p.Tiers[i]
			}
		}
		return nil
	}
	for i := range p.Tenants {
		if t := &p.Tenants[i]; t.ID == tenant {
			return policy.LimitsOf(t, tierOf(t.Tier))
		}
	}
	return policy.LimitsOf(nil, tierOf(p.DefaultTier))
}

// budgetSummary is the budget stream: its budget, its refusals and retries
// and the tokens its answers used against the budget.
type budgetSummary struct {
	Stream  string `json:"stream"`
	Tenant  string `json:"tenant"`
	Tier    string `json:"tier"`
	Workers int    `json:"workers"`
	// TokensPerMinute is the pool-wide budget: the sum of PerDispatcher,
	// each dispatcher's part of it.
	TokensPerMinute int64   `json:"tokensPerMinute"`
	PerDispatcher   []int64 `json:"perDispatcher"`
	// Cost is what the client expects each call to reserve.
	Cost      int64 `json:"cost"`
	Calls     int   `json:"calls"`
	Succeeded int   `json:"succeeded"`
	Failed    int   `json:"failed"`
	Cut       int   `json:"cut"`
	Attempts  int   `json:"attempts"`
	// RateLimited counts attempts refused with 429 rate_limited; NoRetry
	// those of them that said x-should-retry: false.
	RateLimited int `json:"rateLimited"`
	NoRetry     int `json:"noRetry"`
	// RetriesAfterHeader counts attempts after a refusal with Retry-After,
	// Honoured those that waited it (within the recorder's resolution).
	RetriesAfterHeader int `json:"retriesAfterRetryAfter"`
	Honoured           int `json:"honoured"`
	MaxRetryAfter      int `json:"maxRetryAfterSeconds"`
	// Answered counts the attempts the dispatchers answered, WithHeaders
	// those whose answer carried the x-ratelimit-*-tokens headers. An
	// attempt still waiting when the demo ended has no answer.
	Answered    int `json:"answered"`
	WithHeaders int `json:"withHeaders"`
	// Bare lists the answers without those headers, Lost the attempts
	// that got no answer though the demo had not ended, and Failures the
	// calls that failed: each as when and what it was.
	Bare     []string `json:"bareAnswers,omitempty"`
	Lost     []string `json:"lostAttempts,omitempty"`
	Failures []string `json:"failures,omitempty"`
	// Paced counts the waits on those headers between calls, PacedSeconds
	// their total.
	Paced        int     `json:"paced"`
	PacedSeconds float64 `json:"pacedSeconds"`
	// PromptTokens and CompletionTokens are the usage of the answers.
	PromptTokens     int64 `json:"promptTokens"`
	CompletionTokens int64 `json:"completionTokens"`
	// SpanSeconds is from the first attempt to the end of the last served
	// one; AllowedTokens the most a budget of TokensPerMinute admits in
	// it: the full buckets plus their refill, TokensPerMinute × (1 +
	// SpanSeconds/60). Within says the answers used no more.
	SpanSeconds   float64 `json:"spanSeconds"`
	AllowedTokens int64   `json:"allowedTokens"`
	Within        bool    `json:"withinBudget"`
	// BeyondBurstPerMinute is the tokens used beyond the full buckets
	// (the burst a token bucket allows), per minute of SpanSeconds: the
	// rate to hold against TokensPerMinute (Within says it is no more).
	BeyondBurstPerMinute float64 `json:"beyondBurstPerMinute"`
}

// summarizeBudget sums the budget stream's calls; nil without one.
func summarizeBudget(plan []streamPlan, calls []openaiCall, parts []policy.Limits) *budgetSummary {
	var sp *streamPlan
	for i := range plan {
		if plan[i].Budget != nil {
			sp = &plan[i]
		}
	}
	if sp == nil {
		return nil
	}
	b := &budgetSummary{Stream: sp.Name, Tenant: strings.Join(sp.Tenants, ","), Tier: sp.Tier, Workers: sp.Workers, Cost: sp.Budget.cost()}
	for _, p := range parts {
		b.PerDispatcher = append(b.PerDispatcher, p.TokensPerMinute)
		b.TokensPerMinute += p.TokensPerMinute
	}
	first, last := time.Duration(-1), time.Duration(0)
	for _, c := range calls {
		if c.Stream != sp.Name {
			continue
		}
		b.count(c)
		if len(c.Attempts) > 0 && (first < 0 || c.Attempts[0].Start < first) {
			first = c.Attempts[0].Start
		}
		if c.Outcome == outcomeServed {
			last = max(last, c.End)
		}
	}
	if first >= 0 && last > first {
		b.SpanSeconds = (last - first).Seconds()
	}
	b.AllowedTokens = int64(math.Floor(float64(b.TokensPerMinute) * (1 + b.SpanSeconds/60)))
	used := b.PromptTokens + b.CompletionTokens
	b.Within = used <= b.AllowedTokens
	if b.SpanSeconds > 0 {
		b.BeyondBurstPerMinute = float64(max(used-b.TokensPerMinute, 0)) * 60 / b.SpanSeconds
	}
	return b
}

// count adds one call.
func (b *budgetSummary) count(c openaiCall) {
	b.Calls++
	b.Attempts += len(c.Attempts)
	switch c.Outcome {
	case outcomeServed:
		b.Succeeded++
		b.PromptTokens += c.PromptTokens
		b.CompletionTokens += c.CompletionTokens
	case outcomeCut:
		b.Cut++
	default:
		b.Failed++
		b.Failures = append(b.Failures, fmt.Sprintf("call of %s at %.1fs: %s (%s) after %d attempts", c.Tenant, c.Start.Seconds(), c.Outcome, c.Cause, len(c.Attempts)))
	}
	if c.Paced > 0 {
		b.Paced++
		b.PacedSeconds += c.Paced.Seconds()
	}
	for i, a := range c.Attempts {
		if a.Cause == "rate_limited" {
			b.RateLimited++
			if a.Rate.NoRetry {
				b.NoRetry++
			}
		}
		b.countAnswer(c, i)
		if i == 0 || c.Attempts[i-1].RetryAfter <= 0 {
			continue
		}
		prev := c.Attempts[i-1]
		b.RetriesAfterHeader++
		b.MaxRetryAfter = max(b.MaxRetryAfter, prev.RetryAfter)
		if (a.Start - prev.End).Seconds() >= honouredRatio*float64(prev.RetryAfter) {
			b.Honoured++
		}
	}
}

// countAnswer sorts c's attempt i by its answer and its headers.
func (b *budgetSummary) countAnswer(c openaiCall, i int) {
	a := c.Attempts[i]
	what := fmt.Sprintf("attempt %d of %s's call at %.1fs, %.1fs to %.1fs: %d %s %s", i+1, c.Tenant, c.Start.Seconds(), a.Start.Seconds(), a.End.Seconds(), a.Status, a.Outcome, a.Cause)
	switch {
	case a.Status == 0 && a.Outcome != outcomeCut:
		b.Lost = append(b.Lost, what)
	case a.Status == 0:
	case a.Rate.Limit > 0:
		b.Answered++
		b.WithHeaders++
	default:
		b.Answered++
		b.Bare = append(b.Bare, what)
	}
}

// honouredRatio: the client sleeps Retry-After from the moment it has the
// answer, and the recorder notes the end a hair later.
const honouredRatio = 0.98

// budgetMarkdown is the report's section on the budget stream.
func budgetMarkdown(b *budgetSummary) string {
	var s strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&s, format, args...) }
	used := b.PromptTokens + b.CompletionTokens
	w("\n## A tenant over its token budget\n\n")
	w("Tenant `%s` (%s tier) has `tokensPerMinute: %d` in its TenantQuota; in Local mode each dispatcher enforces its part (%s). ",
		b.Tenant, b.Tier, b.TokensPerMinute, joinInts(b.PerDispatcher))
	w("Its %d openai-go workers send prompts that reserve about %d tokens each (the prompt, estimated at the dispatcher's bytes-per-token ratio, plus `max_tokens`), so a bucket holds only a request or two, and refills one every few tens of seconds. ", b.Workers, b.Cost)
	w("The SDK retries a 429 after its `Retry-After`; between calls each worker also waits until the `x-ratelimit-remaining-tokens` of its last answer, refilling at `x-ratelimit-limit-tokens` a minute, would hold its next request.\n\n")
	w("| calls | succeeded | failed | cut | HTTP attempts | 429 rate_limited | of them x-should-retry: false | retries after Retry-After | honoured | max Retry-After | answers with x-ratelimit-* | paced waits |\n")
	w("|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	w("| %d | %d | %d | %d | %d | %d | %d | %d | %d | %ds | %d of %d | %d (%.0fs) |\n\n", b.Calls, b.Succeeded, b.Failed, b.Cut, b.Attempts, b.RateLimited, b.NoRetry,
		b.RetriesAfterHeader, b.Honoured, b.MaxRetryAfter, b.WithHeaders, b.Answered, b.Paced, b.PacedSeconds)
	verdict := "within its budget"
	if !b.Within {
		verdict = "**more than its budget allows**"
	}
	w("Its answers used %d tokens (%d prompt, %d completion) from its first request to its last answer, %.1fs later: %s. A budget of %d a minute admits at most the full buckets plus their refill, %d × (1 + %.1f/60) = %d tokens, in that time. ",
		used, b.PromptTokens, b.CompletionTokens, b.SpanSeconds, verdict, b.TokensPerMinute, b.TokensPerMinute, b.SpanSeconds, b.AllowedTokens)
	w("Beyond the %d of the full buckets it started with (the burst a token bucket allows), it used %d: %.0f tokens a minute against its %d.\n",
		b.TokensPerMinute, max(used-b.TokensPerMinute, 0), b.BeyondBurstPerMinute, b.TokensPerMinute)
	return s.String()
}

// budgetFinding is the budget stream's line among the findings.
func budgetFinding(b *budgetSummary) string {
	used := b.PromptTokens + b.CompletionTokens
	msg := fmt.Sprintf("The tenant %s, over its budget of %d tokens a minute, was refused %d times with 429 rate_limited; the openai-go client retried %d times after Retry-After (%d waited it) and paced itself %d times on the x-ratelimit-* headers. ",
		b.Tenant, b.TokensPerMinute, b.RateLimited, b.RetriesAfterHeader, b.Honoured, b.Paced)
	if b.Within {
		return msg + fmt.Sprintf("Its answers used %d tokens, within the %d its budget admits in %.0fs: beyond its full buckets, %.0f a minute.", used, b.AllowedTokens, b.SpanSeconds, b.BeyondBurstPerMinute)
	}
	return msg + fmt.Sprintf("**Its answers used %d tokens, more than the %d its budget admits in %.0fs.**", used, b.AllowedTokens, b.SpanSeconds)
}

func joinInts(vs []int64) string {
	parts := make([]string, len(vs))
	for i, v := range vs {
		parts[i] = strconv.FormatInt(v, 10)
	}
	return strings.Join(parts, " + ")
}

// readBudgets notes the budget stream's budgets at each dispatcher before
// the load, and says what they are.
func (d *demo) readBudgets(ctx context.Context) error {
	for _, sp := range d.plan {
		if sp.Budget == nil {
			continue
		}
		parts, err := d.budgetParts(ctx, sp.Tenants[0])
		if err != nil {
			return fmt.Errorf("reading %s's budgets from the dispatchers: %w", sp.Tenants[0], err)
		}
		var per []int64
		total := int64(0)
		for _, p := range parts {
			per, total = append(per, p.TokensPerMinute), total+p.TokensPerMinute
		}
		if total == 0 {
			return fmt.Errorf("tenant %q of stream %q has no tokens budget at the dispatchers: was hack/demo/manifests changed?", sp.Tenants[0], sp.Name)
		}
		d.budgets = parts
		d.ui.logf("tenant %s has a budget of %d tokens a minute (Local mode: %s at the dispatchers); its requests reserve about %d each",
			sp.Tenants[0], total, joinInts(per), sp.Budget.cost())
	}
	return nil
}
