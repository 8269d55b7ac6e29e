package server

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	clocktesting "k8s.io/utils/clock/testing"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/dispatcher/tokens"
)

// The request headers tokenAnswer obeys.
const (
	testUsage  = "X-Test-Usage"  // "P,C": the usage to report (a JSON answer, or a stream's last chunk)
	testChunks = "X-Test-Chunks" // "N": answer with a stream of N content chunks
	testHang   = "X-Test-Hang"   // after the chunks, wait for the client to leave
	testLimits = "X-Test-Limits" // send the backend's own x-ratelimit-* headers
)

// wantsTokenAnswer says whether r asks the backend for tokenAnswer.
func wantsTokenAnswer(r *http.Request) bool {
	return r.Header.Get(testUsage) != "" || r.Header.Get(testChunks) != ""
}

// tokenAnswer is an OpenAI-shaped answer: JSON with usage, or an SSE
// stream of content chunks with or without a usage chunk.
func tokenAnswer(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get(testLimits) != "" {
		w.Header().Set("X-Ratelimit-Limit-Tokens", "1")
		w.Header().Set("X-Ratelimit-Remaining-Requests", "1")
	}
	usage := ""
	if u := r.Header.Get(testUsage); u != "" {
		p, c, _ := strings.Cut(u, ",")
		usage = fmt.Sprintf(`{"prompt_tokens":%s,"completion_tokens":%s,"total_tokens":0}`, p, c)
	}
	n, _ := strconv.Atoi(r.Header.Get(testChunks))
	if n == 0 {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"x","choices":[{"index":0,"text":"tok"}],"usage":%s}`, usage)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	for i := range n {
		fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok%d \"}}]}\n\n", i)
		_ = http.NewResponseController(w).Flush()
	}
	if r.Header.Get(testHang) != "" {
		<-r.Context().Done()
		return
	}
	if usage != "" {
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":%s}\n\n", usage)
	}
	_, _ = io.WriteString(w, "data: [DONE]\n\n")
}

// budgetPolicy: acme may send 60 requests and 6000 tokens a minute (a
// refill of 1 request and 100 tokens a second); premium gives the
// tenants it does not list 2 requests a minute and no tokens budget.
// Premium has one slot and one queue place.
func budgetPolicy() *policy.Policy {
	p := testPolicy(policy.AuthTrustedHeader, 1)
	p.DefaultTier = "premium"
	p.Tiers[0].QueueBound, p.Tiers[0].TenantQueueLimit = 1, 1
	p.Tiers[0].TenantLimits = &policy.Limits{RequestsPerMinute: 2}
	p.Tenants[0].Limits = &policy.Limits{RequestsPerMinute: 60, TokensPerMinute: 6000}
	return p
}

// completion is a body of 400 bytes of prompt (100 tokens at the initial
// 4 bytes per token) that may generate maxTokens.
func completion(maxTokens int) string {
	return fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":%d}`, strings.Repeat("x", 400), maxTokens)
}

type tokenCall struct {
	tenant, path, body string
	header             http.Header
	leaveAfter         int // read this many events, then hang up
}

type tokenGot struct {
	code   int
	header http.Header
	body   string
}

func (f *fixture) tokenDo(t *testing.T, c tokenCall) tokenGot {
	t.Helper()
	if c.path == "" {
		c.path = "/v1/completions"
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, f.front.URL+c.path, strings.NewReader(c.body))
	req.Header = c.header.Clone()
	if req.Header == nil {
		req.Header = http.Header{}
	}
	req.Header.Set("X-Tenant-Id", c.tenant)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got := tokenGot{code: resp.StatusCode, header: resp.Header}
	if c.leaveAfter > 0 {
		br := bufio.NewReader(resp.Body)
		for events := 0; events < c.leaveAfter; {
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatalf("after %d events: %v", events, err)
			}
			if line == "\n" {
				events++
			}
		}
		cancel()
		f.idle(t) // settled by the time the handler is gone
		return got
	}
	b, _ := io.ReadAll(resp.Body)
	got.body = string(b)
	return got
}

// limitHeaders are the x-ratelimit-* headers of got (empty values left
// out).
func limitHeaders(h http.Header) map[string]string {
	out := map[string]string{}
	for k, v := range h {
		if strings.HasPrefix(strings.ToLower(k), "x-ratelimit-") {
			out[strings.ToLower(k)] = strings.Join(v, ",")
		}
	}
	return out
}

