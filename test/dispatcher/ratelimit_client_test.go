package dispatcher

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

// attempts records every HTTP attempt the openai-go client makes.
type attempts struct {
	mu  sync.Mutex
	log []attemptSeen
}

type attemptSeen struct {
	at         time.Time
	status     int
	retryAfter string
}

func (a *attempts) middleware(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
	resp, err := next(req)
	seen := attemptSeen{at: time.Now()}
	if resp != nil {
		seen.status, seen.retryAfter = resp.StatusCode, resp.Header.Get("Retry-After")
	}
	a.mu.Lock()
	a.log = append(a.log, seen)
	a.mu.Unlock()
	return resp, err
}

func (a *attempts) seen() []attemptSeen {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]attemptSeen(nil), a.log...)
}

// The openai-go client, retries enabled, against a tenant's tokens budget
// (600 a minute, 10 a second): refused with Retry-After, it waits that
// long and then succeeds; refused with X-Should-Retry: false (more than
// the whole budget), it does not retry, and its error says 429
// rate_limited.
func TestOpenAIClientAndBudgets(t *testing.T) {
	s := startSim(t, "--service-time", "0")
	p := basePolicy(1, 2, s.Addr)
	p.Tenants[0].Limits = &policy.Limits{TokensPerMinute: 600}
	d := startDispatcher(t, dispOpts{policy: p})
	ctx := context.Background()
	rejected := func() float64 {
		return d.Metrics(t)[`tiergate_rejections_total{cause="rate_limited",pool="default/llm",tier="premium"}`]
	}
	served := func() float64 {
		return d.Metrics(t)[`tiergate_requests_total{code="200",pool="default/llm",tier="premium"}`]
	}
	client := func(a *attempts) openai.Client {
		return openai.NewClient(option.WithBaseURL("http://"+d.Data+"/v1"), option.WithAPIKey("unused-in-trusted-header-mode"),
			option.WithHeader("X-Tenant-ID", "acme"), option.WithMaxRetries(3), option.WithMiddleware(a.middleware))
	}
	complete := func(c openai.Client, maxTokens int64) error {
		_, err := c.Completions.New(ctx, openai.CompletionNewParams{
			Model: "sim-model", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("hi")}, MaxTokens: openai.Int(maxTokens),
		})
		return err
	}

	t.Run("backs off on Retry-After", func(t *testing.T) {
		// 571 reserved and used (simserver answers the whole max): about
		// 29 left. The client's 41 then waits about 1.2s: Retry-After 2.
		if r := d.fetch(ctx, t, call{tenant: "acme", body: `{"model":"m","prompt":"hi","max_tokens":570}`}); r.code != 200 {
			t.Fatalf("draining the budget: %d %s", r.code, r.body)
		}
		before, servedBefore := rejected(), served()
		a := &attempts{}
		if err := complete(client(a), 40); err != nil {
			t.Fatalf("the client gave up: %v", err)
		}
		seen := a.seen()
		if len(seen) != 2 || seen[0].status != 429 || seen[1].status != 200 {
			t.Fatalf("attempts %+v, want a 429 then a 200", seen)
		}
		wait, _ := time.ParseDuration(seen[0].retryAfter + "s")
		if gap := seen[1].at.Sub(seen[0].at); wait < time.Second || gap < wait {
			t.Errorf("the retry came %s after the refusal, whose Retry-After was %q", gap, seen[0].retryAfter)
		} else {
			t.Logf("Retry-After %s, retried after %s", wait, gap)
		}
		if got, ok := rejected()-before, served()-servedBefore; got != 1 || ok != 1 {
			t.Errorf("the dispatcher refused %v and served %v of the client's attempts, want 1 and 1", got, ok)
		}
	})

	t.Run("does not retry X-Should-Retry false", func(t *testing.T) {
		before := rejected()
		a := &attempts{}
		err := complete(client(a), 1000)
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusTooManyRequests || apiErr.Type != "rate_limited" {
			t.Fatalf("error %v, want a 429 rate_limited openai.Error", err)
		}
		want := `tenant "acme" is over its tokens budget (600 per minute): this request reserves 1001 tokens, more than the whole budget, so it can never be admitted; lower max_tokens (or max_completion_tokens) or shorten the prompt`
		if apiErr.Message != want {
			t.Errorf("message %q, want %q", apiErr.Message, want)
		}
		if seen := a.seen(); len(seen) != 1 {
			t.Errorf("%d attempts, want exactly 1: %+v", len(seen), seen)
		}
		if got := rejected() - before; got != 1 {
			t.Errorf("the dispatcher saw %v refused attempts, want 1", got)
		}
	})
}

