package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// serviceHost is the host name clients use; serviceTransport replaces it
// with a dispatcher's data address, as the Service would.
const serviceHost = "tiergate-dispatcher.demo"

// streamKind is how a stream issues requests.
type streamKind int

const (
	// kindHTTP: open loop, Poisson arrivals, plain HTTP with SSE streaming.
	kindHTTP streamKind = iota
	// kindOpenAI: closed-loop workers using the openai-go client, which
	// retries refusals after their Retry-After.
	kindOpenAI
)

// streamPlan is one part of the mixed load.
type streamPlan struct {
	Name    string
	Role    string
	Tier    string // what the pool must put its tenants in
	Tenants []string
	Kind    streamKind
	Rate    float64 // kindHTTP: arrivals per second over all Tenants
	MaxOut  int     // kindHTTP: arrivals beyond this many outstanding are not sent
	Workers int     // kindOpenAI
	From    float64 // active from From×duration ...
	To      float64 // ... to To×duration
	// Steady streams keep each tenant under its own caps, so their waits
	// show the tier's priority, not the tenant's own backlog.
	Steady bool
	// Budget, for a kindOpenAI stream, is the tenant over its tokens
	// budget: what its requests cost and whether it paces itself
	// (budget.go).
	Budget *budgetPlan
}

// defaultPlan is the demo's load against the seed's pool (24 slots, 4/s at
// six replicas): the paying tiers take about two thirds of it (the noisy
// premium tenant offers three times what its cap lets through, the
// openai-go client keeps more requests outstanding than its cap), and the
// free flood offers more than the rest.
func defaultPlan() []streamPlan {
	free := []string{"initech"}
	for i := 1; i < 40; i++ {
		free = append(free, fmt.Sprintf("free-%02d", i))
	}
	return []streamPlan{
		{Name: "acme", Steady: true, Role: "premium tenant, steady 0.4 req/s", Tier: "premium", Tenants: []string{"acme"}, Rate: 0.4, MaxOut: 20, To: 1},
		{Name: "umbrella", Role: "premium tenant, noisy: 3 req/s, far over its cap", Tier: "premium", Tenants: []string{"umbrella"}, Rate: 3, MaxOut: 40, From: 0.1, To: 0.9},
		{Name: "soylent", Role: "premium tenant, openai-go client: 12 workers calling back to back, honouring Retry-After", Tier: "premium", Tenants: []string{"soylent"}, Kind: kindOpenAI, Workers: 12, To: 1},
		{Name: "wayne", Role: "standard tenant over its tokens budget: openai-go, 3 workers, 2 KB prompts with max_tokens 100 (about 600 tokens each), honouring Retry-After and pacing on x-ratelimit-*",
			Tier: "standard", Tenants: []string{"wayne"}, Kind: kindOpenAI, Workers: 3, To: 1, Budget: &budgetPlan{PromptBytes: 2000, MaxTokens: 100, Pace: true}},
		{Name: "globex", Steady: true, Role: "standard tenant, 0.15 req/s", Tier: "standard", Tenants: []string{"globex"}, Rate: 0.15, MaxOut: 15, To: 1},
		{Name: "hooli", Steady: true, Role: "standard tenant, 0.15 req/s", Tier: "standard", Tenants: []string{"hooli"}, Rate: 0.15, MaxOut: 15, To: 1},
		{Name: "vandelay", Steady: true, Role: "standard tenant, 0.15 req/s", Tier: "standard", Tenants: []string{"vandelay"}, Rate: 0.15, MaxOut: 15, To: 1},
		{Name: "free flood", Steady: true, Role: "40 free tenants (initech and 39 without a TenantQuota), 3 req/s together", Tier: "free", Tenants: free, Rate: 3, MaxOut: 240, From: 0.05, To: 1},
	}
}

// tierOrder is the order tiers are shown in: by the plan.
func tierOrder(plan []streamPlan) []string {
	var out []string
	seen := map[string]bool{}
	for _, s := range plan {
		if !seen[s.Tier] {
			seen[s.Tier] = true
			out = append(out, s.Tier)
		}
	}
	return out
}

// checkPlan makes sure the cluster puts every tenant where the plan says.
func checkPlan(plan []streamPlan, p *poolInfo) error {
	for _, s := range plan {
		for _, t := range s.Tenants {
			if got := p.tierOf(t); got != s.Tier {
				return fmt.Errorf("tenant %q of stream %q is in tier %q, the demo expects %q: were config/samples or hack/demo/manifests changed?", t, s.Name, got, s.Tier)
			}
		}
	}
	return nil
}

// Outcomes of a request.
const (
	outcomeServed  = "served"  // 200 and the whole answer
	outcomeRefused = "refused" // the dispatcher's JSON refusal
	outcomeCut     = "cut"     // the demo ended (or was interrupted) first
	outcomeError   = "error"   // anything else
)

// record is one HTTP request to a dispatcher (an openai-go attempt is
// one).
type record struct {
	Stream     string
	Tenant     string
	Tier       string
	Client     string // "http" or "openai-go"
	Start, End time.Duration
	Status     int
	Outcome    string
	Cause      string // refusal type, or what went wrong
	RetryAfter int
}

