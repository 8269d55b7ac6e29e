package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestPercentile(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	tests := map[string]struct {
		in   []time.Duration
		q    float64
		want time.Duration
	}{
		"empty":              {in: nil, q: .5, want: 0},
		"one":                {in: ms(7), q: .95, want: 7 * time.Millisecond},
		"median of four":     {in: ms(4, 1, 3, 2), q: .5, want: 2 * time.Millisecond},
		"p95 of twenty":      {in: ms(20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1), q: .95, want: 19 * time.Millisecond},
		"p95 of twenty-one":  {in: ms(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21), q: .95, want: 20 * time.Millisecond},
		"max":                {in: ms(3, 9, 1), q: 1, want: 9 * time.Millisecond},
		"q zero is the min":  {in: ms(3, 9, 1), q: 0, want: 1 * time.Millisecond},
		"input is not moved": {in: ms(3, 1, 2), q: .5, want: 2 * time.Millisecond},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			before := append([]time.Duration(nil), tc.in...)
			if got := percentile(tc.in, tc.q); got != tc.want {
				t.Errorf("percentile(%v, %v) = %v, want %v", tc.in, tc.q, got, tc.want)
			}
			if diff := cmp.Diff(before, tc.in); diff != "" {
				t.Errorf("input changed (-before +after):\n%s", diff)
			}
		})
	}
}

func TestRefusalFrom(t *testing.T) {
	tests := map[string]struct {
		status     int
		retryAfter string
		body       string
		want       [3]any
	}{
		"tenant limit": {status: 429, retryAfter: "3", body: `{"error":{"type":"tenant_limit","message":"…","tier":"premium","queue_position":4,"retry_after_seconds":3}}`,
			want: [3]any{outcomeRefused, "tenant_limit", 3}},
		"capacity":       {status: 429, retryAfter: "20", body: `{"error":{"type":"capacity"}}`, want: [3]any{outcomeRefused, "capacity", 20}},
		"queue timeout":  {status: 504, body: `{"error":{"type":"queue_timeout"}}`, want: [3]any{outcomeRefused, "queue_timeout", 0}},
		"not json":       {status: 502, body: "Bad Gateway", want: [3]any{outcomeError, "HTTP 502 without a refusal body", 0}},
		"json, no type":  {status: 500, body: `{"error":{}}`, want: [3]any{outcomeError, "HTTP 500 without a refusal body", 0}},
		"bad RetryAfter": {status: 429, retryAfter: "soon", body: `{"error":{"type":"capacity"}}`, want: [3]any{outcomeRefused, "capacity", 0}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			h := http.Header{}
			if tc.retryAfter != "" {
				h.Set("Retry-After", tc.retryAfter)
			}
			o, c, ra := refusalFrom(tc.status, h, []byte(tc.body))
			if diff := cmp.Diff(tc.want, [3]any{o, c, ra}); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestWaitHeader(t *testing.T) {
	tests := map[string]struct {
		value  string
		want   time.Duration
		wantOK bool
	}{
		"ms":       {value: "1250", want: 1250 * time.Millisecond, wantOK: true},
		"zero":     {value: "0", want: 0, wantOK: true},
		"missing":  {value: "", wantOK: false},
		"negative": {value: "-1", wantOK: false},
		"garbage":  {value: "1.5s", wantOK: false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			resp := &http.Response{Header: http.Header{}}
			if tc.value != "" {
				resp.Header.Set("X-Queue-Wait-Ms", tc.value)
			}
			got, ok := waitHeader(resp)
			if got != tc.want || ok != tc.wantOK {
				t.Errorf("waitHeader(%q) = %v, %v; want %v, %v", tc.value, got, ok, tc.want, tc.wantOK)
			}
		})
	}
}

// The transport spreads requests over the dispatchers in turn, as their
// Service would, whatever host the client asked for.
func TestServiceTransportRoundRobin(t *testing.T) {
	var mu sync.Mutex
	hits := map[string]int{}
	var targets []string
	for i := 0; i < 3; i++ {
		name := fmt.Sprintf("d%d", i)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			hits[name]++
			mu.Unlock()
			fmt.Fprint(w, name)
		}))
		t.Cleanup(srv.Close)
		targets = append(targets, strings.TrimPrefix(srv.URL, "http://"))
	}
	c := &http.Client{Transport: &serviceTransport{base: newTransport(), targets: targets}}
	var got []string
	for i := 0; i < 7; i++ {
		resp, err := c.Get("http://" + serviceHost + "/v1/models")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		got = append(got, string(b))
	}
	want := []string{"d0", "d1", "d2", "d0", "d1", "d2", "d0"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("order (-want +got):\n%s", diff)
	}
}

