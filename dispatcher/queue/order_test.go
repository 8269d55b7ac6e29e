package queue

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// drainOrder releases the blocker and then each dispatched job in turn and
// returns the tenants in the order they were dispatched.
func drainOrder(t *testing.T, q *Queue, blocker *Handle, hs []*Handle) []string {
	t.Helper()
	var got []string
	blocker.Release()
	done := map[*Handle]bool{}
	for len(done) < len(hs) {
		var next *Handle
		for _, h := range hs {
			if !done[h] && dispatched(h) {
				if next != nil {
					t.Fatalf("two jobs dispatched with one slot: %s and %s", tenantOf(next), tenantOf(h))
				}
				next = h
			}
		}
		if next == nil {
			t.Fatalf("nothing dispatched; order so far %v", got)
		}
		if err := checkStructure(q); err != nil {
			t.Fatal(err)
		}
		got = append(got, tenantOf(next))
		done[next] = true
		next.Release()
	}
	return got
}

func TestSeedClaims(t *testing.T) {
	type arrival struct {
		tenant, tier string
		at           time.Duration
	}
	tests := map[string]struct {
		arrivals []arrival
		want     []string
	}{
		"a free job that has waited 60s outranks a fresh standard job": {
			arrivals: []arrival{{"f", "free", 0}, {"s", "standard", 60 * time.Second}},
			want:     []string{"f", "s"},
		},
		"at 59s the free job is still behind a fresh standard job": {
			arrivals: []arrival{{"f", "free", 0}, {"s", "standard", 59 * time.Second}},
			want:     []string{"s", "f"},
		},
		"at 120s a free job ties with fresh premium and wins on arrival order": {
			arrivals: []arrival{{"f", "free", 0}, {"p", "premium", 120 * time.Second}},
			want:     []string{"f", "p"},
		},
		"at 119s fresh premium still goes first": {
			arrivals: []arrival{{"f", "free", 0}, {"p", "premium", 119 * time.Second}},
			want:     []string{"p", "f"},
		},
		"a standard job that has waited 60s ties with fresh premium and wins": {
			arrivals: []arrival{{"s", "standard", 0}, {"p", "premium", 60 * time.Second}},
			want:     []string{"s", "p"},
		},
		"fresh work is served by tier": {
			arrivals: []arrival{{"f", "free", 0}, {"s", "standard", 0}, {"p", "premium", 0}},
			want:     []string{"p", "s", "f"},
		},
		"one tier is first come first served": {
			arrivals: []arrival{{"a", "standard", 0}, {"b", "standard", 0}, {"c", "standard", time.Second}},
			want:     []string{"a", "b", "c"},
		},
		"ageing interleaves three tiers": {
			// keys (s): f 120, s1 60+30=90, p1 0+100=100, s2 60+110=170
			arrivals: []arrival{{"f", "free", 0}, {"s1", "standard", 30 * time.Second}, {"p1", "premium", 100 * time.Second}, {"s2", "standard", 110 * time.Second}},
			want:     []string{"s1", "p1", "f", "s2"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			q, clk := newTestQueue(t, seedPolicy(1))
			blocker := mustAdmit(t, q, "blocker", "premium")
			var hs []*Handle
			var now time.Duration
			for _, a := range tc.arrivals {
				clk.Step(a.at - now)
				now = a.at
				hs = append(hs, mustAdmit(t, q, a.tenant, a.tier))
			}
			got := drainOrder(t, q, blocker, hs)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("dispatch order (-want +got):\n%s", diff)
			}
		})
	}
}

func TestCappedTenantIsSkipped(t *testing.T) {
	q, clk := newTestQueue(t, seedPolicy(2))
	// free's tenant limit is 1.
	a1 := mustAdmit(t, q, "a", "free")
	p1 := mustAdmit(t, q, "p", "premium")
	clk.Step(time.Second)
	a2 := mustAdmit(t, q, "a", "free")
	clk.Step(time.Second)
	c1 := mustAdmit(t, q, "c", "free")
	clk.Step(time.Second)
	a3 := mustAdmit(t, q, "a", "free")
	clk.Step(time.Second)
	d1 := mustAdmit(t, q, "d", "free")
	if !dispatched(a1) || !dispatched(p1) {
		t.Fatal("a1 and p1 should hold both slots")
	}

	p1.Release() // a is at its cap: c moves ahead of a's older a2
	if dispatched(a2) || !dispatched(c1) {
		t.Fatalf("after p1: a2 dispatched=%v c1 dispatched=%v; want c1 only", dispatched(a2), dispatched(c1))
	}
	if got := q.Stats().TenantInFlight["a"]; got != 1 {
		t.Fatalf("a in flight = %d, want 1", got)
	}
	a1.Release() // a2 kept its place: it goes before d1, which is newer
	if !dispatched(a2) || dispatched(d1) || dispatched(a3) {
		t.Fatalf("after a1: a2=%v d1=%v a3=%v; want a2 only", dispatched(a2), dispatched(d1), dispatched(a3))
	}
	if got := q.Stats().TenantInFlight["a"]; got != 1 {
		t.Fatalf("a in flight = %d, want 1", got)
	}
	c1.Release() // a is capped again (a2), so d1 goes before a3
	if !dispatched(d1) || dispatched(a3) {
		t.Fatalf("after c1: d1=%v a3=%v; want d1", dispatched(d1), dispatched(a3))
	}
	a2.Release()
	if !dispatched(a3) {
		t.Fatal("a3 not dispatched after a2")
	}
	a3.Release()
	d1.Release()
	assertEmpty(t, q)
}

func TestTenantLimitOverride(t *testing.T) {
	p := seedPolicy(4)
	p.Tenants = []policyTenant{{ID: "big", Tier: "free", MaxConcurrency: 3}}
	q, _ := newTestQueue(t, p)
	var hs []*Handle
	for range 4 {
		hs = append(hs, mustAdmit(t, q, "big", "free"))
	}
	n := 0
	for _, h := range hs {
		if dispatched(h) {
			n++
		}
	}
	if n != 3 {
		t.Fatalf("dispatched %d of big's jobs with maxConcurrency 3 and 4 slots", n)
	}
	other := mustAdmit(t, q, "small", "free")
	if !dispatched(other) {
		t.Fatal("small should take the 4th slot")
	}
	for _, h := range append(hs, other) {
		h.Release()
	}
	assertEmpty(t, q)
}

func assertEmpty(t *testing.T, q *Queue) {
	t.Helper()
	if err := checkStructure(q); err != nil {
		t.Fatal(err)
	}
	s := q.Stats()
	if s.Queued != 0 || s.InFlight != 0 || len(s.TenantInFlight) != 0 {
		t.Fatalf("not empty: queued %d, in flight %d, tenants %v", s.Queued, s.InFlight, s.TenantInFlight)
	}
	for name, ts := range s.Tiers {
		if ts.Queued != 0 || ts.InFlight != 0 || ts.Retired {
			t.Fatalf("tier %s not empty: %+v", name, ts)
		}
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.tenants) != 0 || len(q.heap) != 0 {
		t.Fatalf("%d tenants and %d heap entries left", len(q.tenants), len(q.heap))
	}
	tot := s.Totals
	if tot.Admitted != tot.Dispatched+tot.Abandoned+tot.Expired+tot.Drained {
		t.Fatalf("totals do not balance: %+v", tot)
	}
	if s.Completed != tot.Dispatched {
		t.Fatalf("completed %d != dispatched %d", s.Completed, tot.Dispatched)
	}
}
