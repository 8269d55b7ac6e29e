package apierror

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/dispatcher/identity"
	"github.com/tiergate/tiergate/dispatcher/queue"
	"github.com/tiergate/tiergate/dispatcher/tokens"
)

func TestFromQueue(t *testing.T) {
	tests := map[string]struct {
		err  error
		want Error
	}{
		"queue full": {
			err: &queue.Refusal{Cause: queue.ErrQueueFull, Tier: "premium", Position: 21, RetryAfter: 3 * time.Second},
			want: Error{Status: 429, Cause: queue.CauseCapacity, Tier: "premium", Position: 21, RetryAfter: 3 * time.Second,
				Message: `the queue of tier "premium" is full; retry after 3s`},
		},
		"tenant limit, wrapped": {
			err: fmt.Errorf("admit: %w", &queue.Refusal{Cause: queue.ErrTenantLimit, Tier: "premium", Position: 4, RetryAfter: time.Second}),
			want: Error{Status: 429, Cause: queue.CauseTenantLimit, Tier: "premium", Position: 4, RetryAfter: time.Second,
				Message: `tenant "acme" has as many requests queued as tier "premium" allows one tenant; retry after 1s`},
		},
		"unknown tier": {
			err:  queue.ErrUnknownTier,
			want: Error{Status: 403, Cause: queue.CauseUnknownTenant, Message: `tenant "acme" is not known and the pool has no default tier`},
		},
		"no policy": {
			err:  queue.ErrNoPolicy,
			want: Error{Status: 503, Cause: queue.CauseUnavailable, RetryAfter: time.Second, Message: "the dispatcher has no policy yet"},
		},
		"no capacity: retry after the tier's wait": {
			err: queue.ErrNoCapacity,
			want: Error{Status: 503, Cause: queue.CauseUnavailable, Tier: "premium", RetryAfter: 5 * time.Second,
				Message: "the pool has no capacity right now (no ready backends)"},
		},
		"a tier that cannot wait out the cold start: retry after it": {
			err: &queue.ColdStartRefusal{Tier: "premium", ColdStart: 12 * time.Second},
			want: Error{Status: 503, Cause: queue.CauseUnavailable, Tier: "premium", RetryAfter: 12 * time.Second,
				Message: `the pool is starting from zero replicas and its first replica takes 12s to become ready, longer than tier "premium" can wait, so the request is refused rather than held; retry after 12s`},
		},
		"a cold start under a second: retry after 1s": {
			err: fmt.Errorf("admit: %w", &queue.ColdStartRefusal{Tier: "premium", ColdStart: 300 * time.Millisecond}),
			want: Error{Status: 503, Cause: queue.CauseUnavailable, Tier: "premium", RetryAfter: time.Second,
				Message: `the pool is starting from zero replicas and its first replica takes 300ms to become ready, longer than tier "premium" can wait, so the request is refused rather than held; retry after 1s`},
		},
		"a cold start of 1.5s: Retry-After rounds up to 2s": {
			err: &queue.ColdStartRefusal{Tier: "premium", ColdStart: 1500 * time.Millisecond},
			want: Error{Status: 503, Cause: queue.CauseUnavailable, Tier: "premium", RetryAfter: 1500 * time.Millisecond,
				Message: `the pool is starting from zero replicas and its first replica takes 1.5s to become ready, longer than tier "premium" can wait, so the request is refused rather than held; retry after 2s`},
		},
		"draining": {
			err: queue.ErrDraining,
			want: Error{Status: 503, Cause: queue.CauseDraining, Tier: "premium", RetryAfter: time.Second,
				Message: "the dispatcher is shutting down; retry on another instance"},
		},
		"drained while queued": {
			err: queue.ErrDrained,
			want: Error{Status: 503, Cause: queue.CauseDraining, Tier: "premium", RetryAfter: time.Second,
				Message: "the dispatcher is shutting down; retry on another instance"},
		},
		"expired": {
			err: queue.ErrExpired,
			want: Error{Status: 504, Cause: queue.CauseQueueTimeout, Tier: "premium",
				Message: `the request waited in the queue of tier "premium" for the client timeout (30s) without being dispatched`},
		},
		"gate failure": {
			err: fmt.Errorf("redis: connection refused"),
			want: Error{Status: 503, Cause: queue.CauseUnavailable, Tier: "premium", RetryAfter: time.Second,
				Message: "admission failed: redis: connection refused"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := FromQueue(tc.err, "acme", "premium", 5*time.Second, 30*time.Second)
			if diff := cmp.Diff(tc.want, *got); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
		})
	}
}

