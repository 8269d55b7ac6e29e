package controllers

import (
	"context"
	"encoding/json"
	"errors"
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

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/tiergate/tiergate/dispatcher/policy"
)

// fakeDispatcher is a real HTTP server on 127.0.0.1 that answers the admin
// API contract: PUT /v1/policy and GET /v1/policy.
type fakeDispatcher struct {
	srv *httptest.Server

	mu      sync.Mutex
	token   string
	held    int64
	puts    []policy.Policy
	auths   []string
	answer  func(p policy.Policy) (int, string) // optional override
	block   chan struct{}                       // when set, PUT waits on it
	getSeen int
}

func newFakeDispatcher(t *testing.T, token string, wrap ...func(http.Handler) http.Handler) *fakeDispatcher {
	t.Helper()
	f := &fakeDispatcher{token: token}
	var h http.Handler = http.HandlerFunc(f.serve)
	for _, w := range wrap {
		h = w(h)
	}
	f.srv = httptest.NewServer(h)
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeDispatcher) addr() string { return strings.TrimPrefix(f.srv.URL, "http://") }

func (f *fakeDispatcher) serve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	block := f.block
	f.mu.Unlock()
	if block != nil && r.Method == http.MethodPut {
		select {
		case <-block:
		case <-r.Context().Done():
			return
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if r.URL.Path != "/v1/policy" {
		http.NotFound(w, r)
		return
	}
	f.auths = append(f.auths, r.Header.Get("Authorization"))
	if r.Header.Get("Authorization") != "Bearer "+f.token {
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	if r.Method == http.MethodGet {
		f.getSeen++
		_ = json.NewEncoder(w).Encode(policy.Policy{Version: f.held})
		return
	}
	var p policy.Policy
	b, _ := io.ReadAll(r.Body)
	if err := json.Unmarshal(b, &p); err != nil || r.Header.Get("Content-Type") != "application/json" {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	f.puts = append(f.puts, p)
	if f.answer != nil {
		code, body := f.answer(p)
		if code != 0 {
			w.WriteHeader(code)
			_, _ = io.WriteString(w, body)
			return
		}
	}
	if p.Version < f.held {
		w.WriteHeader(http.StatusConflict)
		return
	}
	f.held = p.Version
	_ = json.NewEncoder(w).Encode(policy.Ack{Version: p.Version, Stats: policy.Measured{ServiceTimeSeconds: 2.5, Completed: 40}})
}

func (f *fakeDispatcher) putCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.puts)
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

func TestPushOnceClassifies(t *testing.T) {
	tests := map[string]struct {
		serverToken string
		held        int64
		answer      func(policy.Policy) (int, string)
		unreachable bool
		timeout     bool
		noTokenFile bool
		wantResult  PushResult
		wantErr     error
		wantMsg     string // substring of the error
		wantHeld    int64
		wantAcked   int64
	}{
		"200 with the ack of the sent version": {
			serverToken: "s3cret", wantResult: PushOK, wantAcked: 7,
		},
		"401 on a wrong token": {
			serverToken: "other", wantResult: PushUnauthorized, wantErr: ErrPushUnauthorized, wantMsg: "answered 401",
		},
		"403 counts as unauthorized too": {
			serverToken: "s3cret", answer: func(policy.Policy) (int, string) { return 403, "" },
			wantResult: PushUnauthorized, wantErr: ErrPushUnauthorized, wantMsg: "answered 403",
		},
		"400 carries the validation errors": {
			serverToken: "s3cret",
			answer: func(policy.Policy) (int, string) {
				return 400, `{"error":{"type":"invalid_policy","message":"tiers[0].queueBound: must be >= 1, got 0"}}`
			},
			wantResult: PushRejected, wantErr: ErrPushRejected, wantMsg: "answered 400: {\"error\":{\"type\":\"invalid_policy\",\"message\":\"tiers[0].queueBound: must be >= 1, got 0\"}}",
		},
		"409 naming the held version in its body": {
			serverToken: "s3cret", answer: func(policy.Policy) (int, string) { return 409, `{"error":{"type":"conflict","currentVersion":9}}` },
			wantResult: PushConflict, wantErr: ErrPushConflict, wantMsg: "holds version 9, sent 7", wantHeld: 9,
		},
		"409 without a version asks GET /v1/policy": {
			serverToken: "s3cret", held: 12,
			wantResult: PushConflict, wantErr: ErrPushConflict, wantMsg: "holds version 12, sent 7", wantHeld: 12,
		},
		"500 is a failure with the answer": {
			serverToken: "s3cret", answer: func(policy.Policy) (int, string) { return 500, "boom" },
			wantResult: PushFailed, wantErr: ErrPushFailed, wantMsg: "answered 500: boom",
		},
		"an ack of another version is a failure": {
			serverToken: "s3cret", answer: func(policy.Policy) (int, string) { return 200, `{"version":3,"stats":{}}` },
			wantResult: PushFailed, wantErr: ErrPushFailed, wantMsg: "acknowledged version 3, sent 7",
		},
		"an unreadable ack is a failure": {
			serverToken: "s3cret", answer: func(policy.Policy) (int, string) { return 200, `not json` },
			wantResult: PushFailed, wantErr: ErrPushFailed, wantMsg: "unreadable ack",
		},
		"nothing listening": {
			unreachable: true, wantResult: PushUnreachable, wantErr: ErrPushUnreachable, wantMsg: "connection refused",
		},
		"no answer within the timeout": {
			serverToken: "s3cret", timeout: true, wantResult: PushUnreachable, wantErr: ErrPushUnreachable, wantMsg: "context deadline exceeded",
		},
		"an unreadable token file": {
			serverToken: "s3cret", noTokenFile: true, wantResult: PushFailed, wantErr: ErrPushFailed, wantMsg: "reading the push token",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			f := newFakeDispatcher(t, tc.serverToken)
			f.held, f.answer = tc.held, tc.answer
			addr := f.addr()
			if tc.unreachable {
				addr = closedAddr(t)
			}
			if tc.timeout {
				f.block = make(chan struct{})
				defer close(f.block)
			}
			tokenFile := writeToken(t, "s3cret")
			if tc.noTokenFile {
				tokenFile = filepath.Join(t.TempDir(), "missing")
			}
			p, err := NewPusher(PusherOptions{TokenFile: tokenFile, Timeout: 200 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			a := p.push(context.Background(), Target{Name: "d-0", Address: addr, Policy: policy.Policy{Version: 7, Pool: "ns/p", Slots: 3}})
			if a.result != tc.wantResult || !errors.Is(a.err, tc.wantErr) || a.held != tc.wantHeld || a.ack.Version != tc.wantAcked {
				t.Fatalf("push = {%s, %v, held %d, acked %d}, want {%s, %v, held %d, acked %d}", a.result, a.err, a.held, a.ack.Version, tc.wantResult, tc.wantErr, tc.wantHeld, tc.wantAcked)
			}
			if tc.wantMsg != "" && !strings.Contains(a.err.Error(), tc.wantMsg) {
				t.Errorf("error %q does not contain %q", a.err, tc.wantMsg)
			}
			if a.err != nil && strings.Contains(a.err.Error(), "s3cret") {
				t.Errorf("error %q leaks the token", a.err)
			}
			if tc.wantResult == PushOK {
				if diff := cmp.Diff(policy.Measured{ServiceTimeSeconds: 2.5, Completed: 40}, a.ack.Stats); diff != "" {
					t.Errorf("ack stats (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff([]policy.Policy{{Version: 7, Pool: "ns/p", Slots: 3}}, f.puts); diff != "" {
					t.Errorf("received policies (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff([]string{"Bearer s3cret"}, f.auths); diff != "" {
					t.Errorf("Authorization headers (-want +got):\n%s", diff)
				}
			}
		})
	}
}

// pusherHarness runs a Pusher with a fake clock and records notifications.
type pusherHarness struct {
	p      *Pusher
	clk    *clocktesting.FakeClock
	notify chan types.NamespacedName
	cancel context.CancelFunc
	done   chan struct{}
}

func startPusher(t *testing.T, tokenFile string) *pusherHarness {
	t.Helper()
	h := &pusherHarness{clk: clocktesting.NewFakeClock(time.Unix(1000, 0)), notify: make(chan types.NamespacedName, 100), done: make(chan struct{})}
	p, err := NewPusher(PusherOptions{TokenFile: tokenFile, Timeout: time.Second, Clock: h.clk,
		Notify: func(n types.NamespacedName) { h.notify <- n }})
	if err != nil {
		t.Fatal(err)
	}
	h.p = p
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() { _ = p.Start(ctx); close(h.done) }()
	t.Cleanup(h.stop)
	return h
}

func (h *pusherHarness) stop() {
	h.cancel()
	<-h.done
}

// next waits for one attempt to finish.
func (h *pusherHarness) next(t *testing.T) {
	t.Helper()
	select {
	case <-h.notify:
	case <-time.After(5 * time.Second):
		t.Fatal("no push attempt finished within 5s")
	}
}

// quiet asserts that no attempt finishes for a short while.
func (h *pusherHarness) quiet(t *testing.T) {
	t.Helper()
	select {
	case n := <-h.notify:
		t.Fatalf("unexpected push attempt for %s", n)
	case <-time.After(100 * time.Millisecond):
	}
}

// waitTimer waits until a sender sleeps on the fake clock.
func (h *pusherHarness) waitTimer(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !h.clk.HasWaiters() {
		if time.Now().After(deadline) {
			t.Fatal("no sender is waiting on the clock")
		}
		time.Sleep(time.Millisecond)
	}
}

var testPool = types.NamespacedName{Namespace: "ns", Name: "p"}

func TestPusherAcksAndStopsWhenCurrent(t *testing.T) {
	f := newFakeDispatcher(t, "tok")
	h := startPusher(t, writeToken(t, "tok"))
	h.p.Sync(testPool, []Target{{UID: "u1", Name: "d-0", Address: f.addr(), Policy: policy.Policy{Version: 1}}}, false)
	h.next(t)
	states := h.p.States(testPool)
	if len(states) != 1 || states[0].AckedVersion != 1 || states[0].Result != PushOK || states[0].Stats.Completed != 40 {
		t.Fatalf("states = %+v, want d-0 acked at 1 with its stats", states)
	}
	// Same version again: nothing to push.
	h.p.Sync(testPool, []Target{{UID: "u1", Name: "d-0", Address: f.addr(), Policy: policy.Policy{Version: 1}}}, false)
	h.quiet(t)
	// A resync pushes although the pod is current.
	h.p.Sync(testPool, []Target{{UID: "u1", Name: "d-0", Address: f.addr(), Policy: policy.Policy{Version: 1}}}, true)
	h.next(t)
	if got := f.putCount(); got != 2 {
		t.Errorf("PUTs = %d, want 2 (first push and resync)", got)
	}
}

func TestPusherRepushesAPodThatLostReadinessOrRestarted(t *testing.T) {
	f := newFakeDispatcher(t, "tok")
	h := startPusher(t, writeToken(t, "tok"))
	tgt := Target{UID: "u1", Name: "d-0", Address: f.addr(), Ready: true, Policy: policy.Policy{Version: 1}}
	h.p.Sync(testPool, []Target{tgt}, false)
	h.next(t)
	tgt.Ready = false
	h.p.Sync(testPool, []Target{tgt}, false)
	h.next(t)
	// Still unready, nothing new: no push.
	h.p.Sync(testPool, []Target{tgt}, false)
	h.quiet(t)
	tgt.Restarts = 1
	h.p.Sync(testPool, []Target{tgt}, false)
	h.next(t)
	if got := f.putCount(); got != 3 {
		t.Errorf("PUTs = %d, want 3", got)
	}
}

func TestPusherBacksOffAndRetries(t *testing.T) {
	f := newFakeDispatcher(t, "tok")
	fails := 2
	f.answer = func(policy.Policy) (int, string) {
		if fails > 0 {
			fails--
			return 503, "warming up"
		}
		return 0, ""
	}
	h := startPusher(t, writeToken(t, "tok"))
	h.p.Sync(testPool, []Target{{UID: "u1", Name: "d-0", Address: f.addr(), Policy: policy.Policy{Version: 4}}}, false)
	h.next(t)
	if s := h.p.States(testPool)[0]; s.Failures != 1 || s.Result != PushFailed {
		t.Fatalf("after the first attempt: %+v, want 1 failure", s)
	}
	h.waitTimer(t)
	h.clk.Step(249 * time.Millisecond)
	h.quiet(t) // backoff is 250ms
	h.clk.Step(time.Millisecond)
	h.next(t)
	h.waitTimer(t)
	h.clk.Step(499 * time.Millisecond)
	h.quiet(t) // doubled to 500ms
	h.clk.Step(time.Millisecond)
	h.next(t)
	s := h.p.States(testPool)[0]
	if s.AckedVersion != 4 || s.Failures != 0 || s.Attempts != 3 || s.Err != nil {
		t.Errorf("final state %+v, want acked 4 after 3 attempts", s)
	}
}

func TestPusherNewVersionSkipsTheBackoff(t *testing.T) {
	f := newFakeDispatcher(t, "tok")
	f.answer = func(p policy.Policy) (int, string) {
		if p.Version == 1 {
			return 400, "bad"
		}
		return 0, ""
	}
	h := startPusher(t, writeToken(t, "tok"))
	h.p.Sync(testPool, []Target{{UID: "u1", Name: "d-0", Address: f.addr(), Policy: policy.Policy{Version: 1}}}, false)
	h.next(t)
	if s := h.p.States(testPool)[0]; s.Result != PushRejected || !errors.Is(s.Err, ErrPushRejected) {
		t.Fatalf("state %+v, want rejected", s)
	}
	h.p.Sync(testPool, []Target{{UID: "u1", Name: "d-0", Address: f.addr(), Policy: policy.Policy{Version: 2}}}, false)
	h.next(t) // no clock step needed
	if s := h.p.States(testPool)[0]; s.AckedVersion != 2 {
		t.Errorf("state %+v, want acked 2", s)
	}
}

func TestPusherStopsPushingToRemovedPods(t *testing.T) {
	a, b := newFakeDispatcher(t, "tok"), newFakeDispatcher(t, "tok")
	h := startPusher(t, writeToken(t, "tok"))
	both := []Target{
		{UID: "ua", Name: "d-a", Address: a.addr(), Policy: policy.Policy{Version: 1}},
		{UID: "ub", Name: "d-b", Address: b.addr(), Policy: policy.Policy{Version: 1}},
	}
	h.p.Sync(testPool, both, false)
	h.next(t)
	h.next(t)
	h.p.Sync(testPool, []Target{{UID: "ua", Name: "d-a", Address: a.addr(), Policy: policy.Policy{Version: 2}}}, true)
	h.next(t)
	h.quiet(t)
	if a.putCount() != 2 || b.putCount() != 1 {
		t.Errorf("PUTs a=%d b=%d, want 2 and 1: the removed pod got pushed to", a.putCount(), b.putCount())
	}
	if got := h.p.States(testPool); len(got) != 1 || got[0].Name != "d-a" {
		t.Errorf("states %+v, want only d-a", got)
	}
	h.p.Forget(testPool)
	if got := h.p.States(testPool); len(got) != 0 {
		t.Errorf("states after Forget: %+v", got)
	}
}

func TestPusherPushesConcurrently(t *testing.T) {
	// Two pods that each block until both requests arrived prove the pushes
	// overlap; a sequential pusher would time out.
	var arrived sync.WaitGroup
	arrived.Add(2)
	release := make(chan struct{})
	go func() { arrived.Wait(); close(release) }()
	gate := func(inner http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			arrived.Done()
			select {
			case <-release:
			case <-time.After(3 * time.Second):
			}
			inner.ServeHTTP(w, r)
		})
	}
	a, b := newFakeDispatcher(t, "tok", gate), newFakeDispatcher(t, "tok", gate)
	h := startPusher(t, writeToken(t, "tok"))
	h.p.Sync(testPool, []Target{
		{UID: "ua", Name: "d-a", Address: a.addr(), Policy: policy.Policy{Version: 1}},
		{UID: "ub", Name: "d-b", Address: b.addr(), Policy: policy.Policy{Version: 1}},
	}, false)
	h.next(t)
	h.next(t)
	for _, s := range h.p.States(testPool) {
		if s.AckedVersion != 1 {
			t.Errorf("%s: %+v, want acked 1 (pushes did not overlap within the 1s timeout)", s.Name, s)
		}
	}
}

func TestPusherOptionsValidate(t *testing.T) {
	_, err := NewPusher(PusherOptions{BackoffBase: time.Second, BackoffMax: time.Millisecond})
	if err == nil || err.Error() != "push options: timeout 5s, backoff 1s..1ms: durations must be positive and base <= max" {
		t.Errorf("err = %v", err)
	}
}

func TestBackoffDoublesUpToTheMax(t *testing.T) {
	p, err := NewPusher(PusherOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var got []time.Duration
	for f := 1; f <= 7; f++ {
		got = append(got, p.backoff(f))
	}
	want := []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("backoff (-want +got):\n%s", diff)
	}
}
