package fleet

import (
	"fmt"
	"sort"

	"github.com/tiergate/tiergate/dispatcher/queue/gate"
)

// batch is one pool's leases grouped by the sorted set that holds them;
// slot sets come first, so a removal announces freed slots.
type batch struct {
	keys    []string
	members [][]string
	index   map[string]int
}

// newBatch starts a batch whose first set is first, even if it ends up
// with no members.
func newBatch(first string) *batch {
	return &batch{keys: []string{first}, members: [][]string{nil}, index: map[string]int{first: 0}}
}

func (b *batch) add(key, member string) {
	if b.index == nil {
		b.index = map[string]int{}
	}
	i, ok := b.index[key]
	if !ok {
		i = len(b.keys)
		b.index[key] = i
		b.keys = append(b.keys, key)
		b.members = append(b.members, nil)
	}
	b.members[i] = append(b.members[i], member)
}

// addLease adds both sets that hold ls.
func (b *batch) addLease(ls *lease) {
	x, y := leaseKeys(keysFor(ls.pool), ls.kind, ls.tenant, ls.tier)
	b.add(x, ls.member)
	b.add(y, ls.member)
}

// args is the per-key "n, members…" tail of the remove and renew scripts.
func (b *batch) args() []any {
	var a []any
	for _, ms := range b.members {
		a = append(a, len(ms))
		for _, m := range ms {
			a = append(a, m)
		}
	}
	return a
}

func leaseKeys(ks keys, k kind, tenant, tier string) (string, string) {
	if k == kindSlot {
		return ks.slots(), ks.tenantSlots(tenant)
	}
	return ks.tierQueued(tier), ks.tenantQueued(tenant)
}

// batchesLocked groups every held lease by pool and set. The pool slot
// set is first.
func (g *Redis) batchesLocked() map[string]*batch {
	out := map[string]*batch{}
	for _, ls := range g.led.leases {
		b := out[ls.pool]
		if b == nil {
			b = newBatch(keysFor(ls.pool).slots()) // first, so removals announce
			out[ls.pool] = b
		}
		b.addLease(ls)
	}
	return out
}

func (g *Redis) renewLoop() {
	defer g.wg.Done()
	t := g.clk.NewTicker(g.cfg.RenewInterval)
	defer t.Stop()
	for {
		select {
		case <-g.stop:
			return
		case <-t.C():
		case <-g.renewCh:
		}
		g.renew()
	}
}

// renewal is one renewal's snapshot of what the dispatcher holds.
type renewal struct {
	pool        string
	wasDegraded bool
	batches     map[string]*batch
	held        map[string]heldLease // by member, as it was in the batch
	pending     []pendingRemoval
}

type heldLease struct {
	n    gate.Lease
	ls   *lease
	kind kind
	pool string
}

// renew extends every lease this dispatcher holds in one round trip per
// pool (normally one), registers it as alive and learns the fleet's size.
// After an outage it first replays the removals Redis missed, then writes
// back every lease it holds: that is the reconciliation, and fleet mode
// resumes.
func (g *Redis) renew() {
	rn, ok := g.prepareRenewal()
	if !ok {
		return
	}
	if err := g.flush(rn.pending); err != nil {
		g.failRenew(opFlush, err, rn.pending)
		return
	}
	alive, missing, err := g.renewBatches(rn)
	if err != nil {
		g.failRenew(opRenew, err, nil)
		return
	}
	lost, restored, resumed := g.reconcile(rn, alive, missing)
	for p, b := range lost {
		if _, err := g.run(opRenew, renewScript, append([]string{keysFor(p).dispatchers()}, b.keys...),
			append([]any{g.ttlMs, "", 1}, b.args()...)...); err != nil {
			g.failRenew(opRenew, err, nil)
			return
		}
	}
	g.m.restored.Add(float64(restored))
	if resumed {
		g.log.Info("Redis reachable again: fleet mode resumed", "pool", rn.pool, "dispatchers", len(alive), "leasesWrittenBack", restored)
		g.signal(wakeTransition)
		g.renewSoon() // leases taken during the last round trip
	}
}

func (g *Redis) prepareRenewal() (*renewal, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.fleet {
		return nil, false
	}
	rn := &renewal{pool: g.pool, wasDegraded: g.degraded, batches: g.batchesLocked(), held: map[string]heldLease{}}
	if _, ok := rn.batches[rn.pool]; !ok {
		rn.batches[rn.pool] = &batch{}
	}
	for n, ls := range g.led.leases {
		rn.held[ls.member] = heldLease{n: n, ls: ls, kind: ls.kind, pool: ls.pool}
	}
	rn.pending = g.takePendingLocked()
	return rn, true
}

