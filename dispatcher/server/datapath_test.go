package server

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/dispatcher/forward"
)

// The tests of issue 21's table that are about the dispatcher's own
// answers, through the real server.

// A client can neither remove the tenant header the dispatcher sets (by
// naming it in Connection) nor forge it, in any spelling that a CGI-style
// backend folds into it ('_' for '-').
func TestTenantHeaderCannotBeRemovedOrForged(t *testing.T) {
	cases := map[string]http.Header{
		"named in Connection":     {"Connection": {"X-Tiergate-Tenant"}},
		"named in Connection, lc": {"Connection": {"keep-alive, x-tiergate-tenant"}},
		"forged":                  {"X-Tiergate-Tenant": {"evil"}},
		"forged with underscores": {"X_Tiergate_Tenant": {"evil"}},
		"forged, mixed":           {"X-Tiergate_tenant": {"evil"}, "x_tiergate-TENANT": {"evil"}},
		"forged tier":             {"X-Tier": {"gold"}, "X_Tier": {"gold"}},
		"forged and named":        {"Connection": {"X_Tiergate_Tenant, X-Tiergate-Tenant"}, "X_Tiergate_Tenant": {"evil"}},
	}
	for name, h := range cases {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, testPolicy(policy.AuthTrustedHeader, 2))
			h := h.Clone()
			h.Set("X-Tenant-Id", "acme")
			if a := f.do(t, http.MethodPost, "/v1/completions", h); a.StatusCode != http.StatusOK {
				t.Fatalf("status %d", a.StatusCode)
			}
			got := http.Header{}
			for k, v := range f.be.headers[0] {
				if folded := strings.ToLower(strings.ReplaceAll(k, "_", "-")); folded == "x-tiergate-tenant" || folded == "x-tier" {
					got[k] = v
				}
			}
			if diff := cmp.Diff(http.Header{"X-Tiergate-Tenant": {"acme"}}, got); diff != "" {
				t.Errorf("the backend's tenant fields (-want +got)\n%s", diff)
			}
		})
	}
}

// A client's streamed body that fails (malformed chunks, or the client
// half-closing mid-body) never becomes a 200 that no backend sent: the
// client gets 400, and the backend, which did nothing wrong, stays in
// service.
func TestFailedStreamedBodyIsNever200(t *testing.T) {
	const head = "POST /v1/models HTTP/1.1\r\nHost: x\r\nX-Tenant-Id: acme\r\n"
	cases := map[string]struct {
		send    string
		wantMsg string
	}{
		"malformed chunks": {
			send:    head + "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n",
			wantMsg: "could not read the request body: invalid byte in chunk length",
		},
		"half-closed mid-body": {
			send:    head + "Content-Length: 100\r\n\r\n0123456789",
			wantMsg: "could not read the request body: unexpected EOF",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, testPolicy(policy.AuthTrustedHeader, 2))
			c, err := net.Dial("tcp", strings.TrimPrefix(f.front.URL, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_, _ = io.WriteString(c, tc.send)
			_ = c.(*net.TCPConn).CloseWrite()
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("no answer: %v", err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusBadRequest {
				t.Fatalf("got %d %q, want 400", resp.StatusCode, b)
			}
			want := map[string]any{"type": "bad_request", "message": tc.wantMsg, "tier": "premium", "queue_position": 0.0, "retry_after_seconds": 0.0}
			if diff := cmp.Diff(want, refusalBody(t, b)); diff != "" {
				t.Errorf("body (-want +got)\n%s", diff)
			}
			if got := f.bal.Snapshot()[0].Failures; got != 0 {
				t.Errorf("the backend has %d failures for a client's body, want 0", got)
			}
		})
	}
}

// floodBackend answers every request with a status line and then flood
// bytes of header fields; it returns its address.
func floodBackend(t *testing.T, flood int) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	chunk := []byte(strings.Repeat("X-Flood: "+strings.Repeat("a", 1000)+"\r\n", 64))
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
					return
				}
				_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\n")
				for n := 0; n < flood; n += len(chunk) {
					if _, err := c.Write(chunk); err != nil {
						return
					}
				}
				_, _ = io.WriteString(c, "Content-Length: 2\r\n\r\nok")
			})
		}
	})
	t.Cleanup(func() { _ = l.Close(); wg.Wait() })
	return l.Addr().String()
}

// A backend that sends 40 MB of response headers gets the client a 502
// backend_error.
func TestResponseHeaderFloodIs502(t *testing.T) {
	p := testPolicy(policy.AuthTrustedHeader, 2)
	f := newFixture(t, p)
	f.withBackends(t, p, floodBackend(t, 40<<20))
	req, _ := http.NewRequest(http.MethodPost, f.front.URL+"/v1/completions", strings.NewReader("{}"))
	req.Header.Set("X-Tenant-Id", "acme")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("the client got no answer: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("got %d, want 502", resp.StatusCode)
	}
	want := map[string]any{"type": "backend_error", "message": "the model backend failed before answering", "tier": "premium", "queue_position": 0.0, "retry_after_seconds": 0.0}
	if diff := cmp.Diff(want, refusalBody(t, b)); diff != "" {
		t.Errorf("body (-want +got)\n%s", diff)
	}
}

// A backend that sends no response head within the response-header
// timeout gets the client a 504 backend_timeout, counted by that cause,
// and counts as the backend's failure.
func TestBackendTimeoutIs504(t *testing.T) {
	opt := forward.DefaultOptions()
	opt.ResponseHeaderTimeout = 50 * time.Millisecond
	f := newFixtureConfig(t, testPolicy(policy.AuthTrustedHeader, 2), Config{Forwarder: forward.New(opt)})
	f.be.hold = make(chan struct{})
	defer close(f.be.hold)
	got := f.send(t.Context(), "/slow", []byte("{}"), true)
	if got.Err != nil || got.Code != http.StatusGatewayTimeout {
		t.Fatalf("got %d, %v, want 504: %s", got.Code, got.Err, got.Body)
	}
	want := map[string]any{"type": "backend_timeout", "message": "the model backend did not start its answer in time", "tier": "premium", "queue_position": 0.0, "retry_after_seconds": 0.0}
	if diff := cmp.Diff(want, refusalBody(t, []byte(got.Body))); diff != "" {
		t.Errorf("body (-want +got)\n%s", diff)
	}
	if got := f.bal.Snapshot()[0].Failures; got != 1 {
		t.Errorf("the backend has %d failures, want 1", got)
	}
	if diff := cmp.Diff(map[string]float64{"cause=backend_timeout,pool=p,tier=premium": 1}, series(t, f.reg, "tiergate_rejections_total")); diff != "" {
		t.Errorf("tiergate_rejections_total (-want +got)\n%s", diff)
	}
}