func rl(limitReq, remReq, resetReq, limitTok, remTok, resetTok string) map[string]string {
	m := map[string]string{}
	if limitReq != "" {
		m["x-ratelimit-limit-requests"], m["x-ratelimit-remaining-requests"], m["x-ratelimit-reset-requests"] = limitReq, remReq, resetReq
	}
	if limitTok != "" {
		m["x-ratelimit-limit-tokens"], m["x-ratelimit-remaining-tokens"], m["x-ratelimit-reset-tokens"] = limitTok, remTok, resetTok
	}
	return m
}

// One tenant's budgets through a sequence of requests, on a clock that
// does not move (so nothing refills): each answer's headers show the
// reservation taken, and the next one's show how the last was settled.
// Every reservation is 200 tokens (100 of prompt, max_tokens 100) unless
// said otherwise.
func TestBudgetsReserveAndSettle(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_000_000, 0))
	f := newFixtureConfig(t, budgetPolicy(), Config{Limiter: tokens.NewLocal(clk)})
	usage := func(u string) http.Header { return http.Header{testUsage: {u}} }
	steps := []struct {
		name     string
		call     tokenCall
		wantCode int
		want     map[string]string // the x-ratelimit-* headers
	}{
		{name: "a JSON answer; the backend's own headers are replaced",
			call:     tokenCall{tenant: "acme", body: completion(100), header: http.Header{testUsage: {"100,50"}, testLimits: {"1"}}},
			wantCode: 200, want: rl("60", "59", "1s", "6000", "5800", "2s")},
		// Settled on its usage: 5800 + 200 - 150 = 5850.
		{name: "a stream with a usage chunk",
			call:     tokenCall{tenant: "acme", body: completion(100), header: http.Header{testUsage: {"100,5"}, testChunks: {"5"}}},
			wantCode: 200, want: rl("60", "58", "2s", "6000", "5650", "3.5s")},
		// 5650 + 200 - 105 = 5745.
		{name: "a stream without usage: the prompt estimate and the chunks",
			call:     tokenCall{tenant: "acme", body: completion(100), header: http.Header{testChunks: {"7"}}},
			wantCode: 200, want: rl("60", "57", "3s", "6000", "5545", "4.55s")},
		// 5545 + 200 - 107 = 5638.
		{name: "a stream the client leaves after 3 chunks",
			call:     tokenCall{tenant: "acme", body: completion(100), header: http.Header{testChunks: {"3"}, testHang: {"1"}}, leaveAfter: 3},
			wantCode: 200, want: rl("60", "56", "4s", "6000", "5438", "5.62s")},
		// 5438 + 200 - 103 = 5535.
		{name: "a JSON answer without usage is charged its prompt estimate",
			call:     tokenCall{tenant: "acme", body: completion(100)},
			wantCode: 200, want: rl("60", "55", "5s", "6000", "5335", "6.65s")},
		// 5335 + 200 - 100 = 5435: the refused requests below take nothing.
		{name: "over the tokens budget: 429 at once",
			call:     tokenCall{tenant: "acme", body: completion(5400)},
			wantCode: 429, want: rl("60", "55", "5s", "6000", "5435", "5.65s")},
		{name: "more than the whole tokens budget: 429, not to be retried",
			call:     tokenCall{tenant: "acme", body: completion(6000)},
			wantCode: 429, want: rl("60", "55", "5s", "6000", "5435", "5.65s")},
		{name: "an unlisted tenant has its tier's requests budget only",
			call:     tokenCall{tenant: "zed", body: completion(100), header: http.Header{testUsage: {"100,1"}, testLimits: {"1"}}},
			wantCode: 200, want: rl("2", "1", "30s", "", "", "")},
		{name: "its second request",
			call:     tokenCall{tenant: "zed", body: completion(100), header: usage("100,1")},
			wantCode: 200, want: rl("2", "0", "1m0s", "", "", "")},
		{name: "its third is over the requests budget",
			call:     tokenCall{tenant: "zed", body: completion(100)},
			wantCode: 429, want: rl("2", "0", "1m0s", "", "", "")},
	}
	for _, s := range steps {
		got := f.tokenDo(t, s.call)
		if got.code != s.wantCode {
			t.Fatalf("%s: status %d, want %d: %s", s.name, got.code, s.wantCode, got.body)
		}
		if diff := cmp.Diff(s.want, limitHeaders(got.header)); diff != "" {
			t.Errorf("%s: x-ratelimit-* (-want +got)\n%s", s.name, diff)
		}
	}
	f.idle(t)
	// The refused requests reached no backend and were never queued.
	if n := len(f.be.paths); n != 7 {
		t.Errorf("%d requests reached the backend, want the 7 admitted", n)
	}
	if st := f.q.Stats(); st.Completed != 7 || st.InFlight != 0 {
		t.Errorf("queue: %d completed, %d in flight; want 7 and 0", st.Completed, st.InFlight)
	}
	want := map[string]float64{
		"kind=prompt,pool=p,tier=premium":     7 * 100,
		"kind=completion,pool=p,tier=premium": 50 + 5 + 7 + 3 + 0 + 1 + 1,
	}
	if diff := cmp.Diff(want, series(t, f.reg, "tiergate_tokens_total")); diff != "" {
		t.Errorf("tokens_total (-want +got)\n%s", diff)
	}
	if diff := cmp.Diff(map[string]float64{"cause=rate_limited,pool=p,tier=premium": 3}, series(t, f.reg, "tiergate_rejections_total")); diff != "" {
		t.Errorf("rejections_total (-want +got)\n%s", diff)
	}
}

