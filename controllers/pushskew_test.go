package controllers

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

// oldDispatcher answers like a dispatcher from before the schema header:
// no header at all, and a strict decoder that refuses the schemaVersion
// field it does not know, as revision 0 did. invalid refuses every push.
type oldDispatcher struct {
	mu      sync.Mutex
	bodies  []string
	invalid bool
}

func (o *oldDispatcher) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	o.mu.Lock()
	o.bodies = append(o.bodies, string(b))
	invalid := o.invalid
	o.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	var p policy.Policy
	_ = json.Unmarshal(b, &p)
	switch {
	case strings.Contains(string(b), `"schemaVersion"`):
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, `{"error":{"type":"invalid_policy","message":"decoding policy: json: unknown field \"schemaVersion\""}}`)
	case invalid:
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, `{"error":{"type":"invalid_policy","message":"the policy has 1 error(s); the previous policy stays"}}`)
	default:
		_, _ = io.WriteString(w, `{"version":`+strconv.FormatInt(p.Version, 10)+`,"stats":{}}`)
	}
}

// revisions are the schemaVersion of each body received ("absent" for
// none).
func (o *oldDispatcher) revisions(t *testing.T) []string {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	return bodyRevisions(t, o.bodies)
}

func bodyRevisions(t *testing.T, bodies []string) []string {
	t.Helper()
	var out []string
	for _, b := range bodies {
		var m map[string]any
		if err := json.Unmarshal([]byte(b), &m); err != nil {
			t.Fatalf("body %q: %v", b, err)
		}
		v, ok := m["schemaVersion"]
		if !ok {
			out = append(out, "absent")
			continue
		}
		out = append(out, strconv.FormatFloat(v.(float64), 'f', -1, 64))
	}
	return out
}

// skewState is the schema part of a pod's state.
type skewState struct {
	Result  PushResult
	Known   bool
	Rev     int
	Dropped []string
}

func skewOf(s PodState) skewState {
	return skewState{s.Result, s.SchemaKnown, s.SchemaVersion, s.Dropped}
}

// A pod not yet known is pushed at this build's revision; an old
// dispatcher's 400 without a header is pushed again at once at revision
// 0, and later pushes are written at 0 from the start.
func TestPusherPushesAnOldDispatcherAtItsRevision(t *testing.T) {
	old := &oldDispatcher{}
	d := newDispatcherServer(t, serverOptions{token: "tok", wrap: func(http.Handler) http.Handler { return old }})
	h := startPusher(t, writeToken(t, "tok"))
	h.p.Sync(testPool, []Target{target("u1", d, 1)}, false)
	h.next(t)
	want := skewState{Result: PushOK, Known: true, Rev: 0}
	if diff := cmp.Diff(want, skewOf(h.p.States(testPool)[0])); diff != "" {
		t.Errorf("state (-want +got):\n%s", diff)
	}
	h.p.Sync(testPool, []Target{target("u1", d, 2)}, false)
	h.next(t)
	if diff := cmp.Diff([]string{strconv.Itoa(policy.SchemaVersion), "absent", "absent"}, old.revisions(t)); diff != "" {
		t.Errorf("schemaVersion of the bodies (-want +got):\n%s", diff)
	}
	if s := h.p.States(testPool)[0]; s.AckedVersion != 2 || s.Failures != 0 {
		t.Errorf("state %+v, want acked 2 without failures", s)
	}
}

// A policy an old dispatcher refuses at its own revision too is rejected
// after the one re-push, and retried at that revision only.
func TestPusherOldDispatcherRefusesThePolicyAtItsRevisionToo(t *testing.T) {
	old := &oldDispatcher{invalid: true}
	d := newDispatcherServer(t, serverOptions{token: "tok", wrap: func(http.Handler) http.Handler { return old }})
	h := startPusher(t, writeToken(t, "tok"))
	h.p.Sync(testPool, []Target{target("u1", d, 1)}, false)
	h.next(t)
	s := h.p.States(testPool)[0]
	if diff := cmp.Diff(skewState{Result: PushRejected, Known: true, Rev: 0}, skewOf(s)); diff != "" {
		t.Errorf("state (-want +got):\n%s", diff)
	}
	wantMsg := "dispatcher rejected the policy: " + d.addr() + " answered 400: invalid_policy: the policy has 1 error(s); the previous policy stays"
	if s.Err == nil || s.Err.Error() != wantMsg {
		t.Errorf("error %v\nwant  %s", s.Err, wantMsg)
	}
	h.expect(t, "u1", pushBackoff)
	h.clk.Step(h.retryIn(testPool, "u1"))
	h.next(t)
	if diff := cmp.Diff([]string{strconv.Itoa(policy.SchemaVersion), "absent", "absent"}, old.revisions(t)); diff != "" {
		t.Errorf("schemaVersion of the bodies (-want +got):\n%s", diff)
	}
}

