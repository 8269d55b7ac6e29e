package server

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/dispatcher/balancer"
)

// closedAddr is a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// withBackends points f's policy at addrs, the fixture's backend first.
func (f *fixture) withBackends(t *testing.T, p *policy.Policy, addrs ...string) {
	t.Helper()
	p.Backends = nil
	for _, a := range addrs {
		p.Backends = append(p.Backends, policy.Backend{Address: a})
	}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	f.bal.Update(p.Backends)
	f.q.UpdatePolicy(p)
	f.srv.SetPolicy(p)
}

func (f *fixture) live() string { return strings.TrimPrefix(f.backend.URL, "http://") }

func refusalBody(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var body struct {
		Error map[string]any `json:"error"`
	}
	if err := json.Unmarshal(b, &body); err != nil {
		t.Fatalf("refusal body %q: %v", b, err)
	}
	return body.Error
}

// A backend that refuses connections costs no request: the refused one is
// retried on the other backend inside its slot, and the dead backend is
// ejected after its first refusal, so it is never picked again.
func TestUnreachableBackendIsRetriedAndEjected(t *testing.T) {
	p := testPolicy(policy.AuthTrustedHeader, 2)
	f := newFixture(t, p)
	dead := closedAddr(t)
	f.withBackends(t, p, dead, f.live())
	h := http.Header{"X-Tenant-Id": {"acme"}}
	for i := range 10 {
		if a := f.do(t, http.MethodPost, "/v1/completions", h); a.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d", i, a.StatusCode)
		}
	}
	if got := len(f.be.paths); got != 10 {
		t.Errorf("the live backend saw %d requests, want 10", got)
	}
	byAddr := map[string]balancer.Load{}
	for _, l := range f.bal.Snapshot() {
		byAddr[l.Address] = l
	}
	if diff := cmp.Diff(balancer.Load{Address: dead, Ejected: true, Ejections: 1}, byAddr[dead]); diff != "" {
		t.Errorf("dead backend (-want +got)\n%s", diff)
	}
	got := series(t, f.reg, "tiergate_requests_total")
	if diff := cmp.Diff(map[string]float64{"code=200,pool=p,tier=premium": 10}, got); diff != "" {
		t.Errorf("requests_total (-want +got)\n%s", diff)
	}
	if st := f.q.Stats(); st.InFlight != 0 || st.Completed != 10 || st.Served != 10 {
		t.Errorf("queue: in flight %d, completed %d, served %d; want 0, 10, 10", st.InFlight, st.Completed, st.Served)
	}
}

// With no other backend to retry on, a refused connection is a 502; the
// only backend is never ejected.
func TestUnreachableOnlyBackendIs502(t *testing.T) {
	p := testPolicy(policy.AuthTrustedHeader, 2)
	f := newFixture(t, p)
	dead := closedAddr(t)
	f.withBackends(t, p, dead)
	req, _ := http.NewRequest(http.MethodPost, f.front.URL+"/v1/completions", strings.NewReader(`{}`))
	req.Header.Set("X-Tenant-Id", "acme")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("status %d, want 502", resp.StatusCode)
	}
	want := map[string]any{"type": "backend_error", "message": "the model backend failed before answering", "tier": "premium",
		"queue_position": 0.0, "retry_after_seconds": 0.0}
	if diff := cmp.Diff(want, refusalBody(t, b)); diff != "" {
		t.Errorf("body (-want +got)\n%s", diff)
	}
	if diff := cmp.Diff([]balancer.Load{{Address: dead, Failures: 1}}, f.bal.Snapshot()); diff != "" {
		t.Errorf("backend (-want +got)\n%s", diff)
	}
	if st := f.q.Stats(); st.InFlight != 0 || st.Completed != 1 || st.Served != 0 {
		t.Errorf("queue: %+v", st)
	}
}

// Only a 2xx answer is a service-time sample; 5xx and 4xx answers end
// their slot without one.
func TestOnlyServedRequestsMeasure(t *testing.T) {
	f := newFixture(t, testPolicy(policy.AuthTrustedHeader, 2))
	h := http.Header{"X-Tenant-Id": {"acme"}}
	for _, path := range []string{"/status/500", "/status/500", "/status/404", "/v1/completions"} {
		f.do(t, http.MethodPost, path, h)
	}
	if st := f.q.Stats(); st.Completed != 4 || st.Served != 1 {
		t.Errorf("completed %d, served %d; want 4 and 1", st.Completed, st.Served)
	}
	if l := f.bal.Snapshot()[0]; l.Failures != 0 || l.Ejected {
		t.Errorf("backend after a 2xx: %+v", l)
	}
}

// rawRequest writes req on a fresh connection and reads the answer; it
// reports whether the server closed the connection after it.
func rawRequest(t *testing.T, addr, req string) (*http.Response, []byte, bool) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	_, err = br.ReadByte()
	return resp, b, errors.Is(err, io.EOF)
}

