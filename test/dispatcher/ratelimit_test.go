package dispatcher

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/internal/testutil"
)

// The six x-ratelimit-* headers, as OpenAI names them.
var (
	requestsHeaders = []string{"x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests"}
	tokensHeaders   = []string{"x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"}
)

// limitHeaders are h's x-ratelimit-* headers, by lower-case name.
func limitHeaders(h http.Header) map[string]string {
	out := map[string]string{}
	for k, v := range h {
		if l := strings.ToLower(k); strings.HasPrefix(l, "x-ratelimit-") {
			out[l] = strings.Join(v, ",")
		}
	}
	return out
}

// checkLimitHeaders fails unless h has exactly the headers of the budgets
// named (requests, tokens), each well formed.
func checkLimitHeaders(t *testing.T, what string, h http.Header, requests, tokens bool) {
	t.Helper()
	var want []string
	if requests {
		want = append(want, requestsHeaders...)
	}
	if tokens {
		want = append(want, tokensHeaders...)
	}
	got := limitHeaders(h)
	var names []string
	for _, n := range want {
		v, ok := got[n]
		names = append(names, n)
		switch {
		case !ok:
			t.Errorf("%s: no %s header (got %v)", what, n, got)
		case strings.HasPrefix(n, "x-ratelimit-reset-"):
			if _, err := time.ParseDuration(v); err != nil {
				t.Errorf("%s: %s %q is not a duration", what, n, v)
			}
		default:
			if _, err := strconv.ParseInt(v, 10, 64); err != nil {
				t.Errorf("%s: %s %q is not a whole number", what, n, v)
			}
		}
	}
	if len(got) != len(want) {
		t.Errorf("%s: x-ratelimit-* headers %v, want exactly %v", what, got, names)
	}
}

func headerInt(t *testing.T, h http.Header, name string) int64 {
	t.Helper()
	v, err := strconv.ParseInt(h.Get(name), 10, 64)
	if err != nil {
		t.Fatalf("%s %q: %v", name, h.Get(name), err)
	}
	return v
}

// completionBody is a /v1/completions body whose prompt is promptBytes of
// text (promptBytes / 4 tokens at the initial ratio, and at simserver's
// default bytes per token).
func completionBody(promptBytes, maxTokens int, stream, usage bool) string {
	b := fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":%d`, strings.Repeat("x", promptBytes), maxTokens)
	if stream {
		b += `,"stream":true`
		if usage {
			b += `,"stream_options":{"include_usage":true}`
		}
	}
	return b + "}"
}

// waitRefusal is a rate_limited refusal's message split around its wait,
// checked against the bounds the caller computed from the bucket.
type waitRefusal struct {
	prefix   string        // the message up to "; retry after "
	min, max time.Duration // the wait's bounds
}

func checkRateLimited(t *testing.T, what string, got result, w waitRefusal) {
	t.Helper()
	if got.err != nil || got.code != http.StatusTooManyRequests {
		t.Fatalf("%s: %d %v %s, want 429", what, got.code, got.err, got.body)
	}
	r := testutil.ParseRefusal(t, []byte(got.body))
	m := regexp.MustCompile(`^(.*); retry after (\S+)$`).FindStringSubmatch(r.Error.Message)
	if r.Error.Type != "rate_limited" || m == nil || m[1] != w.prefix {
		t.Fatalf("%s: %s %q, want rate_limited %q; retry after ...", what, r.Error.Type, r.Error.Message, w.prefix)
	}
	wait, err := time.ParseDuration(m[2])
	if err != nil || wait < w.min || wait > w.max {
		t.Errorf("%s: retry after %q, want within [%s, %s]", what, m[2], w.min, w.max)
	}
	secs := int(math.Ceil(wait.Seconds()))
	if ra := got.header.Get("Retry-After"); ra != strconv.Itoa(secs) || r.Error.RetryAfterSeconds != secs {
		t.Errorf("%s: Retry-After %q, retry_after_seconds %d; want %d (the wait %s rounded up)", what, ra, r.Error.RetryAfterSeconds, secs, wait)
	}
	if got.header.Get("X-Should-Retry") != "" || got.header.Get("X-Queue-Wait-Ms") != "" || got.header.Get("X-Queue-Position") != "" {
		t.Errorf("%s: headers %v", what, got.header)
	}
}