// renewBatches runs renewScript for each pool: the dispatchers alive in
// the current pool, and the leases Redis did not have.
func (g *Redis) renewBatches(rn *renewal) ([]string, []missingLease, error) {
	restore := 0
	if rn.wasDegraded {
		restore = 1
	}
	var alive []string
	var missing []missingLease
	for p, b := range rn.batches {
		ks := keysFor(p)
		id := ""
		if p == rn.pool {
			id = g.id
		}
		v, err := g.run(opRenew, renewScript, append([]string{ks.dispatchers()}, b.keys...),
			append([]any{g.ttlMs, id, restore}, b.args()...)...)
		if err != nil {
			return nil, nil, err
		}
		a, ms, err := parseRenew(v, b)
		if err != nil {
			return nil, nil, err
		}
		if p == rn.pool {
			alive = a
		}
		for i := range ms {
			ms[i].pool = p
		}
		missing = append(missing, ms...)
	}
	return alive, missing, nil
}

// reconcile learns the fleet's size and finds the leases still held that
// Redis lost (a restart, or a renewal later than the TTL): those are
// written back. Released ones stay gone, and so does a queued place an
// exchange is turning into a slot.
func (g *Redis) reconcile(rn *renewal, alive []string, missing []missingLease) (map[string]*batch, int, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.alive, g.rank = len(alive), rankOf(alive, g.id)
	if g.alive == 0 || g.rank == g.alive {
		g.alive++ // not listed (yet): count itself
	}
	lost := map[string]*batch{}
	restored := map[string]bool{}
	for _, m := range missing {
		h, ok := rn.held[m.member]
		if !ok || g.led.leases[h.n] != h.ls || h.ls.kind != h.kind || h.ls.pool != h.pool || h.ls.claiming {
			continue
		}
		restored[m.member] = true
		if rn.wasDegraded {
			continue // already written back by restore=1
		}
		if lost[m.pool] == nil {
			lost[m.pool] = &batch{}
		}
		lost[m.pool].add(m.key, m.member)
	}
	resumed := rn.wasDegraded && g.degraded
	if resumed {
		g.degraded = false
	}
	return lost, len(restored), resumed
}

// failRenew degrades (once) and keeps the removals for the next try.
func (g *Redis) failRenew(op string, err error, pending []pendingRemoval) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.pending = append(pending, g.pending...)
	g.degradeLocked(op, err)
}

// takePendingLocked hands out the removals to replay, dropping those older
// than a TTL: Redis has expired those leases by itself.
func (g *Redis) takePendingLocked() []pendingRemoval {
	if len(g.pending) == 0 {
		return nil
	}
	cut := g.clk.Now().Add(-g.cfg.LeaseTTL)
	out := make([]pendingRemoval, 0, len(g.pending))
	for _, p := range g.pending {
		if p.at.After(cut) {
			out = append(out, p)
		}
	}
	g.pending = nil
	return out
}

// flush replays removals, one round trip per pool.
func (g *Redis) flush(pending []pendingRemoval) error {
	if len(pending) == 0 {
		return nil
	}
	byPool := map[string]*batch{}
	for i := range pending {
		ls := &pending[i].lease
		b := byPool[ls.pool]
		if b == nil {
			b = newBatch(keysFor(ls.pool).slots())
			byPool[ls.pool] = b
		}
		b.addLease(ls)
	}
	for p, b := range byPool {
		ks := keysFor(p)
		if _, err := g.run(opFlush, removeScript, append([]string{ks.waiting()}, b.keys...),
			append([]any{ks.freed(), g.id, 1}, b.args()...)...); err != nil {
			return err
		}
	}
	return nil
}

type missingLease struct {
	pool   string
	key    string
	member string
}

func parseRenew(v any, b *batch) ([]string, []missingLease, error) {
	a, ok := v.([]any)
	if !ok || len(a) != 2 {
		return nil, nil, fmt.Errorf("%w: renew: %v", errReply, v)
	}
	list, ok1 := a[0].([]any)
	miss, ok2 := a[1].([]any)
	if !ok1 || !ok2 || len(miss)%2 != 0 {
		return nil, nil, fmt.Errorf("%w: renew: %v", errReply, v)
	}
	alive := make([]string, 0, len(list))
	for _, x := range list {
		s, ok := x.(string)
		if !ok {
			return nil, nil, fmt.Errorf("%w: renew: %v", errReply, v)
		}
		alive = append(alive, s)
	}
	var out []missingLease
	for i := 0; i < len(miss); i += 2 {
		idx, ok1 := miss[i].(int64)
		m, ok2 := miss[i+1].(string)
		if !ok1 || !ok2 || idx < 1 || int(idx) > len(b.keys) {
			return nil, nil, fmt.Errorf("%w: renew: %v", errReply, v)
		}
		out = append(out, missingLease{key: b.keys[idx-1], member: m})
	}
	return alive, out, nil
}

// rankOf is id's index among the sorted ids, or len(ids) if absent.
func rankOf(ids []string, id string) int {
	s := append([]string(nil), ids...)
	sort.Strings(s)
	for i, x := range s {
		if x == id {
			return i
		}
	}
	return len(s)
}
