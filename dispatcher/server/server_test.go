package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
	"k8s.io/utils/clock"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/dispatcher/balancer"
	"github.com/tiergate/tiergate/dispatcher/forward"
	"github.com/tiergate/tiergate/dispatcher/metrics"
	"github.com/tiergate/tiergate/dispatcher/queue"
	"github.com/tiergate/tiergate/dispatcher/tokens"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// backend records what reached it. Paths: /slow waits on hold; /status/404
// answers 404; /sse sends one event, waits on next, sends another; /cut
// sends one event and drops the connection; /status/500 answers 500;
// anything else answers 200. A request with the token tests' headers gets
// tokenAnswer whatever its path.
type backend struct {
	mu      sync.Mutex
	headers []http.Header
	paths   []string
	hold    chan struct{} // when set, requests to /slow wait on it
	next    chan struct{} // /sse waits on it between its events
	arrived chan string   // when set, gets each path as it arrives
}

func (b *backend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b.mu.Lock()
	b.headers = append(b.headers, r.Header.Clone())
	b.paths = append(b.paths, r.URL.Path)
	arrived := b.arrived
	b.mu.Unlock()
	_, _ = io.Copy(io.Discard, r.Body)
	if arrived != nil {
		arrived <- r.URL.Path
	}
	if wantsTokenAnswer(r) {
		tokenAnswer(w, r)
		return
	}
	switch r.URL.Path {
	case "/slow":
		if b.hold != nil {
			select {
			case <-b.hold:
			case <-r.Context().Done():
				return
			}
		}
	case "/status/404":
		w.WriteHeader(http.StatusNotFound)
		return
	case "/status/500":
		w.WriteHeader(http.StatusInternalServerError)
		return
	case "/sse", "/cut":
		b.stream(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"ok":true}`)
}

func (b *backend) stream(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/event-stream")
	_, _ = io.WriteString(w, "data: 1\n\n")
	_ = http.NewResponseController(w).Flush()
	if r.URL.Path == "/cut" {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
		return
	}
	select {
	case <-b.next:
	case <-r.Context().Done():
		return
	}
	_, _ = io.WriteString(w, "data: 2\n\n")
}

type fixture struct {
	srv     *Server
	bal     *balancer.Balancer
	front   *httptest.Server
	be      *backend
	q       *queue.Queue
	reg     *prometheus.Registry
	backend *httptest.Server
}

func newFixture(t *testing.T, p *policy.Policy) *fixture {
	t.Helper()
	return newFixtureConfig(t, p, Config{})
}

// newFixtureConfig is newFixture with cfg's limits (its Log and Forwarder
// is the fixture's, and so is its Forwarder unless cfg has one).
func newFixtureConfig(t *testing.T, p *policy.Policy, cfg Config) *fixture {
	t.Helper()
	be := &backend{}
	bts := httptest.NewServer(be)
	f := &fixture{be: be, backend: bts, reg: prometheus.NewRegistry()}
	f.q = queue.New(clock.RealClock{})
	bal := balancer.New(balancer.Health{}, nil)
	f.bal = bal
	m, err := metrics.New(f.reg, func() metrics.Snapshot { return metrics.Snapshot{} })
	if err != nil {
		t.Fatal(err)
	}
	cfg.Log = logr.Discard()
	if cfg.Forwarder == nil {
		cfg.Forwarder = forward.New(forward.DefaultOptions())
	}
	f.srv, err = New(withLimits(cfg), f.q, bal, m)
	if err != nil {
		t.Fatal(err)
	}
	if p != nil {
		p.Backends = []policy.Backend{{Address: strings.TrimPrefix(bts.URL, "http://")}}
		if err := p.Validate(); err != nil {
			t.Fatal(err)
		}
		bal.Update(p.Backends)
		f.q.UpdatePolicy(p)
		f.srv.SetPolicy(p)
	}
	f.front = httptest.NewServer(f.srv)
	t.Cleanup(func() {
		f.front.Close()
		bts.Close()
		f.srv.fwd.CloseIdle()
	})
	return f
}

// withLimits fills cfg's zero limits with dispatcher.Config's defaults
// (which this package cannot import), and its Limiter with a Local one:
// New takes a complete Config.
func withLimits(cfg Config) Config {
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = 4 << 20
	}
	if cfg.BodyTimeout == 0 {
		cfg.BodyTimeout = 30 * time.Second
	}
	if cfg.MaxQueuedBytes == 0 {
		cfg.MaxQueuedBytes = 256 << 20
	}
	if cfg.Limiter == nil {
		cfg.Limiter = tokens.NewLocal(clock.RealClock{})
	}
	return cfg
}

func testPolicy(mode string, slots int) *policy.Policy {
	sum := sha256.Sum256([]byte("sk-acme"))
	return &policy.Policy{
		Version: 1, Pool: "p", Slots: slots, ServiceRate: 1, AgeingRate: 1,
		Authentication: policy.Authentication{Mode: mode, HeaderName: "X-Tenant-ID"},
		ExemptPaths:    []string{"/v1/models"},
		Tiers:          []policy.Tier{{Name: "premium", TolerableWaitSeconds: 5, QueueBound: 4, TenantConcurrencyLimit: 2, TenantQueueLimit: 4}},
		Tenants:        []policy.Tenant{{ID: "acme", Tier: "premium", APIKeySHA256: []string{hex.EncodeToString(sum[:])}}},
	}
}

// answer is a finished response: its status and headers.
type answer struct {
	StatusCode int
	Header     http.Header
	Close      bool // the server said Connection: close
}

func (f *fixture) do(t *testing.T, method, path string, h http.Header) answer {
	t.Helper()
	req, _ := http.NewRequest(method, f.front.URL+path, strings.NewReader(`{"prompt":"x"}`))
	for k, v := range h {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return answer{StatusCode: resp.StatusCode, Header: resp.Header, Close: resp.Close}
}

// The backend never sees the client's credential or a client-chosen
// tenant header; it sees the resolved tenant.
func TestCredentialsStripped(t *testing.T) {
	tests := map[string]struct {
		mode string
		h    http.Header
	}{
		"api key": {mode: policy.AuthAPIKey, h: http.Header{"Authorization": {"Bearer sk-acme"}, "X-Tiergate-Tenant": {"evil"}}},
		"header":  {mode: policy.AuthTrustedHeader, h: http.Header{"X-Tenant-Id": {"acme"}, "X-Tiergate-Tenant": {"evil"}}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, testPolicy(tc.mode, 2))
			if resp := f.do(t, http.MethodPost, "/v1/completions", tc.h); resp.StatusCode != http.StatusOK || resp.Header.Get("X-Queue-Wait-Ms") != "0" {
				t.Fatalf("status %d, wait %q", resp.StatusCode, resp.Header.Get("X-Queue-Wait-Ms"))
			}
			got := f.be.headers[0]
			want := map[string][]string{"Authorization": nil, "X-Tenant-Id": nil, "X-Tiergate-Tenant": {"acme"}}
			gotSome := map[string][]string{}
			for k := range want {
				gotSome[k] = got[k]
			}
			if diff := cmp.Diff(want, gotSome); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
		})
	}
}

// Exempt paths reach a backend even when the pool has no slots; others
// get 503.
func TestExemptPathBypassesQueue(t *testing.T) {
	f := newFixture(t, testPolicy(policy.AuthTrustedHeader, 0))
	h := http.Header{"X-Tenant-Id": {"acme"}}
	if resp := f.do(t, http.MethodGet, "/v1/models", h); resp.StatusCode != http.StatusOK || resp.Header.Get("X-Queue-Wait-Ms") != "" {
		t.Errorf("exempt: %d, X-Queue-Wait-Ms %q", resp.StatusCode, resp.Header.Get("X-Queue-Wait-Ms"))
	}
	if resp := f.do(t, http.MethodPost, "/v1/completions", h); resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("queued path with no slots: %d", resp.StatusCode)
	}
	if diff := cmp.Diff([]string{"/v1/models"}, f.be.paths); diff != "" {
		t.Errorf("backend paths (-want +got)\n%s", diff)
	}
}

// An exempt path streams its body to the backend; one of unknown length
// that outgrows MaxBodyBytes on the way gets 413, and the backend, which
// did nothing wrong, stays in service.
func TestExemptStreamedBodyTooLarge(t *testing.T) {
	f := newFixtureConfig(t, testPolicy(policy.AuthTrustedHeader, 0), Config{MaxBodyBytes: 1024})
	// Not declared: sent chunked, so the length is learnt as it streams.
	got := f.send(t.Context(), "/v1/models", []byte(strings.Repeat("x", 4096)), false)
	if got.Err != nil || got.Code != http.StatusRequestEntityTooLarge {
		t.Fatalf("got %d, %v, want 413: %s", got.Code, got.Err, got.Body)
	}
	want := map[string]any{"type": "body_too_large", "message": "the request body is larger than 1024 bytes", "tier": "premium", "queue_position": 0.0, "retry_after_seconds": 0.0}
	if diff := cmp.Diff(want, refusalBody(t, []byte(got.Body))); diff != "" {
		t.Errorf("body (-want +got)\n%s", diff)
	}
	if got := f.bal.Snapshot()[0].Failures; got != 0 {
		t.Errorf("the backend has %d failures in a row for a client's body, want 0", got)
	}
	if resp := f.do(t, http.MethodGet, "/v1/models", http.Header{"X-Tenant-Id": {"acme"}}); resp.StatusCode != http.StatusOK {
		t.Errorf("next exempt request: %d, want 200", resp.StatusCode)
	}
}

// Drain: new requests get 503 at once; WaitIdle returns when the last
// in-flight request has finished; every slot is released.
func TestDrainWaitsForInFlight(t *testing.T) {
	f := newFixture(t, testPolicy(policy.AuthTrustedHeader, 2))
	f.be.hold = make(chan struct{})
	f.be.arrived = make(chan string, 1)
	h := http.Header{"X-Tenant-Id": {"acme"}}
	done := make(chan int)
	go func() { done <- f.do(t, http.MethodPost, "/slow", h).StatusCode }()
	<-f.be.arrived // in flight: inside the handler, holding its slot
	if a, q := f.srv.Active(), f.q.Stats().InFlight; a != 1 || q != 1 {
		t.Fatalf("active %d, in flight %d; want 1 and 1", a, q)
	}
	f.srv.StartDrain()
	if resp := f.do(t, http.MethodPost, "/v1/completions", h); resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("new request while draining: %d", resp.StatusCode)
	}
	// With a request in flight WaitIdle can only end with its context.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := f.srv.WaitIdle(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("WaitIdle with a request in flight = %v, want context.Canceled", err)
	}
	close(f.be.hold)
	if code := <-done; code != 200 {
		t.Errorf("in-flight request: %d", code)
	}
	if err := f.srv.WaitIdle(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := f.q.Stats(); st.InFlight != 0 || st.DoubleReleases != 0 || st.Completed != 1 {
		t.Errorf("queue after drain: %+v", st)
	}
}

// New takes its Config as it is (dispatcher.Config defaults and checks
// it) and refuses only what it cannot run with.
func TestNewRefusesAnIncompleteConfig(t *testing.T) {
	fwd := forward.New(forward.Options{})
	tests := map[string]struct {
		cfg     Config
		wantErr string
	}{
		"complete":     {cfg: withLimits(Config{Forwarder: fwd})},
		"no forwarder": {cfg: withLimits(Config{}), wantErr: "server: Config.Forwarder is nil"},
		"no limiter": {cfg: Config{MaxBodyBytes: 1, BodyTimeout: time.Second, MaxQueuedBytes: 1, Forwarder: fwd},
			wantErr: "server: Config.Limiter is nil"},
		"no body budget": {cfg: Config{MaxBodyBytes: 1, BodyTimeout: time.Second, Forwarder: fwd, Limiter: tokens.NewLocal(clock.RealClock{})},
			wantErr: "budget: the limit must be > 0, got 0"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := New(tc.cfg, nil, nil, nil)
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != tc.wantErr {
				t.Errorf("err %q, want %q", got, tc.wantErr)
			}
			if tc.cfg.Forwarder == nil && !errors.Is(err, errNoForwarder) {
				t.Errorf("err %v is not errNoForwarder", err)
			}
		})
	}
}

// A client that is gone when its slot comes is counted as abandoned at
// dispatch, its slot goes back, and nothing reaches the backend.
func TestAbandonedAtDispatch(t *testing.T) {
	f := newFixture(t, testPolicy(policy.AuthTrustedHeader, 2))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/completions", strings.NewReader(`{"prompt":"x"}`))
	req.Header.Set("X-Tenant-Id", "acme")
	rec := httptest.NewRecorder()
	f.srv.ServeHTTP(rec, req) // a free slot: dispatched at Admit, then the client check fails
	want := `
# HELP tiergate_abandoned_total Requests whose client went away, by stage (queued, dispatch, inflight).
# TYPE tiergate_abandoned_total counter
tiergate_abandoned_total{pool="p",stage="dispatch",tier="premium"} 1
# HELP tiergate_requests_total Finished requests by HTTP status sent (499: the client went away first).
# TYPE tiergate_requests_total counter
tiergate_requests_total{code="499",pool="p",tier="premium"} 1
`
	if err := testutil.GatherAndCompare(f.reg, strings.NewReader(want), "tiergate_abandoned_total", "tiergate_requests_total"); err != nil {
		t.Error(err)
	}
	if st := f.q.Stats(); st.InFlight != 0 || st.Completed != 1 {
		t.Errorf("queue: %+v", st)
	}
	if len(f.be.paths) != 0 {
		t.Errorf("backend reached: %v", f.be.paths)
	}
}
