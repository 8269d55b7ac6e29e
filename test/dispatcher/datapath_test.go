package dispatcher

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/tiergate/tiergate/internal/testutil"
)

func openaiClient(baseURL, tenant string, retries int) openai.Client {
	return openai.NewClient(
		option.WithBaseURL(baseURL),
		option.WithAPIKey("unused-in-trusted-header-mode"),
		option.WithHeader("X-Tenant-ID", tenant),
		option.WithMaxRetries(retries),
	)
}

func streamChat(t *testing.T, c openai.Client, opts ...option.RequestOption) (content []string, finish string) {
	t.Helper()
	stream := c.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
		Model:     "sim-model",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say something.")},
		MaxTokens: openai.Int(12),
	}, opts...)
	for stream.Next() {
		ch := stream.Current()
		if len(ch.Choices) == 0 {
			continue
		}
		if d := ch.Choices[0].Delta.Content; d != "" {
			content = append(content, d)
		}
		if f := ch.Choices[0].FinishReason; f != "" {
			finish = f
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	return content, finish
}

// A streamed chat completion through the dispatcher is the same, chunk by
// chunk, as one made directly against the backend, and carries
// X-Queue-Wait-Ms.
func TestStreamingMatchesDirect(t *testing.T) {
	s := startSim(t, "--service-time", "const:120ms")
	d := startDispatcher(t, dispOpts{policy: basePolicy(1, 2, s.Addr)})

	direct, directFinish := streamChat(t, openaiClient("http://"+s.Addr+"/v1", "acme", 0))
	var resp *http.Response
	proxied, proxiedFinish := streamChat(t, openaiClient("http://"+d.Data+"/v1", "acme", 0), option.WithResponseInto(&resp))
	if diff := cmp.Diff(direct, proxied); diff != "" {
		t.Errorf("chunks (-direct +proxied)\n%s", diff)
	}
	if len(proxied) != 12 || directFinish != "stop" || proxiedFinish != "stop" {
		t.Errorf("%d chunks, finish %q/%q; want 12 and stop", len(proxied), directFinish, proxiedFinish)
	}
	if v := resp.Header.Get("X-Queue-Wait-Ms"); v == "" {
		t.Error("no X-Queue-Wait-Ms on a successful response")
	} else if _, err := strconv.Atoi(v); err != nil {
		t.Errorf("X-Queue-Wait-Ms %q is not an integer", v)
	}

	// Non-streaming completions match too.
	comp := func(base string) string {
		c := openaiClient(base, "globex", 0)
		r, err := c.Completions.New(context.Background(), openai.CompletionNewParams{
			Model: "sim-model", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("hi")}, MaxTokens: openai.Int(5),
		})
		if err != nil {
			t.Fatal(err)
		}
		return r.Choices[0].Text
	}
	if a, b := comp("http://"+s.Addr+"/v1"), comp("http://"+d.Data+"/v1"); a != b || a != "tok0 tok1 tok2 tok3 tok4 " {
		t.Errorf("completion direct %q, proxied %q", a, b)
	}

	// Events arrive as the backend produces them, not all at the end: with
	// 12 tokens over 600ms, the first event comes well before the last.
	req, _ := http.NewRequest(http.MethodPost, "http://"+d.Data+"/v1/chat/completions",
		strings.NewReader(`{"stream":true,"max_tokens":12,"messages":[]}`))
	req.Header.Set("X-Tenant-ID", "acme")
	req.Header.Set("X-Sim-Service-Time", "600ms")
	start := time.Now()
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	sc := bufio.NewScanner(r.Body)
	var first, last time.Duration
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data: ") {
			if first == 0 {
				first = time.Since(start)
			}
			last = time.Since(start)
		}
	}
	if first > 300*time.Millisecond || last-first < 300*time.Millisecond {
		t.Errorf("first event after %s, last after %s: not streamed per event", first, last)
	}

	// The backend saw the resolved tenant on every proxied request (2 for
	// acme, 1 for globex); only the 2 direct calls came without one.
	if st := s.Stats(t); st.Tenants["acme"].Requests != 2 || st.Tenants["globex"].Requests != 1 || st.Tenants["(none)"].Requests != 2 {
		t.Errorf("simserver tenants: %+v", st.Tenants)
	}
}

