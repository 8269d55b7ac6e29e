package controllers

import (
	"context"
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
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/dispatcher/admin"
)

// adminBackend is what the admin handler drives in these tests, as a
// dispatcher does: it applies valid policies under the dispatcher's
// version rule (policy.CheckVersion) and acknowledges with its figures.
type adminBackend struct {
	mu  sync.Mutex
	pol *policy.Policy
}

var testMeasured = policy.Measured{ServiceTimeSeconds: 2.5, Completed: 40}

func (b *adminBackend) Apply(p *policy.Policy) (policy.Ack, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.pol != nil {
		if err := policy.CheckPool(b.pol.Pool, p.Pool); err != nil {
			return policy.Ack{}, err
		}
		if err := policy.CheckVersion(b.pol.Version, p.Version); err != nil {
			return policy.Ack{}, err
		}
	}
	b.pol = p
	return policy.Ack{Version: p.Version, Stats: testMeasured}, nil
}

func (b *adminBackend) Policy() *policy.Policy { b.mu.Lock(); defer b.mu.Unlock(); return b.pol }
func (b *adminBackend) Stats() any             { return struct{}{} }
func (b *adminBackend) Ready() (bool, string)  { return b.Policy() != nil, "no policy yet" }

// version is the applied policy's version, 0 before the first.
func (b *adminBackend) version() int64 {
	if p := b.Policy(); p != nil {
		return p.Version
	}
	return 0
}

// dispatcherServer is the real admin API (admin.New) on 127.0.0.1 in
// front of an adminBackend. It counts the requests it gets; intercept,
// when set, may answer instead of the admin API (a proxy in between, a
// dispatcher that is starting), returning true when it did.
type dispatcherServer struct {
	srv     *httptest.Server
	backend *adminBackend

	mu        sync.Mutex
	requests  []string // "METHOD path"
	auths     []string
	intercept func(w http.ResponseWriter, r *http.Request) bool
}

type serverOptions struct {
	token          string // the admin token; "" disables the admin API
	held           int64  // a policy version applied before the test
	heldPool       string // the pool of that policy (default that of pushPolicy)
	maxPolicyBytes int64
	wrap           func(http.Handler) http.Handler
}

func newDispatcherServer(t *testing.T, o serverOptions) *dispatcherServer {
	t.Helper()
	d := &dispatcherServer{backend: &adminBackend{}}
	h, err := admin.New(admin.Config{Token: []byte(o.token), Gatherer: prometheus.NewRegistry(),
		MaxPolicyBytes: o.maxPolicyBytes, Log: logr.Discard()}, d.backend)
	if err != nil {
		t.Fatal(err)
	}
	if o.held != 0 {
		p := pushPolicy(o.held)
		if o.heldPool != "" {
			p.Pool = o.heldPool
		}
		if _, err := d.backend.Apply(&p); err != nil {
			t.Fatal(err)
		}
	}
	var outer http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d.mu.Lock()
		d.requests = append(d.requests, r.Method+" "+r.URL.Path)
		d.auths = append(d.auths, r.Header.Get("Authorization"))
		intercept := d.intercept
		d.mu.Unlock()
		if intercept != nil && intercept(w, r) {
			return
		}
		h.ServeHTTP(w, r)
	})
	if o.wrap != nil {
		outer = o.wrap(outer)
	}
	d.srv = httptest.NewServer(outer)
	t.Cleanup(d.srv.Close)
	return d
}

func (d *dispatcherServer) addr() string { return strings.TrimPrefix(d.srv.URL, "http://") }

func (d *dispatcherServer) seen() (requests, auths []string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.requests...), append([]string(nil), d.auths...)
}

func (d *dispatcherServer) putCount() int {
	reqs, _ := d.seen()
	n := 0
	for _, r := range reqs {
		if r == "PUT /v1/policy" {
			n++
		}
	}
	return n
}

