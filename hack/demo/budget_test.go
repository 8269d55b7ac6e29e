package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

func TestBudgetPlanCost(t *testing.T) {
	b := &budgetPlan{PromptBytes: 2001, MaxTokens: 100}
	if got := len(b.prompt()); got != 2001 {
		t.Errorf("prompt of %d bytes, want 2001", got)
	}
	if got, want := b.cost(), int64(501+100); got != want {
		t.Errorf("cost %d, want ⌈2001/4⌉ + 100 = %d", got, want)
	}
}

func TestReadRateHeaders(t *testing.T) {
	h := http.Header{}
	h.Set("X-Ratelimit-Limit-Tokens", "900")
	h.Set("X-Ratelimit-Remaining-Tokens", "300")
	h.Set("X-Should-Retry", "false")
	if diff := cmp.Diff(rateHeaders{Limit: 900, Remaining: 300, NoRetry: true}, readRateHeaders(h)); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(rateHeaders{}, readRateHeaders(http.Header{})); diff != "" {
		t.Errorf("no headers (-want +got):\n%s", diff)
	}
}

func TestPaceFor(t *testing.T) {
	tests := map[string]struct {
		h    rateHeaders
		cost int64
		want time.Duration
	}{
		"no headers":          {h: rateHeaders{}, cost: 600, want: 0},
		"enough left":         {h: rateHeaders{Limit: 900, Remaining: 600}, cost: 600, want: 0},
		"300 short at 15/s":   {h: rateHeaders{Limit: 900, Remaining: 300}, cost: 600, want: 20 * time.Second},
		"empty: a whole cost": {h: rateHeaders{Limit: 1800, Remaining: 0}, cost: 600, want: 20 * time.Second},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := paceFor(tc.h, tc.cost); got != tc.want {
				t.Errorf("paceFor(%+v, %d) = %s, want %s", tc.h, tc.cost, got, tc.want)
			}
		})
	}
}

func TestLimitsIn(t *testing.T) {
	p := &policy.Policy{
		DefaultTier: "free",
		Tiers: []policy.Tier{
			{Name: "standard", TenantLimits: &policy.Limits{RequestsPerMinute: 60, TokensPerMinute: 5000}},
			{Name: "free", TenantLimits: &policy.Limits{RequestsPerMinute: 10}},
		},
		Tenants: []policy.Tenant{{ID: "wayne", Tier: "standard", Limits: &policy.Limits{TokensPerMinute: 900}}},
	}
	for tenant, want := range map[string]policy.Limits{
		"wayne":   {RequestsPerMinute: 60, TokensPerMinute: 900}, // its own tokens, the tier's requests
		"unknown": {RequestsPerMinute: 10},                       // the default tier's
	} {
		if diff := cmp.Diff(want, limitsIn(p, tenant)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tenant, diff)
		}
	}
}