func TestRecorderBudgetAndLive(t *testing.T) {
	r := newRecorder(time.Now().Add(-time.Minute), 3)
	for i := 0; i < 3; i++ {
		if !r.take() {
			t.Fatalf("take %d refused within the budget", i)
		}
	}
	if r.take() {
		t.Fatal("take beyond the budget of 3 succeeded")
	}
	r.begin("premium")
	r.begin("premium")
	r.begin("free")
	r.end(record{Tier: "premium", Outcome: outcomeServed})
	r.end(record{Tier: "premium", Outcome: outcomeRefused, Cause: "tenant_limit"})
	// Waits older than the window do not count.
	r.wait(waitSample{Tier: "premium", Dispatch: 10 * time.Second, Wait: time.Hour})
	for i := 1; i <= 20; i++ {
		r.wait(waitSample{Tier: "premium", Dispatch: time.Minute - time.Second, Wait: time.Duration(i) * time.Second})
	}
	live := r.live(10 * time.Second)
	p := live["premium"]
	want := tierLive{Served: 1, Pending: 0, Refused: map[string]int{"tenant_limit": 1}, P50: 10 * time.Second, P95: 19 * time.Second, WindowN: 20}
	if diff := cmp.Diff(want, *p); diff != "" {
		t.Errorf("premium (-want +got):\n%s", diff)
	}
	if f := live["free"]; f.Pending != 1 || f.WindowN != 0 {
		t.Errorf("free: pending %d, window %d; want 1, 0", f.Pending, f.WindowN)
	}
}

func TestCheckPlan(t *testing.T) {
	pool := &poolInfo{Tenants: map[string]string{"acme": "premium", "globex": "standard", "": "free"}}
	ok := []streamPlan{{Name: "a", Tier: "premium", Tenants: []string{"acme"}}, {Name: "f", Tier: "free", Tenants: []string{"anyone"}}}
	if err := checkPlan(ok, pool); err != nil {
		t.Fatalf("checkPlan: %v", err)
	}
	bad := []streamPlan{{Name: "g", Tier: "premium", Tenants: []string{"globex"}}}
	want := `tenant "globex" of stream "g" is in tier "standard", the demo expects "premium": were config/samples or hack/demo/manifests changed?`
	if err := checkPlan(bad, pool); err == nil || err.Error() != want {
		t.Fatalf("checkPlan = %v, want %q", err, want)
	}
}

// An HTTP stream stops at the end of its window and never sends more than
// its budget; every request it sent is recorded once.
func TestHTTPStreamBounded(t *testing.T) {
	var mu sync.Mutex
	served := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		served++
		mu.Unlock()
		if r.Header.Get("X-Tenant-ID") != "t1" {
			w.WriteHeader(http.StatusForbidden)
			fmt.Fprint(w, `{"error":{"type":"unknown_tenant"}}`)
			return
		}
		w.Header().Set("X-Queue-Wait-Ms", "5")
		fmt.Fprint(w, "data: {}\n\ndata: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	rec := newRecorder(time.Now(), 25)
	g := &loadGen{
		sched: schedule{Load: 500 * time.Millisecond}, rec: rec, header: "X-Tenant-ID", timeout: 5 * time.Second,
		client: &http.Client{Transport: &serviceTransport{base: newTransport(), targets: []string{strings.TrimPrefix(srv.URL, "http://")}}},
		plan:   []streamPlan{{Name: "s", Tier: "premium", Tenants: []string{"t1"}, Rate: 200, MaxOut: 100, To: 1}},
	}
	ctx := context.Background()
	g.run(ctx, ctx)
	recs, waits, _ := rec.snapshot()
	if len(recs) != 25 || served != 25 {
		t.Fatalf("%d records, %d served by the server; want the budget of 25 each", len(recs), served)
	}
	for _, r := range recs {
		if r.Outcome != outcomeServed || r.End < r.Start || r.Tenant != "t1" {
			t.Fatalf("record %+v", r)
		}
	}
	if len(waits) != 25 || waits[0].Wait != 5*time.Millisecond {
		t.Fatalf("waits %v", waits)
	}
}
