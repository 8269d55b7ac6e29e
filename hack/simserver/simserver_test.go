package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/tiergate/tiergate/internal/testutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParseServiceTime(t *testing.T) {
	tests := map[string]struct {
		in      string
		want    string
		wantErr bool
	}{
		"zero":                {in: "0", want: "const:0s"},
		"const zero":          {in: "const:0", want: "const:0s"},
		"const":               {in: "const:200ms", want: "const:200ms"},
		"bare duration":       {in: "1.5s", want: "const:1.5s"},
		"exp":                 {in: "exp:6s", want: "exp:6s"},
		"lognormal":           {in: "lognormal:6s,2s", want: "lognormal:6s,2s"},
		"lognormal no sd":     {in: "lognormal:6s", wantErr: true},
		"lognormal zero mean": {in: "lognormal:0,1s", wantErr: true},
		"unknown kind":        {in: "gamma:1s", wantErr: true},
		"negative":            {in: "const:-1s", wantErr: true},
		"garbage":             {in: "fast", wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			d, err := parseServiceTime(tc.in, newLockedRand(1))
			if tc.wantErr {
				if !errors.Is(err, errBadDist) {
					t.Fatalf("err = %v, want errBadDist", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, d.String()); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
		})
	}
}

// The sample mean and deviation of the random distributions match what
// the flag promises, within sampling error.
func TestDistributionMoments(t *testing.T) {
	tests := map[string]struct {
		in           string
		mean, stddev float64
	}{
		"exp":       {in: "exp:6s", mean: 6, stddev: 6},
		"lognormal": {in: "lognormal:6s,2s", mean: 6, stddev: 2},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			d, err := parseServiceTime(tc.in, newLockedRand(7))
			if err != nil {
				t.Fatal(err)
			}
			const n = 200000
			var sum, sq float64
			for range n {
				x := d.Sample().Seconds()
				sum += x
				sq += x * x
			}
			mean := sum / n
			sd := math.Sqrt(sq/n - mean*mean)
			if math.Abs(mean-tc.mean)/tc.mean > 0.02 || math.Abs(sd-tc.stddev)/tc.stddev > 0.05 {
				t.Errorf("mean %.3f sd %.3f, want %.3f and %.3f", mean, sd, tc.mean, tc.stddev)
			}
		})
	}
}

func TestSlotsFIFO(t *testing.T) {
	s := newSlots(1)
	ctx := context.Background()
	if !s.acquire(ctx) {
		t.Fatal("first acquire failed")
	}
	var mu sync.Mutex
	var order []int
	var wg sync.WaitGroup
	// Waiters queue up in a known order; each registers before the next starts.
	for i := range 3 {
		wg.Add(1)
		started := make(chan struct{})
		go func() {
			defer wg.Done()
			go close(started)
			if s.acquire(ctx) {
				mu.Lock()
				order = append(order, i)
				mu.Unlock()
				s.release()
			}
		}()
		<-started
		testutil.EventuallyTrue(t, 5*time.Second, fmt.Sprintf("%d waiting", i+1), func() bool { s.mu.Lock(); defer s.mu.Unlock(); return s.waiting.Len() == i+1 })
	}
	// A waiter that gives up leaves the FIFO without taking a slot.
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan bool)
	go func() { done <- s.acquire(cctx) }()
	testutil.EventuallyTrue(t, 5*time.Second, "4 waiting", func() bool { s.mu.Lock(); defer s.mu.Unlock(); return s.waiting.Len() == 4 })
	cancel()
	if <-done {
		t.Fatal("cancelled acquire reported success")
	}
	s.release()
	wg.Wait()
	if diff := cmp.Diff([]int{0, 1, 2}, order); diff != "" {
		t.Errorf("service order (-want +got)\n%s", diff)
	}
	if s.busy != 0 || s.waiting.Len() != 0 {
		t.Errorf("busy=%d waiting=%d after all released", s.busy, s.waiting.Len())
	}
}

func newTestServer(t *testing.T, concurrency int, dist string) (*server, *httptest.Server) {
	t.Helper()
	d, err := parseServiceTime(dist, newLockedRand(1))
	if err != nil {
		t.Fatal(err)
	}
	s := &server{model: "sim", tokens: 4, tenantHeader: TenantHeader, dist: d, tok: tokenModel{bytesPerToken: 4}, slots: newSlots(concurrency),
		stats: newStats(), log: logr.Discard(), maxBodyBytes: 1 << 20}
	ts := httptest.NewServer(s.routes())
	t.Cleanup(ts.Close)
	return s, ts
}

func post(ctx context.Context, t *testing.T, url, tenant, body string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(TenantHeader, tenant)
	return http.DefaultClient.Do(req)
}