// histogram reads one histogram of the Prometheus text at url.
func histogram(t *testing.T, url, name string) *dto.Histogram {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	f, ok := fams[name]
	if !ok || len(f.GetMetric()) != 1 {
		t.Fatalf("%s: not one series in the scrape", name)
	}
	return f.GetMetric()[0].GetHistogram()
}

// errorStats are the samples of the estimate error histogram between two
// scrapes: how many, their mean, the bucket (lo, hi] holding the median,
// and the share in the two buckets either side of 1.
type errorStats struct {
	count           uint64
	mean            float64
	medianLo, medHi float64
	nearOne         float64
}

// errorsBetween is what after holds that before (nil: nothing) did not.
func errorsBetween(before, after *dto.Histogram) errorStats {
	cum := func(h *dto.Histogram, i int) uint64 {
		if h == nil {
			return 0
		}
		return h.GetBucket()[i].GetCumulativeCount()
	}
	n := after.GetSampleCount() - before.GetSampleCount()
	st := errorStats{count: n, mean: (after.GetSampleSum() - before.GetSampleSum()) / float64(n)}
	lo, prev := 0.0, uint64(0)
	var near uint64
	for i, b := range after.GetBucket() {
		c := cum(after, i) - cum(before, i)
		hi := b.GetUpperBound()
		if st.medHi == 0 && 2*c >= n {
			st.medianLo, st.medHi = lo, hi
		}
		if hi == 1 || lo == 1 {
			near += c - prev
		}
		lo, prev = hi, c
	}
	st.nearOne = float64(near) / float64(n)
	return st
}

// The estimate calibrates on simserver: with prompts of 3.2 bytes a token
// the dispatcher's bytes per token moves from 4 to within 3% of 3.2, and
// once it has, the prompt estimates are within a bucket of exact. The
// figures are logged (the closing note quotes them).
func TestEstimateCalibration(t *testing.T) {
	const truth = 3.2
	s := startSim(t, "--service-time", "0", "--concurrency", "8", "--bytes-per-token", "3.2", "--output-tokens", "const:1")
	d := startDispatcher(t, dispOpts{policy: basePolicy(1, 8, s.Addr)})
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	words := []string{"token ", "the ", "budget ", "dispatcher ", "queue ", "a ", "estimate "}
	prompt := func() string {
		var b strings.Builder
		for n := 100 + rng.IntN(2900); b.Len() < n; {
			b.WriteString(words[rng.IntN(len(words))])
		}
		return b.String()
	}
	send := func(n int) {
		bodies := make(chan string, n)
		for range n {
			bodies <- `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"` + prompt() + `"}]}`
		}
		close(bodies)
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				for b := range bodies {
					if r := d.fetch(context.Background(), t, call{tenant: "acme", path: "/v1/chat/completions", body: b}); r.code != 200 {
						t.Errorf("status %d: %s", r.code, r.body)
					}
				}
			})
		}
		wg.Wait()
	}
	const name = "tiergate_token_estimate_error_ratio"
	send(100)
	warm := histogram(t, d.AdminURL("/metrics"), name)
	ratioWarm := d.Metrics(t)[`tiergate_bytes_per_token{pool="default/llm"}`]
	send(200)
	after := histogram(t, d.AdminURL("/metrics"), name)
	ratio := d.Metrics(t)[`tiergate_bytes_per_token{pool="default/llm"}`]
	st := errorsBetween(warm, after)
	all := errorsBetween(nil, after)
	t.Logf("bytes per token: %.3f after 100 requests, %.3f after 300 (simserver's %.1f: off by %.2f%%)", ratioWarm, ratio, truth, 100*math.Abs(ratio-truth)/truth)
	t.Logf("estimate/actual over the last 200: mean %.3f, median in (%.3f, %.3f], %.0f%% within 2^(±1/4); over all 300 (from 4 bytes a token): mean %.3f",
		st.mean, st.medianLo, st.medHi, 100*st.nearOne, all.mean)
	if math.Abs(ratio-truth)/truth > 0.03 {
		t.Errorf("bytes per token %.3f, want within 3%% of %.1f", ratio, truth)
	}
	if st.count != 200 || st.medianLo > 1 || st.medHi < 1 || math.Abs(st.mean-1) > 0.05 {
		t.Errorf("after calibration: %d samples, median in (%.3f, %.3f], mean %.3f; want 200, a median bucket touching 1, a mean within 5%% of 1",
			st.count, st.medianLo, st.medHi, st.mean)
	}
}
