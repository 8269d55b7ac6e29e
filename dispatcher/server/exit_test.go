package server

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/dispatcher/apierror"
	"github.com/tiergate/tiergate/dispatcher/metrics"
	"github.com/tiergate/tiergate/dispatcher/queue"
	"github.com/tiergate/tiergate/dispatcher/tokens"
)

// exitCase is one way a request ends: the outcome a stage returns (built
// from the exchange, as the stages do) and what the exit makes of it.
type exitCase struct {
	pool, tier string // the exchange's labels when the stage returned
	noPolicy   bool   // the request started with no policy in force
	outcome    func(x *exchange) outcome
	wantStatus int
	wantBody   map[string]any // the refusal's JSON; nil: nothing written by the exit
	wantHeader http.Header    // headers that must be set
	wantTotal  string         // the requests_total series counted
	wantReject string         // the rejections_total series counted, if any
	wantAband  string         // the abandoned_total series counted, if any
}

func refusalJSON(typ, msg, tier string, pos, retry float64) map[string]any {
	return map[string]any{"error": map[string]any{"type": typ, "message": msg, "tier": tier, "queue_position": pos, "retry_after_seconds": retry}}
}

// ref is a stage that refuses with e.
func ref(e *apierror.Error) func(*exchange) outcome {
	return func(*exchange) outcome { return refused(e) }
}

// The buckets of a refused decision: acme's requests (1 of 60 taken) and
// tokens (200 of 60000 left).
var (
	requests59 = tokens.Bucket{Limit: 60, Remaining: 59, Reset: time.Second}
	tokens200  = tokens.Bucket{Limit: 60000, Remaining: 200, Reset: 58800 * time.Millisecond}
)

// rateLimited is the budget's refusal of a 1300-token request from acme,
// with d the latest decision, as reserve leaves the exchange.
func rateLimited(d tokens.Decision) func(x *exchange) outcome {
	return func(x *exchange) outcome {
		x.tok.budget, x.tok.dec = true, d
		x.sw.tok = &x.tok
		return refused(apierror.RateLimited("acme", x.tier, d, 1300))
	}
}

