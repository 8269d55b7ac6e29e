package queue

import (
	"fmt"
)

// checkStructure verifies the queue's internal consistency (the data
// structures of docs/architecture.md#the-queue) and returns the first violation found:
// counts agree with the lists, every tenant FIFO and tier list is in order,
// the heap holds exactly the runnable tenants in heap order, (local mode)
// no runnable tenant waits while a slot is free, and (fleet mode) a pump
// is scheduled whenever an exchange is due.
func checkStructure(q *Queue) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	queued, inFlight, nClaimed := 0, 0, 0
	tierQueued := map[*tierState]int{}
	runnable := 0
	for id, ts := range q.tenants {
		if ts.id != id {
			return fmt.Errorf("tenant map key %q holds tenant %q", id, ts.id)
		}
		if ts.queued == 0 && ts.inFlight == 0 {
			return fmt.Errorf("idle tenant %q kept", id)
		}
		n, err := checkFIFO(q, ts, tierQueued)
		if err != nil {
			return err
		}
		claimed, err := checkClaimed(q, ts, tierQueued)
		if err != nil {
			return err
		}
		if n+claimed != ts.queued || claimed != ts.nClaimed {
			return fmt.Errorf("tenant %q: queued=%d claimed=%d but FIFO has %d and claimed list %d", id, ts.queued, ts.nClaimed, n, claimed)
		}
		nClaimed += claimed
		n += claimed
		if ts.limit != q.limitFor(id, ts.tier) {
			return fmt.Errorf("tenant %q: limit %d, want %d", id, ts.limit, q.limitFor(id, ts.tier))
		}
		queued += n
		inFlight += ts.inFlight
		if q.tokens {
			if err := checkFairTenant(q, ts); err != nil {
				return err
			}
		} else if q.runnable(ts) != (ts.idx >= 0) {
			return fmt.Errorf("tenant %q: runnable=%v but heap index %d", id, q.runnable(ts), ts.idx)
		}
		if h := ts.fifo.head; h != nil && (ts.hkey != h.key || ts.hseq != h.seq) {
			return fmt.Errorf("tenant %q: cached head key stale", id)
		}
		if ts.idx >= 0 {
			runnable++
			if ts.idx >= len(q.heap) || q.heap[ts.idx] != ts {
				return fmt.Errorf("tenant %q: heap index %d wrong", id, ts.idx)
			}
		}
	}
	if err := checkFairHeaps(q); err != nil {
		return err
	}
	if runnable != len(q.heap) {
		return fmt.Errorf("heap has %d tenants, %d runnable", len(q.heap), runnable)
	}
	for i := 1; i < len(q.heap); i++ {
		if tenantLess(q.heap[i], q.heap[(i-1)/2]) {
			return fmt.Errorf("heap order broken at %d", i)
		}
	}
	if nClaimed != q.fleet.claimed {
		return fmt.Errorf("fleet.claimed=%d but tenants hold %d claimed", q.fleet.claimed, nClaimed)
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
		n, err := checkArrival(tr)
		if err != nil {
			return err
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
	if q.gate == nil && q.inFlight < q.slots && q.bestTenant() != nil {
		return fmt.Errorf("work not conserved: %d/%d slots used with a runnable tenant", q.inFlight, q.slots)
	}
	if q.gate != nil && !q.fleet.pumping && q.exchangeDue() {
		return fmt.Errorf("an exchange is due (%d returns, claimable work %v) but no pump is scheduled", len(q.fleet.returns), q.canClaim())
	}
	if q.queued > 0 && q.timeoutNs > 0 && !q.timerArmed {
		return fmt.Errorf("jobs queued with clientTimeout but no expiry timer")
	}
	return nil
}

// checkFIFO checks a tenant's FIFO: links, order, keys and handles.
func checkFIFO(q *Queue, ts *tenant, tierQueued map[*tierState]int) (int, error) {
	id := ts.id
	n := 0
	var prev *job
	for j := ts.fifo.head; j != nil; j = j.link[byTenant].next {
		if j.link[byTenant].prev != prev {
			return 0, fmt.Errorf("tenant %q: broken prev link", id)
		}
		if j.ts != ts {
			return 0, fmt.Errorf("tenant %q: job of another tenant in its FIFO", id)
		}
		if j.tr != ts.tier {
			return 0, fmt.Errorf("tenant %q: job in tier %q, tenant in tier %q", id, j.tr.name, ts.tier.name)
		}
		if j.h == nil || j.h.state != stQueued || j.h.j != j || j.fleet != fleetNone {
			return 0, fmt.Errorf("tenant %q: queued job with bad handle or fleet state %d", id, j.fleet)
		}
		if prev != nil && (j.key < prev.key || (j.key == prev.key && j.seq < prev.seq)) {
			return 0, fmt.Errorf("tenant %q: FIFO not in key order", id)
		}
		if want := q.keyFor(j.tr, j.enq); j.key != want {
			return 0, fmt.Errorf("tenant %q: stale key %d, want %d", id, j.key, want)
		}
		if (q.gate != nil) != (j.lease != 0) {
			return 0, fmt.Errorf("tenant %q: queued job with lease %d", id, j.lease)
		}
		tierQueued[j.tr]++
		prev = j
		n++
	}
	if prev != ts.fifo.tail {
		return 0, fmt.Errorf("tenant %q: tail mismatch", id)
	}
	return n, nil
}

// checkClaimed checks a tenant's claimed jobs (fleet mode): queued, in
// its tier, with a lease, and part of the exchange in flight.
func checkClaimed(q *Queue, ts *tenant, tierQueued map[*tierState]int) (int, error) {
	n := 0
	var prev *job
	for j := ts.claimed.head; j != nil; j = j.link[byTenant].next {
		if j.link[byTenant].prev != prev || j.ts != ts || j.tr != ts.tier {
			return 0, fmt.Errorf("tenant %q: broken claimed list", ts.id)
		}
		if j.fleet != fleetClaimed || j.h.state != stQueued || j.lease == 0 || q.gate == nil {
			return 0, fmt.Errorf("tenant %q: claimed job in fleet state %d, handle state %d, lease %d", ts.id, j.fleet, j.h.state, j.lease)
		}
		if want := q.keyFor(j.tr, j.enq); j.key != want {
			return 0, fmt.Errorf("tenant %q: claimed job with stale key %d, want %d", ts.id, j.key, want)
		}
		in := false
		for _, b := range q.fleet.batch {
			in = in || b == j
		}
		if !in {
			return 0, fmt.Errorf("tenant %q: claimed job outside the exchange in flight", ts.id)
		}
		tierQueued[j.tr]++
		prev = j
		n++
	}
	if prev != ts.claimed.tail {
		return 0, fmt.Errorf("tenant %q: claimed tail mismatch", ts.id)
	}
	return n, nil
}

// checkArrival checks a tier's arrival list: links and arrival order.
func checkArrival(tr *tierState) (int, error) {
	n := 0
	var prev *job
	for j := tr.arrival.head; j != nil; j = j.link[byTier].next {
		if j.link[byTier].prev != prev || j.tr != tr {
			return 0, fmt.Errorf("tier %q: broken arrival list", tr.name)
		}
		if prev != nil && (j.seq < prev.seq || j.enq < prev.enq) {
			return 0, fmt.Errorf("tier %q: arrival list out of order", tr.name)
		}
		prev = j
		n++
	}
	if prev != tr.arrival.tail {
		return 0, fmt.Errorf("tier %q: newest mismatch", tr.name)
	}
	return n, nil
}
