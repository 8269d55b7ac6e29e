package queue

import (
	"fmt"
)

// checkStructure verifies the queue's internal consistency (DESIGN.md
// section 5 data structures) and returns the first violation found:
// counts agree with the lists, every tenant FIFO and tier list is in order,
// the heap holds exactly the runnable tenants in heap order, and (local
// mode) no runnable tenant waits while a slot is free.
func checkStructure(q *Queue) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	queued, inFlight := 0, 0
	tierQueued := map[*tierState]int{}
	runnable := 0
	for id, ts := range q.tenants {
		if ts.id != id {
			return fmt.Errorf("tenant map key %q holds tenant %q", id, ts.id)
		}
		if ts.queued == 0 && ts.inFlight == 0 {
			return fmt.Errorf("idle tenant %q kept", id)
		}
		n := 0
		var prev *job
		for j := ts.head; j != nil; j = j.next {
			if j.prev != prev {
				return fmt.Errorf("tenant %q: broken prev link", id)
			}
			if j.ts != ts {
				return fmt.Errorf("tenant %q: job of another tenant in its FIFO", id)
			}
			if j.tr != ts.tier {
				return fmt.Errorf("tenant %q: job in tier %q, tenant in tier %q", id, j.tr.name, ts.tier.name)
			}
			if j.h == nil || j.h.state != stQueued || j.h.j != j {
				return fmt.Errorf("tenant %q: queued job with bad handle", id)
			}
			if prev != nil && (j.key < prev.key || (j.key == prev.key && j.seq < prev.seq)) {
				return fmt.Errorf("tenant %q: FIFO not in key order", id)
			}
			if want := q.keyFor(j.tr, j.enq); j.key != want {
				return fmt.Errorf("tenant %q: stale key %d, want %d", id, j.key, want)
			}
			tierQueued[j.tr]++
			prev = j
			n++
		}
		if prev != ts.tail {
			return fmt.Errorf("tenant %q: tail mismatch", id)
		}
		if n != ts.queued {
			return fmt.Errorf("tenant %q: queued=%d but FIFO has %d", id, ts.queued, n)
		}
		if ts.limit != q.limitFor(id, ts.tier) {
			return fmt.Errorf("tenant %q: limit %d, want %d", id, ts.limit, q.limitFor(id, ts.tier))
		}
		queued += n
		inFlight += ts.inFlight
		if q.runnable(ts) != (ts.idx >= 0) {
			return fmt.Errorf("tenant %q: runnable=%v but heap index %d", id, q.runnable(ts), ts.idx)
		}
		if ts.head != nil && (ts.hkey != ts.head.key || ts.hseq != ts.head.seq) {
			return fmt.Errorf("tenant %q: cached head key stale", id)
		}
		if ts.idx >= 0 {
			runnable++
			if ts.idx >= len(q.heap) || q.heap[ts.idx] != ts {
				return fmt.Errorf("tenant %q: heap index %d wrong", id, ts.idx)
			}
		}
	}
	if runnable != len(q.heap) {
		return fmt.Errorf("heap has %d tenants, %d runnable", len(q.heap), runnable)
	}
	for i := 1; i < len(q.heap); i++ {
		if tenantLess(q.heap[i], q.heap[(i-1)/2]) {
			return fmt.Errorf("heap order broken at %d", i)
		}
	}
	if queued != q.queued {
		return fmt.Errorf("queued=%d but FIFOs hold %d", q.queued, queued)
	}
	if inFlight != q.inFlight {
		return fmt.Errorf("inFlight=%d but tenants hold %d", q.inFlight, inFlight)
	}
	tierIn := 0
	for name, tr := range q.tiers {
		if tr.name != name {
			return fmt.Errorf("tier map key %q holds %q", name, tr.name)
		}
		n := 0
		var prev *job
		for j := tr.oldest; j != nil; j = j.tnext {
			if j.tprev != prev || j.tr != tr {
				return fmt.Errorf("tier %q: broken arrival list", name)
			}
			if prev != nil && (j.seq < prev.seq || j.enq < prev.enq) {
				return fmt.Errorf("tier %q: arrival list out of order", name)
			}
			prev = j
			n++
		}
		if prev != tr.newest {
			return fmt.Errorf("tier %q: newest mismatch", name)
		}
		if n != tr.queued || n != tierQueued[tr] {
			return fmt.Errorf("tier %q: queued=%d, list %d, FIFOs %d", name, tr.queued, n, tierQueued[tr])
		}
		if tr.retired && tr.queued == 0 && tr.inFlight == 0 {
			return fmt.Errorf("empty retired tier %q kept", name)
		}
		if tr.queued < 0 || tr.inFlight < 0 {
			return fmt.Errorf("tier %q: negative counts", name)
		}
		tierIn += tr.inFlight
	}
	if tierIn != q.inFlight {
		return fmt.Errorf("tiers hold %d in flight, queue %d", tierIn, q.inFlight)
	}
	if q.gate == nil && q.inFlight < q.slots && len(q.heap) > 0 {
		return fmt.Errorf("work not conserved: %d/%d slots used with %d runnable tenants", q.inFlight, q.slots, len(q.heap))
	}
	if q.queued > 0 && q.timeoutNs > 0 && !q.timerArmed {
		return fmt.Errorf("jobs queued with clientTimeout but no expiry timer")
	}
	return nil
}
