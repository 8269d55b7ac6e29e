package fleet

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/tiergate/tiergate/dispatcher/queue/gate"
	"github.com/tiergate/tiergate/internal/redistest"
)

// TestExchangeScriptHandsOff plays three dispatchers on a pool of two
// slots, one exchange at a time, and checks each exchange's codes, its
// re-check hint, the waiting, starved and handoff sets and what it
// announced.
func TestExchangeScriptHandsOff(t *testing.T) {
	s := redistest.Start(t, redistest.Options{})
	c := rawClient(t, s)
	ctx := context.Background()
	ks := keysFor("ns/pool")
	sub := c.Subscribe(ctx, ks.freed())
	defer sub.Close()
	if _, err := sub.ReceiveTimeout(ctx, 5*time.Second); err != nil { // the subscription ack
		t.Fatalf("subscribe: %v", err)
	}
	seed(t, c, ks.slots(), map[string]int64{"x1": far, "x2": far}) // d1's two slots
	seed(t, c, ks.tierQueued("free"), map[string]int64{"q": far, "e1": far, "e2": far, "r": far})
	ret := func(m string) xreturn { return xreturn{m, [2]string{ks.slots(), ks.tenantSlots("t" + m)}} }
	claim := func(m string) xclaim { return xclaim{m, "t" + m, 1} }

	steps := []struct {
		name, id       string
		returns        []xreturn
		claims         []xclaim
		want           []int64
		wait           int64 // about, in ms; 0: none
		slots          []string
		waiting        []string
		starved, holds []string
		announced      bool
	}{
		{name: "refused for the pool, d2 waits and is starved", id: "d2", claims: []xclaim{claim("q")},
			want: []int64{resPoolFull}, wait: far, slots: []string{"x1", "x2"},
			waiting: []string{"d2"}, starved: []string{"d2"}},
		{name: "the slot d1 frees is held for d2, not d1's own claim", id: "d1", returns: []xreturn{ret("x1")}, claims: []xclaim{claim("e1")},
			want: []int64{resPoolFull}, wait: testHold, slots: []string{"x2"},
			waiting: []string{"d1", "d2"}, starved: []string{"d1", "d2"}, holds: []string{"d2"}, announced: true},
		{name: "the hold outlives d1's next try", id: "d1", claims: []xclaim{claim("e1")},
			want: []int64{resPoolFull}, wait: testHold, slots: []string{"x2"},
			waiting: []string{"d1", "d2"}, starved: []string{"d1", "d2"}, holds: []string{"d2"}},
		{name: "d2 spends its hold and waits no more", id: "d2", claims: []xclaim{claim("q")},
			want: []int64{resOK}, slots: []string{"q", "x2"},
			waiting: []string{"d1"}, starved: []string{"d1"}},
		{name: "with nobody else starved d1 keeps what it frees", id: "d1", returns: []xreturn{ret("x2")}, claims: []xclaim{claim("e1"), claim("e2")},
			want: []int64{resOK, resPoolFull}, wait: testTTL, slots: []string{"e1", "q"},
			waiting: []string{"d1"}, starved: []string{"d1"}},
		{name: "d3 starves too", id: "d3", claims: []xclaim{claim("r")},
			want: []int64{resPoolFull}, wait: testTTL, slots: []string{"e1", "q"},
			waiting: []string{"d1", "d3"}, starved: []string{"d1", "d3"}},
		{name: "a release goes to the longest starved", id: "d2", returns: []xreturn{ret("q")},
			slots: []string{"e1"}, waiting: []string{"d1", "d3"}, starved: []string{"d1", "d3"}, holds: []string{"d1"}, announced: true},
		{name: "d1 spends its hold and frees one for d3", id: "d1", returns: []xreturn{ret("e1")}, claims: []xclaim{claim("e2")},
			want: []int64{resOK}, slots: []string{"e2"},
			waiting: []string{"d3"}, starved: []string{"d3"}, holds: []string{"d3"}, announced: true},
		{name: "a tenant refusal starves nobody and spends the hold", id: "d3", claims: []xclaim{{"r", "te2", 1}},
			want: []int64{resTenantFull}, wait: testTTL, slots: []string{"e2"},
			waiting: []string{"d3"}},
	}
	for _, st := range steps {
		got := runExchangeAs(t, c, st.id, 2, st.returns, st.claims)
		if diff := cmp.Diff(st.want, got[:len(got)-1], cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("%s: codes (-want +got):\n%s", st.name, diff)
		}
		if w := got[len(got)-1]; (st.wait == 0) != (w == 0) || w <= st.wait-1000 || w > st.wait {
			t.Errorf("%s: wait = %dms, want about %dms", st.name, w, st.wait)
		}
		for _, set := range []struct {
			key  string
			want []string
		}{{ks.slots(), st.slots}, {ks.waiting(), st.waiting}, {ks.starved(), st.starved}, {ks.handoff(), st.holds}} {
			if diff := cmp.Diff(set.want, members(t, c, set.key), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("%s: %s (-want +got):\n%s", st.name, set.key, diff)
			}
		}
		// A PUBLISH after each step orders the channel: the step's own
		// message, if any, arrives before this marker.
		c.Publish(ctx, ks.freed(), "marker")
		m, err := sub.ReceiveMessage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got := m.Payload != "marker"; got != st.announced {
			t.Errorf("%s: message %q, want an announcement %v", st.name, m.Payload, st.announced)
		}
		if m.Payload != "marker" {
			if m.Payload != st.id {
				t.Errorf("%s: payload %q, want %q", st.name, m.Payload, st.id)
			}
			if m, err = sub.ReceiveMessage(ctx); err != nil || m.Payload != "marker" {
				t.Fatalf("%s: after the announcement got %v, %v", st.name, m, err)
			}
		}
	}
}

