package fleet

import (
	"time"

	"github.com/tiergate/tiergate/dispatcher/queue/gate"
)

// Enqueue implements gate.Gate: one round trip of enqueueScript, made with
// only this call waiting on it.
func (g *Redis) Enqueue(tenant, tier string, tierBound, tenantQueueLimit int) (gate.Place, error) {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return gate.Place{}, errClosed
	}
	g.seq++
	n := g.seq
	ls := &lease{member: memberOf(g.id, n), pool: g.pool, tenant: tenant, tier: tier}
	if !g.remoteLocked() {
		p := g.localEnqueueLocked(n, ls, tierBound, tenantQueueLimit)
		g.mu.Unlock()
		return p, nil
	}
	ks := g.poolKeys
	g.calls.Add(1)
	g.mu.Unlock()
	defer g.calls.Done()

	v, err := g.run(opEnqueue, enqueueScript, []string{ks.tierQueued(tier), ks.tenantQueued(tenant)},
		ls.member, g.ttlMs, tierBound, tenantQueueLimit)
	var r []int64
	if err == nil {
		r, err = ints(opEnqueue, v, 2)
	}

	g.mu.Lock()
	defer g.mu.Unlock()
	if err != nil {
		// The script may or may not have run. If the local answer admits,
		// the same lease is written back on reconnection (idempotent); if
		// it refuses, a lease that did get in expires unrenewed.
		g.degradeLocked(opEnqueue, err)
		return g.localEnqueueLocked(n, ls, tierBound, tenantQueueLimit), nil
	}
	switch r[0] {
	case resOK:
		g.led.add(n, ls)
		return gate.Place{Lease: n, QueuedInTier: int(r[1]), Result: gate.OK}, nil
	case resTierFull:
		return gate.Place{QueuedInTier: int(r[1]), Result: gate.TierFull}, nil
	default:
		return gate.Place{QueuedInTier: int(r[1]), Result: gate.TenantQueueFull}, nil
	}
}

// localEnqueueLocked decides without Redis: under a Local policy it admits
// (the queue's own counts already hold), while degraded it enforces the
// slice.
func (g *Redis) localEnqueueLocked(n gate.Lease, ls *lease, bound, qlimit int) gate.Place {
	q := g.led.tierQueued[ls.tier]
	if g.fleet {
		s := g.sliceLocked(g.poolSlots)
		if q >= s.scale(bound) {
			return gate.Place{QueuedInTier: q, Result: gate.TierFull}
		}
		if g.led.tenantCount[kindQueued][ls.tenant] >= s.scale(qlimit) {
			return gate.Place{QueuedInTier: q, Result: gate.TenantQueueFull}
		}
	}
	g.led.add(n, ls)
	return gate.Place{Lease: n, QueuedInTier: q + 1, Result: gate.OK}
}

// exchange is one Exchange in progress: the leases it ends and the leases
// its claims name (nil for one the ledger does not hold).
type exchange struct {
	pool    string
	keys    keys
	slots   int
	returns []*lease
	claims  []gate.Claim
	leases  []*lease
}

// Exchange implements gate.Gate: one round trip of exchangeScript for the
// current pool (plus one of removeScript per other pool that still holds
// returned leases), made with only the queue's pump waiting on it.
func (g *Redis) Exchange(slots int, returns []gate.Lease, claims []gate.Claim) {
	g.mu.Lock()
	if g.closed {
		// Close gives back whatever the ledger still holds (or already
		// has): the returns stay in it for that.
		g.mu.Unlock()
		for i := range claims {
			claims[i].Result = gate.PoolFull
		}
		return
	}
	x := g.beginExchangeLocked(slots, returns, claims)
	if !g.remoteLocked() {
		g.localExchangeLocked(x)
		g.mu.Unlock()
		return
	}
	for _, ls := range x.leases {
		if ls != nil {
			ls.claiming = true
		}
	}
	g.calls.Add(1)
	g.mu.Unlock()
	defer g.calls.Done()

	waitMs, err := g.remoteExchange(x)

	g.mu.Lock()
	defer g.mu.Unlock()
	for _, ls := range x.leases {
		if ls != nil {
			ls.claiming = false
		}
	}
	if err != nil {
		// The script may or may not have run: the removals are replayed on
		// reconnection, and whatever Redis may hold against the local
		// answer is removed then too.
		g.degradeLocked(opExchange, err)
		for _, ls := range x.returns {
			g.addPendingLocked(*ls)
		}
		x.returns = nil
		g.localExchangeLocked(x)
		g.unsureLocked(x)
		return
	}
	g.settleLocked(x, waitMs)
}

// beginExchangeLocked takes the returned leases out of the ledger and
// finds the claimed ones.
func (g *Redis) beginExchangeLocked(slots int, returns []gate.Lease, claims []gate.Claim) *exchange {
	if slots > 0 {
		g.poolSlots = slots
	}
	// A return-only exchange may pass 0: the pool's last known size still
	// decides what its returns free for a hand-off.
	x := &exchange{pool: g.pool, keys: g.poolKeys, slots: g.poolSlots, claims: claims, leases: make([]*lease, len(claims))}
	for _, n := range returns {
		if ls, ok := g.led.remove(n); ok {
			x.returns = append(x.returns, ls)
		}
	}
	for i, c := range claims {
		if ls := g.led.leases[c.Lease]; ls != nil && ls.kind == kindQueued {
			x.leases[i] = ls
		}
	}
	return x
}