// The refusals of the budgets: exact status, body and headers.
func TestBudgetRefusals(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_000_000, 0))
	f := newFixtureConfig(t, budgetPolicy(), Config{Limiter: tokens.NewLocal(clk)})
	tests := []struct {
		name        string
		call        tokenCall
		wantBody    map[string]any
		wantRetry   string // Retry-After
		wantNoRetry string // X-Should-Retry
	}{
		// 5900 reserved and used, of 6000: 100 left.
		{name: "tokens: most of the budget",
			call: tokenCall{tenant: "acme", body: completion(5800), header: http.Header{testUsage: {"100,5800"}}}},
		{name: "over the tokens budget",
			call: tokenCall{tenant: "acme", body: completion(100)},
			wantBody: map[string]any{"type": "rate_limited", "tier": "premium", "queue_position": 0.0, "retry_after_seconds": 1.0,
				"message": `tenant "acme" is over its tokens budget (6000 per minute): this request reserves 200 tokens; retry after 1s`},
			wantRetry: "1"},
		{name: "over the whole tokens budget",
			call: tokenCall{tenant: "acme", body: completion(5901)},
			wantBody: map[string]any{"type": "rate_limited", "tier": "premium", "queue_position": 0.0, "retry_after_seconds": 0.0,
				"message": `tenant "acme" is over its tokens budget (6000 per minute): this request reserves 6001 tokens, more than the whole budget, so it can never be admitted; lower max_tokens (or max_completion_tokens) or shorten the prompt`},
			wantNoRetry: "false"},
		{name: "requests: zed's first", call: tokenCall{tenant: "zed", body: completion(1)}},
		{name: "requests: zed's second", call: tokenCall{tenant: "zed", body: completion(1)}},
		{name: "over the requests budget",
			call: tokenCall{tenant: "zed", body: completion(1)},
			wantBody: map[string]any{"type": "rate_limited", "tier": "premium", "queue_position": 0.0, "retry_after_seconds": 30.0,
				"message": `tenant "zed" is over its requests budget (2 per minute): this request reserves 1 request; retry after 30s`},
			wantRetry: "30"},
	}
	for _, tc := range tests {
		got := f.tokenDo(t, tc.call)
		if tc.wantBody == nil {
			if got.code != 200 {
				t.Fatalf("%s: %d %s", tc.name, got.code, got.body)
			}
			continue
		}
		if got.code != http.StatusTooManyRequests {
			t.Fatalf("%s: status %d, want 429: %s", tc.name, got.code, got.body)
		}
		if diff := cmp.Diff(tc.wantBody, refusalBody(t, []byte(got.body))); diff != "" {
			t.Errorf("%s: body (-want +got)\n%s", tc.name, diff)
		}
		h := map[string]string{"Retry-After": got.header.Get("Retry-After"), "X-Should-Retry": got.header.Get("X-Should-Retry"), "X-Queue-Wait-Ms": got.header.Get("X-Queue-Wait-Ms")}
		if diff := cmp.Diff(map[string]string{"Retry-After": tc.wantRetry, "X-Should-Retry": tc.wantNoRetry, "X-Queue-Wait-Ms": ""}, h); diff != "" {
			t.Errorf("%s: headers (-want +got)\n%s", tc.name, diff)
		}
	}
}