// A current dispatcher (the real admin API) declares this build's
// revision: one PUT at it, and a 400 it sends is not pushed again.
func TestPusherPushesACurrentDispatcherAtThisRevision(t *testing.T) {
	var mu sync.Mutex
	var bodies []string
	record := func(inner http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			mu.Lock()
			bodies = append(bodies, string(b))
			mu.Unlock()
			r.Body = io.NopCloser(strings.NewReader(string(b)))
			inner.ServeHTTP(w, r)
		})
	}
	d := newDispatcherServer(t, serverOptions{token: "tok", wrap: record})
	h := startPusher(t, writeToken(t, "tok"))
	h.p.Sync(testPool, []Target{target("u1", d, 1)}, false)
	h.next(t)
	if diff := cmp.Diff(skewState{Result: PushOK, Known: true, Rev: policy.SchemaVersion}, skewOf(h.p.States(testPool)[0])); diff != "" {
		t.Errorf("state (-want +got):\n%s", diff)
	}
	bad := target("u1", d, 2)
	bad.Policy.Slots = -1
	h.p.Sync(testPool, []Target{bad}, false)
	h.next(t)
	if diff := cmp.Diff(skewState{Result: PushRejected, Known: true, Rev: policy.SchemaVersion}, skewOf(h.p.States(testPool)[0])); diff != "" {
		t.Errorf("state after an invalid policy (-want +got):\n%s", diff)
	}
	mu.Lock()
	defer mu.Unlock()
	rev := strconv.Itoa(policy.SchemaVersion)
	if diff := cmp.Diff([]string{rev, rev}, bodyRevisions(t, bodies)); diff != "" {
		t.Errorf("schemaVersion of the bodies (-want +got):\n%s", diff)
	}
}

// revisionOneDispatcher answers like a dispatcher of schema revision 1
// (the release before the token budgets): it declares revision 1 on every
// answer, refuses a newer schemaVersion, and refuses the fields of
// revision 2 as unknown, as its strict decoder did.
type revisionOneDispatcher struct {
	mu     sync.Mutex
	bodies []string
}

func (o *revisionOneDispatcher) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	o.mu.Lock()
	o.bodies = append(o.bodies, string(b))
	o.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set(policy.SchemaHeader, "1")
	var p policy.Policy
	_ = json.Unmarshal(b, &p)
	switch {
	case p.SchemaVersion > 1:
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, `{"error":{"type":"unsupported_schema","message":"schemaVersion `+strconv.Itoa(p.SchemaVersion)+` is newer than 1"}}`)
	case strings.Contains(string(b), `"limits"`) || strings.Contains(string(b), `"tenantLimits"`) || strings.Contains(string(b), `"tokens"`):
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, `{"error":{"type":"invalid_policy","message":"unknown field"}}`)
	default:
		_, _ = io.WriteString(w, `{"version":`+strconv.FormatInt(p.Version, 10)+`,"schemaVersion":1,"stats":{}}`)
	}
}

// A revision-1 dispatcher is pushed the policy without the budgets and
// the token settings, after one refused push at this build's revision,
// and its state names the fields in use it cannot enforce (what the
// DispatcherSkew condition reports).
func TestPusherPushesARevisionOneDispatcherWithoutTheBudgets(t *testing.T) {
	old := &revisionOneDispatcher{}
	d := newDispatcherServer(t, serverOptions{token: "tok", wrap: func(http.Handler) http.Handler { return old }})
	h := startPusher(t, writeToken(t, "tok"))
	tgt := target("u1", d, 1)
	tgt.Policy.Tokens = &policy.Tokens{DefaultMaxTokens: 512}
	tgt.Policy.Tiers[0].TenantLimits = &policy.Limits{RequestsPerMinute: 60}
	tgt.Policy.Tenants = []policy.Tenant{{ID: "acme", Tier: "premium", Limits: &policy.Limits{TokensPerMinute: 1000}}}
	h.p.Sync(testPool, []Target{tgt}, false)
	h.next(t)
	want := skewState{Result: PushOK, Known: true, Rev: 1, Dropped: []string{"tokens", "tiers[].tenantLimits", "tenants[].limits"}}
	if diff := cmp.Diff(want, skewOf(h.p.States(testPool)[0])); diff != "" {
		t.Errorf("state (-want +got):\n%s", diff)
	}
	old.mu.Lock()
	bodies := append([]string(nil), old.bodies...)
	old.mu.Unlock()
	if diff := cmp.Diff([]string{strconv.Itoa(policy.SchemaVersion), "1"}, bodyRevisions(t, bodies)); diff != "" {
		t.Fatalf("schemaVersion of the bodies (-want +got):\n%s", diff)
	}
	var got policy.Policy
	if err := json.Unmarshal([]byte(bodies[1]), &got); err != nil {
		t.Fatal(err)
	}
	if got.Tokens != nil || got.Tiers[0].TenantLimits != nil || got.Tenants[0].Limits != nil || got.Tenants[0].ID != "acme" {
		t.Errorf("the revision-1 push carries %s", bodies[1])
	}
	if tgt.Policy.Tenants[0].Limits == nil || tgt.Policy.Tiers[0].TenantLimits == nil {
		t.Error("clearing the fields for the old pod wrote through the target's policy")
	}
}
