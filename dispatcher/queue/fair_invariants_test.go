package queue

import "fmt"

// checkFairTenant checks a tenant's places in Tokens mode: out of the
// Requests heap, in its tier's runnable heaps exactly when runnable, in its
// backlog exactly when it has queued jobs, and its queued tokens.
func checkFairTenant(q *Queue, ts *tenant) error {
	tr := ts.tier
	run := q.runnable(ts)
	switch {
	case ts.idx >= 0:
		return fmt.Errorf("tenant %q: in the Requests heap in Tokens mode", ts.id)
	case run != (ts.runIdx >= 0) || run != (ts.pickIdx >= 0):
		return fmt.Errorf("tenant %q: runnable=%v but run/pick indexes %d/%d", ts.id, run, ts.runIdx, ts.pickIdx)
	case (ts.queued > 0) != (ts.backIdx >= 0):
		return fmt.Errorf("tenant %q: queued=%d but backlog index %d", ts.id, ts.queued, ts.backIdx)
	case ts.runIdx >= 0 && (ts.runIdx >= tr.run.len() || tr.run.s[ts.runIdx] != ts):
		return fmt.Errorf("tenant %q: run index %d wrong", ts.id, ts.runIdx)
	case ts.pickIdx >= 0 && (ts.pickIdx >= tr.pick.len() || tr.pick.s[ts.pickIdx] != ts):
		return fmt.Errorf("tenant %q: pick index %d wrong", ts.id, ts.pickIdx)
	case ts.backIdx >= 0 && (ts.backIdx >= tr.back.len() || tr.back.s[ts.backIdx] != ts):
		return fmt.Errorf("tenant %q: backlog index %d wrong", ts.id, ts.backIdx)
	case ts.weight != q.weightFor(ts.id):
		return fmt.Errorf("tenant %q: weight %d, want %d", ts.id, ts.weight, q.weightFor(ts.id))
	}
	return nil
}

// checkFairHeaps checks, in either mode, the queued tokens of every tenant
// and tier, and in Tokens mode the order of every tier's heaps and of the
// heap of tiers, which holds exactly the tiers with a runnable tenant.
func checkFairHeaps(q *Queue) error {
	tierTokens := map[*tierState]int64{}
	for _, ts := range q.tenants {
		var n int64
		for _, l := range [2]*jobList{&ts.fifo, &ts.claimed} {
			for j := l.head; j != nil; j = j.link[byTenant].next {
				n += j.wcost
				if want := q.fair.Cost(j.h.cost.Prompt, j.h.cost.Output); j.wcost != want {
					return fmt.Errorf("tenant %q: job cost %d, want %d", ts.id, j.wcost, want)
				}
			}
		}
		if n != ts.queuedTokens {
			return fmt.Errorf("tenant %q: queuedTokens %d, jobs hold %d", ts.id, ts.queuedTokens, n)
		}
		tierTokens[ts.tier] += n
	}
	for name, tr := range q.tiers {
		if tr.queuedTokens != tierTokens[tr] {
			return fmt.Errorf("tier %q: queuedTokens %d, tenants hold %d", name, tr.queuedTokens, tierTokens[tr])
		}
	}
	if !q.tokens {
		for name, tr := range q.tiers {
			if tr.run.len()+tr.pick.len()+tr.back.len() > 0 || tr.heapIdx >= 0 {
				return fmt.Errorf("tier %q: Tokens heaps in use in Requests mode", name)
			}
		}
		if q.tiersByKey.len() > 0 {
			return fmt.Errorf("heap of tiers in use in Requests mode")
		}
		return nil
	}
	if len(q.heap) > 0 {
		return fmt.Errorf("Requests heap in use in Tokens mode")
	}
	ready := 0
	for name, tr := range q.tiers {
		for _, h := range []*iheap[*tenant]{&tr.run, &tr.pick, &tr.back} {
			if err := heapOrdered(h); err != nil {
				return fmt.Errorf("tier %q: %v", name, err)
			}
			for _, ts := range h.s {
				if ts.tier != tr || q.tenants[ts.id] != ts {
					return fmt.Errorf("tier %q: heap holds tenant %q of another tier or dropped", name, ts.id)
				}
			}
		}
		in := tr.heapIdx >= 0 && tr.heapIdx < q.tiersByKey.len() && q.tiersByKey.s[tr.heapIdx] == tr
		if in != (tr.run.len() > 0) {
			return fmt.Errorf("tier %q: in the heap of tiers %v with %d runnable tenants", name, in, tr.run.len())
		}
		if in {
			ready++
		}
	}
	if ready != q.tiersByKey.len() {
		return fmt.Errorf("heap of tiers holds %d, %d tiers ready", q.tiersByKey.len(), ready)
	}
	return heapOrdered(&q.tiersByKey)
}

func heapOrdered[T comparable](h *iheap[T]) error {
	for i := range h.s {
		if *h.at(h.s[i]) != i {
			return fmt.Errorf("heap index of element %d is %d", i, *h.at(h.s[i]))
		}
		if i > 0 && h.less(h.s[i], h.s[(i-1)/2]) {
			return fmt.Errorf("heap order broken at %d", i)
		}
	}
	return nil
}
