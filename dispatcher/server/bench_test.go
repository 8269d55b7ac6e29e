package server

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/dispatcher/balancer"
	"github.com/tiergate/tiergate/dispatcher/forward"
	"github.com/tiergate/tiergate/dispatcher/identity"
	"github.com/tiergate/tiergate/dispatcher/metrics"
	"github.com/tiergate/tiergate/dispatcher/queue"
	"github.com/tiergate/tiergate/dispatcher/tokens"
)

// cannedBackend answers every request on its connections with a fixed
// 200, without allocating, over in-memory pipes: a benchmark measures the
// data path and the forwarder, not a network or a backend.
type cannedBackend struct{}

const cannedAnswer = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"ok\":true}"

// Dial is forward.Options.Dial: one pipe, served until it closes.
func (cannedBackend) Dial(context.Context, string, string) (net.Conn, error) {
	client, server := net.Pipe()
	go serveCanned(server)
	return client, nil
}

func serveCanned(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		n := int64(0)
		for {
			line, err := br.ReadSlice('\n')
			if err != nil {
				return
			}
			if len(line) <= 2 {
				break
			}
			if v, ok := bytes.CutPrefix(line, []byte("Content-Length: ")); ok {
				n, _ = strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64)
			}
		}
		if _, err := br.Discard(int(n)); err != nil {
			return
		}
		if _, err := io.WriteString(c, cannedAnswer); err != nil {
			return
		}
	}
}

// benchServer is a data path with one tier and slots; acme has limits
// when they are set.
func benchServer(b *testing.B, slots int, limits *policy.Limits) (*Server, *queue.Queue) {
	b.Helper()
	q := queue.New(clock.RealClock{})
	bal := balancer.New(balancer.Health{}, nil)
	m, err := metrics.New(prometheus.NewRegistry(), func() metrics.Snapshot { return metrics.Snapshot{} })
	if err != nil {
		b.Fatal(err)
	}
	fwd := forward.New(forward.Options{Dial: cannedBackend{}.Dial})
	b.Cleanup(fwd.CloseIdle)
	srv, err := New(withLimits(Config{Log: logr.Discard(), Forwarder: fwd, Limiter: tokens.NewLocal(clock.RealClock{})}), q, bal, m)
	if err != nil {
		b.Fatal(err)
	}
	p := testPolicy(policy.AuthTrustedHeader, slots)
	p.Tiers[0].QueueBound, p.Tiers[0].TenantQueueLimit = 1, 1
	p.Tenants[0].Limits = limits
	p.Backends = []policy.Backend{{Address: "127.0.0.1:1"}}
	if err := p.Validate(); err != nil {
		b.Fatal(err)
	}
	bal.Update(p.Backends)
	q.UpdatePolicy(p)
	srv.SetPolicy(p)
	return srv, q
}

func serveOnce(b *testing.B, srv *Server, want int) {
	req := httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(`{"prompt":"x"}`))
	req.Header.Set("X-Tenant-Id", "acme")
	rec := httptest.NewRecorder()
	srv.ServeHTTP(rec, req)
	if rec.Code != want {
		b.Fatalf("status %d, want %d: %s", rec.Code, want, rec.Body)
	}
}

// BenchmarkServeHTTP measures the time and allocations of one request
// through the data path: proxied to a backend, and refused with 429.
// harness is what the benchmark itself pays per request (the request and
// the recorder; the canned backend allocates nothing), to subtract from
// proxied. proxied's tenant has no budget (the token path estimates and
// meters only); proxied-budget's has one that never refuses, so it also
// reserves, settles and sets the x-ratelimit-* headers: the difference is
// what a budget costs per request.
func BenchmarkServeHTTP(b *testing.B) {
	b.Run("harness", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			req := httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(`{"prompt":"x"}`))
			req.Header.Set("X-Tenant-Id", "acme")
			rec := httptest.NewRecorder()
			_, _ = io.Copy(io.Discard, req.Body)
			rec.Header().Set("Content-Type", "application/json")
			rec.WriteHeader(http.StatusOK)
			_, _ = io.WriteString(rec, `{"ok":true}`)
		}
	})
	b.Run("proxied", func(b *testing.B) {
		srv, _ := benchServer(b, 2, nil)
		b.ReportAllocs()
		for b.Loop() {
			serveOnce(b, srv, http.StatusOK)
		}
	})
	b.Run("proxied-budget", func(b *testing.B) {
		srv, _ := benchServer(b, 2, &policy.Limits{RequestsPerMinute: 1 << 40, TokensPerMinute: 1 << 50})
		b.ReportAllocs()
		for b.Loop() {
			serveOnce(b, srv, http.StatusOK)
		}
	})
	b.Run("refused-429", func(b *testing.B) {
		srv, q := benchServer(b, 1, nil)
		// One request holds the slot and one fills the queue (bound 1).
		running, err := q.Admit("acme", "premium")
		if err != nil {
			b.Fatal(err)
		}
		queued, err := q.Admit("acme", "premium")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { queued.Release(); running.Release() })
		b.ReportAllocs()
		for b.Loop() {
			serveOnce(b, srv, http.StatusTooManyRequests)
		}
	})
}

// discardWriter is a ResponseWriter that keeps nothing but its headers.
type discardWriter struct{ h http.Header }

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *discardWriter) WriteHeader(int)             {}

// BenchmarkTokenPath is the token path alone, as the data path runs it
// for one request between reading its body and its exit: the estimate,
// the reservation (with a budget), the head's x-ratelimit-* headers, the
// Meter reading a JSON answer with usage, and the settlement (tokens_total,
// the estimate error, the Ratio). No HTTP, queue or backend, so the figure
// is the token path's own; BenchmarkServeHTTP gives the whole request.
func BenchmarkTokenPath(b *testing.B) {
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 1000) + `"}],"max_tokens":100}`)
	answer := []byte(`{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"tok0 tok1"},"finish_reason":"length"}],"usage":{"prompt_tokens":250,"completion_tokens":2,"total_tokens":252}}`)
	for name, limits := range map[string]*policy.Limits{
		"no-budget": nil,
		"budget":    {RequestsPerMinute: 1_000_000_000, TokensPerMinute: 1_000_000_000},
	} {
		b.Run(name, func(b *testing.B) {
			srv, _ := benchServer(b, 2, limits)
			st := srv.cur.Load()
			req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
			who := identity.Identity{Tenant: "acme", Tier: "premium"}
			w := &discardWriter{h: http.Header{"Content-Type": {"application/json"}}}
			b.ReportAllocs()
			for b.Loop() {
				x := getExchange(w, &srv.draining)
				x.st, x.pool, x.tier = st, st.pool, who.Tier
				if _, ok := srv.reserve(x, req, st, who, body); !ok {
					b.Fatal("refused")
				}
				x.tok.reached = true
				x.sw.WriteHeader(http.StatusOK)
				_, _ = x.sw.Write(answer)
				srv.settleTokens(x, req)
				putExchange(x)
			}
		})
	}
}