// Under overload the openai-go client gets 429 with Retry-After, waits as
// told and eventually succeeds on its own.
func TestOpenAIClientHonoursRetryAfter(t *testing.T) {
	s := startSim(t, "--service-time", "const:300ms")
	p := basePolicy(1, 1, s.Addr)
	p.Tiers[0].QueueBound = 1
	d := startDispatcher(t, dispOpts{policy: p})

	// globex takes the slot and acme the one queue place.
	background(t, d, call{tenant: "globex"})
	testutil.EventuallyTrue(t, settle, "slot taken", func() bool { return d.stats(t).Queue.InFlight == 1 })
	background(t, d, call{tenant: "acme"})
	testutil.EventuallyTrue(t, settle, "place taken", func() bool { return d.stats(t).Queue.Queued == 1 })

	c := openaiClient("http://"+d.Data+"/v1", "globex", 5)
	start := time.Now()
	r, err := c.Completions.New(context.Background(), openai.CompletionNewParams{
		Model: "sim-model", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("hi")}, MaxTokens: openai.Int(2),
	})
	if err != nil {
		t.Fatalf("client gave up: %v", err)
	}
	took := time.Since(start)
	if r.Choices[0].Text != "tok0 tok1 " {
		t.Errorf("text %q", r.Choices[0].Text)
	}
	m := d.Metrics(t)
	refused := m[`tiergate_rejections_total{cause="capacity",pool="default/llm",tier="premium"}`]
	if refused < 1 {
		t.Fatalf("no capacity refusal recorded; the retry was not exercised")
	}
	// The first answer said Retry-After: 1 (ceil(2 / 4 per s) clamped to
	// 1s), and the client waited at least that.
	if took < time.Second {
		t.Errorf("succeeded after %s: the client did not wait for Retry-After", took)
	}
}

// Noisy neighbour: one premium tenant floods. Its in-flight count at the
// backend never exceeds its limit, and another premium tenant's requests
// go to the backend ahead of the flooder's queued ones.
func TestNoisyNeighbour(t *testing.T) {
	s := startSim(t, "--concurrency", "8", "--service-time", "const:600ms")
	p := basePolicy(1, 4, s.Addr)
	p.Tiers[0].TenantConcurrencyLimit = 2
	p.Tiers[0].TenantQueueLimit = 20
	p.Tiers[0].QueueBound = 40
	d := startDispatcher(t, dispOpts{policy: p})

	var wg sync.WaitGroup
	codes := make(chan int, 30)
	send := func(tenant string) {
		defer wg.Done()
		r := d.fetch(context.Background(), t, call{tenant: tenant})
		codes <- r.code
	}
	for range 16 {
		wg.Add(1)
		go send("acme")
	}
	testutil.EventuallyTrue(t, settle, "the flood queued", func() bool { return d.stats(t).Queue.Queued == 14 })
	var calm []result
	var mu sync.Mutex
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := d.fetch(context.Background(), t, call{tenant: "globex"})
			mu.Lock()
			calm = append(calm, r)
			mu.Unlock()
		}()
	}
	wg.Wait()
	close(codes)
	for c := range codes {
		if c != 200 {
			t.Errorf("flood request got %d", c)
		}
	}
	for _, r := range calm {
		if r.code != 200 {
			t.Fatalf("calm tenant got %d %s", r.code, r.body)
		}
		if w, _ := strconv.Atoi(r.header.Get("X-Queue-Wait-Ms")); w > 200 {
			t.Errorf("calm tenant waited %dms behind the flood", w)
		}
	}
	st := s.Stats(t)
	if got := st.Tenants["acme"].PeakActive; got != 2 {
		t.Errorf("flooder's peak at the backend %d, want exactly its limit 2", got)
	}
	// Arrival order at the backend: the flooder's first two, then the calm
	// tenant's two, before any more of the flooder's 14 queued requests.
	var order []string
	for _, a := range st.Arrivals[:4] {
		order = append(order, a.Tenant)
	}
	if diff := cmp.Diff([]string{"acme", "acme", "globex", "globex"}, order); diff != "" {
		t.Errorf("arrival order (-want +got)\n%s", diff)
	}
	if st.Requests != 18 {
		t.Errorf("backend saw %d requests, want 18", st.Requests)
	}
}