// A tenant over its tokens budget, over its requests budget, or asking
// for more than its whole budget gets 429 rate_limited at once, with the
// exact message, Retry-After (none for the last, which says
// X-Should-Retry: false) and its budgets' headers; successes carry the
// headers too, with less remaining each time, and the refused requests
// never reach the backend. The buckets refill at 10 tokens and 10
// requests a second (acme) and 2 requests a minute (globex); each bound
// allows for the refill over the time the test measured.
func TestBudgetRefusals(t *testing.T) {
	s := startSim(t, "--service-time", "0", "--output-tokens", "const:10")
	p := basePolicy(1, 4, s.Addr)
	p.Tenants[0].Limits = &policy.Limits{RequestsPerMinute: 600, TokensPerMinute: 600}
	p.Tenants[1].Limits = &policy.Limits{RequestsPerMinute: 2}
	d := startDispatcher(t, dispOpts{policy: p})
	ctx := context.Background()
	start := time.Now()
	// Each reserves 100 of prompt and 100 of output, and uses 110.
	r1 := d.fetch(ctx, t, call{tenant: "acme", body: completionBody(400, 100, false, false)})
	if r1.code != 200 {
		t.Fatalf("first: %d %s", r1.code, r1.body)
	}
	want := map[string]string{
		"x-ratelimit-limit-requests": "600", "x-ratelimit-remaining-requests": "599", "x-ratelimit-reset-requests": "100ms",
		"x-ratelimit-limit-tokens": "600", "x-ratelimit-remaining-tokens": "400", "x-ratelimit-reset-tokens": "20s",
	}
	if diff := cmp.Diff(want, limitHeaders(r1.header)); diff != "" {
		t.Errorf("first answer's x-ratelimit-* (-want +got)\n%s", diff)
	}
	// 400 + 90 given back - 200, plus the refill since the start.
	r2 := d.fetch(ctx, t, call{tenant: "acme", body: completionBody(400, 100, false, false)})
	refill := int64(10*time.Since(start).Seconds()) + 1
	checkLimitHeaders(t, "second answer", r2.header, true, true)
	if rem := headerInt(t, r2.header, "X-Ratelimit-Remaining-Tokens"); r2.code != 200 || rem < 290 || rem > 290+refill {
		t.Errorf("second: %d, remaining tokens %d, want within [290, %d]", r2.code, rem, 290+refill)
	}
	if rem := headerInt(t, r2.header, "X-Ratelimit-Remaining-Requests"); rem != 598 && rem != 599 {
		t.Errorf("second: remaining requests %d, want 598", rem)
	}

	// 380 left (after the second's settlement), 600 asked: 22s, less the
	// refill.
	r3 := d.fetch(ctx, t, call{tenant: "acme", body: completionBody(400, 500, false, false)})
	refill = int64(10*time.Since(start).Seconds()) + 1
	checkRateLimited(t, "over the tokens budget", r3, waitRefusal{
		prefix: `tenant "acme" is over its tokens budget (600 per minute): this request reserves 600 tokens`,
		min:    time.Duration(220-refill) * time.Second / 10, max: 22 * time.Second,
	})
	checkLimitHeaders(t, "tokens refusal", r3.header, true, true)

	r4 := d.fetch(ctx, t, call{tenant: "acme", body: completionBody(400, 600, false, false)})
	checkRefusal(t, r4, wantRefusal{code: 429, typ: "rate_limited", tier: "premium",
		msg: `tenant "acme" is over its tokens budget (600 per minute): this request reserves 700 tokens, more than the whole budget, so it can never be admitted; lower max_tokens (or max_completion_tokens) or shorten the prompt`})
	if v := r4.header.Get("X-Should-Retry"); v != "false" {
		t.Errorf("more than the whole budget: X-Should-Retry %q, want false", v)
	}
	checkLimitHeaders(t, "never refusal", r4.header, true, true)

	// globex: 2 requests a minute, and no tokens budget.
	for i, wantRem := range []string{"1", "0"} {
		g := d.fetch(ctx, t, call{tenant: "globex", body: completionBody(4, 1, false, false)})
		checkLimitHeaders(t, "globex", g.header, true, false)
		if g.code != 200 || g.header.Get("X-Ratelimit-Remaining-Requests") != wantRem {
			t.Errorf("globex %d: %d, remaining %q, want %s", i, g.code, g.header.Get("X-Ratelimit-Remaining-Requests"), wantRem)
		}
	}
	gStart := time.Now()
	g3 := d.fetch(ctx, t, call{tenant: "globex", body: completionBody(4, 1, false, false)})
	checkRateLimited(t, "over the requests budget", g3, waitRefusal{
		prefix: `tenant "globex" is over its requests budget (2 per minute): this request reserves 1 request`,
		min:    30*time.Second - time.Since(gStart) - 2*time.Second, max: 30 * time.Second,
	})
	checkLimitHeaders(t, "requests refusal", g3.header, true, false)

	st := s.Stats(t)
	if st.Tenants["acme"].Requests != 2 || st.Tenants["globex"].Requests != 2 {
		t.Errorf("simserver saw acme %d, globex %d requests; want the 2 admitted each", st.Tenants["acme"].Requests, st.Tenants["globex"].Requests)
	}
	m := d.Metrics(t)
	if n := m[`tiergate_rejections_total{cause="rate_limited",pool="default/llm",tier="premium"}`]; n != 3 {
		t.Errorf("rate_limited refusals counted: %v, want 3", n)
	}
}

