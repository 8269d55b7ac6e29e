package state

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/redis/go-redis/v9"
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
// set, when present, is first.
func (g *Redis) batchesLocked() map[string]*batch {
	out := map[string]*batch{}
	get := func(pool string) *batch {
		b := out[pool]
		if b == nil {
			b = newBatch(keysFor(pool).slots()) // first, so removals announce
			out[pool] = b
		}
		return b
	}
	for _, k := range []kind{kindSlot, kindQueued} {
		for tt, ls := range g.led.leases[k] {
			for _, l := range ls {
				a, b := leaseKeys(keysFor(l.pool), k, tt.tenant, tt.tier)
				get(l.pool).add(a, l.id)
				get(l.pool).add(b, l.id)
			}
		}
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

// renew extends every lease this dispatcher holds in one round trip per
// pool (normally one), registers it as alive and learns the fleet's size.
// After an outage it first replays the removals Redis missed, then writes
// back every lease it holds: that is the reconciliation, and fleet mode
// resumes.
func (g *Redis) renew() {
	g.mu.Lock()
	if !g.fleet {
		g.mu.Unlock()
		return
	}
	wasDegraded := g.degraded
	pool := g.pool
	batches := g.batchesLocked()
	if _, ok := batches[pool]; !ok {
		batches[pool] = &batch{}
	}
	pending := g.takePendingLocked()
	g.mu.Unlock()

	if err := g.flush(pending); err != nil {
		g.failRenew(opFlush, err, pending)
		return
	}
	restore := 0
	if wasDegraded {
		restore = 1
	}
	var alive []string
	var missing []missingLease
	for p, b := range batches {
		ks := keysFor(p)
		id := ""
		if p == pool {
			id = g.id
		}
		v, err := g.run(opRenew, renewScript, append([]string{ks.dispatchers()}, b.keys...),
			append([]any{g.ttlMs, id, restore}, b.args()...)...)
		if err != nil {
			g.failRenew(opRenew, err, nil)
			return
		}
		a, ms, err := parseRenew(v, b)
		if err != nil {
			g.failRenew(opRenew, err, nil)
			return
		}
		if p == pool {
			alive = a
		}
		for i := range ms {
			ms[i].pool = p
		}
		missing = append(missing, ms...)
	}

	g.mu.Lock()
	g.alive, g.rank = len(alive), rankOf(alive, g.id)
	if g.alive == 0 || g.rank == g.alive {
		g.alive++ // not listed (yet): count itself
	}
	// Missing leases still held were lost by Redis (a restart, or a renewal
	// later than the TTL): write them back. Released ones stay gone.
	lost := map[string]*batch{}
	restored := map[string]bool{}
	for _, m := range missing {
		if !g.led.holds(m.member) {
			continue
		}
		restored[m.member] = true
		if wasDegraded {
			continue // already written back by restore=1
		}
		if lost[m.pool] == nil {
			lost[m.pool] = &batch{}
		}
		lost[m.pool].add(m.key, m.member)
	}
	resumed := wasDegraded && g.degraded
	if resumed {
		g.degraded = false
	}
	g.mu.Unlock()

	for p, b := range lost {
		if _, err := g.run(opRenew, renewScript, append([]string{keysFor(p).dispatchers()}, b.keys...),
			append([]any{g.ttlMs, "", 1}, b.args()...)...); err != nil {
			g.failRenew(opRenew, err, nil)
			return
		}
	}
	n := len(restored)
	g.m.restored.Add(float64(n))
	if resumed {
		g.log.Info("Redis reachable again: fleet mode resumed", "pool", pool, "dispatchers", len(alive), "leasesWrittenBack", n)
		g.signal(wakeTransition)
		g.renewSoon() // leases taken during the last round trip
	}
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
	for _, p := range pending {
		b := byPool[p.lease.pool]
		if b == nil {
			b = newBatch(keysFor(p.lease.pool).slots())
			byPool[p.lease.pool] = b
		}
		x, y := leaseKeys(keysFor(p.lease.pool), p.kind, p.tenant, p.tier)
		b.add(x, p.lease.id)
		b.add(y, p.lease.id)
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

// waker calls the queue's Kick for coalesced wake-up signals, outside any
// Gate or queue lock.
func (g *Redis) waker() {
	defer g.wg.Done()
	for {
		select {
		case <-g.stop:
			return
		case <-g.wakeCh:
			g.mu.Lock()
			w := g.wake
			g.mu.Unlock()
			if w != nil {
				w()
			}
		}
	}
}

// resubscribe points the subscriber at the current pool's channel.
func (g *Redis) resubscribe() {
	g.mu.Lock()
	ps := g.ps
	want := ""
	if g.fleet {
		want = keysFor(g.pool).freed()
	}
	old := g.subscribed
	if ps == nil || want == old {
		g.mu.Unlock()
		return
	}
	g.subscribed = want
	g.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), g.cfg.OpTimeout)
	defer cancel()
	if old != "" {
		_ = ps.Unsubscribe(ctx, old)
	}
	if want != "" {
		// Remembered even if this fails; the subscriber's reconnection
		// subscribes again.
		_ = ps.Subscribe(ctx, want)
	}
}

// subscriber turns "slot freed" messages of other dispatchers into
// wake-ups. After a reconnection it wakes the queue too, since messages
// may have been lost meanwhile. Errors back off up to the re-check
// interval; the re-check timer covers whatever is missed.
func (g *Redis) subscriber() {
	defer g.wg.Done()
	g.mu.Lock()
	ps := g.ps
	g.mu.Unlock()
	backoff := minRecheck
	for {
		msg, err := ps.ReceiveTimeout(context.Background(), 2*g.cfg.RecheckInterval)
		select {
		case <-g.stop:
			return
		default:
		}
		if err != nil {
			if isTimeout(err) {
				// Quiet channel: a PING proves the connection still works.
				ctx, cancel := context.WithTimeout(context.Background(), g.cfg.OpTimeout)
				_ = ps.Ping(ctx)
				cancel()
				continue
			}
			select {
			case <-g.stop:
				return
			case <-g.clk.After(backoff):
			}
			backoff = min(2*backoff, g.cfg.RecheckInterval)
			continue
		}
		backoff = minRecheck
		switch m := msg.(type) {
		case *redis.Message:
			if m.Payload != g.id {
				g.signal(wakePubSub)
			}
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				g.signal(wakeResub)
			}
		}
	}
}

func isTimeout(err error) bool {
	var te interface{ Timeout() bool }
	return errors.As(err, &te) && te.Timeout()
}