// pushPolicy is a valid policy of the given version.
func pushPolicy(version int64) policy.Policy {
	return policy.Policy{
		Version: version, Pool: "ns/p", Slots: 1, ServiceRate: 1, AgeingRate: 6,
		Authentication: policy.Authentication{Mode: policy.AuthTrustedHeader, HeaderName: "X-Tenant-ID"},
		Tiers:          []policy.Tier{{Name: "premium", TolerableWaitSeconds: 5, QueueBound: 1, TenantConcurrencyLimit: 1, TenantQueueLimit: 1}},
		Backends:       []policy.Backend{{Address: "127.0.0.1:8000"}},
	}
}

func writeToken(t *testing.T, token string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// One push against the real admin API: every answer it gives, classified,
// with exactly one request per push (a 409 names the held version in its
// body, so nothing is asked afterwards).
func TestPushAgainstTheAdminAPI(t *testing.T) {
	invalid := pushPolicy(7)
	invalid.Slots = -1
	tests := map[string]struct {
		server     serverOptions
		send       policy.Policy
		wantResult PushResult
		wantErr    error
		wantMsg    string // ADDR stands for the dispatcher's address
		wantHeld   int64  // of a conflict
		wantAcked  int64
		// wantHeldPool is the pool a pool_mismatch names.
		wantHeldPool string
		wantHolds    int64 // the version the dispatcher holds afterwards
	}{
		"200: applied and acknowledged": {
			server: serverOptions{token: "s3cret", held: 5}, send: pushPolicy(7),
			wantResult: PushOK, wantAcked: 7, wantHolds: 7,
		},
		"200: the same version again (a resync)": {
			server: serverOptions{token: "s3cret", held: 7}, send: pushPolicy(7),
			wantResult: PushOK, wantAcked: 7, wantHolds: 7,
		},
		"400: an invalid policy is refused and the old one stays": {
			server: serverOptions{token: "s3cret", held: 5}, send: invalid,
			wantResult: PushRejected, wantErr: ErrPushRejected, wantHolds: 5,
			wantMsg: "dispatcher rejected the policy: ADDR answered 400: invalid_policy: the policy has 1 error(s); the previous policy stays: slots: must be >= 0, got -1",
		},
		"409: the held version comes from the body": {
			server: serverOptions{token: "s3cret", held: 9}, send: pushPolicy(7),
			wantResult: PushConflict, wantErr: ErrPushConflict, wantHeld: 9, wantHolds: 9,
			wantMsg: "dispatcher holds a newer policy version: ADDR holds version 9, sent 7",
		},
		"409: another pool's policy is held, and nothing is bumped": {
			server: serverOptions{token: "s3cret", held: 9, heldPool: "ns/other"}, send: pushPolicy(7),
			wantResult: PushPoolMismatch, wantErr: ErrPushPoolMismatch, wantHeldPool: "ns/other", wantHolds: 9,
			wantMsg: "dispatcher holds another pool's policy: ADDR holds the policy of pool ns/other, sent pool ns/p",
		},
		"401: a wrong token": {
			server: serverOptions{token: "other", held: 5}, send: pushPolicy(7),
			wantResult: PushUnauthorized, wantErr: ErrPushUnauthorized, wantHolds: 5,
			wantMsg: "dispatcher refused the push token: ADDR answered 401: unauthenticated: wrong bearer token",
		},
		"401: the admin API is disabled": {
			server: serverOptions{}, send: pushPolicy(7),
			wantResult: PushUnauthorized, wantErr: ErrPushUnauthorized,
			wantMsg: "dispatcher refused the push token: ADDR answered 401: unauthenticated: the admin API is disabled: the dispatcher was started without --admin-token-file",
		},
		"413: a policy over the dispatcher's limit": {
			server: serverOptions{token: "s3cret", held: 5, maxPolicyBytes: 64}, send: pushPolicy(7),
			wantResult: PushFailed, wantErr: ErrPushFailed, wantHolds: 5,
			wantMsg: "push failed: ADDR answered 413: body_too_large: the policy is larger than 64 bytes",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			d := newDispatcherServer(t, tc.server)
			p, err := NewPusher(testPusherOptions(writeToken(t, "s3cret"), 5*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			a := p.push(context.Background(), Target{Name: "d-0", Address: d.addr(), Policy: tc.send}, policy.SchemaVersion)
			if a.result != tc.wantResult || !errors.Is(a.err, tc.wantErr) || a.held != tc.wantHeld || a.ack.Version != tc.wantAcked || a.heldPool != tc.wantHeldPool {
				t.Fatalf("push = {%s, %v, held %d %q, acked %d}, want {%s, %v, held %d %q, acked %d}",
					a.result, a.err, a.held, a.heldPool, a.ack.Version, tc.wantResult, tc.wantErr, tc.wantHeld, tc.wantHeldPool, tc.wantAcked)
			}
			if tc.wantMsg != "" && a.err.Error() != strings.ReplaceAll(tc.wantMsg, "ADDR", d.addr()) {
				t.Errorf("error %q\nwant  %q", a.err, strings.ReplaceAll(tc.wantMsg, "ADDR", d.addr()))
			}
			if a.result == PushOK {
				if diff := cmp.Diff(testMeasured, a.ack.Stats); diff != "" {
					t.Errorf("ack stats (-want +got):\n%s", diff)
				}
			}
			reqs, auths := d.seen()
			if diff := cmp.Diff([]string{"PUT /v1/policy"}, reqs); diff != "" {
				t.Errorf("requests (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff([]string{"Bearer s3cret"}, auths); diff != "" {
				t.Errorf("Authorization headers (-want +got):\n%s", diff)
			}
			if got := d.backend.version(); got != tc.wantHolds {
				t.Errorf("the dispatcher holds version %d, want %d", got, tc.wantHolds)
			}
		})
	}
}

// Answers the admin API never gives, from whatever may stand between the
// controller and a dispatcher, and pushes that never get an answer.
func TestPushClassifiesOtherAnswers(t *testing.T) {
	answer := func(code int, body string) func(http.ResponseWriter, *http.Request) bool {
		return func(w http.ResponseWriter, _ *http.Request) bool {
			w.WriteHeader(code)
			_, _ = io.WriteString(w, body)
			return true
		}
	}
	tests := map[string]struct {
		intercept   func(http.ResponseWriter, *http.Request) bool
		unreachable bool
		noTokenFile bool
		wantResult  PushResult
		wantErr     error
		wantMsg     string // ADDR and TOKENFILE stand for themselves
	}{
		"403 without a body": {intercept: answer(403, ""), wantResult: PushUnauthorized, wantErr: ErrPushUnauthorized,
			wantMsg: "dispatcher refused the push token: ADDR answered 403"},
		"500 with a text body": {intercept: answer(500, "boom\n"), wantResult: PushFailed, wantErr: ErrPushFailed,
			wantMsg: "push failed: ADDR answered 500: boom"},
		"409 that is neither stale_version nor pool_mismatch": {intercept: answer(409, `{"error":{"type":"elsewhere","message":"not this pool"}}`),
			wantResult: PushFailed, wantErr: ErrPushFailed, wantMsg: "push failed: ADDR answered 409: elsewhere: not this pool"},
		"409 without a body": {intercept: answer(409, ""), wantResult: PushFailed, wantErr: ErrPushFailed,
			wantMsg: "push failed: ADDR answered 409"},
		"an ack of another version": {intercept: answer(200, `{"version":3,"stats":{}}`), wantResult: PushFailed, wantErr: ErrPushFailed,
			wantMsg: "push failed: ADDR acknowledged version 3, sent 7"},
		"an unreadable ack": {intercept: answer(200, "not json"), wantResult: PushFailed, wantErr: ErrPushFailed,
			wantMsg: "push failed: ADDR answered 200 with an unreadable ack: invalid character 'o' in literal null (expecting 'u')"},
		"nothing listening": {unreachable: true, wantResult: PushUnreachable, wantErr: ErrPushUnreachable,
			wantMsg: `dispatcher unreachable: ADDR: Put "http://ADDR/v1/policy": dial tcp ADDR: connect: connection refused`},
		"an unreadable token file": {noTokenFile: true, wantResult: PushFailed, wantErr: ErrPushFailed,
			wantMsg: "push failed: reading the push token: token file: stat TOKENFILE: no such file or directory"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			d := newDispatcherServer(t, serverOptions{token: "s3cret"})
			d.intercept = tc.intercept
			addr := d.addr()
			if tc.unreachable {
				addr = closedAddr(t)
			}
			tokenFile := writeToken(t, "s3cret")
			if tc.noTokenFile {
				tokenFile = filepath.Join(t.TempDir(), "missing")
			}
			p, err := NewPusher(testPusherOptions(tokenFile, 5*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			a := p.push(context.Background(), Target{Name: "d-0", Address: addr, Policy: pushPolicy(7)}, policy.SchemaVersion)
			if a.result != tc.wantResult || !errors.Is(a.err, tc.wantErr) {
				t.Fatalf("push = {%s, %v}, want {%s, %v}", a.result, a.err, tc.wantResult, tc.wantErr)
			}
			want := strings.NewReplacer("ADDR", addr, "TOKENFILE", tokenFile).Replace(tc.wantMsg)
			if a.err.Error() != want {
				t.Errorf("error %q\nwant  %q", a.err, want)
			}
			if strings.Contains(a.err.Error(), "s3cret") {
				t.Errorf("error %q leaks the token", a.err)
			}
		})
	}
}

// A dispatcher that never answers costs one timeout, then counts as
// unreachable.
func TestPushTimesOut(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	d := newDispatcherServer(t, serverOptions{token: "s3cret"})
	d.intercept = func(_ http.ResponseWriter, r *http.Request) bool {
		select {
		case <-release:
		case <-r.Context().Done():
		}
		return true
	}
	p, err := NewPusher(testPusherOptions(writeToken(t, "s3cret"), 100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	a := p.push(context.Background(), Target{Name: "d-0", Address: d.addr(), Policy: pushPolicy(7)}, policy.SchemaVersion)
	want := fmt.Sprintf(`dispatcher unreachable: %s: Put "http://%s/v1/policy": context deadline exceeded`, d.addr(), d.addr())
	if a.result != PushUnreachable || !errors.Is(a.err, ErrPushUnreachable) || a.err.Error() != want {
		t.Fatalf("push = {%s, %v}, want {%s, %q}", a.result, a.err, PushUnreachable, want)
	}
}

// testPusherOptions are the default configuration's, with a token file
// and a push timeout.
func testPusherOptions(tokenFile string, timeout time.Duration) PusherOptions {
	o := DefaultConfig().pusherOptions()
	o.TokenFile, o.Timeout = tokenFile, timeout
	return o
}

func TestPusherOptionsValidate(t *testing.T) {
	o := testPusherOptions("", time.Second)
	o.BackoffBase, o.BackoffMax = time.Second, time.Millisecond
	_, err := NewPusher(o)
	if !errors.Is(err, ErrInvalidOptions) || err.Error() != "invalid controller options: push backoff 1s..1ms must be positive, base <= max" {
		t.Errorf("err = %v", err)
	}
	o = testPusherOptions("", time.Second)
	o.Clock = nil
	if _, err := NewPusher(o); !errors.Is(err, ErrInvalidOptions) || err.Error() != "invalid controller options: the Pusher needs a clock" {
		t.Errorf("err = %v", err)
	}
}

func TestBackoffDoublesUpToTheMax(t *testing.T) {
	p, err := NewPusher(testPusherOptions("", time.Second))
	if err != nil {
		t.Fatal(err)
	}
	// The limiter counts a key's failures; another key has its own.
	k := pushKey{testPool, "u1"}
	var got []time.Duration
	for f := 1; f <= 7; f++ {
		got = append(got, p.limiter.When(k))
	}
	if d := p.limiter.When(pushKey{testPool, "u2"}); d != 250*time.Millisecond {
		t.Errorf("another pod's first backoff %s, want 250ms", d)
	}
	p.limiter.Forget(k)
	if d := p.limiter.When(k); d != 250*time.Millisecond {
		t.Errorf("backoff after Forget %s, want 250ms", d)
	}
	want := []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("backoff (-want +got):\n%s", diff)
	}
}
