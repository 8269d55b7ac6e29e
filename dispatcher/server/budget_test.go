package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/dispatcher/budget"
)

// trickle hands out its chunks one Read at a time and records, at every
// Read, what had arrived before it and what the charge held.
type trickle struct {
	chunks  [][]byte
	charge  *budget.Charge
	arrived int64
	worst   float64 // the largest (charge - firstChunk) / arrived seen
	peak    int64
}

func (r *trickle) Read(p []byte) (int, error) {
	held := r.charge.Bytes()
	r.peak = max(r.peak, held)
	if r.arrived > 0 {
		r.worst = max(r.worst, float64(held-firstChunk)/float64(r.arrived))
	} else if held > firstChunk {
		r.worst = float64(held) // charged before anything arrived
	}
	if len(r.chunks) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.chunks[0])
	r.chunks[0] = r.chunks[0][n:]
	if len(r.chunks[0]) == 0 {
		r.chunks = r.chunks[1:]
	}
	r.arrived += int64(n)
	return n, nil
}

func chunks(total, size int) [][]byte {
	var out [][]byte
	for total > 0 {
		n := min(size, total)
		out = append(out, bytes.Repeat([]byte{'x'}, n))
		total -= n
	}
	return out
}

// readAll grows its buffer as the body arrives: what it charges is never
// more than twice what arrived plus the first chunk, a declared length
// reserves nothing, and the charge at the end is the buffer it returns.
func TestReadAllChargesAsTheBodyArrives(t *testing.T) {
	type out struct {
		Len     int
		Charged int64 // after the read
		Peak    int64
		Err     string
	}
	for name, tc := range map[string]struct {
		body     [][]byte
		declared int64
		limit    int64 // --max-body-bytes
		budget   int64
		taken    int64 // charged by another request first
		want     out
	}{
		"declared length: exact at the end": {
			body: chunks(10000, 1000), declared: 10000, limit: 1 << 20, budget: 1 << 20,
			want: out{Len: 10000, Charged: 10000, Peak: 10000},
		},
		"a large declared length reserves nothing": {
			body: chunks(10, 10), declared: 4 << 20, limit: 4 << 20, budget: 4 << 20,
			want: out{Charged: firstChunk, Peak: firstChunk, Err: "the body ended before its Content-Length: unexpected EOF"},
		},
		"unknown length: the buffer doubles": {
			body: chunks(10000, 3000), declared: -1, limit: 1 << 20, budget: 1 << 20,
			want: out{Len: 10000, Charged: 16384, Peak: 16384},
		},
		"unknown length up to the limit exactly": {
			body: chunks(8192, 1000), declared: -1, limit: 8192, budget: 8192,
			want: out{Len: 8192, Charged: 8192, Peak: 8192},
		},
		"unknown length past the limit": {
			body: chunks(8193, 1000), declared: -1, limit: 8192, budget: 8192,
			want: out{Charged: 8192, Peak: 8192, Err: "http: request body too large"},
		},
		"the budget runs out mid-body": {
			body: chunks(10000, 1000), declared: 10000, limit: 16384, budget: 16384, taken: 8192,
			want: out{Charged: 8192, Peak: 8192, Err: budget.ErrExceeded.Error()},
		},
		"longer than declared": {
			body: chunks(6, 6), declared: 5, limit: 100, budget: 100,
			want: out{Charged: 5, Peak: 5, Err: "the body is longer than its Content-Length"},
		},
		"empty, declared": {
			declared: 0, limit: 100, budget: 100,
			want: out{},
		},
		"empty, chunked": {
			declared: -1, limit: 1 << 20, budget: 1 << 20,
			want: out{Charged: firstChunk, Peak: firstChunk},
		},
	} {
		t.Run(name, func(t *testing.T) {
			b, err := budget.New(tc.budget)
			if err != nil {
				t.Fatal(err)
			}
			other := b.Open()
			if err := other.Grow(tc.taken); err != nil {
				t.Fatal(err)
			}
			c := b.Open()
			r := &trickle{chunks: tc.body, charge: &c}
			body, err := readAll(http.MaxBytesReader(nil, io.NopCloser(r), tc.limit), tc.declared, tc.limit, &c)
			got := out{Len: len(body), Charged: c.Bytes(), Peak: max(r.peak, c.Bytes())}
			if err != nil {
				got.Err = err.Error()
			} else if body == nil {
				t.Error("a nil body without an error")
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			if r.worst > 2 {
				t.Errorf("charged %.1f× what had arrived (plus the first chunk), want at most 2×", r.worst)
			}
			if c.Release(); b.Used() != tc.taken {
				t.Errorf("after the release the budget holds %d, want %d", b.Used(), tc.taken)
			}
		})
	}
}

// budgetFixture is a server whose bodies share a budget of 16 KiB (the
// largest body too), premium has 1 slot, and the backend holds /slow
// until release, which the test's cleanup calls too.
func budgetFixture(t *testing.T, clientTimeout float64) (f *fixture, release func()) {
	t.Helper()
	p := testPolicy(policy.AuthTrustedHeader, 1)
	p.ClientTimeoutSeconds = clientTimeout
	f = newFixtureConfig(t, p, Config{MaxBodyBytes: 16 << 10, MaxQueuedBytes: 16 << 10})
	f.be.hold = make(chan struct{})
	f.be.arrived = make(chan string, 4)
	var once sync.Once
	release = func() { once.Do(func() { close(f.be.hold) }) }
	t.Cleanup(release)
	return f, release
}

type sent struct {
	Code int
	Body string
	Err  error
}

// send posts body (chunked when declared is false) as acme, with ctx.
func (f *fixture) send(ctx context.Context, path string, body []byte, declared bool) sent {
	var r io.Reader = bytes.NewReader(body)
	if !declared {
		r = io.MultiReader(r) // hides the length: sent chunked
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, f.front.URL+path, r)
	req.Header.Set("X-Tenant-Id", "acme")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return sent{Err: err}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return sent{Code: resp.StatusCode, Body: string(b)}
}

// waitQueued waits until n requests are queued.
func (f *fixture) waitQueued(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for f.q.Stats().Queued != n {
		if time.Now().After(deadline) {
			t.Fatalf("queued %d, want %d", f.q.Stats().Queued, n)
		}
		time.Sleep(time.Millisecond)
	}
}

const overloadedBody = `{"error":{"type":"overloaded","message":"queued request bodies would exceed the dispatcher's 16 KiB budget (--max-queued-bytes); retry shortly or on another instance","tier":"premium","queue_position":0,"retry_after_seconds":1}}` + "\n"

// A queued body holds its bytes of the budget until it is dispatched; one
// that would not fit is refused with 503 overloaded, whether its length is
// declared (before a byte is read) or not (once its buffer would outgrow
// what is left); every end gives the bytes back.
func TestQueuedBodiesShareTheBudget(t *testing.T) {
	f, release := budgetFixture(t, 0)
	ctx := context.Background()
	inflight := make(chan sent, 1)
	go func() { inflight <- f.send(ctx, "/slow", make([]byte, 12000), true) }()
	<-f.be.arrived
	if held, _ := f.srv.Bodies(); held != 0 {
		t.Fatalf("a dispatched body still holds %d bytes", held)
	}
	queued := make(chan sent, 1)
	go func() { queued <- f.send(ctx, "/v1/completions", make([]byte, 10000), true) }()
	f.waitQueued(t, 1)
	if held, _ := f.srv.Bodies(); held != 10000 {
		t.Fatalf("a queued body of 10000 bytes holds %d", held)
	}

	got := []sent{
		f.send(ctx, "/v1/completions", make([]byte, 10000), true),
		f.send(ctx, "/v1/completions", make([]byte, 10000), false),
	}
	want := []sent{{Code: 503, Body: overloadedBody}, {Code: 503, Body: overloadedBody}}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b error) bool { return (a == nil) == (b == nil) })); diff != "" {
		t.Fatalf("requests past the budget (-want +got):\n%s", diff)
	}
	// Small ones still fit.
	small := make(chan sent, 1)
	go func() { small <- f.send(ctx, "/v1/completions", make([]byte, 100), true) }()
	f.waitQueued(t, 2)

	release()
	for _, c := range []chan sent{inflight, queued, small} {
		if s := <-c; s.Code != 200 {
			t.Errorf("served request: %d %s %v", s.Code, s.Body, s.Err)
		}
	}
	f.idle(t)
	if held, _ := f.srv.Bodies(); held != 0 {
		t.Errorf("after the load the budget holds %d, want 0", held)
	}
	if got := series(t, f.reg, "tiergate_rejections_total"); !cmp.Equal(got, map[string]float64{"cause=overloaded,pool=p,tier=premium": 2}) {
		t.Errorf("rejections_total %v, want 2 overloaded", got)
	}
}

