package server

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/tiergate/tiergate/dispatcher/balancer"
	"github.com/tiergate/tiergate/dispatcher/metrics"
	"github.com/tiergate/tiergate/dispatcher/policy"
	"github.com/tiergate/tiergate/dispatcher/queue"
)

// cannedTransport answers every request with a fixed 200, so a benchmark
// measures the data path and the proxy, not a network.
type cannedTransport struct{}

func (cannedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		_, _ = io.Copy(io.Discard, r.Body)
		_ = r.Body.Close()
	}
	return &http.Response{
		StatusCode: http.StatusOK, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:  http.Header{"Content-Type": {"application/json"}},
		Body:    io.NopCloser(strings.NewReader(`{"ok":true}`)),
		Request: r, ContentLength: 11,
	}, nil
}

func benchServer(b *testing.B, slots int) (*Server, *queue.Queue) {
	b.Helper()
	q := queue.New(clock.RealClock{})
	bal := balancer.New(balancer.Health{}, nil)
	m, err := metrics.New(prometheus.NewRegistry(), func() metrics.Snapshot { return metrics.Snapshot{} })
	if err != nil {
		b.Fatal(err)
	}
	srv, err := New(Config{Log: logr.Discard(), Transport: cannedTransport{}}, q, bal, m)
	if err != nil {
		b.Fatal(err)
	}
	p := testPolicy(policy.AuthTrustedHeader, slots)
	p.Tiers[0].QueueBound, p.Tiers[0].TenantQueueLimit = 1, 1
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
// harness is what the benchmark itself pays per request (the request, the
// recorder and the canned backend answer), to subtract from proxied.
func BenchmarkServeHTTP(b *testing.B) {
	b.Run("harness", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			req := httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(`{"prompt":"x"}`))
			req.Header.Set("X-Tenant-Id", "acme")
			rec := httptest.NewRecorder()
			resp, _ := cannedTransport{}.RoundTrip(req)
			rec.WriteHeader(resp.StatusCode)
			_, _ = io.Copy(rec, resp.Body)
			_ = resp.Body.Close()
		}
	})
	b.Run("proxied", func(b *testing.B) {
		srv, _ := benchServer(b, 2)
		b.ReportAllocs()
		for b.Loop() {
			serveOnce(b, srv, http.StatusOK)
		}
	})
	b.Run("refused-429", func(b *testing.B) {
		srv, q := benchServer(b, 1)
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
