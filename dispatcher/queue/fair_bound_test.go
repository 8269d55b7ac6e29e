package queue

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

// TestVTCBound checks the bound Tokens mode keeps between two tenants of
// one tier while both stay backlogged and runnable, with no Settle or
// shared counter applied: |c_f − c_g| ≤ max(D0, U), where D0 is the gap
// when both became backlogged and U the largest cost ÷ weight of one of
// their dispatched jobs. (The slot goes to the smaller counter, which then
// grows by at most U.) Over any such interval the weighted service they
// got therefore differs by at most D0 + max(D0, U) ≤ 2U when D0 ≤ U, as
// here. A third tenant shares the tier; random sizes, weights and
// releases. The seed is logged.
func TestVTCBound(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 23))
	for run := range 50 {
		wf, wg := 1+rng.IntN(3), 1+rng.IntN(3)
		p := oneTier(3, policy.Tenant{ID: "f", Tier: "std", Weight: wf}, policy.Tenant{ID: "g", Tier: "std", Weight: wg})
		q, clk := newTestQueue(t, p)
		var running []*Handle
		q.setOnDispatch(func(h *Handle) { running = append(running, h) })
		u := 0.0
		cost := func(id string, w int) Cost {
			c := Cost{Prompt: rng.Int64N(3000), Output: rng.Int64N(500)}
			if id != "x" {
				u = max(u, float64(q.fair.Cost(c.Prompt, c.Output))/float64(w))
			}
			return c
		}
		top := func() { // keep f and g backlogged: two queued each
			for _, id := range []string{"f", "g"} {
				w := map[string]int{"f": wf, "g": wg}[id]
				for queuedOf(q, id) < 2 {
					mustAdmitCost(t, q, id, cost(id, w))
				}
			}
		}
		mustAdmitCost(t, q, "x", cost("x", 1)) // the slots fill first
		top()
		d0 := -1.0
		for step := range 400 {
			if rng.IntN(3) == 0 && queuedOf(q, "x") < 3 {
				mustAdmitCost(t, q, "x", cost("x", 1))
			}
			if len(running) > 0 {
				i := rng.IntN(len(running))
				h := running[i]
				running = append(running[:i], running[i+1:]...)
				h.Release()
			}
			top()
			clk.Step(time.Millisecond)
			gap := counterOf(q, "f") - counterOf(q, "g")
			if gap < 0 {
				gap = -gap
			}
			if d0 < 0 {
				d0 = gap
			}
			if lim := max(d0, u); gap > lim*(1+1e-12) {
				t.Fatalf("seed %d run %d step %d: |c_f − c_g| = %v over max(D0 %v, U %v)", seed, run, step, gap, d0, u)
			}
			st := q.Stats().Tiers["std"]
			if g := st.FairnessGapTokens; g < gap*(1-1e-12) {
				t.Fatalf("FairnessGapTokens %v below the gap %v of two backlogged tenants", g, gap)
			}
			// The bound the metric reports is U over the jobs dispatched
			// so far (x's included), and it holds too.
			if b := st.FairnessGapBoundTokens; b <= 0 || gap > max(d0, b)*(1+1e-12) {
				t.Fatalf("seed %d run %d step %d: gap %v, D0 %v, reported bound %v (u %v)", seed, run, step, gap, d0, b, u)
			}
		}
	}
}

func queuedOf(q *Queue, id string) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	if ts := q.tenants[id]; ts != nil {
		return ts.queued
	}
	return 0
}

// TestSharedCounters: ApplySharedCounters moves a counter by the change
// of the others' value, takes max for a tenant seen for the first time,
// leaves absent tenants alone, keeps idle values above the floor only, and
// re-orders the tier; the sink hears charges, not the shared values.
func TestSharedCounters(t *testing.T) {
	p := oneTier(1)
	var sunk []string
	q, _ := newTestQueue(t, p, WithCounterSink(func(tier, tenant string, d float64) {
		sunk = append(sunk, fmt.Sprintf("%s/%s %+g", tier, tenant, d))
	}))
	var order []string
	var running []*Handle
	q.setOnDispatch(func(h *Handle) { order, running = append(order, h.tenant), append(running, h) })
	mustAdmitCost(t, q, "warm", Cost{10, 0})
	for range 3 {
		mustAdmitCost(t, q, "a", Cost{100, 0})
		mustAdmitCost(t, q, "b", Cost{100, 0})
	}
	// Both lifted to 10 (warm, last served). Others charged a 500: a
	// becomes 500 (a first value: max with its own), then 520 (+20 since);
	// b stays; an idle tenant c above the floor is kept, d below it is not.
	q.ApplySharedCounters("std", map[string]float64{"a": 500, "c": 900, "d": 3})
	q.ApplySharedCounters("nope", map[string]float64{"a": 1e9})
	q.ApplySharedCounters("std", map[string]float64{"a": 520}) // +20 since
	got := map[string]float64{"a": counterOf(q, "a"), "b": counterOf(q, "b")}
	if diff := cmp.Diff(map[string]float64{"a": 520, "b": 10}, got); diff != "" {
		t.Errorf("counters (-want +got):\n%s", diff)
	}
	q.mu.Lock()
	idle := map[string]float64{}
	for id, e := range q.tiers["std"].idle {
		idle[id] = e.vc
	}
	q.mu.Unlock()
	if diff := cmp.Diff(map[string]float64{"c": 900}, idle); diff != "" {
		t.Errorf("idle counters (-want +got):\n%s", diff)
	}
	for i := 0; i < len(running); i++ {
		running[i].Release()
	}
	want := []string{"warm", "b", "b", "b", "a", "a", "a"}
	if diff := cmp.Diff(want, order); diff != "" {
		t.Errorf("dispatch order (-want +got):\n%s", diff)
	}
	wantSunk := []string{"std/warm +10", "std/b +100", "std/b +100", "std/b +100", "std/a +100", "std/a +100", "std/a +100"}
	if diff := cmp.Diff(wantSunk, sunk); diff != "" {
		t.Errorf("sink (-want +got):\n%s", diff)
	}
}

// TestIdleCountersBounded: a stream of one-off tenants, each served once,
// leaves the tier's idle counters bounded: those a lift would overwrite
// are pruned.
func TestIdleCountersBounded(t *testing.T) {
	q, _ := newTestQueue(t, oneTier(1))
	var running []*Handle
	ran := ""
	q.setOnDispatch(func(h *Handle) { running, ran = append(running, h), h.tenant })
	kept := 0
	for i := range 3000 {
		for queuedOf(q, "steady") < 2 {
			mustAdmitCost(t, q, "steady", Cost{50, 0})
		}
		once := fmt.Sprint("once", i)
		mustAdmitCost(t, q, once, Cost{int64(1 + i%100), 0})
		for ran != once {
			h := running[0]
			running = running[1:]
			h.Release()
		}
		q.mu.Lock()
		kept = max(kept, len(q.tiers["std"].idle))
		q.mu.Unlock()
	}
	if kept < 2 || kept > 2*idleSweepMin+1 {
		t.Errorf("at most %d idle counters kept over 3000 one-off tenants, want some and at most %d", kept, 2*idleSweepMin+1)
	}
}
