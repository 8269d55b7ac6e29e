package dispatcher

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/internal/testutil"
)

func sha(key string) string {
	s := sha256.Sum256([]byte(key))
	return hex.EncodeToString(s[:])
}

// wantRefusal is everything a refusal is checked for.
type wantRefusal struct {
	code                 int
	typ, msg, tier       string
	position, retryAfter int
}

func checkRefusal(t *testing.T, got result, want wantRefusal) {
	t.Helper()
	if got.err != nil {
		t.Fatal(got.err)
	}
	if got.code != want.code {
		t.Fatalf("status %d, want %d; body %s", got.code, want.code, got.body)
	}
	r := testutil.ParseRefusal(t, []byte(got.body))
	gotFields := wantRefusal{code: got.code, typ: r.Error.Type, msg: r.Error.Message, tier: r.Error.Tier,
		position: r.Error.QueuePosition, retryAfter: r.Error.RetryAfterSeconds}
	if diff := cmp.Diff(want, gotFields, cmp.AllowUnexported(wantRefusal{})); diff != "" {
		t.Errorf("body (-want +got)\n%s", diff)
	}
	hdr := func(v int) string {
		if v == 0 {
			return ""
		}
		return strconv.Itoa(v)
	}
	wantHeaders := map[string]string{
		"Retry-After":      hdr(want.retryAfter),
		"X-Queue-Position": hdr(want.position),
		"X-Tier":           want.tier,
		"Content-Type":     "application/json",
		"X-Queue-Wait-Ms":  "",
	}
	gotHeaders := map[string]string{}
	for k := range wantHeaders {
		gotHeaders[k] = got.header.Get(k)
	}
	if diff := cmp.Diff(wantHeaders, gotHeaders); diff != "" {
		t.Errorf("headers (-want +got)\n%s", diff)
	}
}