func TestSummarizeBudget(t *testing.T) {
	plan := []streamPlan{
		{Name: "soylent", Kind: kindOpenAI},
		{Name: "wayne", Tier: "standard", Tenants: []string{"wayne"}, Kind: kindOpenAI, Workers: 2, Budget: &budgetPlan{PromptBytes: 2000, MaxTokens: 100}},
	}
	parts := []policy.Limits{{TokensPerMinute: 900}, {TokensPerMinute: 900}}
	full := rateHeaders{Limit: 900, Remaining: 300}
	calls := []openaiCall{
		{Stream: "soylent", Outcome: outcomeServed, PromptTokens: 8, Attempts: []attempt{{Start: 0, End: sec(1), Status: 200}}},
		// Served at once: its usage counts.
		{Stream: "wayne", Outcome: outcomeServed, End: sec(7), PromptTokens: 500, CompletionTokens: 100,
			Attempts: []attempt{{Start: sec(1), End: sec(7), Status: 200, Rate: full}}},
		// Refused, retried after its Retry-After of 20 s, served; then
		// paced 5 s.
		{Stream: "wayne", Outcome: outcomeServed, End: sec(49), PromptTokens: 500, CompletionTokens: 100, Paced: sec(5), Attempts: []attempt{
			{Start: sec(2), End: sec(2.01), Status: 429, Cause: "rate_limited", RetryAfter: 20, Rate: rateHeaders{Limit: 900}},
			{Start: sec(22.01), End: sec(28), Status: 200, Rate: full},
		}},
		// Retried too early, then failed.
		{Stream: "wayne", Tenant: "wayne", Outcome: outcomeRefused, Cause: "rate_limited", Start: sec(50), End: sec(60), Attempts: []attempt{
			{Start: sec(50), End: sec(50), Status: 429, Cause: "rate_limited", RetryAfter: 10, Rate: rateHeaders{Limit: 900}},
			{Start: sec(55), End: sec(55), Status: 429, Cause: "rate_limited", RetryAfter: 10, Rate: rateHeaders{Limit: 900, NoRetry: true}},
		}},
		// Still queued when the demo ended: no answer, so no headers.
		{Stream: "wayne", Outcome: outcomeCut, Attempts: []attempt{{Start: sec(58), End: sec(60), Outcome: outcomeCut, Cause: "demo ended while queued"}}},
	}
	got := summarizeBudget(plan, calls, parts)
	// From the first attempt (1 s) to the end of the last served call
	// (49 s): 48 s, in which 1,800 a minute admits 1800 × (1 + 48/60).
	// Its 1,200 tokens are all within the first full buckets.
	want := &budgetSummary{
		Stream: "wayne", Tenant: "wayne", Tier: "standard", Workers: 2, TokensPerMinute: 1800, PerDispatcher: []int64{900, 900}, Cost: 600,
		Calls: 4, Succeeded: 2, Failed: 1, Cut: 1, Attempts: 6, RateLimited: 3, NoRetry: 1,
		RetriesAfterHeader: 2, Honoured: 1, MaxRetryAfter: 20, Answered: 5, WithHeaders: 5, Paced: 1, PacedSeconds: 5,
		Failures:     []string{"call of wayne at 50.0s: refused (rate_limited) after 2 attempts"},
		PromptTokens: 1000, CompletionTokens: 200, SpanSeconds: 48, AllowedTokens: 3240, Within: true, BeyondBurstPerMinute: 0,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if summarizeBudget(plan[:1], calls, parts) != nil {
		t.Error("a summary without a budget stream")
	}
	// 600 a minute over 48 s admits 1080; beyond the first 600 it used
	// 600 more in 48 s, 750 a minute.
	over := summarizeBudget(plan, calls, []policy.Limits{{TokensPerMinute: 300}, {TokensPerMinute: 300}})
	if over.Within || over.AllowedTokens != 1080 || over.BeyondBurstPerMinute != 750 {
		t.Errorf("600 a minute over 48 s admits 1080 tokens, not the 1200 used (750 a minute beyond the burst): %+v", over)
	}
	md := budgetMarkdown(got)
	for _, s := range []string{"## A tenant over its token budget", "`tokensPerMinute: 1800`", "(900 + 900)",
		"| 4 | 2 | 1 | 1 | 6 | 3 | 1 | 2 | 1 | 20s | 5 of 5 | 1 (5s) |", "within its budget", "1800 × (1 + 48.0/60) = 3240 tokens", "Beyond the 1800 of the full buckets it started with (the burst a token bucket allows), it used 0: 0 tokens a minute against its 1800."} {
		if !strings.Contains(md, s) {
			t.Errorf("the section lacks %q:\n%s", s, md)
		}
	}
	if f := budgetFinding(over); !strings.Contains(f, "**Its answers used 1200 tokens, more than the 1080") {
		t.Errorf("finding %q", f)
	}
}

// TestCountAnswer: an answer without the headers is Bare, an attempt
// without an answer Lost unless the demo's end cut it.
func TestCountAnswer(t *testing.T) {
	for _, tc := range []struct {
		name             string
		a                attempt
		answered, headed int
		bare, lost       []string
	}{
		{name: "answer with headers", a: attempt{Status: 200, Outcome: outcomeServed, Rate: rateHeaders{Limit: 900}}, answered: 1, headed: 1},
		{name: "refusal without headers", a: attempt{Start: sec(3), End: sec(4), Status: 429, Outcome: outcomeRefused, Cause: "overloaded"}, answered: 1,
			bare: []string{"attempt 1 of wayne's call at 2.0s, 3.0s to 4.0s: 429 refused overloaded"}},
		{name: "cut while queued", a: attempt{Outcome: outcomeCut, Cause: "demo ended while queued"}},
		{name: "transport error", a: attempt{Start: sec(3), End: sec(3), Outcome: outcomeError, Cause: "connection reset by peer"},
			lost: []string{"attempt 1 of wayne's call at 2.0s, 3.0s to 3.0s: 0 error connection reset by peer"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b budgetSummary
			b.countAnswer(openaiCall{Tenant: "wayne", Start: sec(2), Attempts: []attempt{tc.a}}, 0)
			want := budgetSummary{Answered: tc.answered, WithHeaders: tc.headed, Bare: tc.bare, Lost: tc.lost}
			if diff := cmp.Diff(want, b); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// TestBudgetWorkerPaces runs a budget worker against a server that
// answers like a dispatcher whose bucket is nearly empty: the openai-go
// client retries its 429 after Retry-After, and the worker then waits on
// the x-ratelimit-* headers of the answer before its next call.
func TestBudgetWorkerPaces(t *testing.T) {
	var mu sync.Mutex
	var arrivals []time.Time
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		arrivals = append(arrivals, time.Now())
		n := len(arrivals)
		mu.Unlock()
		w.Header().Set("X-Ratelimit-Limit-Tokens", "6000")
		if n == 1 {
			w.Header().Set("X-Ratelimit-Remaining-Tokens", "0")
			w.Header().Set("Retry-After", "1")
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = w.Write([]byte(`{"error":{"type":"rate_limited","message":"over its tokens budget"}}`))
			return
		}
		// 40 short of the next call's 60: 400 ms at 100 a second.
		w.Header().Set("X-Ratelimit-Remaining-Tokens", "20")
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"c1","object":"chat.completion","created":0,"model":"sim-model",` +
			`"choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"ok"}}],` +
			`"usage":{"prompt_tokens":10,"completion_tokens":50,"total_tokens":60}}`))
	}))
	defer srv.Close()

	s := streamPlan{Name: "wayne", Tier: "standard", Tenants: []string{"wayne"}, Kind: kindOpenAI, Workers: 1, To: 1,
		Budget: &budgetPlan{PromptBytes: 40, MaxTokens: 50, Pace: true}}
	rec := newRecorder(time.Now(), 2) // two calls, then the worker stops
	g := &loadGen{plan: []streamPlan{s}, sched: schedule{Load: time.Minute}, rec: rec, header: "X-Tenant-ID", timeout: 10 * time.Second,
		client: &http.Client{Transport: &serviceTransport{base: newTransport(), targets: []string{strings.TrimPrefix(srv.URL, "http://")}}}}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	g.openaiWorker(ctx, ctx, s, 0)

	_, _, calls := rec.snapshot()
	if len(calls) != 2 {
		t.Fatalf("%d calls, want 2", len(calls))
	}
	first := calls[0]
	if len(first.Attempts) != 2 || first.Attempts[0].Cause != "rate_limited" || first.Attempts[0].RetryAfter != 1 || first.Outcome != outcomeServed {
		t.Errorf("first call: %+v", first)
	}
	if first.PromptTokens != 10 || first.CompletionTokens != 50 {
		t.Errorf("first call's usage %d + %d, want 10 + 50", first.PromptTokens, first.CompletionTokens)
	}
	if first.Paced < 400*time.Millisecond || first.Paced > 2*time.Second {
		t.Errorf("paced %s after the first call, want the 400ms its headers ask for", first.Paced)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(arrivals) != 3 {
		t.Fatalf("%d requests reached the server, want 3", len(arrivals))
	}
	if gap := arrivals[1].Sub(arrivals[0]); gap < time.Second {
		t.Errorf("the retry came %s after the 429, before its Retry-After of 1s", gap)
	}
	if gap := arrivals[2].Sub(arrivals[1]); gap < 400*time.Millisecond {
		t.Errorf("the next call came %s after the answer, before the 400ms its headers ask for", gap)
	}
}