// exitCases are the refusals, one cause or more each.
func exitCases() map[string]exitCase {
	return map[string]exitCase{
		"unauthenticated": {pool: "p", outcome: ref(apierror.FromIdentity(errors.New("missing the X-Tenant-ID header that names the tenant"))),
			wantStatus: 401, wantBody: refusalJSON("unauthenticated", "missing the X-Tenant-ID header that names the tenant", "", 0, 0),
			wantTotal: "code=401,pool=p,tier=", wantReject: "cause=unauthenticated,pool=p,tier="},
		"unknown tenant": {pool: "p", outcome: ref(apierror.FromQueue(queue.ErrUnknownTier, "carol", "", 0, 0)),
			wantStatus: 403, wantBody: refusalJSON("unknown_tenant", `tenant "carol" is not known and the pool has no default tier`, "", 0, 0),
			wantTotal: "code=403,pool=p,tier=", wantReject: "cause=unknown_tenant,pool=p,tier="},
		"capacity": {pool: "p", tier: "premium",
			outcome:    ref(apierror.FromQueue(&queue.Refusal{Cause: queue.ErrQueueFull, Tier: "premium", Position: 5, RetryAfter: 2 * time.Second}, "acme", "premium", 0, 0)),
			wantStatus: 429, wantBody: refusalJSON("capacity", `the queue of tier "premium" is full; retry after 2s`, "premium", 5, 2),
			wantHeader: http.Header{"Retry-After": {"2"}, "X-Queue-Position": {"5"}, "X-Tier": {"premium"}},
			wantTotal:  "code=429,pool=p,tier=premium", wantReject: "cause=capacity,pool=p,tier=premium"},
		"tenant limit": {pool: "p", tier: "premium",
			outcome:    ref(apierror.FromQueue(&queue.Refusal{Cause: queue.ErrTenantLimit, Tier: "premium", Position: 2, RetryAfter: time.Second}, "acme", "premium", 0, 0)),
			wantStatus: 429, wantBody: refusalJSON("tenant_limit", `tenant "acme" has as many requests queued as tier "premium" allows one tenant; retry after 1s`, "premium", 2, 1),
			wantTotal: "code=429,pool=p,tier=premium", wantReject: "cause=tenant_limit,pool=p,tier=premium"},
		"unavailable: no policy": {noPolicy: true, outcome: ref(apierror.NoPolicy()),
			wantStatus: 503, wantBody: refusalJSON("unavailable", "the dispatcher has no policy yet", "", 0, 1),
			wantHeader: http.Header{"Retry-After": {"1"}},
			wantTotal:  "code=503,pool=,tier=", wantReject: "cause=unavailable,pool=,tier="},
		"unavailable: no backend": {pool: "p", tier: "premium", outcome: ref(apierror.NoBackend("premium")),
			wantStatus: 503, wantBody: refusalJSON("unavailable", "no ready backend", "premium", 0, 1),
			wantTotal: "code=503,pool=p,tier=premium", wantReject: "cause=unavailable,pool=p,tier=premium"},
		// Refused before the pool is read from the policy: pool "".
		"draining": {outcome: ref(apierror.Draining()),
			wantStatus: 503, wantBody: refusalJSON("draining", "the dispatcher is shutting down; retry on another instance", "", 0, 1),
			wantTotal: "code=503,pool=,tier=", wantReject: "cause=draining,pool=,tier="},
		"overloaded": {pool: "p", tier: "premium",
			outcome: func(*exchange) outcome {
				return outcome{refusal: apierror.Overloaded("premium", 1<<20), discard: true}
			},
			wantStatus: 503, wantBody: refusalJSON("overloaded", "queued request bodies would exceed the dispatcher's 1 MiB budget (--max-queued-bytes); retry shortly or on another instance", "premium", 0, 1),
			wantTotal: "code=503,pool=p,tier=premium", wantReject: "cause=overloaded,pool=p,tier=premium"},
		"queue timeout": {pool: "p", tier: "premium", outcome: ref(apierror.FromQueue(queue.ErrExpired, "acme", "premium", 5*time.Second, 30*time.Second)),
			wantStatus: 504, wantBody: refusalJSON("queue_timeout", `the request waited in the queue of tier "premium" for the client timeout (30s) without being dispatched`, "premium", 0, 0),
			wantTotal: "code=504,pool=p,tier=premium", wantReject: "cause=queue_timeout,pool=p,tier=premium"},
		"body too large: the tier is the caller's": {pool: "p", tier: "premium", outcome: ref(apierror.BodyTooLarge(1024)),
			wantStatus: 413, wantBody: refusalJSON("body_too_large", "the request body is larger than 1024 bytes", "premium", 0, 0),
			wantTotal: "code=413,pool=p,tier=premium", wantReject: "cause=body_too_large,pool=p,tier=premium"},
		"bad request": {pool: "p", outcome: ref(apierror.BadRequest(upgradeRefused)),
			wantStatus: 400, wantBody: refusalJSON("bad_request", upgradeRefused, "", 0, 0),
			wantTotal: "code=400,pool=p,tier=", wantReject: "cause=bad_request,pool=p,tier="},
		"request timeout": {pool: "p", tier: "premium", outcome: ref(apierror.RequestTimeout(30 * time.Second)),
			wantStatus: 408, wantBody: refusalJSON("request_timeout", "the request body did not arrive within 30s", "premium", 0, 0),
			wantTotal: "code=408,pool=p,tier=premium", wantReject: "cause=request_timeout,pool=p,tier=premium"},
		"backend error": {pool: "p", tier: "premium",
			outcome: func(x *exchange) outcome {
				return outcome{refusal: apierror.BackendError(x.tier), err: errors.New("forward: backend failed before answering: EOF")}
			},
			wantStatus: 502, wantBody: refusalJSON("backend_error", "the model backend failed before answering", "premium", 0, 0),
			wantTotal: "code=502,pool=p,tier=premium", wantReject: "cause=backend_error,pool=p,tier=premium"},
		"backend timeout": {pool: "p", tier: "premium",
			outcome: func(x *exchange) outcome {
				return outcome{refusal: apierror.BackendTimeout(x.tier), err: errors.New("forward: no response head in time")}
			},
			wantStatus: 504, wantBody: refusalJSON("backend_timeout", "the model backend did not start its answer in time", "premium", 0, 0),
			wantTotal: "code=504,pool=p,tier=premium", wantReject: "cause=backend_timeout,pool=p,tier=premium"},
		"rate limited: Retry-After and the budget's headers": {pool: "p", tier: "premium",
			outcome:    rateLimited(tokens.Decision{Budget: tokens.BudgetTokens, RetryAfter: 1300 * time.Millisecond, Requests: requests59, Tokens: tokens200}),
			wantStatus: 429, wantBody: refusalJSON("rate_limited", `tenant "acme" is over its tokens budget (60000 per minute): this request reserves 1300 tokens; retry after 1.3s`, "premium", 0, 2),
			wantHeader: http.Header{"Retry-After": {"2"}, "X-Tier": {"premium"}, "X-Should-Retry": nil,
				"X-Ratelimit-Limit-Requests": {"60"}, "X-Ratelimit-Remaining-Requests": {"59"}, "X-Ratelimit-Reset-Requests": {"1s"},
				"X-Ratelimit-Limit-Tokens": {"60000"}, "X-Ratelimit-Remaining-Tokens": {"200"}, "X-Ratelimit-Reset-Tokens": {"58.8s"}},
			wantTotal: "code=429,pool=p,tier=premium", wantReject: "cause=rate_limited,pool=p,tier=premium"},
		"rate limited for good: X-Should-Retry false, no Retry-After": {pool: "p", tier: "premium",
			outcome: rateLimited(tokens.Decision{Budget: tokens.BudgetTokens, Never: true, Requests: requests59,
				Tokens: tokens.Bucket{Limit: 1000, Remaining: 1000}}),
			wantStatus: 429, wantBody: refusalJSON("rate_limited", `tenant "acme" is over its tokens budget (1000 per minute): this request reserves 1300 tokens, more than the whole budget, so it can never be admitted; lower max_tokens (or max_completion_tokens) or shorten the prompt`, "premium", 0, 0),
			wantHeader: http.Header{"Retry-After": nil, "X-Should-Retry": {"false"},
				"X-Ratelimit-Limit-Tokens": {"1000"}, "X-Ratelimit-Remaining-Tokens": {"1000"}, "X-Ratelimit-Reset-Tokens": {"0s"}},
			wantTotal: "code=429,pool=p,tier=premium", wantReject: "cause=rate_limited,pool=p,tier=premium"},
		"method not allowed": {pool: "p", outcome: refuseConnect,
			wantStatus: 405, wantBody: refusalJSON("method_not_allowed", "the dispatcher does not accept CONNECT: it proxies model API calls and is not a tunnel", "", 0, 0),
			wantHeader: http.Header{"Allow": {allowedMethods}, "Connection": {"close"}},
			wantTotal:  "code=405,pool=p,tier=", wantReject: "cause=method_not_allowed,pool=p,tier="},
	}
}