// TestUnspentHoldIdlesItsSlotAtMostTheHold: a dispatcher starved for the
// pool that never claims again (its queue emptied) holds the slot freed
// for it only for HandoffHold. The dispatcher refused meanwhile is told to
// re-check when the hold ends, and then gets the slot.
func TestUnspentHoldIdlesItsSlotAtMostTheHold(t *testing.T) {
	s := redistest.Start(t, redistest.Options{})
	const hold = 200 * time.Millisecond
	cfg := Config{LeaseTTL: 5 * time.Second, RenewInterval: time.Second, HandoffHold: hold}
	woken := make(chan time.Time, 8)
	gs := make([]*Redis, 2)
	for i, id := range []string{"d1", "d2"} {
		gs[i] = newGate(t, s, id, cfg)
		gs[i].ObservePolicy(fleetPolicy("ns/idle", 1))
		if i == 0 {
			gs[i].Start(func() {
				select {
				case woken <- time.Now():
				default:
				}
			})
		} else {
			gs[i].Start(func() {})
		}
	}
	l := newLeases(t, gs...)
	l.enqueue(0, "a", "a", 5, 5, gate.OK, 1)
	l.claim(1, 1, results(gate.OK), "a")
	l.enqueue(1, "b", "b", 5, 5, gate.OK, 1)
	l.claim(1, 1, results(gate.PoolFull), "b") // d2 is starved
	l.give("b")                                // and its queue empties
	l.enqueue(0, "c", "c", 5, 5, gate.OK, 1)
	for len(woken) > 0 {
		<-woken
	}
	start := time.Now()
	cs := []gate.Claim{{Lease: l.byName["c"], TenantLimit: 1}}
	gs[0].Exchange(1, []gate.Lease{l.byName["a"]}, cs) // a's slot is held for d2
	if cs[0].Result != gate.PoolFull {
		t.Fatalf("c: %v, want PoolFull: a's slot is held for d2", cs[0].Result)
	}
	select {
	case at := <-woken:
		idle := at.Sub(start)
		t.Logf("the held slot idled %s (hold %s)", idle.Round(time.Millisecond), hold)
		if idle < hold-50*time.Millisecond || idle > hold+time.Second {
			t.Errorf("re-check after %s, want about the hold %s", idle, hold)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no re-check within 5s of the hold")
	}
	l.claim(1, 1, results(gate.OK), "c")
}

// TestLeavingGivesItsHoldBack: a starved dispatcher that closes takes its
// hold and its waiting entries out at once, so the slot held for it is
// free for the others before the hold ends.
func TestLeavingGivesItsHoldBack(t *testing.T) {
	s := redistest.Start(t, redistest.Options{})
	c := rawClient(t, s)
	cfg := Config{LeaseTTL: 5 * time.Second, RenewInterval: time.Second, HandoffHold: time.Minute}
	gs := []*Redis{newGate(t, s, "d1", cfg), newGate(t, s, "d2", cfg)}
	for _, g := range gs {
		g.ObservePolicy(fleetPolicy("ns/leave", 1))
		g.Start(func() {})
	}
	l := newLeases(t, gs...)
	l.enqueue(0, "a", "a", 5, 5, gate.OK, 1)
	l.claim(1, 1, results(gate.OK), "a")
	l.enqueue(1, "b", "b", 5, 5, gate.OK, 1)
	l.claim(1, 1, results(gate.PoolFull), "b")
	l.enqueue(0, "c", "c", 5, 5, gate.OK, 2)
	l.give("a")
	l.claim(1, 1, results(gate.PoolFull), "c") // held for d2, for a minute
	ks := keysFor("ns/leave")
	if diff := cmp.Diff([]string{"d2"}, members(t, c, ks.handoff())); diff != "" {
		t.Fatalf("holds (-want +got):\n%s", diff)
	}
	_ = gs[1].Close()
	if diff := cmp.Diff([]string{}, members(t, c, ks.handoff()), cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("holds after d2 left (-want +got):\n%s", diff)
	}
	for _, k := range []string{ks.starved(), ks.waiting()} {
		if diff := cmp.Diff([]string{"d1"}, members(t, c, k)); diff != "" {
			t.Errorf("%s after d2 left (-want +got):\n%s", k, diff)
		}
	}
	l.claim(1, 1, results(gate.OK), "c")
}