// A request admitted by its budget and then refused by the queue, or whose
// every backend refused the connection, never reached a backend: all of
// its reservation goes back, the request included, and the refusal's
// headers already show it.
func TestNeverServedIsRefunded(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_000_000, 0))
	p := budgetPolicy()
	f := newFixtureConfig(t, p, Config{Limiter: tokens.NewLocal(clk)})
	full := rl("60", "60", "0s", "6000", "6000", "0s")

	// The slot and the queue place taken: 429 capacity.
	fillQueue(t, f)
	f.withBackends(t, budgetPolicy(), f.live()) // fillQueue's policy has no budgets
	got := f.tokenDo(t, tokenCall{tenant: "acme", body: completion(100)})
	if typ := refusalBody(t, []byte(got.body))["type"]; got.code != 429 || typ == "rate_limited" {
		t.Fatalf("a full queue: %d %s", got.code, got.body)
	}
	if diff := cmp.Diff(full, limitHeaders(got.header)); diff != "" {
		t.Errorf("queue refusal: x-ratelimit-* (-want +got)\n%s", diff)
	}

	// Only an unreachable backend: 502 backend_error, refunded.
	g := newFixtureConfig(t, p, Config{Limiter: tokens.NewLocal(clk)})
	g.withBackends(t, budgetPolicy(), closedAddr(t))
	got = g.tokenDo(t, tokenCall{tenant: "acme", body: completion(100)})
	if got.code != http.StatusBadGateway {
		t.Fatalf("unreachable backend: %d %s", got.code, got.body)
	}
	if diff := cmp.Diff(full, limitHeaders(got.header)); diff != "" {
		t.Errorf("unreachable backend: x-ratelimit-* (-want +got)\n%s", diff)
	}
	if n := len(series(t, g.reg, "tiergate_tokens_total")); n != 0 {
		t.Errorf("tokens_total counted %d series for requests that reached no backend", n)
	}
}

// failingLimiter is a store that cannot be reached.
type failingLimiter struct{}

var errStoreDown = errors.New("redis: connection refused")

func (failingLimiter) Reserve(context.Context, tokens.Key, policy.Limits, int64) (tokens.Decision, error) {
	return tokens.Decision{}, errStoreDown
}

func (failingLimiter) Settle(context.Context, tokens.Key, policy.Limits, tokens.Settlement) (tokens.Decision, error) {
	return tokens.Decision{}, errStoreDown
}

// Budgets that cannot be read refuse the tenants that have one with 503
// unavailable (no decision, so no x-ratelimit-* headers); a tenant
// without a budget does not ask the store and is served.
func TestBudgetsUnavailable(t *testing.T) {
	f := newFixtureConfig(t, budgetPolicy(), Config{Limiter: failingLimiter{}})
	got := f.tokenDo(t, tokenCall{tenant: "acme", body: completion(100)})
	if got.code != http.StatusServiceUnavailable {
		t.Fatalf("status %d: %s", got.code, got.body)
	}
	want := map[string]any{"type": "unavailable", "tier": "premium", "queue_position": 0.0, "retry_after_seconds": 1.0,
		"message": "the tenant's budgets could not be checked: redis: connection refused"}
	if diff := cmp.Diff(want, refusalBody(t, []byte(got.body))); diff != "" {
		t.Errorf("body (-want +got)\n%s", diff)
	}
	if h := limitHeaders(got.header); len(h) != 0 {
		t.Errorf("x-ratelimit-* on a refusal without a decision: %v", h)
	}
	p := budgetPolicy()
	p.Version, p.Tiers[0].TenantLimits, p.Tenants[0].Limits = 2, nil, nil
	f.withBackends(t, p, f.live())
	if got := f.tokenDo(t, tokenCall{tenant: "acme", body: completion(100)}); got.code != 200 || len(limitHeaders(got.header)) != 0 {
		t.Errorf("no budget: %d, x-ratelimit-* %v", got.code, limitHeaders(got.header))
	}
	if n := len(f.be.paths); n != 1 {
		t.Errorf("%d requests reached the backend, want 1", n)
	}
}