// settleStep is one request of TestBudgetSettlement: what it reserves and
// the bounds of what it uses.
type settleStep struct {
	name             string
	call             call
	reserve          int64
	usedMin, usedMax int64
	leaveAfter       int // content events read before hanging up
}

// settleRun follows one tenant's tokens bucket through answers: each
// answer's remaining tokens must be the last one's, plus what the last
// request gave back, minus this reservation, plus at most the refill
// since the last one was sent.
type settleRun struct {
	t        *testing.T
	d        *disp
	rate     float64 // tokens refilled per second
	rem      int64   // the last answer's remaining tokens
	backMin  int64   // what the last request gave back, at least
	backMax  int64
	lastSent time.Time
}

func (r *settleRun) check(name string, h http.Header, reserve int64, sent time.Time) {
	r.t.Helper()
	got := headerInt(r.t, h, "X-Ratelimit-Remaining-Tokens")
	lo := r.rem + r.backMin - reserve
	hi := r.rem + r.backMax - reserve + int64(r.rate*time.Since(r.lastSent).Seconds()) + 1
	if got < lo || got > hi {
		r.t.Errorf("%s: remaining tokens %d, want within [%d, %d]", name, got, lo, hi)
	}
	r.t.Logf("%s: remaining tokens %d (bounds [%d, %d])", name, got, lo, hi)
	r.rem, r.lastSent = got, sent
}