// endCases are the ends that are not refusals: 499s, a cut stream, an
// answer of the backend's.
func endCases() map[string]exitCase {
	return map[string]exitCase{
		"client closed while sending its body": {pool: "p", tier: "premium", outcome: func(*exchange) outcome { return clientGone("") },
			wantStatus: 200, wantTotal: "code=499,pool=p,tier=premium"},
		"client closed while queued": {pool: "p", tier: "premium", outcome: func(*exchange) outcome { return clientGone(metrics.StageQueued) },
			wantStatus: 200, wantTotal: "code=499,pool=p,tier=premium", wantAband: "pool=p,stage=queued,tier=premium"},
		"client gone at dispatch": {pool: "p", tier: "premium", outcome: func(*exchange) outcome { return clientGone(metrics.StageDispatch) },
			wantStatus: 200, wantTotal: "code=499,pool=p,tier=premium", wantAband: "pool=p,stage=dispatch,tier=premium"},
		"client closed mid-generation": {pool: "p", tier: "premium",
			outcome: func(*exchange) outcome {
				o := clientGone(metrics.StageInflight)
				o.abort = true
				return o
			},
			wantStatus: 200, wantTotal: "code=499,pool=p,tier=premium", wantAband: "pool=p,stage=inflight,tier=premium"},
		"a stream the backend cut": {pool: "p", tier: "premium",
			outcome: func(*exchange) outcome {
				return outcome{code: http.StatusBadGateway, abort: true, err: errors.New("forward: answer cut")}
			},
			wantStatus: 200, wantTotal: "code=502,pool=p,tier=premium"},
		"a tier of a newer policy": {pool: "p", tier: "batch", outcome: ref(apierror.FromQueue(queue.ErrDrained, "acme", "batch", 0, 0)),
			wantStatus: 503, wantBody: refusalJSON("draining", "the dispatcher is shutting down; retry on another instance", "batch", 0, 1),
			wantTotal: "code=503,pool=p,tier=batch", wantReject: "cause=draining,pool=p,tier=batch"},
		"served": {pool: "p", tier: "premium",
			outcome: func(x *exchange) outcome {
				x.sw.WriteHeader(http.StatusCreated) // the backend's answer, forwarded
				return served
			},
			wantStatus: 201, wantTotal: "code=201,pool=p,tier=premium"},
	}
}