// The status of every cause, pinned: scripts and clients rely on them.
func TestEveryCauseHasAStatus(t *testing.T) {
	want := map[string]int{
		"capacity": 429, "tenant_limit": 429, "unauthenticated": 401, "unknown_tenant": 403,
		"unavailable": 503, "draining": 503, "queue_timeout": 504, "body_too_large": 413,
		"bad_request": 400, "request_timeout": 408, "backend_error": 502, "method_not_allowed": 405,
		"overloaded": 503, "backend_timeout": 504, "rate_limited": 429,
	}
	got := map[string]int{}
	for _, c := range queue.Causes() {
		got[c] = statusOf(c)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got)\n%s", diff)
	}
	if diff := cmp.Diff(want, statuses); diff != "" {
		t.Errorf("statuses has causes queue.Causes lacks (-want +got)\n%s", diff)
	}
	if got := statusOf("no-such-cause"); got != 500 {
		t.Errorf("Status of an unknown cause = %d", got)
	}
}

func TestFromIdentity(t *testing.T) {
	p := &policy.Policy{
		Authentication: policy.Authentication{Mode: policy.AuthTrustedHeader, HeaderName: "X-Tenant-ID"},
		Tiers:          []policy.Tier{{Name: "premium"}},
	}
	id := identity.New(p)
	tests := map[string]struct {
		header http.Header
		want   Error
	}{
		"missing header is 401": {
			header: http.Header{},
			want:   Error{Status: 401, Cause: queue.CauseUnauthenticated, Message: "missing the X-Tenant-ID header that names the tenant"},
		},
		"repeated header is 400": {
			header: http.Header{"X-Tenant-Id": {"a", "b"}},
			want:   Error{Status: 400, Cause: queue.CauseBadRequest, Message: "the X-Tenant-ID header is repeated 2 times; send it once"},
		},
		"unknown tenant is 403": {
			header: http.Header{"X-Tenant-Id": {"carol"}},
			want:   Error{Status: 403, Cause: queue.CauseUnknownTenant, Message: `tenant "carol" is not known and the pool has no default tier`},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := id.Identify(&http.Request{Header: tc.header, RemoteAddr: "127.0.0.1:1"})
			if err == nil {
				t.Fatal("identified")
			}
			if diff := cmp.Diff(tc.want, *FromIdentity(err)); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
		})
	}
	// An error that is not an *identity.Error still refuses, with 401.
	got := FromIdentity(errors.New("no idea"))
	if diff := cmp.Diff(Error{Status: 401, Cause: queue.CauseUnauthenticated, Message: "no idea"}, *got); diff != "" {
		t.Errorf("(-want +got)\n%s", diff)
	}
}

func TestWrite(t *testing.T) {
	tests := map[string]struct {
		err         Error
		wantHeaders http.Header
		wantBody    string
	}{
		"429 carries every header": {
			err: Error{Status: 429, Cause: queue.CauseCapacity, Message: "full", Tier: "free", Position: 241, RetryAfter: 1500 * time.Millisecond},
			wantHeaders: http.Header{"Retry-After": {"2"}, "X-Queue-Position": {"241"}, "X-Tier": {"free"},
				"Content-Type": {"application/json"}, "Cache-Control": {"no-store"}},
			wantBody: `{"error":{"type":"capacity","message":"full","tier":"free","queue_position":241,"retry_after_seconds":2}}` + "\n",
		},
		"503 overloaded names the budget and carries Retry-After": {
			err: *Overloaded("free", 128<<20),
			wantHeaders: http.Header{"Retry-After": {"1"}, "X-Tier": {"free"},
				"Content-Type": {"application/json"}, "Cache-Control": {"no-store"}},
			wantBody: `{"error":{"type":"overloaded","message":"queued request bodies would exceed the dispatcher's 128 MiB budget (--max-queued-bytes); retry shortly or on another instance","tier":"free","queue_position":0,"retry_after_seconds":1}}` + "\n",
		},
		"504 backend_timeout names the tier": {
			err:         *BackendTimeout("free"),
			wantHeaders: http.Header{"X-Tier": {"free"}, "Content-Type": {"application/json"}, "Cache-Control": {"no-store"}},
			wantBody:    `{"error":{"type":"backend_timeout","message":"the model backend did not start its answer in time","tier":"free","queue_position":0,"retry_after_seconds":0}}` + "\n",
		},
		"429 rate_limited: Retry-After rounded up, no queue position": {
			err: *RateLimited("acme", "premium", tokens.Decision{Budget: tokens.BudgetTokens, RetryAfter: 1300 * time.Millisecond,
				Tokens: tokens.Bucket{Limit: 60000}}, 1300),
			wantHeaders: http.Header{"Retry-After": {"2"}, "X-Tier": {"premium"},
				"Content-Type": {"application/json"}, "Cache-Control": {"no-store"}},
			wantBody: `{"error":{"type":"rate_limited","message":"tenant \"acme\" is over its tokens budget (60000 per minute): this request reserves 1300 tokens; retry after 1.3s","tier":"premium","queue_position":0,"retry_after_seconds":2}}` + "\n",
		},
		"429 rate_limited that can never fit: X-Should-Retry false, no Retry-After": {
			err: *RateLimited("acme", "premium", tokens.Decision{Budget: tokens.BudgetTokens, Never: true,
				Tokens: tokens.Bucket{Limit: 1000, Remaining: 1000}}, 1300),
			wantHeaders: http.Header{"X-Should-Retry": {"false"}, "X-Tier": {"premium"},
				"Content-Type": {"application/json"}, "Cache-Control": {"no-store"}},
			wantBody: `{"error":{"type":"rate_limited","message":"` + neverMsg + `","tier":"premium","queue_position":0,"retry_after_seconds":0}}` + "\n",
		},
		"401 has no queue headers": {
			err:         Error{Status: 401, Cause: queue.CauseUnauthenticated, Message: "unknown API key"},
			wantHeaders: http.Header{"Content-Type": {"application/json"}, "Cache-Control": {"no-store"}},
			wantBody:    `{"error":{"type":"unauthenticated","message":"unknown API key","tier":"","queue_position":0,"retry_after_seconds":0}}` + "\n",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			rec.Header().Set(HeaderQueueWaitMs, "12") // a refusal must drop it
			tc.err.Write(rec)
			tc.wantHeaders.Set("Content-Length", strconv.Itoa(len(tc.wantBody)))
			if rec.Code != tc.err.Status {
				t.Errorf("status %d", rec.Code)
			}
			if diff := cmp.Diff(tc.wantHeaders, rec.Header()); diff != "" {
				t.Errorf("headers (-want +got)\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantBody, rec.Body.String()); diff != "" {
				t.Errorf("body (-want +got)\n%s", diff)
			}
		})
	}
}