// Every way a request with a body ends gives its bytes back: refused
// before the queue, abandoned, expired, drained.
func TestEveryEndReleasesTheBody(t *testing.T) {
	for name, tc := range map[string]struct {
		clientTimeout float64
		// end makes the queued request end; it returns what the client
		// should see (0: the client left).
		end      func(t *testing.T, f *fixture, cancel context.CancelFunc) int
		wantType string
	}{
		"abandoned while queued": {end: func(t *testing.T, f *fixture, cancel context.CancelFunc) int { cancel(); return 0 }},
		"expired in the queue": {clientTimeout: 0.05, wantType: "queue_timeout",
			end: func(t *testing.T, f *fixture, cancel context.CancelFunc) int { return 504 }},
		"drained": {wantType: "draining", end: func(t *testing.T, f *fixture, cancel context.CancelFunc) int {
			f.q.Drain()
			f.q.FlushQueued()
			return 503
		}},
		"refused by the queue (tenant queue limit)": {wantType: "tenant_limit", end: func(t *testing.T, f *fixture, cancel context.CancelFunc) int {
			p := testPolicy(policy.AuthTrustedHeader, 1)
			p.Version = 2
			p.Tiers[0].TenantQueueLimit = 1
			p.Backends = []policy.Backend{{Address: strings.TrimPrefix(f.backend.URL, "http://")}}
			f.q.UpdatePolicy(p)
			f.srv.SetPolicy(p)
			s := f.send(context.Background(), "/v1/completions", make([]byte, 3000), true)
			if s.Code != 429 || !strings.Contains(s.Body, `"tenant_limit"`) {
				t.Errorf("second queued request: %d %s", s.Code, s.Body)
			}
			cancel()
			return 0
		}},
	} {
		t.Run(name, func(t *testing.T) {
			f, release := budgetFixture(t, tc.clientTimeout)
			go f.send(context.Background(), "/slow", nil, true)
			<-f.be.arrived
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			queued := make(chan sent, 1)
			go func() { queued <- f.send(ctx, "/v1/completions", make([]byte, 5000), true) }()
			if tc.clientTimeout == 0 {
				f.waitQueued(t, 1)
				if held, _ := f.srv.Bodies(); held != 5000 {
					t.Fatalf("queued body holds %d, want 5000", held)
				}
			}
			wantCode := tc.end(t, f, cancel)
			s := <-queued
			switch {
			case wantCode == 0 && !errors.Is(s.Err, context.Canceled):
				t.Errorf("the client that left got %d %v", s.Code, s.Err)
			case wantCode != 0 && (s.Code != wantCode || !strings.Contains(s.Body, fmt.Sprintf(`"type":%q`, tc.wantType))):
				t.Errorf("queued request: %d %s, want %d %s", s.Code, s.Body, wantCode, tc.wantType)
			}
			deadline := time.Now().Add(5 * time.Second)
			for held, _ := f.srv.Bodies(); held != 0; held, _ = f.srv.Bodies() {
				if time.Now().After(deadline) {
					t.Fatalf("the budget still holds %d after the request ended", held)
				}
				time.Sleep(time.Millisecond)
			}
			release()
			f.idle(t)
		})
	}
}