// TestRefusals checks every refusal the data path makes for its exact
// status, JSON type, message and headers, and that each is counted by
// cause in tiergate_rejections_total.
func TestRefusals(t *testing.T) {
	s := startSim(t, "--concurrency", "8", "--service-time", "const:50ms")
	ctx := context.Background()

	tests := map[string]struct {
		policy func() *policy.Policy // nil: no policy at all
		args   []string
		// setup runs before the checked request; it may start requests in
		// the background that hold slots or queue places.
		setup func(t *testing.T, d *disp)
		req   call
		want  wantRefusal
		cause string
	}{
		"missing tenant header": {
			policy: func() *policy.Policy { return basePolicy(1, 2, s.Addr) },
			req:    call{},
			want:   wantRefusal{code: 401, typ: "unauthenticated", msg: "missing the X-Tenant-ID header that names the tenant"},
			cause:  "unauthenticated",
		},
		"repeated tenant header": {
			policy: func() *policy.Policy { return basePolicy(1, 2, s.Addr) },
			req:    call{header: http.Header{"X-Tenant-Id": {"acme", "globex"}}},
			want:   wantRefusal{code: 400, typ: "bad_request", msg: "the X-Tenant-ID header is repeated 2 times; send it once"},
			cause:  "bad_request",
		},
		"unknown tenant and no default tier": {
			policy: func() *policy.Policy { p := basePolicy(1, 2, s.Addr); p.DefaultTier = ""; return p },
			req:    call{tenant: "zed"},
			want:   wantRefusal{code: 403, typ: "unknown_tenant", msg: `tenant "zed" is not known and the pool has no default tier`},
			cause:  "unknown_tenant",
		},
		"api key missing": {
			policy: apiKeyPolicy(s.Addr),
			req:    call{tenant: "acme"},
			want:   wantRefusal{code: 401, typ: "unauthenticated", msg: `missing API key; send "Authorization: Bearer <key>"`},
			cause:  "unauthenticated",
		},
		"api key unknown": {
			policy: apiKeyPolicy(s.Addr),
			req:    call{header: http.Header{"Authorization": {"Bearer sk-wrong"}}},
			want:   wantRefusal{code: 401, typ: "unauthenticated", msg: "unknown API key"},
			cause:  "unauthenticated",
		},
		"body too large": {
			policy: func() *policy.Policy { return basePolicy(1, 2, s.Addr) },
			args:   []string{"--max-body-bytes", "1024"},
			req:    call{tenant: "acme", body: `{"prompt":"` + strings.Repeat("x", 2000) + `"}`},
			want:   wantRefusal{code: 413, typ: "body_too_large", msg: "the request body is larger than 1024 bytes", tier: "premium"},
			cause:  "body_too_large",
		},
		"no policy": {
			req:   call{tenant: "acme"},
			want:  wantRefusal{code: 503, typ: "unavailable", msg: "the dispatcher has no policy yet", retryAfter: 1},
			cause: "unavailable",
		},
		"no capacity": {
			policy: func() *policy.Policy { p := basePolicy(1, 0); return p },
			req:    call{tenant: "acme"},
			want:   wantRefusal{code: 503, typ: "unavailable", msg: "the pool has no capacity right now (no ready backends)", tier: "premium", retryAfter: 5},
			cause:  "unavailable",
		},
		"backend down": {
			policy: func() *policy.Policy { return basePolicy(1, 2, freeAddrNoT()) },
			req:    call{tenant: "acme"},
			want:   wantRefusal{code: 502, typ: "backend_error", msg: "the model backend failed before answering", tier: "premium"},
			cause:  "backend_error",
		},
		"tier queue full": {
			// One slot, held by a standard request; premium's bound of 1 is
			// taken by acme; globex is refused. Premium has dispatched
			// nothing, so Retry-After comes from serviceRate: ceil(2/0.5).
			policy: func() *policy.Policy {
				p := basePolicy(1, 1, s.Addr)
				p.ServiceRate = 0.5
				p.Tiers[0].QueueBound = 1
				return p
			},
			setup: holdSlotQueueAcme,
			req:   call{tenant: "globex"},
			want: wantRefusal{code: 429, typ: "capacity", tier: "premium", position: 2, retryAfter: 4,
				msg: `the queue of tier "premium" is full; retry after 4s`},
			cause: "capacity",
		},
		"tenant queue limit": {
			policy: func() *policy.Policy {
				p := basePolicy(1, 1, s.Addr)
				p.ServiceRate = 0.5
				p.Tiers[0].TenantQueueLimit = 1
				return p
			},
			setup: holdSlotQueueAcme,
			req:   call{tenant: "acme"},
			want: wantRefusal{code: 429, typ: "tenant_limit", tier: "premium", position: 2, retryAfter: 4,
				msg: `tenant "acme" has as many requests queued as tier "premium" allows one tenant; retry after 4s`},
			cause: "tenant_limit",
		},
		"queue timeout": {
			policy: func() *policy.Policy {
				p := basePolicy(1, 1, s.Addr)
				p.ClientTimeoutSeconds = 0.5
				return p
			},
			setup: func(t *testing.T, d *disp) {
				background(t, d, call{tenant: "initech", header: long})
				testutil.EventuallyTrue(t, settle, "slot taken", func() bool { return d.stats(t).Queue.InFlight == 1 })
			},
			req: call{tenant: "acme"},
			want: wantRefusal{code: 504, typ: "queue_timeout", tier: "premium",
				msg: `the request waited in the queue of tier "premium" for the client timeout (500ms) without being dispatched`},
			cause: "queue_timeout",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			o := dispOpts{args: tc.args}
			if tc.policy != nil {
				o.policy = tc.policy()
			}
			d := startDispatcher(t, o)
			if tc.setup != nil {
				tc.setup(t, d)
			}
			got := d.fetch(ctx, t, tc.req)
			checkRefusal(t, got, tc.want)
			tier := tc.want.tier
			if tc.cause == "bad_request" || tc.cause == "unauthenticated" || tc.cause == "unknown_tenant" {
				tier = ""
			}
			pool := "default/llm"
			if tc.policy == nil {
				pool = ""
			}
			key := `tiergate_rejections_total{cause="` + tc.cause + `",pool="` + pool + `",tier="` + tier + `"}`
			if v := d.Metrics(t)[key]; v != 1 {
				t.Errorf("%s = %v, want 1", key, v)
			}
		})
	}
}

func apiKeyPolicy(backend string) func() *policy.Policy {
	return func() *policy.Policy {
		p := basePolicy(1, 2, backend)
		p.Authentication = policy.Authentication{Mode: policy.AuthAPIKey}
		p.DefaultTier = ""
		p.Tenants[0].APIKeySHA256 = []string{sha("sk-acme")}
		return p
	}
}