// Starvation guard: premium keeps the pool saturated and its queue full,
// yet free requests complete within the stated bound
// maxWait(free) = ageingRate × (base_free − base_premium) + ΣL/μ + S.
func TestStarvationGuard(t *testing.T) {
	const service = 200 * time.Millisecond
	s := startSim(t, "--concurrency", "8", "--service-time", "const:200ms")
	p := basePolicy(1, 2, s.Addr)
	p.AgeingRate = 0.05 // 20 points × 0.05s = 1s ageing horizon
	p.ServiceRate = 10  // μ = slots / S = 2 / 0.2s
	p.Tiers = p.Tiers[:1]
	p.Tiers[0].QueueBound, p.Tiers[0].TenantConcurrencyLimit, p.Tiers[0].TenantQueueLimit = 10, 1, 3
	p.Tiers = append(p.Tiers, policyTier("free", 20, 60, 20, 1, 5))
	p.Tenants = nil
	for _, id := range []string{"p1", "p2", "p3", "p4"} {
		p.Tenants = append(p.Tenants, tenant(id, "premium"))
	}
	d := startDispatcher(t, dispOpts{policy: p})
	maxWait := time.Duration(p.AgeingRate*20*float64(time.Second)) + time.Duration(float64(10+20)/p.ServiceRate*float64(time.Second)) + service

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	// 4 premium tenants × 3 closed-loop clients: 12 wanting 2 slots.
	for _, id := range []string{"p1", "p2", "p3", "p4"} {
		for range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					r := d.fetch(ctx, t, call{tenant: id})
					if r.code == http.StatusTooManyRequests {
						time.Sleep(20 * time.Millisecond)
					}
				}
			}()
		}
	}
	testutil.EventuallyTrue(t, settle, "premium saturating", func() bool { st := d.stats(t); return st.Queue.Queued >= 6 && st.Queue.InFlight == 2 })
	var waits []time.Duration
	for range 3 {
		start := time.Now()
		r := d.fetch(context.Background(), t, call{tenant: "free-user"})
		took := time.Since(start)
		if r.code != 200 {
			t.Fatalf("free request got %d %s", r.code, r.body)
		}
		waits = append(waits, took)
		if queued := d.stats(t).Queue.Queued; queued < 3 {
			t.Errorf("premium queue drained to %d: the pool was not saturated", queued)
		}
	}
	cancel()
	wg.Wait()
	for _, w := range waits {
		if w > maxWait {
			t.Errorf("free request took %s, beyond the stated bound %s", w, maxWait)
		}
		// Under strict priority it would never be served; with ageing it
		// waits about the horizon, so it did queue behind premium.
		if w < 500*time.Millisecond {
			t.Errorf("free request took only %s: premium was not ahead of it", w)
		}
	}
	t.Logf("free waits %v, bound %s", waits, maxWait)
}

// Disconnects: a client leaving while queued is removed at once; one
// leaving mid-stream cancels the upstream generation; a backend dying
// mid-stream cuts the client's stream. After each, in-flight is 0.
func TestDisconnects(t *testing.T) {
	t.Run("cancel while queued", func(t *testing.T) {
		s := startSim(t, "--service-time", "const:50ms")
		d := startDispatcher(t, dispOpts{policy: basePolicy(1, 1, s.Addr)})
		background(t, d, call{tenant: "initech", header: http.Header{"X-Sim-Service-Time": {"1500ms"}}})
		testutil.EventuallyTrue(t, settle, "slot taken", func() bool { return d.stats(t).Queue.InFlight == 1 })
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan result)
		go func() { done <- d.fetch(ctx, t, call{tenant: "acme"}) }()
		testutil.EventuallyTrue(t, settle, "queued", func() bool { return d.stats(t).Queue.Queued == 1 })
		cancel()
		if r := <-done; !errors.Is(r.err, context.Canceled) {
			t.Fatalf("got %+v", r)
		}
		testutil.EventuallyTrue(t, settle, "removed from the queue at once", func() bool { return d.stats(t).Queue.Queued == 0 })
		if st := d.stats(t); st.Queue.InFlight != 1 {
			t.Errorf("in flight %d while the long request runs", st.Queue.InFlight)
		}
		testutil.EventuallyTrue(t, settle, "in-flight back to 0", func() bool { st := d.stats(t); return st.Queue.InFlight == 0 && st.Active == 0 })
		m := d.Metrics(t)
		if v := m[`tiergate_abandoned_total{pool="default/llm",stage="queued",tier="premium"}`]; v != 1 {
			t.Errorf("abandoned queued = %v, want 1", v)
		}
		if st := s.Stats(t); st.Tenants["acme"].Requests != 0 {
			t.Errorf("the abandoned request reached the backend")
		}
	})

	t.Run("cancel mid-stream", func(t *testing.T) {
		s := startSim(t, "--service-time", "const:50ms")
		d := startDispatcher(t, dispOpts{policy: basePolicy(1, 2, s.Addr)})
		ctx, cancel := context.WithCancel(context.Background())
		resp, err := d.do(ctx, t, call{tenant: "acme", path: "/v1/chat/completions", body: `{"stream":true,"max_tokens":20}`,
			header: http.Header{"X-Sim-Service-Time": {"4s"}}})
		if err != nil {
			t.Fatal(err)
		}
		line, err := bufio.NewReader(resp.Body).ReadString('\n')
		if err != nil || !strings.HasPrefix(line, "data: ") {
			t.Fatalf("first line %q, %v", line, err)
		}
		cancel()
		resp.Body.Close()
		testutil.EventuallyTrue(t, settle, "the backend saw the cancel", func() bool { return s.Stats(t).Tenants["acme"].Cancelled == 1 })
		testutil.EventuallyTrue(t, settle, "in-flight back to 0", func() bool { st := d.stats(t); return st.Queue.InFlight == 0 && st.Active == 0 })
		m := d.Metrics(t)
		if v := m[`tiergate_abandoned_total{pool="default/llm",stage="inflight",tier="premium"}`]; v != 1 {
			t.Errorf("abandoned inflight = %v, want 1", v)
		}
		if v := m[`tiergate_backend_inflight{backend="`+s.Addr+`",pool="default/llm"}`]; v != 0 {
			t.Errorf("backend_inflight = %v", v)
		}
	})

	t.Run("backend killed mid-stream", func(t *testing.T) {
		s := startSim(t, "--service-time", "const:50ms")
		d := startDispatcher(t, dispOpts{policy: basePolicy(1, 2, s.Addr)})
		resp, err := d.do(context.Background(), t, call{tenant: "acme", path: "/v1/chat/completions", body: `{"stream":true,"max_tokens":20}`,
			header: http.Header{"X-Sim-Service-Time": {"4s"}}})
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		br := bufio.NewReader(resp.Body)
		if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
			t.Fatalf("first line %q, %v", line, err)
		}
		s.Kill()
		rest, err := io.ReadAll(br)
		if err == nil {
			t.Fatalf("stream ended cleanly after the backend died: %q", rest)
		}
		if strings.Contains(string(rest), "[DONE]") {
			t.Errorf("a cut stream must not look complete")
		}
		testutil.EventuallyTrue(t, settle, "in-flight back to 0", func() bool { st := d.stats(t); return st.Queue.InFlight == 0 && st.Active == 0 })
		if v := d.Metrics(t)[`tiergate_requests_total{code="502",pool="default/llm",tier="premium"}`]; v != 1 {
			t.Errorf("requests_total 502 = %v, want 1", v)
		}
		// With the backend gone, the next request gets a 502 refusal, and
		// its slot is released too.
		r := d.fetch(context.Background(), t, call{tenant: "acme"})
		checkRefusal(t, r, wantRefusal{code: 502, typ: "backend_error", msg: "the model backend failed before answering", tier: "premium"})
		if st := d.stats(t); st.Queue.InFlight != 0 || st.Queue.DoubleReleases != 0 {
			t.Errorf("after 502: %+v", st.Queue)
		}
	})
}

