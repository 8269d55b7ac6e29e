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
	"github.com/tiergate/tiergate/dispatcher/metrics"
	"github.com/tiergate/tiergate/dispatcher/queue"
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

func benchServer(b *testing.B, slots int) (*Server, *queue.Queue) {
	b.Helper()
	q := queue.New(clock.RealClock{})
	bal := balancer.New(balancer.Health{}, nil)
	m, err := metrics.New(prometheus.NewRegistry(), func() metrics.Snapshot { return metrics.Snapshot{} })
	if err != nil {
		b.Fatal(err)
	}
	fwd := forward.New(forward.Options{Dial: cannedBackend{}.Dial})
	b.Cleanup(fwd.CloseIdle)
	srv, err := New(withLimits(Config{Log: logr.Discard(), Forwarder: fwd}), q, bal, m)
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
// harness is what the benchmark itself pays per request (the request and
// the recorder; the canned backend allocates nothing), to subtract from
// proxied.
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