// freeAddrNoT is a loopback address nothing listens on.
func freeAddrNoT() string {
	ports, err := testutil.FreePorts("127.0.0.1", 1)
	if err != nil {
		panic(err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))
}

// background sends a request that the test does not wait for; it ends
// when the test does.
func background(t *testing.T, d *disp, c call) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		resp, err := d.do(ctx, t, c)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
}

// TestBadInput covers what a hostile or broken client can send: a body
// that never arrives (408), headers that never end (the connection is
// closed), a malformed header line (400) and a body larger than allowed
// with no Content-Length (413).
func TestBadInput(t *testing.T) {
	s := startSim(t, "--service-time", "0")
	d := startDispatcher(t, dispOpts{policy: basePolicy(1, 2, s.Addr),
		args: []string{"--body-timeout", "500ms", "--read-header-timeout", "500ms", "--max-body-bytes", "100"}})

	raw := func(t *testing.T, req string) (string, time.Duration) {
		t.Helper()
		c, err := net.Dial("tcp", d.Data)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		start := time.Now()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(bufio.NewReader(c))
		return string(b), time.Since(start)
	}

	t.Run("body never arrives", func(t *testing.T) {
		out, took := raw(t, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Tenant-ID: acme\r\nContent-Length: 50\r\n\r\n{\"prompt\":")
		if !strings.HasPrefix(out, "HTTP/1.1 408 ") {
			t.Fatalf("got %q", out)
		}
		_, body, _ := strings.Cut(out, "\r\n\r\n")
		r := testutil.ParseRefusal(t, []byte(body))
		if r.Error.Type != "request_timeout" || r.Error.Message != "the request body did not arrive within 500ms" {
			t.Errorf("refusal %+v", r.Error)
		}
		if took > 5*time.Second {
			t.Errorf("took %s", took)
		}
	})
	t.Run("headers never end", func(t *testing.T) {
		out, took := raw(t, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Tenant-ID: acme\r\n")
		// net/http closes the connection after --read-header-timeout.
		if took < 400*time.Millisecond || took > 5*time.Second {
			t.Errorf("connection closed after %s (out %q), want about 500ms", took, out)
		}
		if strings.Contains(out, "200 OK") {
			t.Errorf("got a response: %q", out)
		}
	})
	t.Run("malformed header line", func(t *testing.T) {
		out, _ := raw(t, "GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Tenant-ID acme\r\n\r\n")
		if !strings.HasPrefix(out, "HTTP/1.1 400 ") {
			t.Errorf("got %q", out)
		}
	})
	t.Run("chunked body over the limit", func(t *testing.T) {
		body := strings.Repeat("x", 300)
		out, _ := raw(t, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Tenant-ID: acme\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n12c\r\n"+body+"\r\n0\r\n\r\n")
		if !strings.HasPrefix(out, "HTTP/1.1 413 ") {
			t.Fatalf("got %q", out)
		}
		_, b, _ := strings.Cut(out, "\r\n\r\n")
		if r := testutil.ParseRefusal(t, []byte(b)); r.Error.Type != "body_too_large" || r.Error.Message != "the request body is larger than 100 bytes" {
			t.Errorf("refusal %+v", r.Error)
		}
	})
	if got := d.stats(t); got.Queue.InFlight != 0 || got.Queue.Queued != 0 || got.Active != 0 {
		t.Errorf("after bad input: %+v", got)
	}
}

// long makes simserver hold a request for 3s.
var long = http.Header{"X-Sim-Service-Time": {"3s"}}

// holdSlotQueueAcme fills the only slot with a long standard request and
// queues one premium request of acme behind it.
func holdSlotQueueAcme(t *testing.T, d *disp) {
	background(t, d, call{tenant: "initech", header: long})
	testutil.EventuallyTrue(t, settle, "slot taken", func() bool { return d.stats(t).Queue.InFlight == 1 })
	background(t, d, call{tenant: "acme"})
	testutil.EventuallyTrue(t, settle, "acme queued", func() bool { return d.stats(t).Queue.Queued == 1 })
}