// Drain on SIGTERM: readyz fails, new requests get 503 draining, the
// in-flight stream finishes, a queued request is dispatched if it can be
// within --drain-timeout and gets 503 draining if not, and the process
// exits 0.
func TestDrain(t *testing.T) {
	tests := map[string]struct {
		drainTimeout string
		queuedCode   int
	}{
		"queued request served within the drain timeout": {drainTimeout: "5s", queuedCode: 200},
		"queued request refused at the drain timeout":    {drainTimeout: "300ms", queuedCode: 503},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s := startSim(t, "--service-time", "const:50ms")
			d := startDispatcher(t, dispOpts{policy: basePolicy(1, 1, s.Addr), args: []string{"--drain-timeout", tc.drainTimeout}})
			inflight := make(chan result, 1)
			go func() {
				inflight <- d.fetch(context.Background(), t, call{tenant: "acme", path: "/v1/chat/completions",
					body: `{"stream":true,"max_tokens":10}`, header: http.Header{"X-Sim-Service-Time": {"1500ms"}}})
			}()
			testutil.EventuallyTrue(t, settle, "in flight", func() bool { return d.stats(t).Queue.InFlight == 1 })
			queued := make(chan result, 1)
			go func() { queued <- d.fetch(context.Background(), t, call{tenant: "globex"}) }()
			testutil.EventuallyTrue(t, settle, "queued", func() bool { return d.stats(t).Queue.Queued == 1 })

			if err := d.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			testutil.EventuallyTrue(t, settle, "readyz fails", func() bool {
				code, body := d.AdminDo(t, http.MethodGet, "/readyz", "", nil)
				return code == 503 && string(body) == "draining\n"
			})
			checkRefusal(t, d.fetch(context.Background(), t, call{tenant: "initech"}),
				wantRefusal{code: 503, typ: "draining", msg: "the dispatcher is shutting down; retry on another instance", retryAfter: 1})

			r := <-inflight
			if r.code != 200 || !strings.HasSuffix(r.body, "data: [DONE]\n\n") {
				t.Errorf("in-flight stream: %d %q", r.code, r.body)
			}
			q := <-queued
			if q.code != tc.queuedCode {
				t.Errorf("queued request got %d %s, want %d", q.code, q.body, tc.queuedCode)
			}
			if tc.queuedCode == 503 {
				checkRefusal(t, q, wantRefusal{code: 503, typ: "draining", tier: "premium",
					msg: "the dispatcher is shutting down; retry on another instance", retryAfter: 1})
			}
			if exited, err := d.Wait(10 * time.Second); !exited || err != nil {
				t.Fatalf("exited %v: %v", exited, err)
			}
		})
	}
}