// waitSample is one dispatched request's queue wait (X-Queue-Wait-Ms),
// placed at its dispatch time.
type waitSample struct {
	Tier, Tenant string
	Dispatch     time.Duration
	Wait         time.Duration
}

// recorder keeps every request's outcome and every dispatch's wait.
type recorder struct {
	t0  time.Time
	max int64

	sent atomic.Int64

	mu      sync.Mutex
	recs    []record
	waits   []waitSample
	pending map[string]int // tier → requests sent and not yet ended
	skipped map[string]int // stream → arrivals not sent (MaxOut reached)
	calls   []openaiCall
}

func newRecorder(t0 time.Time, maxRequests int) *recorder {
	return &recorder{t0: t0, max: int64(maxRequests), pending: map[string]int{}, skipped: map[string]int{}}
}

func (r *recorder) since() time.Duration { return time.Since(r.t0) }

// take reserves one request of the global budget.
func (r *recorder) take() bool {
	if r.sent.Add(1) > r.max {
		r.sent.Add(-1)
		return false
	}
	return true
}

func (r *recorder) begin(tier string) {
	r.mu.Lock()
	r.pending[tier]++
	r.mu.Unlock()
}

func (r *recorder) end(rec record) {
	r.mu.Lock()
	r.pending[rec.Tier]--
	r.recs = append(r.recs, rec)
	r.mu.Unlock()
}

func (r *recorder) wait(w waitSample) {
	r.mu.Lock()
	r.waits = append(r.waits, w)
	r.mu.Unlock()
}

func (r *recorder) skip(stream string) {
	r.mu.Lock()
	r.skipped[stream]++
	r.mu.Unlock()
}

// snapshot copies what the recorder holds.
func (r *recorder) snapshot() ([]record, []waitSample, []openaiCall) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]record(nil), r.recs...), append([]waitSample(nil), r.waits...), append([]openaiCall(nil), r.calls...)
}

// tierLive is the client's view of one tier for the table.
type tierLive struct {
	Served, Pending  int
	Refused          map[string]int // by cause
	Other            int            // cut or error
	P50, P95         time.Duration  // of waits dispatched within the window
	WindowN          int
	ServedInWindowPS float64
}

// live summarises per tier; waits over the last window.
func (r *recorder) live(window time.Duration) map[string]*tierLive {
	now := r.since()
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]*tierLive{}
	get := func(t string) *tierLive {
		if out[t] == nil {
			out[t] = &tierLive{Refused: map[string]int{}}
		}
		return out[t]
	}
	for t, n := range r.pending {
		get(t).Pending = n
	}
	for _, rec := range r.recs {
		tl := get(rec.Tier)
		switch rec.Outcome {
		case outcomeServed:
			tl.Served++
		case outcomeRefused:
			tl.Refused[rec.Cause]++
		default:
			tl.Other++
		}
	}
	byTier := map[string][]time.Duration{}
	for _, w := range r.waits {
		if w.Dispatch > now-window {
			byTier[w.Tier] = append(byTier[w.Tier], w.Wait)
		}
	}
	for t, ws := range byTier {
		tl := get(t)
		tl.WindowN = len(ws)
		tl.P50, tl.P95 = percentile(ws, 0.50), percentile(ws, 0.95)
	}
	return out
}

// serviceTransport sends each request to the next dispatcher in turn, as
// the dispatchers' Service would.
type serviceTransport struct {
	base    http.RoundTripper
	targets []string
	next    atomic.Uint64
}

func (s *serviceTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	out := r.Clone(r.Context())
	out.URL.Host = s.targets[(s.next.Add(1)-1)%uint64(len(s.targets))]
	out.Host = ""
	return s.base.RoundTrip(out)
}

func newTransport() *http.Transport {
	return &http.Transport{
		Proxy:               nil, // loopback only, never through a proxy
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}
}

// loadGen issues the plan's requests.
type loadGen struct {
	plan     []streamPlan
	sched    schedule
	rec      *recorder
	client   *http.Client
	header   string // the pool's tenant header
	seed     uint64
	timeout  time.Duration // one request's (or openai-go call's) limit
	requests sync.WaitGroup
}

// run issues requests until issueCtx ends (or the plan's windows close),
// then waits for every request it started; requests end when they finish
// or when reqCtx ends.
func (g *loadGen) run(issueCtx, reqCtx context.Context) {
	var streams sync.WaitGroup
	for i, s := range g.plan {
		rng := rand.New(rand.NewPCG(g.seed, uint64(i)+1))
		switch s.Kind {
		case kindHTTP:
			streams.Add(1)
			go func() { defer streams.Done(); g.httpStream(issueCtx, reqCtx, s, rng) }()
		case kindOpenAI:
			for w := 0; w < s.Workers; w++ {
				streams.Add(1)
				go func() { defer streams.Done(); g.openaiWorker(issueCtx, reqCtx, s, w) }()
			}
		}
	}
	streams.Wait()
	g.requests.Wait()
}