// localExchangeLocked answers without Redis. Returns are only forgotten
// (under a Local policy nothing is in Redis; while degraded the caller
// keeps them for the reconnection), claims are decided against the slice.
func (g *Redis) localExchangeLocked(x *exchange) {
	if g.fleet && g.degraded {
		for _, ls := range x.returns {
			g.addPendingLocked(*ls)
		}
	}
	var s slice
	if g.fleet {
		s = g.sliceLocked(x.slots)
	}
	for i := range x.claims {
		ls := x.leases[i]
		switch {
		case ls == nil:
			x.claims[i].Result = gate.PoolFull
		case g.fleet && g.led.total[kindSlot] >= s.slots:
			x.claims[i].Result = gate.PoolFull
		case g.fleet && g.led.tenantCount[kindSlot][ls.tenant] >= s.scale(x.claims[i].TenantLimit):
			x.claims[i].Result = gate.TenantFull
		default:
			x.claims[i].Result = gate.OK
			if g.fleet && g.degraded && ls.pool != "" {
				// Redis still holds its queued place: removed on reconnection.
				g.addPendingLocked(*ls)
			}
			g.led.grant(ls, g.pool)
		}
	}
}

// unsureLocked follows a failed exchange whose script may have run: a
// claim refused locally may hold a slot in Redis, removed on reconnection.
func (g *Redis) unsureLocked(x *exchange) {
	for i, ls := range x.leases {
		if ls != nil && x.claims[i].Result != gate.OK {
			slot := *ls
			slot.kind, slot.pool = kindSlot, x.pool
			g.addPendingLocked(slot)
		}
	}
}

// settleLocked applies the script's answers to the ledger.
func (g *Redis) settleLocked(x *exchange, waitMs int64) {
	refused := false
	for i, ls := range x.leases {
		switch {
		case ls == nil:
			x.claims[i].Result = gate.PoolFull
		case x.claims[i].Result == gate.OK:
			if ls.pool != x.pool {
				g.addPendingLocked(*ls) // its queued place is under another pool's keys
			}
			g.led.grant(ls, x.pool)
		default:
			refused = true
		}
	}
	if refused {
		g.armRecheckLocked(waitMs)
	}
}

// remoteExchange runs the exchange on Redis: the returns held under other
// pools' keys first, then exchangeScript. It sets the claims' results and
// returns the script's re-check hint.
func (g *Redis) remoteExchange(x *exchange) (int64, error) {
	ks := x.keys
	keys := make([]string, 4, 4+2*len(x.returns)+3*len(x.claims))
	keys[0], keys[1], keys[2], keys[3] = ks.slots(), ks.waiting(), ks.starved(), ks.handoff()
	args := make([]any, 7, 7+len(x.returns)+2*len(x.claims))
	args[0], args[1], args[2], args[3] = g.ttlMs, x.slots, g.id, ks.freed()
	args[5], args[6] = g.cfg.HandoffHold.Milliseconds(), (2 * g.cfg.RecheckInterval).Milliseconds()
	var others map[string]*batch
	for _, ls := range x.returns {
		if ls.pool != x.pool {
			if others == nil {
				others = map[string]*batch{}
			}
			if others[ls.pool] == nil {
				others[ls.pool] = newBatch(keysFor(ls.pool).slots())
			}
			others[ls.pool].addLease(ls)
			continue
		}
		a, b := leaseKeys(ks, ls.kind, ls.tenant, ls.tier)
		keys = append(keys, a, b)
		args = append(args, ls.member)
	}
	args[4] = len(args) - 7
	if err := g.removeElsewhere(others); err != nil {
		return 0, err
	}
	sent := make([]int, 0, len(x.claims)) // the claims the script decides
	for i, ls := range x.leases {
		if ls == nil {
			continue // settleLocked refuses it
		}
		sent = append(sent, i)
		keys = append(keys, ks.tenantSlots(ls.tenant), ks.tierQueued(ls.tier), ks.tenantQueued(ls.tenant))
		args = append(args, ls.member, x.claims[i].TenantLimit)
	}
	v, err := g.run(opExchange, exchangeScript, keys, args...)
	if err != nil {
		return 0, err
	}
	r, err := ints(opExchange, v, len(sent)+1)
	if err != nil {
		return 0, err
	}
	for k, i := range sent {
		switch r[k] {
		case resOK:
			x.claims[i].Result = gate.OK
		case resPoolFull:
			x.claims[i].Result = gate.PoolFull
		default:
			x.claims[i].Result = gate.TenantFull
		}
	}
	return r[len(sent)], nil
}

// removeElsewhere removes returned leases held under other pools' keys (the
// policy moved the dispatcher to another pool since they were taken).
func (g *Redis) removeElsewhere(byPool map[string]*batch) error {
	for p, b := range byPool {
		ks := keysFor(p)
		if _, err := g.run(opFlush, removeScript, append([]string{ks.waiting()}, b.keys...),
			append([]any{ks.freed(), g.id, 1}, b.args()...)...); err != nil {
			return err
		}
	}
	return nil
}

// armRecheckLocked makes sure the queue asks again within the re-check
// interval, or sooner when the lease that blocks it expires sooner (a
// crashed dispatcher's capacity comes back with no message).
func (g *Redis) armRecheckLocked(waitMs int64) {
	d := g.cfg.RecheckInterval
	if w := time.Duration(waitMs+1) * time.Millisecond; waitMs > 0 && w < d {
		d = w
	}
	d = max(d, minRecheck)
	now := g.clk.Now()
	at := now.Add(d)
	if g.recheck != nil && g.recheckAt.After(now) && !at.Before(g.recheckAt) {
		return // an earlier re-check is armed
	}
	if g.recheck != nil {
		g.recheck.Stop()
	}
	g.recheckAt = at
	// The callback only signals: a FakeClock runs it under its own lock.
	g.recheck = g.clk.AfterFunc(d, func() { g.signal(wakeTimer) })
}