// A client that waits for "100 Continue" and is refused by the budget
// before a byte was read gets its 503 and sends nothing; the handler does
// not wait for a body that will not come.
func TestOverloadedBeforeContinue(t *testing.T) {
	f, release := budgetFixture(t, 0)
	go f.send(context.Background(), "/slow", nil, true)
	<-f.be.arrived
	queued := make(chan sent, 1)
	go func() { queued <- f.send(context.Background(), "/v1/completions", make([]byte, 10000), true) }()
	f.waitQueued(t, 1)

	client := &http.Client{Transport: &http.Transport{ExpectContinueTimeout: time.Minute}}
	defer client.Transport.(*http.Transport).CloseIdleConnections()
	body := &countingReader{r: bytes.NewReader(make([]byte, 10000))}
	req, _ := http.NewRequest(http.MethodPost, f.front.URL+"/v1/completions", body)
	req.ContentLength = 10000
	req.Header.Set("X-Tenant-Id", "acme")
	req.Header.Set("Expect", "100-continue")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || string(b) != overloadedBody {
		t.Fatalf("%d %s, want 503 overloaded", resp.StatusCode, b)
	}
	if body.n != 0 {
		t.Errorf("the client sent %d bytes of a refused body it was not asked for", body.n)
	}
	done := make(chan struct{})
	go func() { f.idle(t); close(done) }()
	release()
	select {
	case <-done:
	case <-time.After(10 * time.Second): // BodyTimeout is 30s
		t.Fatal("a handler is still waiting for the refused body")
	}
	if s := <-queued; s.Code != 200 {
		t.Errorf("queued request: %d %s", s.Code, s.Body)
	}
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}