// neverMsg is the message of a 1300-token request to acme's 1000-token budget.
const neverMsg = `tenant \"acme\" is over its tokens budget (1000 per minute): this request reserves 1300 tokens, more than the whole budget, so it can never be admitted; lower max_tokens (or max_completion_tokens) or shorten the prompt`

func TestRateLimited(t *testing.T) {
	tests := map[string]struct {
		d           tokens.Decision
		reservation int64
		want        Error
	}{
		"tokens: the wait to the millisecond in the message, whole seconds in Retry-After": {
			d: tokens.Decision{Budget: tokens.BudgetTokens, RetryAfter: 1300 * time.Millisecond,
				Requests: tokens.Bucket{Limit: 60, Remaining: 59}, Tokens: tokens.Bucket{Limit: 60000, Remaining: 200}},
			reservation: 1300,
			want: Error{Status: 429, Cause: queue.CauseRateLimited, Tier: "premium", RetryAfter: 1300 * time.Millisecond,
				Message: `tenant "acme" is over its tokens budget (60000 per minute): this request reserves 1300 tokens; retry after 1.3s`},
		},
		"tokens: a wait of a fraction of a millisecond is rounded up": {
			d:           tokens.Decision{Budget: tokens.BudgetTokens, RetryAfter: 20*time.Millisecond + 1, Tokens: tokens.Bucket{Limit: 500}},
			reservation: 12,
			want: Error{Status: 429, Cause: queue.CauseRateLimited, Tier: "premium", RetryAfter: 20*time.Millisecond + 1,
				Message: `tenant "acme" is over its tokens budget (500 per minute): this request reserves 12 tokens; retry after 21ms`},
		},
		"requests: the cost is one request": {
			d: tokens.Decision{Budget: tokens.BudgetRequests, RetryAfter: 2 * time.Second,
				Requests: tokens.Bucket{Limit: 30}, Tokens: tokens.Bucket{Limit: 60000, Remaining: 60000}},
			reservation: 1300,
			want: Error{Status: 429, Cause: queue.CauseRateLimited, Tier: "premium", RetryAfter: 2 * time.Second,
				Message: `tenant "acme" is over its requests budget (30 per minute): this request reserves 1 request; retry after 2s`},
		},
		"more than the whole budget: Never, no Retry-After": {
			d:           tokens.Decision{Budget: tokens.BudgetTokens, Never: true, Tokens: tokens.Bucket{Limit: 1000, Remaining: 1000}},
			reservation: 1300,
			want: Error{Status: 429, Cause: queue.CauseRateLimited, Tier: "premium", Never: true,
				Message: `tenant "acme" is over its tokens budget (1000 per minute): this request reserves 1300 tokens, more than the whole budget, so it can never be admitted; lower max_tokens (or max_completion_tokens) or shorten the prompt`},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, *RateLimited("acme", "premium", tc.d, tc.reservation)); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
		})
	}
}

func TestBudgetsUnavailable(t *testing.T) {
	got := BudgetsUnavailable("premium", errors.New("redis: connection refused"))
	want := Error{Status: 503, Cause: queue.CauseUnavailable, Tier: "premium", RetryAfter: time.Second,
		Message: "the tenant's budgets could not be checked: redis: connection refused"}
	if diff := cmp.Diff(want, *got); diff != "" {
		t.Errorf("(-want +got)\n%s", diff)
	}
}
