package dispatcher

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/internal/testutil"
)

// rawExchange writes req on a fresh connection to addr and reads one
// answer; closed says whether the dispatcher then closed the connection.
func rawExchange(t *testing.T, addr, req string) (res result, closed bool) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	_, eof := br.ReadByte()
	return result{code: resp.StatusCode, header: resp.Header, body: string(b), err: err}, errors.Is(eof, io.EOF)
}

// Requests that are not model calls: CONNECT gets 405 (never a tunnel)
// and the connection closes; a protocol upgrade gets 400 on a queued path
// and reaches the backend on an exempt one; none of the refused ones
// reaches a backend, and each is counted by cause.
func TestRequestsThatAreNotModelCalls(t *testing.T) {
	s := startSim(t, "--service-time", "0")
	d := startDispatcher(t, dispOpts{policy: basePolicy(1, 2, s.Addr)})

	res, closed := rawExchange(t, d.Data, "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\nX-Tenant-ID: acme\r\n\r\n")
	checkRefusal(t, res, wantRefusal{code: 405, typ: "method_not_allowed",
		msg: "the dispatcher does not accept CONNECT: it proxies model API calls and is not a tunnel"})
	if got := res.header.Get("Allow"); got != "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS" {
		t.Errorf("Allow %q", got)
	}
	if !closed {
		t.Error("the connection stayed open after the CONNECT refusal")
	}

	upgrade := http.Header{"Connection": {"Upgrade"}, "Upgrade": {"websocket"}, "Sec-Websocket-Version": {"13"}, "Sec-Websocket-Key": {"dGhlIHNhbXBsZSBub25jZQ=="}}
	r := d.fetch(t.Context(), t, call{method: http.MethodGet, path: "/v1/chat/completions", tenant: "acme", header: upgrade})
	checkRefusal(t, r, wantRefusal{code: 400, typ: "bad_request",
		msg: "the dispatcher does not switch protocols on queued paths (the request asks for an Upgrade); only the pool's exempt paths may upgrade"})

	if r := d.fetch(t.Context(), t, call{method: http.MethodGet, path: "/health", tenant: "acme", header: upgrade}); r.code != 200 {
		t.Errorf("an upgrade on an exempt path: %d %s, want simserver's 200", r.code, r.body)
	}
	h2c := http.Header{"Connection": {"Upgrade, HTTP2-Settings"}, "Upgrade": {"h2c"}, "Http2-Settings": {"AAMAAABkAAQCAAAAAAIAAAAA"}}
	if r := d.fetch(t.Context(), t, call{tenant: "acme", header: h2c}); r.code != 200 {
		t.Errorf("an h2c upgrade, which is ignored: %d %s, want 200", r.code, r.body)
	}
	// simserver counts generations only: the h2c request, not /health and
	// none of the refused ones.
	if st := s.Stats(t); st.Requests != 1 {
		t.Errorf("simserver generated %d times, want once (the h2c request)", st.Requests)
	}
	m := d.Metrics(t)
	got := map[string]float64{
		"405": m[`tiergate_rejections_total{cause="method_not_allowed",pool="default/llm",tier=""}`],
		"400": m[`tiergate_rejections_total{cause="bad_request",pool="default/llm",tier=""}`],
	}
	if diff := cmp.Diff(map[string]float64{"405": 1, "400": 1}, got); diff != "" {
		t.Errorf("rejections_total (-want +got)\n%s", diff)
	}
}

// A push for another pool than the one the dispatcher holds is refused
// with 409 pool_mismatch, naming both pools; the held policy stays.
func TestPushForAnotherPool(t *testing.T) {
	s := startSim(t, "--service-time", "0")
	d := startDispatcher(t, dispOpts{policy: basePolicy(3, 2, s.Addr)})
	other := basePolicy(9, 2, s.Addr)
	other.Pool = "default/other"
	code, body := d.PutPolicy(t, other)
	if code != http.StatusConflict {
		t.Fatalf("PUT another pool's policy: %d %s", code, body)
	}
	var got policy.AdminErrorBody
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatal(err)
	}
	want := policy.AdminErrorBody{Error: policy.AdminErrorDetail{Type: policy.AdminPoolMismatch, CurrentPool: "default/llm",
		Message: `this dispatcher holds the policy of pool "default/llm" and refuses one for pool "default/other": a dispatcher serves one pool until it restarts (do two ModelPools select the same dispatcher pods?)`}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got)\n%s", diff)
	}
	var held policy.Policy
	code, body = d.AdminDo(t, http.MethodGet, "/v1/policy", d.Token, nil)
	if err := json.Unmarshal(body, &held); err != nil || code != 200 || held.Pool != "default/llm" || held.Version != 3 {
		t.Errorf("held policy: %d, pool %q version %d (%v)", code, held.Pool, held.Version, err)
	}
}

// The policy race: acme's headers arrive under v1 (acme in premium), its
// body only after v2 moved acme to free. The request is queued in free,
// the tier of the policy in force at admission, and globex's queued
// request stays in premium.
func TestTierOfThePolicyInForceAtAdmission(t *testing.T) {
	s := startSim(t, "--service-time", "const:50ms")
	v1 := basePolicy(1, 1, s.Addr)
	d := startDispatcher(t, dispOpts{policy: v1})
	holdSlotQueue(t, d, "globex") // premium, queued behind initech's long request

	c, err := net.Dial("tcp", d.Data)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := `{"model":"m","prompt":"hi"}`
	if _, err := io.WriteString(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Tenant-ID: acme\r\nContent-Type: application/json\r\nContent-Length: 27\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyTrue(t, settle, "acme's headers read", func() bool { return d.stats(t).Active == 3 })
	v2 := basePolicy(2, 1, s.Addr)
	v2.Tenants[0].Tier = "free"
	d.MustPutPolicy(t, v2)
	if _, err := io.WriteString(c, body); err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyTrue(t, settle, "acme queued", func() bool { return d.stats(t).Queue.Queued == 2 })
	tiers := d.stats(t).Queue.Tiers
	got := map[string]int{"premium": tiers["premium"].Queued, "standard": tiers["standard"].Queued, "free": tiers["free"].Queued}
	if diff := cmp.Diff(map[string]int{"premium": 1, "standard": 0, "free": 1}, got); diff != "" {
		t.Errorf("queued by tier (-want +got)\n%s", diff)
	}
}

// holdSlotQueue fills the only slot with a long standard request and
// queues one request of tenant behind it.
func holdSlotQueue(t *testing.T, d *disp, tenant string) {
	t.Helper()
	background(t, d, call{tenant: "initech", header: long})
	testutil.EventuallyTrue(t, settle, "slot taken", func() bool { return d.stats(t).Queue.InFlight == 1 })
	background(t, d, call{tenant: tenant})
	testutil.EventuallyTrue(t, settle, tenant+" queued", func() bool { return d.stats(t).Queue.Queued == 1 })
}