// Exempt paths are not estimated, reserved or given budget headers.
func TestExemptPathsHaveNoBudget(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_000_000, 0))
	f := newFixtureConfig(t, budgetPolicy(), Config{Limiter: tokens.NewLocal(clk)})
	for range 3 {
		if got := f.do(t, http.MethodGet, "/v1/models", http.Header{"X-Tenant-Id": {"zed"}}); got.StatusCode != http.StatusOK || len(limitHeaders(got.Header)) != 0 {
			t.Fatalf("exempt: %d, x-ratelimit-* %v", got.StatusCode, limitHeaders(got.Header))
		}
	}
	// zed's 2 requests a minute are all there.
	if got := f.tokenDo(t, tokenCall{tenant: "zed", body: completion(1)}); got.code != 200 || got.header.Get("X-Ratelimit-Remaining-Requests") != "1" {
		t.Errorf("after the exempt requests: %d, remaining %q", got.code, got.header.Get("X-Ratelimit-Remaining-Requests"))
	}
}

// Answers that report usage teach the pool's ratio, and the estimate's
// error is observed against the usage: prompts of 2 bytes a token are
// first estimated at half their tokens.
func TestUsageTeachesTheRatio(t *testing.T) {
	f := newFixture(t, testPolicy(policy.AuthTrustedHeader, 2))
	body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 400) + `"}],"max_tokens":1}`
	got := f.tokenDo(t, tokenCall{tenant: "acme", path: "/v1/chat/completions", body: body, header: http.Header{testUsage: {"200,1"}}})
	if got.code != 200 {
		t.Fatalf("status %d", got.code)
	}
	f.idle(t)
	h := estimateHistogram(t, f.reg)
	if h.GetSampleCount() != 1 || h.GetSampleSum() != 0.5 {
		t.Errorf("estimate error: %d samples, sum %v; want 1 of 100/200", h.GetSampleCount(), h.GetSampleSum())
	}
	if r := f.srv.BytesPerToken(); !(r < tokens.DefaultBytesPerToken && r >= 2) {
		t.Errorf("bytes per token %v after a sample of 2, want in [2, 4)", r)
	}
	// A body that is not one of the three shapes teaches nothing.
	before := f.srv.BytesPerToken()
	f.tokenDo(t, tokenCall{tenant: "acme", path: "/v1/other", body: strings.Repeat("y", 400), header: http.Header{testUsage: {"1,1"}}})
	f.idle(t)
	if r := f.srv.BytesPerToken(); r != before || estimateHistogram(t, f.reg).GetSampleCount() != 1 {
		t.Errorf("an unshaped body moved the ratio to %v (from %v) or was observed", r, before)
	}
}

// estimateHistogram is the estimate error histogram of pool p (empty when
// nothing was observed).
func estimateHistogram(t *testing.T, g prometheus.Gatherer) *dto.Histogram {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "tiergate_token_estimate_error_ratio" {
			return mf.GetMetric()[0].GetHistogram()
		}
	}
	return &dto.Histogram{}
}

// Large bodies are estimated a few at a time: one that waits its turn
// after its client left ends as a 499 without reaching the backend, and
// once a turn is free the next is served.
func TestLargeEstimatesTakeTurns(t *testing.T) {
	f := newFixture(t, testPolicy(policy.AuthTrustedHeader, 2))
	for range cap(f.srv.estimating) {
		f.srv.estimating <- struct{}{}
	}
	body := completion(largeBody) // longer than largeBody with its JSON
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/completions", strings.NewReader(body))
	req.Header.Set("X-Tenant-Id", "acme")
	f.srv.ServeHTTP(httptest.NewRecorder(), req)
	if diff := cmp.Diff(map[string]float64{"code=499,pool=p,tier=premium": 1}, series(t, f.reg, "tiergate_requests_total")); diff != "" {
		t.Errorf("requests_total (-want +got)\n%s", diff)
	}
	for range cap(f.srv.estimating) {
		<-f.srv.estimating
	}
	if got := f.tokenDo(t, tokenCall{tenant: "acme", body: body}); got.code != 200 {
		t.Errorf("with turns free: %d %s", got.code, got.body)
	}
	if n := len(f.be.paths); n != 1 {
		t.Errorf("%d requests reached the backend, want 1", n)
	}
}