// run sends one step, reading a stream to its end or leaving it after
// leaveAfter content events, and waits until the dispatcher has settled it.
func (r *settleRun) run(s settleStep) {
	r.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sent := time.Now()
	resp, err := r.d.do(ctx, r.t, s.call)
	if err != nil {
		r.t.Fatalf("%s: %v", s.name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		r.t.Fatalf("%s: status %d", s.name, resp.StatusCode)
	}
	r.check(s.name, resp.Header, s.reserve, sent)
	br := bufio.NewReader(resp.Body)
	for events := 0; s.leaveAfter == 0 || events < s.leaveAfter; {
		line, err := br.ReadString('\n')
		if err != nil {
			break
		}
		if strings.HasPrefix(line, "data: {") && strings.Contains(line, `"text":"tok`) {
			events++
		}
	}
	cancel()
	testutil.EventuallyTrue(r.t, settle, s.name+" settled", func() bool { return r.d.stats(r.t).Active == 0 })
	r.backMin, r.backMax = s.reserve-s.usedMax, s.reserve-s.usedMin
}

// After JSON answers and streams, with or without a usage chunk, the
// bucket holds what the requests did not use (read from the next answer's
// headers); a stream the client left is charged its prompt and the chunks
// streamed; a request the queue refused is refunded, and its refusal's
// headers show it. Every request reserves 10 tokens of prompt and 50 of
// output; simserver answers 40.
func TestBudgetSettlement(t *testing.T) {
	s := startSim(t, "--service-time", "const:100ms", "--output-tokens", "const:40")
	p := basePolicy(1, 1, s.Addr)
	p.Tiers[0].QueueBound, p.Tiers[0].TenantQueueLimit = 1, 1
	p.Tenants[0].Limits = &policy.Limits{TokensPerMinute: 600}
	d := startDispatcher(t, dispOpts{policy: p})
	r := &settleRun{t: t, d: d, rate: 10, rem: 600, lastSent: time.Now()}
	body := func(stream, usage bool) string { return completionBody(40, 50, stream, usage) }
	slow := http.Header{"X-Sim-Service-Time": {"4s"}}
	for _, s := range []settleStep{
		{name: "JSON", call: call{tenant: "acme", body: body(false, false)}, reserve: 60, usedMin: 50, usedMax: 50},
		{name: "stream with usage", call: call{tenant: "acme", body: body(true, true)}, reserve: 60, usedMin: 50, usedMax: 50},
		{name: "stream without usage", call: call{tenant: "acme", body: body(true, false)}, reserve: 60, usedMin: 50, usedMax: 50},
		// 40 chunks over 4s: the client leaves after 3, and at most 2 more
		// were on their way.
		{name: "stream left after 3 chunks", call: call{tenant: "acme", body: body(true, true), header: slow}, reserve: 60, usedMin: 13, usedMax: 15, leaveAfter: 3},
		{name: "JSON after the cut stream", call: call{tenant: "acme", body: body(false, false)}, reserve: 60, usedMin: 50, usedMax: 50},
	} {
		r.run(s)
	}

	// globex holds the slot and the queue place: acme's next is refused by
	// the queue, after its reservation, which goes back.
	background(t, d, call{tenant: "globex", header: slow})
	testutil.EventuallyTrue(t, settle, "slot taken", func() bool { return d.stats(t).Queue.InFlight == 1 })
	background(t, d, call{tenant: "globex", header: slow})
	testutil.EventuallyTrue(t, settle, "place taken", func() bool { return d.stats(t).Queue.Queued == 1 })
	sent := time.Now()
	got := d.fetch(context.Background(), t, call{tenant: "acme", body: body(false, false)})
	if typ := testutil.ParseRefusal(t, []byte(got.body)).Error.Type; got.code != 429 || typ != "capacity" {
		t.Fatalf("a full queue: %d %s", got.code, got.body)
	}
	r.check("refused by the queue: refunded", got.header, 0, sent)
	r.backMin, r.backMax = 0, 0

	m := d.Metrics(t)
	prompt := m[`tiergate_tokens_total{kind="prompt",pool="default/llm",tier="premium"}`]
	completion := m[`tiergate_tokens_total{kind="completion",pool="default/llm",tier="premium"}`]
	if prompt != 5*10 || completion < 4*40+3 || completion > 4*40+5 {
		t.Errorf("tokens_total: prompt %v, completion %v; want 50 and 163 to 165", prompt, completion)
	}
}