// window is the stream's active time, relative to the load start.
func (g *loadGen) window(s streamPlan) (from, to time.Duration) {
	return time.Duration(s.From * float64(g.sched.Load)), time.Duration(s.To * float64(g.sched.Load))
}

// sleepUntil waits until the load-relative time at; false if ctx ended.
func (g *loadGen) sleepUntil(ctx context.Context, at time.Duration) bool {
	d := at - g.rec.since()
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func (g *loadGen) httpStream(issueCtx, reqCtx context.Context, s streamPlan, rng *rand.Rand) {
	from, to := g.window(s)
	at := from
	var out atomic.Int64
	for {
		at += time.Duration(rng.ExpFloat64() / s.Rate * float64(time.Second))
		if at >= to || !g.sleepUntil(issueCtx, at) {
			return
		}
		if out.Load() >= int64(s.MaxOut) {
			g.rec.skip(s.Name)
			continue
		}
		if !g.rec.take() {
			return
		}
		tenant := s.Tenants[rng.IntN(len(s.Tenants))]
		out.Add(1)
		g.rec.begin(s.Tier)
		g.requests.Add(1)
		go func() {
			defer g.requests.Done()
			defer out.Add(-1)
			g.rec.end(g.doHTTP(reqCtx, s, tenant))
		}()
	}
}

// requestBody asks for a short streamed chat completion. Its prompt is
// 32 bytes, like every prompt of the demo a whole number of simserver's 4
// bytes a token, so the dispatchers' learned ratio stays at 4 and their
// estimates exact: the token-fairness phase's counters get no
// corrections, and its gap bound is the one docs/scheduling.md states.
const requestBody = `{"model":"sim-model","stream":true,"max_tokens":16,"messages":[{"role":"user","content":"` + shortPrompt + `"}]}`

// shortPrompt is the prompt of the HTTP streams and the openai-go client.
const shortPrompt = "Summarise this demo in one line."

// doHTTP sends one streamed chat completion and reads it to the end.
func (g *loadGen) doHTTP(reqCtx context.Context, s streamPlan, tenant string) (rec record) {
	ctx, cancel := context.WithTimeout(reqCtx, g.timeout)
	defer cancel()
	rec = record{Stream: s.Name, Tenant: tenant, Tier: s.Tier, Client: "http", Start: g.rec.since()}
	defer func() { rec.End = g.rec.since() }()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+serviceHost+"/v1/chat/completions", strings.NewReader(requestBody))
	if err != nil {
		rec.Outcome, rec.Cause = outcomeError, err.Error()
		return rec
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(g.header, tenant)
	resp, err := g.client.Do(req)
	if err != nil {
		rec.Outcome, rec.Cause = failure(reqCtx, ctx, "queued", err)
		return rec
	}
	defer resp.Body.Close()
	rec.Status = resp.StatusCode
	if resp.StatusCode != http.StatusOK {
		rec.Outcome, rec.Cause, rec.RetryAfter = refusal(resp)
		return rec
	}
	if w, ok := waitHeader(resp); ok {
		g.rec.wait(waitSample{Tier: s.Tier, Tenant: tenant, Dispatch: rec.Start + w, Wait: w})
	}
	body, err := io.ReadAll(resp.Body)
	switch {
	case err != nil:
		rec.Outcome, rec.Cause = failure(reqCtx, ctx, "streaming", err)
	case !bytes.Contains(body, []byte("data: [DONE]")):
		rec.Outcome, rec.Cause = outcomeError, "stream ended without [DONE]"
	default:
		rec.Outcome = outcomeServed
	}
	return rec
}

// failure classifies a transport error: the demo ending is a cut at the
// given stage, anything else an error.
func failure(reqCtx, ctx context.Context, stage string, err error) (string, string) {
	if reqCtx.Err() != nil {
		return outcomeCut, "demo ended while " + stage
	}
	if ctx.Err() != nil {
		return outcomeError, "client timeout while " + stage
	}
	return outcomeError, err.Error()
}

// refusal reads a dispatcher's JSON refusal.
func refusal(resp *http.Response) (outcome, cause string, retryAfter int) {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return refusalFrom(resp.StatusCode, resp.Header, b)
}

func refusalFrom(status int, h http.Header, body []byte) (outcome, cause string, retryAfter int) {
	retryAfter, _ = strconv.Atoi(h.Get("Retry-After"))
	var e struct {
		Error struct {
			Type string `json:"type"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) == nil && e.Error.Type != "" {
		return outcomeRefused, e.Error.Type, retryAfter
	}
	return outcomeError, fmt.Sprintf("HTTP %d without a refusal body", status), retryAfter
}

// waitHeader reads X-Queue-Wait-Ms.
func waitHeader(resp *http.Response) (time.Duration, bool) {
	ms, err := strconv.ParseInt(resp.Header.Get("X-Queue-Wait-Ms"), 10, 64)
	if err != nil || ms < 0 {
		return 0, false
	}
	return time.Duration(ms) * time.Millisecond, true
}

// percentile is the nearest-rank q-quantile of ds (0 for none).
func percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}
