package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"go.uber.org/goleak"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/dispatcher/balancer"
	"github.com/tiergate/tiergate/dispatcher/fleet"
	"github.com/tiergate/tiergate/internal/redistest"
	"github.com/tiergate/tiergate/internal/testutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func pol(version int64, slots int) *policy.Policy {
	return &policy.Policy{
		Version: version, Pool: "p", Slots: slots, ServiceRate: 1, AgeingRate: 6,
		Authentication: policy.Authentication{Mode: policy.AuthTrustedHeader, HeaderName: "X-Tenant-ID"},
		DefaultTier:    "free",
		Tiers:          []policy.Tier{{Name: "free", BasePriority: 0, TolerableWaitSeconds: 5, QueueBound: 2, TenantConcurrencyLimit: 1, TenantQueueLimit: 2}},
		Backends:       []policy.Backend{{Address: "127.0.0.1:1"}},
	}
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

func TestApplyVersions(t *testing.T) {
	d, err := New(Config{Log: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	if ok, why := d.Ready(); ok || why != "no policy yet" {
		t.Errorf("ready %v %q before a policy", ok, why)
	}
	for _, st := range []struct {
		version int64
		pool    string
		wantErr error
	}{{3, "p", nil}, {3, "p", nil}, {2, "p", policy.ErrStaleVersion}, {9, "other", policy.ErrPoolMismatch}, {4, "p", nil}} {
		p := pol(st.version, 1)
		p.Pool = st.pool
		ack, err := d.Apply(p)
		if !errors.Is(err, st.wantErr) {
			t.Fatalf("apply v%d of pool %s: %v, want %v", st.version, st.pool, err, st.wantErr)
		}
		if err == nil && ack.Version != st.version {
			t.Errorf("ack %+v", ack)
		}
	}
	if v := d.Policy().Version; v != 4 {
		t.Errorf("applied version %d", v)
	}
	if ok, _ := d.Ready(); !ok {
		t.Error("not ready with a policy")
	}
}

// A dispatcher whose Local-mode policy gives it no slot of a pool that
// has ready backends is NotReady, and Ready again once it holds slots; with
// no backends (no ready replica, or held for a cold start) or in Redis mode
// it stays Ready.
func TestReadyHoldsNoSlot(t *testing.T) {
	d, err := New(Config{Log: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	type out struct {
		Ready bool
		Why   string
	}
	noSlot := out{false, "this dispatcher holds no slot of pool p (policy version 2 gives it 0 slots with 1 ready backends, in Local mode): it would refuse every request, so it asks to be routed around"}
	for i, st := range []struct {
		name   string
		mutate func(*policy.Policy)
		slots  int
		want   out
	}{
		{"holds slots", nil, 2, out{true, ""}},
		{"no slot, backends ready", nil, 0, noSlot},
		{"no slot and no backend: the whole pool is down", func(p *policy.Policy) { p.Backends = nil }, 0, out{true, ""}},
		{"Redis mode", func(p *policy.Policy) { p.SharedState = policy.StateRedis }, 0, out{true, ""}},
		{"slots again", nil, 1, out{true, ""}},
	} {
		p := pol(int64(i+1), st.slots)
		if st.mutate != nil {
			st.mutate(p)
		}
		if _, err := d.Apply(p); err != nil {
			t.Fatal(err)
		}
		want := out{st.want.Ready, strings.ReplaceAll(st.want.Why, "version 2", fmt.Sprintf("version %d", i+1))}
		if ok, why := d.Ready(); (out{ok, why}) != want {
			t.Errorf("%s: Ready() = %v %q, want %+v", st.name, ok, why, want)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	tests := map[string]struct {
		cfg     Config
		wantErr string
	}{
		"defaults":       {cfg: Config{}},
		"negative drain": {cfg: Config{DrainTimeout: -time.Second}, wantErr: "--drain-timeout must be >= 0, got -1s"},
		"negative body":  {cfg: Config{MaxBodyBytes: -2}, wantErr: "--max-body-bytes must be > 0, got -2"},
		"bad ejection": {cfg: Config{Health: balancer.Health{BaseEjection: time.Minute, MaxEjection: time.Second}},
			wantErr: "--backend-ejection-base 1m0s must be > 0 and at most --backend-ejection-max 1s"},
		"a body budget smaller than the largest body": {cfg: Config{MaxBodyBytes: 8 << 20, MaxQueuedBytes: 4 << 20},
			wantErr: "--max-queued-bytes (4 MiB) must be at least --max-body-bytes (8 MiB): a body of the largest size would never fit"},
		"a negative body budget": {cfg: Config{MaxQueuedBytes: -1},
			wantErr: "--max-queued-bytes (-1 bytes) must be at least --max-body-bytes (4 MiB): a body of the largest size would never fit"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := New(tc.cfg)
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != tc.wantErr {
				t.Errorf("err %q, want %q", got, tc.wantErr)
			}
		})
	}
}

// Serve loads the policy file, follows its edits, keeps the old policy on
// a bad edit, and on cancellation drains and returns nil, leaving no
// goroutine behind.
func TestServeFileAndDrain(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "policy.json")
	write := func(v any) {
		b, _ := json.Marshal(v)
		if err := os.WriteFile(file, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(pol(1, 1))
	logs := &logLines{}
	d, err := New(Config{PolicyFile: file, PolicyPollInterval: 10 * time.Millisecond, DrainTimeout: time.Second, Log: logs.logger()})
	if err != nil {
		t.Fatal(err)
	}
	data, adm := listen(t), listen(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- d.Serve(ctx, data, adm) }()

	logs.wait(t, `"msg"="serving"`)
	if p := d.Policy(); p == nil || p.Version != 1 {
		t.Fatalf("policy %v once serving, want v1", p)
	}
	// The watcher hashes the file when it starts, which may be after this
	// edit: each try writes the same policy with one more trailing space.
	edit := ""
	testutil.EventuallyTrue(t, 5*time.Second, "v2 applied", func() bool {
		if d.Policy().Version == 2 {
			return true
		}
		b, _ := json.Marshal(pol(2, 3))
		edit += " "
		if err := os.WriteFile(file, append(b, edit...), 0o600); err != nil {
			t.Fatal(err)
		}
		return false
	})
	write(map[string]any{"version": 3, "bogus": true})
	logs.wait(t, "keeping the previous policy")
	if v := d.Policy().Version; v != 2 {
		t.Errorf("version %d after a bad edit", v)
	}
	resp, err := http.Get("http://" + adm.Addr().String() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("readyz %d", resp.StatusCode)
	}
	http.DefaultClient.CloseIdleConnections()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return")
	}
	if ok, why := d.Ready(); ok || why != "draining" {
		t.Errorf("ready %v %q after drain", ok, why)
	}
}

func TestServeRefusesBadPolicyFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "policy.json")
	if err := os.WriteFile(file, []byte(`{"version":1}`), 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := New(Config{PolicyFile: file, Log: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	err = d.Serve(context.Background(), listen(t), listen(t))
	var verrs policy.ValidationErrors
	if !errors.As(err, &verrs) {
		t.Fatalf("err %v, want validation errors", err)
	}
}

func TestFleetConfig(t *testing.T) {
	tests := map[string]struct {
		url     string
		wantErr string
	}{
		"local":          {url: "local"},
		"empty is local": {url: ""},
		"unknown scheme": {url: "etcd://x:1", wantErr: `fleet: invalid configuration: --state "etcd://x:1": want "local", redis://host:port/db or rediss://host:port/db`},
		"not a URL":      {url: "redis", wantErr: `fleet: invalid configuration: --state "redis": want "local", redis://host:port/db or rediss://host:port/db`},
		"no host":        {url: "redis:///0", wantErr: `fleet: invalid configuration: --state "redis:///0": no host`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			d, err := New(Config{Fleet: fleet.Config{URL: tc.url}, Log: logr.Discard()})
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != tc.wantErr {
				t.Fatalf("err %q, want %q", got, tc.wantErr)
			}
			if err == nil && d.gate != nil {
				t.Errorf("local mode built a Gate")
			}
		})
	}
}

// TestServeInFleetMode serves a Redis-mode policy against a real
// redis-server: Serve starts the Gate (the dispatcher registers in Redis),
// a request is admitted through it, and after the drain the Gate has left
// the fleet and stopped every goroutine (TestMain checks).
func TestServeInFleetMode(t *testing.T) {
	rs := redistest.Start(t, redistest.Options{})
	file := filepath.Join(t.TempDir(), "policy.json")
	p := pol(1, 1)
	p.Pool, p.SharedState = "ns/p", policy.StateRedis
	b, _ := json.Marshal(p)
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := New(Config{PolicyFile: file, Fleet: fleet.Config{URL: rs.URL(0), DispatcherID: "d1"}, DrainTimeout: time.Second, Log: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- d.Serve(ctx, listen(t), listen(t)) }()
	dispatchers := func() string { return strings.TrimSpace(rs.CLI("", "ZRANGE", "tg:{ns/p}:dispatchers", "0", "-1")) }
	testutil.EventuallyTrue(t, 5*time.Second, "d1 registered in Redis", func() bool { return dispatchers() == "d1" })
	h, err := d.q.Admit("a", "free")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := strings.TrimSpace(rs.CLI("", "ZCARD", "tg:{ns/p}:slots")); n != "1" {
		t.Errorf("slots in Redis: %s, want 1", n)
	}
	h.Release()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := dispatchers(); got != "" {
		t.Errorf("dispatchers after the drain: %q", got)
	}
	if n := strings.TrimSpace(rs.CLI("", "ZCARD", "tg:{ns/p}:slots")); n != "0" {
		t.Errorf("slots in Redis after the drain: %s", n)
	}
}

// logLines is a logger whose lines a test waits for: the events of the
// dispatcher's lifecycle.
type logLines struct {
	mu    sync.Mutex
	lines []string
	seen  int
	more  chan struct{}
}

func (l *logLines) logger() logr.Logger {
	l.more = make(chan struct{}, 1)
	return funcr.New(func(prefix, args string) {
		l.mu.Lock()
		l.lines = append(l.lines, prefix+" "+args)
		l.mu.Unlock()
		select {
		case l.more <- struct{}{}:
		default:
		}
	}, funcr.Options{})
}

// wait returns once a line after the last one waited for contains s.
func (l *logLines) wait(t *testing.T, s string) {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for {
		l.mu.Lock()
		for i := l.seen; i < len(l.lines); i++ {
			if strings.Contains(l.lines[i], s) {
				l.seen = i + 1
				l.mu.Unlock()
				return
			}
		}
		lines := append([]string(nil), l.lines...)
		l.mu.Unlock()
		select {
		case <-l.more:
		case <-timeout:
			t.Fatalf("no log line with %q; got:\n%s", s, strings.Join(lines, "\n"))
		}
	}
}

// TestStalledRedisStallsNoScrape freezes the dispatcher's Redis (SIGSTOP)
// while two requests wait in it for their queued places: /metrics,
// /v1/stats and /readyz keep answering, and the metrics show both round
// trips in flight at once (admission is not serialised). When Redis thaws
// both requests are served.
func TestStalledRedisStallsNoScrape(t *testing.T) {
	rs := redistest.Start(t, redistest.Options{})
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "served")
	}))
	defer backend.Close()
	p := pol(1, 2)
	p.Pool, p.SharedState = "ns/stall", policy.StateRedis
	p.Backends = []policy.Backend{{Address: strings.TrimPrefix(backend.URL, "http://"), Scheme: "http"}}
	b, _ := json.Marshal(p)
	file := filepath.Join(t.TempDir(), "policy.json")
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	// Op timeouts beyond the test: Redis stalls, it does not fail.
	d, err := New(Config{
		PolicyFile: file, AdminToken: []byte("tok"), DrainTimeout: time.Second, Log: logr.Discard(),
		Fleet: fleet.Config{URL: rs.URL(0), DispatcherID: "d1", OpTimeout: time.Minute, LeaseTTL: time.Minute, RenewInterval: 20 * time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	data, adm := listen(t), listen(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- d.Serve(ctx, data, adm) }()
	admin := "http://" + adm.Addr().String()
	testutil.EventuallyTrue(t, 5*time.Second, "registered in Redis", func() bool {
		return strings.TrimSpace(rs.CLI("", "ZCARD", "tg:{ns/stall}:dispatchers")) == "1"
	})
	inFlight := func() string { return metricLine(t, admin, "tiergate_state_ops_in_flight") }
	testutil.EventuallyTrue(t, 5*time.Second, "the first renewal done", func() bool { return inFlight() == "0" })

	rs.Pause()
	defer rs.Resume()
	served := make(chan string, 2)
	for _, tenant := range []string{"a", "b"} {
		go func() {
			req, _ := http.NewRequest(http.MethodPost, "http://"+data.Addr().String()+"/v1/completions", strings.NewReader("{}"))
			req.Header.Set("X-Tenant-ID", tenant)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				served <- err.Error()
				return
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			served <- fmt.Sprint(resp.StatusCode, " ", string(body))
		}()
	}
	testutil.EventuallyTrue(t, 5*time.Second, "both enqueues in Redis at once", func() bool { return inFlight() == "2" })
	for _, path := range []string{"/v1/stats", "/readyz", "/metrics"} {
		req, _ := http.NewRequest(http.MethodGet, admin+path, nil)
		req.Header.Set("Authorization", "Bearer tok")
		c := &http.Client{Timeout: 2 * time.Second}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("GET %s while Redis stalls: %v", path, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s while Redis stalls: %d", path, resp.StatusCode)
		}
	}

	rs.Resume()
	for range 2 {
		if got := <-served; got != "200 served" {
			t.Errorf("request after Redis thawed: %q", got)
		}
	}
	http.DefaultClient.CloseIdleConnections()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// metricLine is the value of an unlabelled metric on the admin port.
func metricLine(t *testing.T, admin, name string) string {
	t.Helper()
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(admin + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			return v
		}
	}
	t.Fatalf("no %s on /metrics", name)
	return ""
}
