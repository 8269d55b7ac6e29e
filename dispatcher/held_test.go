package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	clocktesting "k8s.io/utils/clock/testing"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/dispatcher/fleet"
	"github.com/tiergate/tiergate/dispatcher/queue"
	"github.com/tiergate/tiergate/internal/redistest"
	"github.com/tiergate/tiergate/internal/testutil"
)

// heldPol is pol at zero replicas, holding for a first replica 12s away:
// tier "fast" (W 5s, tenant "f") cannot wait that long and has bound 0,
// "free" (the default tier) holds 2.
func heldPol(version int64) *policy.Policy {
	p := pol(version, 0)
	p.Backends = nil
	p.ColdStartSeconds = 12
	p.Tiers[0].TolerableWaitSeconds = 30
	p.Tiers = append(p.Tiers, policy.Tier{Name: "fast", TolerableWaitSeconds: 5, QueueBound: 0, TenantConcurrencyLimit: 1, TenantQueueLimit: 1})
	p.Tenants = append(p.Tenants, policy.Tenant{ID: "f", Tier: "fast"})
	return p
}

// The ack carries the queue's report: what it holds now and the offered
// load per tier, on the dispatcher's clock. A held dispatcher stays Ready.
func TestAckReportsOfferedLoadAndHeld(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	d, err := New(Config{Clock: clk, Log: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	ack, err := d.Apply(heldPol(1))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(policy.Ack{Version: 1}, ack); diff != "" {
		t.Errorf("first ack (-want +got):\n%s", diff)
	}
	if ok, why := d.Ready(); !ok {
		t.Errorf("not Ready while held: %s", why)
	}
	clk.Step(20 * time.Second)
	var held []*queue.Handle
	for _, tenant := range []string{"a", "b"} {
		h, err := d.q.Admit(tenant, "free")
		if err != nil {
			t.Fatalf("held admission: %v", err)
		}
		held = append(held, h)
	}
	if _, err := d.q.Admit("c", "free"); !errors.Is(err, queue.ErrQueueFull) {
		t.Fatalf("past free's bound at zero: %v", err)
	}
	if _, err := d.q.Admit("f", "fast"); !errors.As(err, new(*queue.ColdStartRefusal)) {
		t.Fatalf("fast at zero: %v", err)
	}
	ack, err = d.Apply(heldPol(1)) // a resync
	if err != nil {
		t.Fatal(err)
	}
	// Three requests reached free and one fast at t=20s, read over the 20s
	// since the first policy with τ = 60s.
	per := 1 / (60 * -math.Expm1(-20.0/60))
	want := policy.Ack{Version: 1, Stats: policy.Measured{Queued: 2, OfferedLoad: map[string]float64{"free": 3 * per, "fast": per}}}
	if diff := cmp.Diff(want, ack, cmpopts.EquateApprox(1e-12, 0)); diff != "" {
		t.Errorf("ack while held (-want +got):\n%s", diff)
	}
	ack, err = d.Apply(pol(2, 1)) // the first replica: both run, one after the other
	if err != nil {
		t.Fatal(err)
	}
	if ack.Stats.Queued != 1 {
		t.Errorf("queued after the first replica %d, want 1 (one slot)", ack.Stats.Queued)
	}
	for _, h := range held {
		if err := h.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
		h.Release()
	}
}

// In fleet mode a held dispatcher takes no slot in Redis and asks for
// none; the first policy with slots starts its exchanges, and the held
// requests get the pool's slots through Redis.
func TestHeldInFleetMode(t *testing.T) {
	rs := redistest.Start(t, redistest.Options{})
	p := heldPol(1)
	p.Pool, p.SharedState = "ns/p", policy.StateRedis
	file := filepath.Join(t.TempDir(), "policy.json")
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
	cli := func(args ...string) string { return strings.TrimSpace(rs.CLI("", args...)) }
	testutil.EventuallyTrue(t, 5*time.Second, "d1 registered in Redis", func() bool {
		return cli("ZRANGE", "tg:{ns/p}:dispatchers", "0", "-1") == "d1"
	})
	var held []*queue.Handle
	for _, tenant := range []string{"a", "b"} {
		h, err := d.q.Admit(tenant, "free")
		if err != nil {
			t.Fatalf("held admission in fleet mode: %v", err)
		}
		held = append(held, h)
	}
	if _, err := d.q.Admit("c", "free"); !errors.Is(err, queue.ErrQueueFull) {
		t.Fatalf("past free's fleet-wide bound: %v", err)
	}
	d.q.Kick() // as a release elsewhere would: still nothing to claim
	if s := d.q.Stats(); s.Queued != 2 || s.InFlight != 0 || s.Acquiring != 0 {
		t.Fatalf("held: queued %d in flight %d acquiring %d, want 2, 0, 0", s.Queued, s.InFlight, s.Acquiring)
	}
	if n := cli("ZCARD", "tg:{ns/p}:slots"); n != "0" {
		t.Errorf("slots in Redis while held: %s, want 0", n)
	}

	first := pol(2, 1)
	first.Pool, first.SharedState = "ns/p", policy.StateRedis
	if _, err := d.Apply(first); err != nil {
		t.Fatal(err)
	}
	if err := held[0].Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := cli("ZCARD", "tg:{ns/p}:slots"); n != "1" {
		t.Errorf("slots in Redis with the first held request running: %s, want 1", n)
	}
	held[0].Release()
	if err := held[1].Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	held[1].Release()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := cli("ZCARD", "tg:{ns/p}:slots"); n != "0" {
		t.Errorf("slots in Redis after the drain: %s", n)
	}
}