// CONNECT gets 405 with Allow, the connection closes, and nothing reaches
// a backend.
func TestConnectRefused(t *testing.T) {
	f := newFixture(t, testPolicy(policy.AuthTrustedHeader, 2))
	addr := strings.TrimPrefix(f.front.URL, "http://")
	const connect = "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\nX-Tenant-Id: acme\r\n\r\n"
	resp, b, closed := rawRequest(t, addr, connect) //nolint:bodyclose // rawRequest reads and closes it
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("status %d, want 405", resp.StatusCode)
	}
	want := map[string]any{"type": "method_not_allowed", "message": "the dispatcher does not accept CONNECT: it proxies model API calls and is not a tunnel",
		"tier": "", "queue_position": 0.0, "retry_after_seconds": 0.0}
	if diff := cmp.Diff(want, refusalBody(t, b)); diff != "" {
		t.Errorf("body (-want +got)\n%s", diff)
	}
	if got := resp.Header.Get("Allow"); got != allowedMethods {
		t.Errorf("Allow %q", got)
	}
	if !closed || !resp.Close {
		t.Errorf("connection closed %v, Connection: close %v; want both", closed, resp.Close)
	}
	if len(f.be.paths) != 0 {
		t.Errorf("a backend saw %v", f.be.paths)
	}
	got := series(t, f.reg, "tiergate_rejections_total")
	if diff := cmp.Diff(map[string]float64{"cause=method_not_allowed,pool=p,tier=": 1}, got); diff != "" {
		t.Errorf("rejections_total (-want +got)\n%s", diff)
	}
}

// A protocol upgrade is refused with 400 on a queued path, passed on to a
// backend on an exempt path; an h2c upgrade is ignored.
func TestUpgrade(t *testing.T) {
	tests := map[string]struct {
		path, connection, upgrade string
		wantCode                  int
		wantPaths                 []string
		wantUpgrade               string // as the backend saw it
	}{
		"websocket on a queued path": {path: "/v1/chat/completions", connection: "Upgrade", upgrade: "websocket", wantCode: 400},
		"listed among other tokens":  {path: "/v1/completions", connection: "keep-alive, upgrade", upgrade: "websocket", wantCode: 400},
		"websocket on an exempt path": {path: "/v1/models", connection: "Upgrade", upgrade: "websocket", wantCode: 200,
			wantPaths: []string{"/v1/models"}, wantUpgrade: "websocket"},
		"h2c is ignored": {path: "/v1/completions", connection: "Upgrade, HTTP2-Settings", upgrade: "h2c", wantCode: 200,
			wantPaths: []string{"/v1/completions"}},
		"Upgrade without the Connection token is no upgrade": {path: "/v1/completions", upgrade: "websocket", wantCode: 200,
			wantPaths: []string{"/v1/completions"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, testPolicy(policy.AuthTrustedHeader, 2))
			h := http.Header{"X-Tenant-Id": {"acme"}, "Upgrade": {tc.upgrade}, "Http2-Settings": {"AAMAAABkAAQCAAAAAAIAAAAA"}}
			if tc.connection != "" {
				h["Connection"] = []string{tc.connection}
			}
			req, _ := http.NewRequest(http.MethodPost, f.front.URL+tc.path, strings.NewReader(`{}`))
			req.Header = h
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.wantCode {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.wantCode, b)
			}
			if tc.wantCode == 400 {
				want := map[string]any{"type": "bad_request", "message": upgradeRefused, "tier": "", "queue_position": 0.0, "retry_after_seconds": 0.0}
				if diff := cmp.Diff(want, refusalBody(t, b)); diff != "" {
					t.Errorf("body (-want +got)\n%s", diff)
				}
			}
			if diff := cmp.Diff(tc.wantPaths, f.be.paths); diff != "" {
				t.Errorf("backend paths (-want +got)\n%s", diff)
			}
			if len(f.be.headers) == 1 {
				if got := f.be.headers[0].Get("Upgrade"); got != tc.wantUpgrade {
					t.Errorf("the backend saw Upgrade %q, want %q", got, tc.wantUpgrade)
				}
			}
		})
	}
}

// From the drain on, every response says Connection: close: the answer
// of a request already in flight and the 503 of a new one.
func TestDrainClosesConnections(t *testing.T) {
	f := newFixture(t, testPolicy(policy.AuthTrustedHeader, 2))
	h := http.Header{"X-Tenant-Id": {"acme"}}
	before := f.do(t, http.MethodPost, "/v1/completions", h)
	f.be.hold = make(chan struct{})
	f.be.arrived = make(chan string, 1)
	done := make(chan answer)
	go func() { done <- f.do(t, http.MethodPost, "/slow", h) }()
	<-f.be.arrived
	f.srv.StartDrain()
	refused := f.do(t, http.MethodPost, "/v1/completions", h)
	close(f.be.hold)
	inflight := <-done
	got := map[string]bool{"before": before.Close, "in flight": inflight.Close, "refused": refused.Close}
	want := map[string]bool{"before": false, "in flight": true, "refused": true}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Connection headers (-want +got)\n%s", diff)
	}
	if inflight.StatusCode != http.StatusOK || refused.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("in flight %d, refused %d; want 200 and 503", inflight.StatusCode, refused.StatusCode)
	}
}