func TestStreamingAndWhole(t *testing.T) {
	_, ts := newTestServer(t, 2, "const:40ms")
	tests := map[string]struct {
		path, body string
		want       []string
	}{
		"chat stream": {path: "/v1/chat/completions", body: `{"stream":true,"max_tokens":3}`,
			want: []string{"tok0 ", "tok1 ", "tok2 ", "stop", "[DONE]"}},
		"completion stream": {path: "/v1/completions", body: `{"stream":true,"max_tokens":2}`,
			want: []string{"tok0 ", "tok1 ", "stop", "[DONE]"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			resp, err := post(context.Background(), t, ts.URL+tc.path, "a", tc.body)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
				t.Fatalf("Content-Type %q", ct)
			}
			var got []string
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				line, ok := strings.CutPrefix(sc.Text(), "data: ")
				if !ok {
					continue
				}
				if line == "[DONE]" {
					got = append(got, line)
					continue
				}
				var ev struct {
					Choices []struct {
						Text  string `json:"text"`
						Delta struct {
							Content string `json:"content"`
						} `json:"delta"`
						FinishReason *string `json:"finish_reason"`
					} `json:"choices"`
				}
				if err := json.Unmarshal([]byte(line), &ev); err != nil {
					t.Fatal(err)
				}
				c := ev.Choices[0]
				switch {
				case c.FinishReason != nil:
					got = append(got, *c.FinishReason)
				default:
					got = append(got, c.Text+c.Delta.Content)
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("events (-want +got)\n%s", diff)
			}
		})
	}
	t.Run("whole chat", func(t *testing.T) {
		resp, err := post(context.Background(), t, ts.URL+"/v1/chat/completions", "a", `{"max_tokens":2}`)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var got struct {
			Object  string `json:"object"`
			Choices []struct {
				Message struct{ Content string } `json:"message"`
			} `json:"choices"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
			t.Fatal(err)
		}
		if got.Object != "chat.completion" || got.Choices[0].Message.Content != "tok0 tok1 " {
			t.Errorf("got %+v", got)
		}
	})
	t.Run("bad body", func(t *testing.T) {
		resp, err := post(context.Background(), t, ts.URL+"/v1/chat/completions", "a", `{`)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("status %d", resp.StatusCode)
		}
	})
}

// Peaks are recorded per tenant; requests beyond --concurrency wait in the
// FIFO; a client that leaves is counted as a cancellation.
func TestStatsPeaksAndCancels(t *testing.T) {
	s, ts := newTestServer(t, 2, "const:150ms")
	var wg sync.WaitGroup
	for _, tenant := range []string{"a", "a", "a", "b"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := post(context.Background(), t, ts.URL+"/v1/completions", tenant, `{}`)
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	wg.Wait()
	// Two generating requests and one still in the FIFO go away; the queued
	// one first, so it cannot be handed a slot as the others leave.
	genCtx, cancelGen := context.WithCancel(context.Background())
	queuedCtx, cancelQueued := context.WithCancel(context.Background())
	for i := range 3 {
		ctx := genCtx
		if i == 2 {
			ctx = queuedCtx
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := post(ctx, t, ts.URL+"/v1/chat/completions", "c", `{"stream":true}`)
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
		testutil.EventuallyTrue(t, 5*time.Second, fmt.Sprintf("%d of c active", i+1), func() bool { return s.stats.snapshot().Tenants["c"].Active == i+1 })
	}
	cancelQueued()
	testutil.EventuallyTrue(t, 5*time.Second, "the queued one cancelled", func() bool { return s.stats.snapshot().Tenants["c"].CancelledQueued == 1 })
	cancelGen()
	wg.Wait()
	testutil.EventuallyTrue(t, 5*time.Second, "none active", func() bool { return s.stats.snapshot().Active == 0 })
	got := s.stats.snapshot()
	if got.PeakGenerating != 2 {
		t.Errorf("peak generating %d, want 2 (the --concurrency)", got.PeakGenerating)
	}
	if got.Tenants["a"].PeakActive != 3 || got.Tenants["b"].PeakActive != 1 || got.Tenants["a"].Completed != 3 {
		t.Errorf("tenant a %+v, b %+v", got.Tenants["a"], got.Tenants["b"])
	}
	if c := got.Tenants["c"]; c.Cancelled != 3 || c.CancelledQueued != 1 || c.Completed != 0 {
		t.Errorf("tenant c %+v, want 3 cancelled of which 1 queued", c)
	}
	resp, err := http.Post(ts.URL+"/debug/stats/reset", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := s.stats.snapshot(); got.Requests != 0 || len(got.Tenants) != 0 {
		t.Errorf("after reset: %+v", got)
	}
}