// Every cause goes through the one exit: it writes the refusal (status,
// headers, exact JSON) and counts the request once, by cause, stage and
// code, on a series that exists whatever the exchange knew.
func TestExitWritesAndCountsEveryOutcome(t *testing.T) {
	covered := map[string]bool{}
	cases := exitCases()
	for name, tc := range endCases() {
		cases[name] = tc
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, testPolicy(policy.AuthTrustedHeader, 1))
			rec := httptest.NewRecorder()
			x := getExchange(rec, &f.srv.draining)
			defer putExchange(x)
			if !tc.noPolicy {
				x.st = f.srv.cur.Load()
			}
			x.pool, x.tier = tc.pool, tc.tier
			o := tc.outcome(x)
			if o.refusal != nil {
				covered[o.refusal.Cause] = true
			}
			req := httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(""))
			f.srv.exit(x, req, o)

			if rec.Code != tc.wantStatus {
				t.Errorf("status %d, want %d", rec.Code, tc.wantStatus)
			}
			var body map[string]any
			if rec.Body.Len() > 0 {
				if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
					t.Fatalf("body %q: %v", rec.Body.String(), err)
				}
			}
			if diff := cmp.Diff(tc.wantBody, body); diff != "" {
				t.Errorf("body (-want +got)\n%s", diff)
			}
			for k, v := range tc.wantHeader {
				if got := rec.Header().Values(k); !slices.Equal(got, v) {
					t.Errorf("header %s = %q, want %q", k, got, v)
				}
			}
			for metric, want := range map[string]string{
				"tiergate_requests_total": tc.wantTotal, "tiergate_rejections_total": tc.wantReject, "tiergate_abandoned_total": tc.wantAband,
			} {
				wantSeries := map[string]float64{}
				if want != "" {
					wantSeries[want] = 1
				}
				if diff := cmp.Diff(wantSeries, series(t, f.reg, metric)); diff != "" {
					t.Errorf("%s (-want +got)\n%s", metric, diff)
				}
			}
		})
	}
	var missing []string
	for _, c := range queue.Causes() {
		if !covered[c] {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		t.Errorf("causes no case drives through the exit: %v", missing)
	}
}
